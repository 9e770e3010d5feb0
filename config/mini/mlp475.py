# The CPU-sized reproduction, arm 2 of 3: the linear query with the MLP widened to
# 4.75 d, the paper's parameter-matched control (+12.5% non-embedding parameters, more
# than res_gelu adds). Everything else as config/mini/baseline.py.
base = "baseline.py"

out_dir = "out-mini/mlp475"
mlp_ratio = 4.75
