# Table 1, best column "Res. GELU": the paper's nonlinear query Q = (x + f(x)) / 2
# (eq. 2-3) with max lr 3e-3 -> min lr 3e-5 and weight decay 2^-5; val loss 2.915 at
# step 59k in the paper (baseline 2.956).
base = "baseline.py"

out_dir = "out-res-gelu"
query_mode = "res_gelu"
learning_rate = 3e-3
min_lr = 3e-5
weight_decay = 2**-5
