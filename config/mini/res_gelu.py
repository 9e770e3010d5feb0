# The CPU-sized reproduction, arm 3 of 3: the paper's nonlinear query
# Q = (x + f(x)) / 2 (eq. 2-3, r = d/2). Everything else as config/mini/baseline.py,
# weight decay included: only the learning rate is tuned per arm.
base = "baseline.py"

out_dir = "out-mini/res_gelu"
query_mode = "res_gelu"
