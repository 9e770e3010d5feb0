# The CPU-sized reproduction under the modern recipe, arm 1 of 3: config/mini/baseline.py
# (4 layers, width 128, character-level Shakespeare, 1000 steps) with the recipe of
# config/modern/recipe.py (RoPE, RMSNorm, ReLU^2, QK-norm, an untied LM head and Muon). The arms
# differ only in the model; each gets its own Muon rate from a grid and 3 seeds:
#   python sweep.py config/mini/modern_baseline.py --grid muon_learning_rate=0.01,0.02,0.04 --grid seed=1,2,3
base = ["baseline.py", "../modern/recipe.py"]

out_dir = "out-mini/modern_baseline"
min_lr = 1e-4
