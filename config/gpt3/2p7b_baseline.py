# GPT-3 2.7B (Brown et al. 2020, Table 2.1: 32 layers, d = 2560, 32 heads, lr 1.6e-4,
# batch 1M tokens) as this repo's baseline, the linear query, at context 1024 as the paper's runs
# have; everything else as the paper's GPT-2 small (../baseline.py): 60,000 steps, 2000 warmup steps,
# cosine decay to lr / 10, AdamW (0.9, 0.95) with weight decay 0.1, evaluation every 1000 steps.
# What it needs per GPU, and how it fits on one of 80 GB: python bench/memory.py (docs/scale.md, "Larger models").
base = "../baseline.py"

out_dir = "out-gpt3-2p7b-baseline"
wandb_group = "gpt3-2p7b"

n_layer = 32
n_embd = 2560
n_head = 32

learning_rate = 1.6e-4
min_lr = learning_rate / 10

# sharded: without activation checkpointing, DDP's whole copy per GPU does not fit in 80 GB at this micro-batch
parallelism = "fsdp"

# 12 x 80 x 1024 = 983,040 tokens per step; gradient_accumulation_steps is a multiple of 8 (GPUs)
batch_size = 12
gradient_accumulation_steps = 80
