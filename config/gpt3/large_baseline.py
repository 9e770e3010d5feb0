# GPT-3 Large, 760M (Brown et al. 2020, Table 2.1: 24 layers, d = 1536, 16 heads, lr 2.5e-4,
# batch 0.5M tokens) as this repo's baseline, the linear query, at context 1024 as the paper's runs
# have; everything else as the paper's GPT-2 small (../baseline.py): 60,000 steps, 2000 warmup steps,
# cosine decay to lr / 10, AdamW (0.9, 0.95) with weight decay 0.1, evaluation every 1000 steps.
# What it needs per GPU, and how it fits on one of 80 GB: python bench/memory.py (docs/scale.md, "Larger models").
base = "../baseline.py"

out_dir = "out-gpt3-large-baseline"
wandb_group = "gpt3-large"

n_layer = 24
n_embd = 1536
n_head = 16

learning_rate = 2.5e-4
min_lr = learning_rate / 10

# 12 x 40 x 1024 = 491,520 tokens per step; gradient_accumulation_steps is a multiple of 8 (GPUs)
batch_size = 12
gradient_accumulation_steps = 40
