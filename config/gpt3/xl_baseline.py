# GPT-3 XL, 1.3B (Brown et al. 2020, Table 2.1: 24 layers, d = 2048, 24 heads, lr 2e-4,
# batch 1M tokens) as this repo's baseline, the linear query, at context 1024 as the paper's runs
# have; everything else as the paper's GPT-2 small (../baseline.py): 60,000 steps, 2000 warmup steps,
# cosine decay to lr / 10, AdamW (0.9, 0.95) with weight decay 0.1, evaluation every 1000 steps.
# What it needs per GPU, and how it fits on one of 80 GB: python bench/memory.py (docs/scale.md, "Larger models").
base = "../baseline.py"

out_dir = "out-gpt3-xl-baseline"
wandb_group = "gpt3-xl"

n_layer = 24
n_embd = 2048
# GPT-3 XL's 24 heads of 128 are 3072 wide, not d = 2048; here a head is d / n_head wide, so
# 16 heads of 128 (GPT-3's head width), as Pythia-1.4B has at the same d
n_head = 16

learning_rate = 2e-4
min_lr = learning_rate / 10

# 12 x 80 x 1024 = 983,040 tokens per step; gradient_accumulation_steps is a multiple of 8 (GPUs)
batch_size = 12
gradient_accumulation_steps = 80
