# The CPU-sized reproduction under the modern recipe, arm 2 of 3: the linear query with the
# MLP widened to 4.75 d, the parameter-matched control. Everything else as
# config/mini/modern_baseline.py.
base = "modern_baseline.py"

out_dir = "out-mini/modern_mlp475"
mlp_ratio = 4.75
