# The CPU-sized reproduction under the modern recipe, arm 1 of 3: config/mini/baseline.py
# (4 layers, width 128, character-level Shakespeare, 1000 steps) with RoPE, RMSNorm, ReLU^2,
# QK-norm, an untied LM head and Muon, as config/modern/baseline.py. The arms differ only in
# the model; each gets its own Muon rate from a grid and 3 seeds:
#   python sweep.py config/mini/modern_baseline.py --grid muon_learning_rate=0.01,0.02,0.04 --grid seed=1,2,3
base = "baseline.py"

out_dir = "out-mini/modern_baseline"

pos_encoding = "rope"
norm = "rmsnorm"
mlp_activation = "relu2"
qk_norm = True
tie_weights = False

optimizer = "muon"
muon_learning_rate = 0.02  # the middle of the grid above
muon_momentum = 0.95
muon_weight_decay = 0.0
learning_rate = 3e-3  # AdamW's, for the embeddings, the LM head and the norm weights
min_lr = 1e-4
weight_decay = 0.0
