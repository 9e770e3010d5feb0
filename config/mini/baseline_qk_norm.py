# The CPU-sized reproduction's baseline with QK-norm: RMSNorm of each head's q and k over
# head_dim, softmax scale 1/sqrt(head_dim) (Dehghani et al. 2023), the stabilizer that bounds
# the attention logits. An arm of the diagnostics study (docs/diagnostics.md); everything
# else as config/mini/baseline.py:
#   python sweep.py config/mini/baseline_qk_norm.py --grid learning_rate=3e-3,6e-3 --grid seed=1,2,3
base = "baseline.py"

out_dir = "out-mini/baseline_qk_norm"
qk_norm = True
