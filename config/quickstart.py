# The embedded default: a small GPT with the paper's nonlinear query (res_gelu) trained
# on Shakespeare (data/shakespeare/prepare.py) on the CPU: minutes on 2 cores (README). Its
# val loss at step 500 by thread count and CPU: docs/training.md, "The quickstart in detail".
# It refuses to replace a run already in out_dir: pass --overwrite=True to start it afresh.
out_dir = "out-quickstart"
dataset = "shakespeare"
device = "cpu"
compile = False  # gains little on a 2-core CPU

query_mode = "res_gelu"
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128

batch_size = 4  # small batches, many steps: the best use of a few minutes of CPU
gradient_accumulation_steps = 1
max_iters = 500
lr_decay_iters = 500
warmup_iters = 30
eval_interval = 100
eval_iters = 20
log_interval = 25

# the paper's res_gelu tolerates a high learning rate; small models train fast with it
learning_rate = 6e-3
min_lr = 2e-4
weight_decay = 0.1
