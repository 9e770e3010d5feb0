"""
What the query learns: per-layer diagnostics of the attention and the query, measured at
every evaluation by train.py (config `diagnostics`) and for any model by analyze.py.

Why these: attention-logit growth is the known mechanism behind the loss divergences of
Transformers trained at high learning rates. The pre-softmax logits q.k grow, the softmax
turns nearly one-hot (its entropy collapses), and the loss diverges; QK-norm, which bounds
the logits, removes it (Dehghani et al. 2023, "Scaling Vision Transformers to 22 Billion
Parameters"; Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities"; entropy collapse: Zhai et al. 2023, "Stabilizing Transformer Training by
Preventing Attention Entropy Collapse").

Per layer, over the given sequences (each batch row, head and query position counts once):

    attn_logit_max       the largest pre-softmax logit scale * q.k over heads, positions j <= i
    attn_logit_mean_max  the largest logit of each query position (over its keys), averaged
    attn_entropy         -sum_j p_ij log p_ij of the causal softmax, nats, averaged
                         (uniform attention over the i + 1 keys of position i gives log(i + 1))
    query_norm           ||q_h||, the query module's output (before qk_norm and RoPE) per head
    key_norm             ||k_h|| per key head (x W_K, before qk_norm and RoPE)
    query_cos            cos(q_h, a_h), a the query's anchor (QueryModule.decompose); None without one
    query_f_ratio        ||f_h|| / ||a_h||, f the learned part of q = a + f; None without one
    <m>_fro, <m>_spec    Frobenius and spectral norm of W_K (m = w_k) and of each of the query
                         module's matrices (w_q, w1, w2)

The logits are the model's own: q and k come from CausalSelfAttention.qkv and .heads (the
fused projection, qk_norm, RoPE), the scale is the layer's softmax scale (the query
module's scale_mult, or attn_scale), and with grouped-query attention query head h meets
key head h // (n_head / kv_heads), as in scaled_dot_product_attention. They are computed in
float32 from q and k. Norms and cosines are taken per head, on the head_dim slice h of the
(B, T, C) vectors, because each head's logit is a dot product of such slices: without
qk_norm, |logit| <= scale * ||q_h|| * ||k_h|| (RoPE rotates, keeping norms).

The anchor a (QueryModule.decompose): x, the block's ln_1 output (the normalized block
input), for identity (q = x, no f), residual (f = x W_Q), res_gelu and res_linear
(f = f(x), eq. 3); x W_Q for anchored_res_gelu (f = f(x)). The linear query has none. The
softmax's factor (the 1/2 of eq. 2) is in the scale, not in q, a or f.
"""

from contextlib import contextmanager, nullcontext

import torch
import torch.nn as nn
from torch.distributed.fsdp import FSDPModule
from torch.nn import functional as F

from nonlinear_queries.data.batches import get_batch

ACTIVATIONS = ("attn_logit_max", "attn_logit_mean_max", "attn_entropy", "query_norm", "key_norm", "query_cos",
               "query_f_ratio")


def weight_norms(attn):
    """{'<m>_fro': float, '<m>_spec': float} of the attention layer `attn` (CausalSelfAttention): m = w_k,
    the key rows of c_kv (kv_heads head_dim, C), and every nn.Linear of the query module by its name
    (w_q; w1, w2). Frobenius norm and spectral norm (the largest singular value), both in float32."""
    kv = attn.c_kv.out_features // 2
    matrices = {"w_k": attn.c_kv.weight[:kv]}
    matrices.update({name: m.weight for name, m in attn.query.named_children() if isinstance(m, nn.Linear)})
    out = {}
    for name, w in matrices.items():
        w = w.detach().float()
        out[f"{name}_fro"] = torch.linalg.matrix_norm(w).item()
        out[f"{name}_spec"] = torch.linalg.matrix_norm(w, ord=2).item()
    return out


@contextmanager
def unsharded(module):
    """Within the block, `module`'s own full weights under FSDP2 (processes.parallelize shards the root and each
    Block): all-gathered by every process on entry (a collective), sharded again on exit. Without FSDP,
    nothing."""
    if not isinstance(module, FSDPModule):
        yield
        return
    module.unshard()
    try:
        yield
    finally:
        module.reshard()


def per_head(t, heads):
    """(B, T, heads * d) -> (B, T, heads, d) in float32."""
    return t.float().unflatten(-1, (heads, -1))


