# W_Q = I (Q = x): the query projection removed, which the reparametrization invariance
# of attention (paper eq. 1) says loses nothing. Baseline hyperparameters.
import os

exec(open(os.path.join(os.path.dirname(__file__), "baseline.py")).read())

out_dir = "out-identity"
query_mode = "identity"
