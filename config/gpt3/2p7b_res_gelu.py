# GPT-3 2.7B with the paper's nonlinear query Q = (x + f(x)) / 2 (eq. 2-3); everything
# else as 2p7b_baseline.py. res_gelu's learning rate at this size is unknown: this starts from
# the paper's ratio at GPT-2 small, res_gelu's 3e-3 to the baseline's 6e-4 (5x; min lr 1/100 of
# it, weight decay 2^-5, Table 1), so 5 x 1.6e-4 = 8e-4. Tune it per size with a sweep (sweep.py).
base = "2p7b_baseline.py"

out_dir = "out-gpt3-2p7b-res-gelu"
query_mode = "res_gelu"
learning_rate = 8e-4
min_lr = learning_rate / 100
weight_decay = 2**-5
