# Twin of the official configs/configs_untied/config_untiedw_residual_gelu.py
# (MarkoKarbevski/beyond_query_linearity):
# res_gelu with an LM head of its own, at the baseline's rates.
base = "../res_gelu.py"

out_dir = "out-official/config_untiedw_residual_gelu"
wandb_group = "official"
tie_weights = False
learning_rate = 6e-4
min_lr = 6e-5
weight_decay = 0.1
max_iters = 105001  # official: 105,001 steps on a 600,000-step cosine schedule (stopped early)
lr_decay_iters = 600000
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
