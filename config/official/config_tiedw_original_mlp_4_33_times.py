# Twin of the official configs/configs_tied/config_tiedw_original_mlp_4_33_times.py
# (MarkoKarbevski/beyond_query_linearity):
# Figure 2's smallest MLP-widened control: hidden 768 * 4 + 768 / 3 = 3328.
base = "../baseline.py"

out_dir = "out-official/config_tiedw_original_mlp_4_33_times"
wandb_group = "official"
mlp_ratio = 4 + 1 / 3  # int(4.333... * 768) = 3328 exactly
max_iters = 60002  # official max_iters and lr_decay_iters: 60002
lr_decay_iters = 60002
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
