# Table 1, column "MLP4.75": the linear baseline with MLP hidden width 4.75 d = 3648,
# 12.5% more non-embedding parameters (95,570,688), same learning rate.
base = "baseline.py"

out_dir = "out-mlp475"
mlp_ratio = 4.75
