# GPT-3 Large, 760M with the paper's nonlinear query Q = (x + f(x)) / 2 (eq. 2-3); everything
# else as large_baseline.py. res_gelu's learning rate at this size is unknown: this starts from
# the paper's ratio at GPT-2 small, res_gelu's 3e-3 to the baseline's 6e-4 (5x; min lr 1/100 of
# it, weight decay 2^-5, Table 1), so 5 x 2.5e-4 = 1.25e-3. Tune it per size with a sweep (sweep.py).
base = "large_baseline.py"

out_dir = "out-gpt3-large-res-gelu"
query_mode = "res_gelu"
learning_rate = 1.25e-3
min_lr = learning_rate / 100
weight_decay = 2**-5
