# Twin of the official configs/configs_tied/config_tiedw_original_005wd.py
# (MarkoKarbevski/beyond_query_linearity):
# the baseline at weight decay 0.05 (the paper: it diverges before
# 20k steps).
base = "../baseline.py"

out_dir = "out-official/config_tiedw_original_005wd"
wandb_group = "official"
weight_decay = 0.05
max_iters = 60002  # official max_iters and lr_decay_iters: 60002
lr_decay_iters = 60002
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
