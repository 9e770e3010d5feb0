# The modern recipe's model and optimizers, one value each (docs/modern.md): rotary positions (RoPE),
# RMSNorm, ReLU^2 MLP, QK-norm, an untied LM head and Muon for the blocks' matrices (modded-nanogpt's
# speedrun recipe). Not a run by itself: a config takes it as a base after its data and size, e.g.
#   base = ["../baseline.py", "recipe.py"]        (config/modern/baseline.py, GPT-2 small)
#   base = ["baseline.py", "../modern/recipe.py"]  (config/mini/modern_baseline.py, the CPU size)
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
weight_decay = 0.0
