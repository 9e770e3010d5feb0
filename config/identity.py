# W_Q = I (Q = x): the query projection removed, which the reparametrization invariance
# of attention (paper eq. 1) says loses nothing. Baseline hyperparameters.
base = "baseline.py"

out_dir = "out-identity"
query_mode = "identity"
