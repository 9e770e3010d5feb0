# The modern recipe (docs/modern.md), arm 1 of 2: GPT-2 small with the linear
# query, trained the way current models are: rotary positions (RoPE), RMSNorm, ReLU^2 MLP,
# QK-norm, an untied LM head and Muon for the blocks' matrices (modded-nanogpt's speedrun
# recipe). Data, batch, steps and evaluation as the paper's baseline (../baseline.py).
# The rates are a starting point, not tuned at this scale: tune them per arm (sweep.py).
base = "../baseline.py"

out_dir = "out-modern-baseline"
wandb_group = "modern"

pos_encoding = "rope"
norm = "rmsnorm"
mlp_activation = "relu2"
qk_norm = True
tie_weights = False

optimizer = "muon"
muon_learning_rate = 0.02  # Muon's, for the 2-D block matrices (adjust_lr_fn 'original')
muon_momentum = 0.95
muon_weight_decay = 0.0
learning_rate = 3e-3  # AdamW's, for the embeddings, the LM head and the norm weights
min_lr = 3e-5  # the schedule ends both optimizers at 1% of their peak
weight_decay = 0.0
