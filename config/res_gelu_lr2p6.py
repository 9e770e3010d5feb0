# Table 1, column "Res. GELU" with max lr 2.6e-3: the paper's nonlinear query
# Q = (x + f(x)) / 2 (eq. 2-3), weight decay 2^-5, min lr 3e-5.
import os

exec(open(os.path.join(os.path.dirname(__file__), "baseline.py")).read())

out_dir = "out-res-gelu-lr2p6"
query_mode = "res_gelu"
learning_rate = 2.6e-3
min_lr = 3e-5
weight_decay = 2**-5
