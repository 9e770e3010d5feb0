# The ablation study (results/ablations): res_gelu with QK-norm (RMSNorm of each head's q and k,
# Dehghani et al. 2023) and, as with every qk_norm run, softmax scale 1/sqrt(head_dim). Does the
# nonlinear query add anything once the attention logits are bounded? Everything else as config/mini/res_gelu.py.
base = "res_gelu.py"

out_dir = "out-mini/res_gelu_qk_norm"
qk_norm = True
