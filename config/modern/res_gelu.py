# The modern recipe, arm 2 of 2: the paper's nonlinear query Q = (x + f(x)) / 2 (eq. 2-3)
# in the modern GPT-2 small; everything else as config/modern/baseline.py. f's matrices W1
# and W2 are 2-D block matrices, so Muon updates them too.
base = "baseline.py"

out_dir = "out-modern-res-gelu"
query_mode = "res_gelu"
