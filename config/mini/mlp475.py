# The CPU-sized reproduction, arm 2 of 3: the linear query with the MLP widened to
# 4.75 d, the paper's parameter-matched control (+12.5% non-embedding parameters, more
# than res_gelu adds). Everything else as config/mini/baseline.py.
import os

exec(open(os.path.join(os.path.dirname(__file__), "baseline.py")).read())

out_dir = "out-mini/mlp475"
mlp_ratio = 4.75
