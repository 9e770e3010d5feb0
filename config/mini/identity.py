# The ablation study (results/ablations): the identity query Q = x / 2, no query parameters: the
# anchor of eq. 2-3 alone (the half folded into the softmax scale, as in the official code).
# Everything else as config/mini/baseline.py, weight decay included.
base = "baseline.py"

out_dir = "out-mini/identity"
query_mode = "identity"
