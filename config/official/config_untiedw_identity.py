# Twin of the official configs/configs_untied/config_untiedw_identity.py
# (MarkoKarbevski/beyond_query_linearity):
# W_Q = I with an LM head of its own (identity.py's model).
base = "../identity.py"

out_dir = "out-official/config_untiedw_identity"
wandb_group = "official"
max_iters = 105001  # official: 105,001 steps on a 600,000-step cosine schedule (stopped early)
lr_decay_iters = 600000
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
