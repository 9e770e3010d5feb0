# Twin of the official configs/configs_tied/config_tiedw_original_mlp_4_75_times.py
# (MarkoKarbevski/beyond_query_linearity):
# Table 1's MLP4.75: hidden (4 + 6/8) * 768 = 3648.
base = "../mlp475.py"

out_dir = "out-official/config_tiedw_original_mlp_4_75_times"
wandb_group = "official"
max_iters = 60002  # official max_iters and lr_decay_iters: 60002
lr_decay_iters = 60002
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
