# Table 1, column "Baseline": GPT-2 small (124M) with the linear query, nanoGPT's
# hyperparameters (arXiv:2603.13381 §3.1). 12 x 40 x 1024 = 491,520 tokens per step,
# 60,000 steps; evaluated every 1000 steps over 200 x 12 = 2400 fixed sequences.
out_dir = "out-baseline"
wandb_log = True
wandb_project = "nonlinear-queries"
wandb_group = "table1"

dataset = "openwebtext"
batch_size = 12
gradient_accumulation_steps = 40
block_size = 1024
max_iters = 60000
lr_decay_iters = 60000
warmup_iters = 2000
eval_interval = 1000
eval_iters = 200
log_interval = 10

n_layer = 12
n_head = 12
n_embd = 768
query_mode = "linear"
mlp_ratio = 4.0

learning_rate = 6e-4
min_lr = 6e-5
weight_decay = 0.1
