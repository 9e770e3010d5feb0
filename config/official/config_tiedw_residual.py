# Twin of the official configs/configs_tied/config_tiedw_residual.py
# (MarkoKarbevski/beyond_query_linearity):
# the linear residual query Q = (x + x W_Q) / 2 (the official `residual`
# mode: x + x W_Q with the softmax scale 1 / (2 sqrt(64)), this repo's query_mode 'residual').
base = "../baseline.py"

out_dir = "out-official/config_tiedw_residual"
wandb_group = "official"
query_mode = "residual"
max_iters = 60002  # official max_iters and lr_decay_iters: 60002
lr_decay_iters = 60002
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
