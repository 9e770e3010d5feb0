# Twin of the official configs/configs_untied/config_untiedw_original_smaller_mlp.py
# (MarkoKarbevski/beyond_query_linearity):
# the untied baseline with MLP hidden 3.5 * 768 = 2688.
base = "../baseline.py"

out_dir = "out-official/config_untiedw_original_smaller_mlp"
wandb_group = "official"
tie_weights = False
mlp_ratio = 3.5
max_iters = 105001  # official: 105,001 steps on a 600,000-step cosine schedule (stopped early)
lr_decay_iters = 600000
save_checkpoint_steps = (50000, 100000, 105000)  # the official list, whichever steps the run reaches
