# Table 1, column "MLP4.75 (scaled)": MLP hidden 4.75 d with the learning rates divided
# by sqrt(1.125), the parameter ratio to the baseline.
base = "baseline.py"

out_dir = "out-mlp475-scaled"
mlp_ratio = 4.75
learning_rate = 5.66e-4
min_lr = 5.66e-5
