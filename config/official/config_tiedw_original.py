# Twin of the official configs/configs_tied/config_tiedw_original.py
# (MarkoKarbevski/beyond_query_linearity):
# Table 1's baseline as the author ran it.
base = "../baseline.py"

out_dir = "out-official/config_tiedw_original"
wandb_group = "official"
max_iters = 60002  # official max_iters and lr_decay_iters: 60002
lr_decay_iters = 60002
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
