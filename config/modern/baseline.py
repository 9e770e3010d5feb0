# The modern recipe (docs/modern.md), arm 1 of 2: GPT-2 small with the linear query, trained
# the way current models are (recipe.py: RoPE, RMSNorm, ReLU^2, QK-norm, an untied LM head, Muon).
# Data, batch, steps and evaluation as the paper's baseline (../baseline.py).
# The rates are a starting point, not tuned at this scale: tune them per arm (sweep.py).
base = ["../baseline.py", "recipe.py"]

out_dir = "out-modern-baseline"
wandb_group = "modern"
min_lr = 3e-5  # the schedule ends both optimizers at 1% of their peak
