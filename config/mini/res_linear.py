# The ablation study (results/ablations): res_gelu without the GELU, f(x) = LN(RMSNorm(x) W1 W2):
# the bottleneck and both norms, no nonlinearity. Everything else as config/mini/baseline.py.
base = "baseline.py"

out_dir = "out-mini/res_linear"
query_mode = "res_linear"
