# The CPU-sized reproduction under the modern recipe, arm 3 of 3: the paper's nonlinear
# query Q = (x + f(x)) / 2 (eq. 2-3, r = d/2). Everything else as config/mini/modern_baseline.py.
base = "modern_baseline.py"

out_dir = "out-mini/modern_res_gelu"
query_mode = "res_gelu"
