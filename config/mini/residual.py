# The ablation study (results/ablations): the residual query Q = (x + x W_Q) / 2, the anchor plus a
# full linear map. Everything else as config/mini/baseline.py, weight decay included.
base = "baseline.py"

out_dir = "out-mini/residual"
query_mode = "residual"
