# Twin of the official configs/configs_untied/config_untiedw_residual.py
# (MarkoKarbevski/beyond_query_linearity):
# the linear residual query (config_tiedw_residual) with an LM head of its own.
base = "../baseline.py"

out_dir = "out-official/config_untiedw_residual"
wandb_group = "official"
tie_weights = False
query_mode = "residual"
max_iters = 105001  # official: 105,001 steps on a 600,000-step cosine schedule (stopped early)
lr_decay_iters = 600000
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
