# Twin of the official configs/configs_tied/config_tiedw_original_headsize_68.py
# (MarkoKarbevski/beyond_query_linearity):
# a wider baseline: 12 heads of 68, n_embd 768 + 4 * 12 = 816, MLP 4 * 816.
base = "../baseline.py"

out_dir = "out-official/config_tiedw_original_headsize_68"
wandb_group = "official"
n_embd = 816
max_iters = 60002  # official max_iters and lr_decay_iters: 60002
lr_decay_iters = 60002
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
