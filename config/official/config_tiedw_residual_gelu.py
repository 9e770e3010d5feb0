# Twin of the official configs/configs_tied/config_tiedw_residual_gelu.py
# (MarkoKarbevski/beyond_query_linearity):
# the author's first res_gelu run, at a rate near the baseline's.
base = "../res_gelu.py"

out_dir = "out-official/config_tiedw_residual_gelu"
wandb_group = "official"
learning_rate = 8e-4
min_lr = 8e-5
weight_decay = 0.1
max_iters = 60002  # official max_iters and lr_decay_iters: 60002
lr_decay_iters = 60002
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
