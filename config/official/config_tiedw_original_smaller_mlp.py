# Twin of the official configs/configs_tied/config_tiedw_original_smaller_mlp.py
# (MarkoKarbevski/beyond_query_linearity):
# a smaller MLP: hidden 3.5 * 768 = 2688.
base = "../baseline.py"

out_dir = "out-official/config_tiedw_original_smaller_mlp"
wandb_group = "official"
mlp_ratio = 3.5
max_iters = 60002  # official max_iters and lr_decay_iters: 60002
lr_decay_iters = 60002
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
