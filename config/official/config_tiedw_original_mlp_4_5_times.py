# Twin of the official configs/configs_tied/config_tiedw_original_mlp_4_5_times.py
# (MarkoKarbevski/beyond_query_linearity):
# a Figure 2 MLP-widened control: hidden 4.5 * 768 = 3456.
base = "../baseline.py"

out_dir = "out-official/config_tiedw_original_mlp_4_5_times"
wandb_group = "official"
mlp_ratio = 4.5
max_iters = 60002  # official max_iters and lr_decay_iters: 60002
lr_decay_iters = 60002
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
