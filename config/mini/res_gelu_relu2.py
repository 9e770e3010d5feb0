# The ablation study (results/ablations): res_gelu with ReLU^2 in place of GELU inside f (does the
# kind of nonlinearity matter?). Everything else as config/mini/res_gelu.py.
base = "res_gelu.py"

out_dir = "out-mini/res_gelu_relu2"
query_activation = "relu2"