def attention_stats(attn, x, rope, autocast):
    """The activation diagnostics of one batch at one layer, before averaging: x (B, T, C), the layer's ln_1
    output; rope as in CausalSelfAttention.forward; q and k are computed under `autocast`, as the model
    does, and the logits from them in float32. Returns (the largest logit, {name: (sum, count)}) for the
    other names of ACTIVATIONS (query_cos and query_f_ratio only where the query module defines them)."""
    with autocast:
        q_out, k_out, v = attn.qkv(x, attn.fused_qkv)
        q, k, _ = attn.heads(q_out, k_out, v, rope)
        parts = attn.query.decompose(x)
    k = k.repeat_interleave(attn.n_head // attn.n_kv_head, dim=1)  # query head h meets key head h // group
    B, H, T, _ = q.shape
    causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    top, row_max, entropy = -float("inf"), 0.0, 0.0
    for b in range(B):  # one sequence at a time: (H, T, T) logits in memory, not (B, H, T, T)
        logits = (q[b].float() @ k[b].float().transpose(-2, -1) * attn.scale).masked_fill(~causal, -float("inf"))
        rows = logits.amax(dim=-1)  # position i always sees key i: finite
        top = max(top, rows.max().item())
        row_max += rows.sum().item()
        entropy += torch.special.entr(logits.softmax(dim=-1)).sum().item()
    q_heads, k_heads = per_head(q_out, attn.n_head), per_head(k_out, attn.n_kv_head)
    n_q = q_heads[..., 0].numel()
    sums = {"attn_logit_mean_max": (row_max, B * H * T), "attn_entropy": (entropy, B * H * T),
            "query_norm": (q_heads.norm(dim=-1).sum().item(), n_q),
            "key_norm": (k_heads.norm(dim=-1).sum().item(), k_heads[..., 0].numel())}
    if parts is not None:
        anchor = per_head(parts[0], attn.n_head)
        sums["query_cos"] = (F.cosine_similarity(q_heads, anchor, dim=-1).sum().item(), n_q)
        if parts[1] is not None:
            ratio = per_head(parts[1], attn.n_head).norm(dim=-1) / anchor.norm(dim=-1).clamp_min(1e-12)
            sums["query_f_ratio"] = (ratio.sum().item(), n_q)
    return top, sums


@torch.no_grad()
def diagnose(model, tokens, index, block_size, device, autocast=nullcontext()):
    """The per-layer diagnostics (module docstring) of `model` (a GPT, not a torch.compile or DDP
    wrapper; sharded by FSDP2, it is called by every process, which all-gather one Block at a time) on
    the sequences of `index`.

    tokens: a uint16 token memmap; index: int64 (n, B), n batches of B start offsets (train.py: the
    first diagnostics_batches rows of the fixed val_eval stream); block_size: tokens per sequence.
    The forward runs in eval mode (no dropout, so no random numbers are drawn) under `autocast`;
    the model's training mode is restored. Returns {name: [one float per layer]}: the names of
    ACTIVATIONS (query_cos and query_f_ratio hold None per layer where undefined) and the weight
    norms of weight_norms.
    """
    was_training = model.training
    model.eval()
    layers = model.transformer.h
    tops, sums, norms = [-float("inf")] * len(layers), [{} for _ in layers], [None] * len(layers)
    with unsharded(model):  # the embeddings
        for row in index:
            idx, _ = get_batch(tokens, row, block_size, device)
            with autocast:
                x, rope = model.embed(idx)
            for i, block in enumerate(layers):
                with unsharded(block):
                    with autocast:
                        h = block.ln_1(x)
                    top, layer_sums = attention_stats(block.attn, h, rope, autocast)
                    norms[i] = norms[i] or weight_norms(block.attn)
                    with autocast:
                        x = block(x, rope=rope)
                tops[i] = max(tops[i], top)
                for name, (value, count) in layer_sums.items():
                    total, n = sums[i].get(name, (0.0, 0))
                    sums[i][name] = (total + value, n + count)
    model.train(was_training)
    out = {"attn_logit_max": tops}
    out.update({name: [s[name][0] / s[name][1] if name in s else None for s in sums] for name in ACTIVATIONS[1:]})
    out.update({name: [n[name] for n in norms] for name in norms[0]})
    return out
