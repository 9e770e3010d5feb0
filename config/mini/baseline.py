# The CPU-sized reproduction of Table 1 (docs/training.md, "What makes the comparison fair"), arm 1 of 3: the
# linear query. A 4-layer, 128-wide GPT on character-level Shakespeare
# (data/shakespeare_char/prepare.py): 1000 steps of 8 x 256 characters, 2M characters
# in all, 2-3 minutes on one CPU core. The three arms differ only in the model; each
# gets its own learning rate from a grid (sweep.py) and 3 seeds:
#   python sweep.py config/mini/baseline.py --grid learning_rate=1.5e-3,3e-3,6e-3 --grid seed=1,2,3
out_dir = "out-mini/baseline"
dataset = "shakespeare_char"
vocab_size = 128  # the corpus has 84 characters; padded to a multiple of 64
device = "cpu"
compile = False

query_mode = "linear"
n_layer = 4
n_head = 4
n_embd = 128
block_size = 256
mlp_ratio = 4.0

batch_size = 8
gradient_accumulation_steps = 1
max_iters = 1000
lr_decay_iters = 1000
warmup_iters = 40
eval_interval = 200
eval_iters = 32  # 32 x 8 x 256 = 65k characters per split, the same fixed sequences for every run
log_interval = 50

learning_rate = 3e-3  # the best of the grid for all three arms (results/mini)
min_lr = 1e-4
weight_decay = 0.1
