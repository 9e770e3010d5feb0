# The ablation study (results/ablations): res_gelu without the two norms inside f,
# f(x) = GELU(x W1) W2 (do the RMSNorm and LayerNorm of eq. 3 matter?). Everything else as
# config/mini/res_gelu.py.
base = "res_gelu.py"

out_dir = "out-mini/res_gelu_no_norm"
query_norm = False
