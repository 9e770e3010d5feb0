# Table 1, column "Res. GELU" with max lr 2.6e-3: the best res_gelu config (res_gelu.py)
# with a lower peak learning rate; val loss 2.919 at step 59k in the paper.
base = "res_gelu.py"

out_dir = "out-res-gelu-lr2p6"
learning_rate = 2.6e-3
