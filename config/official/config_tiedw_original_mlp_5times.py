# Twin of the official configs/configs_tied/config_tiedw_original_mlp_5times.py
# (MarkoKarbevski/beyond_query_linearity):
# the widest MLP control: hidden 5 * 768 = 3840.
base = "../baseline.py"

out_dir = "out-official/config_tiedw_original_mlp_5times"
wandb_group = "official"
mlp_ratio = 5.0
max_iters = 60002  # official max_iters and lr_decay_iters: 60002
lr_decay_iters = 60002
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
