# Table 1's res_gelu (config/res_gelu.py: eq. 2-3, weight decay 2^-5) under μP (docs/width.md), as
# config/baseline_mup.py is the baseline's: m = 768 / 128 = 6; res_gelu's W1 and W2 are hidden matrices
# like attention's and the MLP's. The rate is the base width's: 3e-3, results/long_horizon's choice for
# res_gelu at width 128 (a CPU proxy); studies/table1_gpt2_mup.toml tunes it at width 128 with this recipe.
base = "res_gelu.py"

out_dir = "out-res-gelu-mup"
wandb_group = "table1-mup"
parametrization = "mup"
mup_base_width = 128
learning_rate = 3e-3
min_lr = 3e-5  # learning_rate / 100, as res_gelu's 3e-3 -> 3e-5
