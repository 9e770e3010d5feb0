# GPT-2 small's baseline (config/baseline.py) under μP (docs/width.md): width multiplier
# m = 768 / 128 = 6, so the hidden matrices start at std 0.02 / sqrt(6) and train at AdamW rate
# learning_rate / 6 (weight decay x 6, lr x wd as at width 128), the logits are divided by 6, and the
# embeddings and norm weights keep learning_rate. The rate is the base width's: 3e-3, results/long_horizon's
# choice for the baseline at width 128 (4 layers, character-level Shakespeare, 3000 steps), a CPU proxy of
# another depth, data set and horizon, whose transfer across width results/width_transfer measured.
# studies/table1_gpt2_mup.toml tunes it where it belongs: at width 128 (2 heads of 64) with this recipe.
base = "baseline.py"

out_dir = "out-baseline-mup"
wandb_group = "table1-mup"
parametrization = "mup"
mup_base_width = 128
learning_rate = 3e-3
min_lr = 3e-4  # learning_rate / 10, as the baseline's 6e-4 -> 6e-5
