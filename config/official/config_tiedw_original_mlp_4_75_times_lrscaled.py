# Twin of the official configs/configs_tied/config_tiedw_original_mlp_4_75_times_lrscaled.py
# (MarkoKarbevski/beyond_query_linearity):
# Table 1's MLP4.75 (scaled): the rates divided by sqrt(1.125) exactly
# (Table 1 rounds them to 5.66e-4 and 5.66e-5).
base = "../mlp475_scaled.py"

out_dir = "out-official/config_tiedw_original_mlp_4_75_times_lrscaled"
wandb_group = "official"
learning_rate = 6e-4 / 1.125**0.5
min_lr = 6e-5 / 1.125**0.5
max_iters = 60002  # official max_iters and lr_decay_iters: 60002
lr_decay_iters = 60002
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
