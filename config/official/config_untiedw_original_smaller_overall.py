# Twin of the official configs/configs_untied/config_untiedw_original_smaller_overall.py
# (MarkoKarbevski/beyond_query_linearity):
# the untied baseline at n_embd 744 (12 heads of 62), MLP 4 * 744.
base = "../baseline.py"

out_dir = "out-official/config_untiedw_original_smaller_overall"
wandb_group = "official"
tie_weights = False
n_embd = 744
max_iters = 105001  # official: 105,001 steps on a 600,000-step cosine schedule (stopped early)
lr_decay_iters = 600000
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
