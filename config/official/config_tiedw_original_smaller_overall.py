# Twin of the official configs/configs_tied/config_tiedw_original_smaller_overall.py
# (MarkoKarbevski/beyond_query_linearity):
# a smaller model: 12 heads of 62, n_embd 744, MLP 4 * 744.
base = "../baseline.py"

out_dir = "out-official/config_tiedw_original_smaller_overall"
wandb_group = "official"
n_embd = 744
max_iters = 60002  # official max_iters and lr_decay_iters: 60002
lr_decay_iters = 60002
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
