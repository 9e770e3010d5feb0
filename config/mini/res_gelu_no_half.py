# The ablation study (results/ablations): res_gelu without the 1/2 of eq. 2, Q = x + f(x): the
# softmax scale is 1/sqrt(head_dim) instead of the folded-in (1/2)/sqrt(head_dim). The public
# audit found a residual query without the halving did best. Everything else as
# config/mini/res_gelu.py.
base = "res_gelu.py"

out_dir = "out-mini/res_gelu_no_half"
attn_scale = (n_embd / n_head) ** -0.5
