"""
GPT-2 (nanoGPT's GPT-2 small) with a pluggable attention query, for Karbevski, "Beyond Linearity in Attention
Projections: The Case for Nonlinear Queries", arXiv:2603.13381 (2026). K = x W_K and V = x W_V stay linear in
the block's normed input x; the query is the QueryModule that `query_mode` picks from QUERY_MODULES (res_gelu:
eq. 2-3). Every choice, its source, the derivations and the parameter counts: docs/design.md. Adding a query
module: README "Adding a query module".
"""

import math
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
from torch.nn import functional as F


@dataclass
class GPTConfig:
    """Model hyperparameters. Defaults are GPT-2 small (124M) with the linear query."""

    block_size: int = 1024  # the context: tokens per training sequence, and the most the model attends over
    vocab_size: int = 50304  # GPT-2's 50257 padded up to a multiple of 64 for speed
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block; head_dim = n_embd / n_head
    n_embd: int = 768  # the width of the residual stream
    dropout: float = 0.0  # on the embeddings, attention weights and residual branches; 0 in pretraining
    mlp_ratio: float = 4.0  # MLP hidden width = int(mlp_ratio * n_embd); 4.75 for the MLP4.75 controls
    query_mode: str = "linear"  # a key of QUERY_MODULES
    query_rank: int = 0  # bottleneck width r of res_gelu; 0 means n_embd // 2 (the paper's r = d/2)
    query_activation: str = "gelu"  # res_gelu's activation in f: 'gelu' (the paper's), 'relu' or 'relu2' (ReLU^2)
    query_norm: bool = True  # res_gelu/res_linear: RMSNorm before W1 and LayerNorm after W2 in f; False drops both
    qk_norm: bool = False  # RMSNorm of each head's query and key over head_dim, learnable weight (any query_mode)
    fused_qkv: bool = True  # one input matmul for K, V and the query's first layer (docs/design.md)
    attn_scale: float = 0.0  # softmax scale; 0 = the query module's own, scale_mult / sqrt(head_dim)
    # an output gate on attention (Qiu et al. 2025, G1): each head's SDPA output times sigmoid(x W_θ), x the block's
    # ln_1 output, before c_proj; 'none', 'headwise' (W_θ n_embd x n_head) or 'elementwise' (n_embd x n_embd)
    attn_gate: str = "none"
    tie_weights: bool = True  # the LM head shares the token embedding's weight; False gives it its own
    bias: bool = False  # a bias in every Linear but the LM head and in every LayerNorm (GPT-2 has them)
    # a key of MLP_ACTIVATIONS ('gelu' exact, 'gelu_tanh' GPT-2's gelu_new, 'relu2') or of GATED_MLP_ACTIVATIONS
    # ('swiglu': three matrices, hidden width 2/3 of int(mlp_ratio * n_embd) rounded to a multiple of 64)
    mlp_activation: str = "gelu"
    pos_encoding: str = "learned"  # 'learned' (GPT-2's wpe) or 'rope' (rotary q and k per head, no wpe)
    rope_theta: float = 10000.0  # RoPE base: pair i of a head rotates by position * rope_theta^(-2i / head_dim)
    n_kv_head: int = 0  # heads of K and V; 0 = n_head (multi-head), a divisor of n_head for GQA, 1 = multi-query
    norm: str = "layernorm"  # block and final norms: 'layernorm' or 'rmsnorm' (the query module's own are its own)
    # 'sp' (standard parametrization) or 'mup' (the maximal update parametrization: GPT.mup_roles, docs/width.md),
    # whose width multiplier is m = n_embd / mup_base_width; at m = 1 μP is SP exactly
    parametrization: str = "sp"
    mup_base_width: int = 128  # the width at which μP's rates were tuned (results/long_horizon's width)
    mup_base_head_dim: int = 0  # μP's head size at the base width; 0 = this model's (width grown by heads)

    def __post_init__(self):
        for key in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if not 0 <= self.dropout < 1 or self.mlp_ratio <= 0:
            raise ValueError(f"dropout must be in [0, 1) and mlp_ratio > 0, got {self.dropout} and {self.mlp_ratio}")
        if self.query_mode not in QUERY_MODULES:
            raise ValueError(
                f"unknown query_mode {self.query_mode!r}; valid query modes: {', '.join(sorted(QUERY_MODULES))}"
            )
        if self.n_embd % self.n_head != 0:
            raise ValueError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.query_activation not in QUERY_ACTIVATIONS:
            raise ValueError(f"unknown query_activation {self.query_activation!r}; "
                             f"valid: {', '.join(QUERY_ACTIVATIONS)}")
        defaults = {f.name: f.default for f in fields(self)}
        for option in QUERY_OPTIONS:  # each one at its default, or declared by the mode's module (its `options`)
            value = getattr(self, option)
            if value != defaults[option] and option not in QUERY_MODULES[self.query_mode].options:
                takers = [mode for mode, module in QUERY_MODULES.items() if option in module.options]
                raise ValueError(f"{option}={value!r} applies to {query_modes_phrase(takers)} only, "
                                 f"not {self.query_mode!r}")
        if self.query_rank < 0:
            raise ValueError(f"query_rank must be >= 0 (0 means n_embd // 2), got {self.query_rank}")
        if self.attn_scale < 0:
            raise ValueError(f"attn_scale must be >= 0 (0 = the query module's own scale), got {self.attn_scale}")
        if self.attn_gate not in ATTN_GATES:
            raise ValueError(f"unknown attn_gate {self.attn_gate!r}; valid: {', '.join(ATTN_GATES)}")
        if self.mlp_activation not in {**MLP_ACTIVATIONS, **GATED_MLP_ACTIVATIONS}:
            raise ValueError(f"unknown mlp_activation {self.mlp_activation!r}; valid: "
                             f"{', '.join([*MLP_ACTIVATIONS, *GATED_MLP_ACTIVATIONS])}")
        if self.pos_encoding not in ("learned", "rope"):
            raise ValueError(f"pos_encoding must be 'learned' or 'rope', got {self.pos_encoding!r}")
        head_dim = self.n_embd // self.n_head
        if self.pos_encoding == "rope" and head_dim % 2:
            raise ValueError(f"pos_encoding='rope' rotates pairs of a head's dimensions, so head_dim = n_embd / "
                             f"n_head must be even; n_embd={self.n_embd}, n_head={self.n_head} give {head_dim}")
        if self.rope_theta <= 0:
            raise ValueError(f"rope_theta must be > 0, got {self.rope_theta}")
        if self.n_kv_head < 0 or (self.n_kv_head and self.n_head % self.n_kv_head):
            raise ValueError(f"n_kv_head must be 0 (= n_head) or a divisor of n_head={self.n_head}: each key/value "
                             f"head serves n_head / n_kv_head query heads; got {self.n_kv_head}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {self.norm!r}")
        if self.parametrization not in ("sp", "mup"):
            raise ValueError(f"parametrization must be 'sp' or 'mup', got {self.parametrization!r}")
        if self.mup_base_width < 1 or self.mup_base_head_dim < 0:
            raise ValueError(f"mup_base_width must be >= 1 and mup_base_head_dim >= 0 (0 = this model's head size), "
                             f"got {self.mup_base_width} and {self.mup_base_head_dim}")
        if self.norm == "rmsnorm" and self.bias:
            raise ValueError("norm='rmsnorm' has no bias, but bias=True asks for one in every norm; use "
                             "norm='layernorm' with bias=True, or bias=False")

    @property
    def mlp_hidden(self):
        """MLP hidden width: int(mlp_ratio * n_embd); for a gated MLP 2/3 of it, rounded to a multiple of 64 (>= 64)."""
        hidden = int(self.mlp_ratio * self.n_embd)
        if self.mlp_activation in GATED_MLP_ACTIVATIONS:
            return max(64, round(hidden * 2 / 3 / 64) * 64)
        return hidden

    @property
    def width_mult(self):
        """μP's width multiplier m = n_embd / mup_base_width; 1.0 under SP."""
        return self.n_embd / self.mup_base_width if self.parametrization == "mup" else 1.0

    @property
    def attn_scale_mult(self):
        """μP's factor on the softmax scale: sqrt(mup_base_head_dim / head_dim), making it ∝ 1/head_dim (Tensor
        Programs V; docs/width.md); 1.0 under SP and with mup_base_head_dim = 0."""
        if self.parametrization != "mup" or not self.mup_base_head_dim:
            return 1.0
        return math.sqrt(self.mup_base_head_dim / (self.n_embd // self.n_head))

    @property
    def kv_heads(self):
        """Number of key/value heads: n_kv_head, or n_head when 0."""
        return self.n_kv_head or self.n_head

    @property
    def query_bottleneck(self):
        """Bottleneck width r of res_gelu's f: query_rank, or n_embd // 2 (the paper's r = d/2) when 0."""
        return self.query_rank or self.n_embd // 2


# attn_gate's kinds (CausalSelfAttention)
ATTN_GATES = ("none", "headwise", "elementwise")

# GPTConfig's fields that some query modules read and others do not: a module names those it takes in its
# `options`, and GPTConfig refuses any of them away from its default for a query_mode whose module does not.
# The rest hold for every mode: query_rank is read by whichever module has a bottleneck (a mode without one
# ignores it, as before), qk_norm and attn_gate act on the attention around any query (no declaration)
QUERY_OPTIONS = ("query_activation", "query_norm")


def query_modes_phrase(modes):
    """"query_mode='a'" for one mode, "query_mode 'a', 'b' or 'c'" for more: the modes an option applies to."""
    if len(modes) == 1:
        return f"query_mode={modes[0]!r}"
    names = [repr(mode) for mode in modes]
    return f"query_mode {', '.join(names[:-1])} or {names[-1]}"


def model_config_keys():
    """Names of the GPTConfig fields (the model-defining subset of a training config)."""
    return [f.name for f in fields(GPTConfig)]


# ---------------------------------------------------------------------------------------
# Query modules: per token, before the split into heads.


class QueryModule(nn.Module):
    """forward(x) -> q: x, the block's ln_1 output, and q both (B, T, C); softmax scale scale_mult / sqrt(head_dim).
    Optional: fused_weight() -> rows (n, C) stacked under W_K, W_V, and from_fused(x, h) -> q from
    h = x @ fused_weight().T (B, T, n), adding the module's biases (None: unfused); decompose(x) -> (anchor, f),
    each (B, T, C), f None if nothing is learned, for the diagnostics (None: no anchor). `options`: the names of
    QUERY_OPTIONS the module reads, which GPTConfig lets away from their defaults for its mode alone; a subclass
    inherits its parent's (a res_gelu subclass takes query_activation and query_norm) unless it sets its own."""

    scale_mult = 1.0
    options = ()

    def fused_weight(self):
        return None

    def decompose(self, x):
        return None

    def from_projection(self, x, p, widths):
        """(q, pieces) from x (B, T, C) and p (B, T, W + n), the fused projection whose last n columns are
        x @ fused_weight().T and whose first W = sum(widths) are other maps' (K's and V's): q (B, T, C) by
        from_fused, and pieces, p's first columns split by `widths` (ints), as views of p."""
        *pieces, h = p.split([*widths, p.size(-1) - sum(widths)], dim=-1)
        return self.from_fused(x, h), pieces


class LinearQuery(QueryModule):
    """Standard query Q = x W_Q (+ b with `bias`), W_Q of shape (C, C). d^2 parameters."""

    def __init__(self, config):
        super().__init__()
        self.w_q = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.w_q(x)

    def fused_weight(self):
        return self.w_q.weight

    def from_fused(self, x, h):
        return h if self.w_q.bias is None else h + self.w_q.bias


class IdentityQuery(QueryModule):
    """Q = x / 2, W_Q fixed to the identity (eq. 1); forward returns x, the 1/2 in scale_mult. No parameters."""

    scale_mult = 0.5

    def __init__(self, config):
        super().__init__()

    def forward(self, x):
        return x

    def decompose(self, x):
        return x, None


class ResidualQuery(LinearQuery):
    """Q = (x + x W_Q) / 2 (the official code's `residual`); forward returns x + x W_Q, the 1/2 in scale_mult. d^2."""

    scale_mult = 0.5

    def forward(self, x):
        return x + self.w_q(x)

    def decompose(self, x):
        return x, self.w_q(x)

    def from_fused(self, x, h):
        return x + super().from_fused(x, h)


def relu2(x):
    """ReLU squared, max(x, 0)^2 (So et al., "Primer", 2021)."""
    return F.relu(x).square()


# activations of res_gelu's bottleneck f, chosen by `query_activation`
QUERY_ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu, "relu2": relu2}


class ResGELUQuery(QueryModule):
    """Eq. 2-3: Q = (x + f(x)) / 2, f(x) = LN(GELU(RMSNorm(x) W1) W2); W1 (C, r), W2 (r, C), r = query_bottleneck;
    norms eps 1e-5 with weights, GELU exact; 2Cr + 2C parameters (`bias`: W1, W2, LN get biases). forward returns
    x + f(x), the 1/2 in scale_mult. Ablations: query_activation; query_norm=False, f = act(x W1) W2. Fused rows:
    diag(g) W1 (docs/design.md)."""

    scale_mult = 0.5
    options = ("query_activation", "query_norm")

    def __init__(self, config):
        super().__init__()
        self.act = QUERY_ACTIVATIONS[config.query_activation]
        self.norm = config.query_norm
        self.rms = nn.RMSNorm(config.n_embd, eps=1e-5) if self.norm else nn.Identity()
        self.w1 = nn.Linear(config.n_embd, config.query_bottleneck, bias=config.bias)
        self.w2 = nn.Linear(config.query_bottleneck, config.n_embd, bias=config.bias)
        self.ln = nn.LayerNorm(config.n_embd, eps=1e-5, bias=config.bias) if self.norm else nn.Identity()

    # an optional fast path: a function (module, x, p, widths) -> (q, pieces), the same math as
    # from_projection's; None computes it here in plain PyTorch. model.py imports nothing of the package, so
    # the package sets it (nonlinear_queries.ops.kernels.use_kernels, TrainConfig's `kernels`: Triton ops)
    kernels = None

    def f(self, x):
        """The bottleneck f(x) of eq. 3; x: (..., C) -> (..., C)."""
        return self.ln(self.w2(self.act(self.w1(self.rms(x)))))

    def forward(self, x):
        if self.kernels is not None:  # the fast path takes f's first matmul from outside, as the fused one gives it
            return self.from_projection(x, F.linear(x, self.fused_weight()), [])[0]
        return x + self.f(x)

    def decompose(self, x):
        return x, self.f(x)

    def fused_weight(self):
        # (r, C): column j of W1^T scaled by g_j
        return self.w1.weight * self.rms.weight if self.norm else self.w1.weight

    def f_from_fused(self, x, h):
        """f(x) from x (..., C) and h = x @ fused_weight().T (..., r); the bias of W1 comes after the 1/rms(x)."""
        if self.norm:
            h = h * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.rms.eps)
        if self.w1.bias is not None:
            h = h + self.w1.bias
        return self.ln(self.w2(self.act(h)))

    def from_fused(self, x, h):
        return x + self.f_from_fused(x, h)

    def from_projection(self, x, p, widths):
        if self.kernels is not None:  # one autograd node over p: its gradient one buffer, not a cat of the pieces'
            return self.kernels(self, x, p, widths)
        return super().from_projection(x, p, widths)


class ResLinearQuery(ResGELUQuery):
    """res_gelu without the activation: f(x) = LN(RMSNorm(x) W1 W2), 2Cr + 2C parameters."""

    options = ("query_norm",)  # its f has no activation to choose

    def __init__(self, config):
        super().__init__(config)
        self.act = nn.Identity()


class AnchoredResGELUQuery(ResGELUQuery):
    """§5, for fine-tuning a linear model: Q = (x W_Q + f(x)) / 2, f as res_gelu's with its LN weight starting at 0;
    forward returns x W_Q + f(x) with scale_mult 1 (scale 2/sqrt(d_head)), so step 0 gives the pretrained logits
    (docs/design.md). d^2 + 2Cr + 2C parameters; fused rows [W_Q | diag(g) W1]."""

    scale_mult = 1.0
    # neither ablation: query_norm=False would leave no LN weight to start at 0, and f's activation is res_gelu's
    options = ()

    def __init__(self, config):
        super().__init__(config)
        self.w_q = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        nn.init.zeros_(self.ln.weight)

    def forward(self, x):
        if self.kernels is not None:
            return self.from_projection(x, F.linear(x, self.fused_weight()), [])[0]
        return self.w_q(x) + self.f(x)

    def decompose(self, x):
        return self.w_q(x), self.f(x)

    def fused_weight(self):
        return torch.cat([self.w_q.weight, super().fused_weight()])

    def from_fused(self, x, h):
        q, h = h.split([x.size(-1), h.size(-1) - x.size(-1)], dim=-1)
        if self.w_q.bias is not None:
            q = q + self.w_q.bias
        return q + self.f_from_fused(x, h)


QUERY_MODULES = {
    "linear": LinearQuery,
    "identity": IdentityQuery,
    "residual": ResidualQuery,
    "res_gelu": ResGELUQuery,
    "res_linear": ResLinearQuery,
    "anchored_res_gelu": AnchoredResGELUQuery,
}


# ---------------------------------------------------------------------------------------
# Transformer


class KVCache:
    """One layer's keys and values for decoding: (B, kv_heads, max_len, head_dim) buffers, made at the first append
    in its keys' dtype and device; `length` positions filled."""

    def __init__(self, max_len):
        self.max_len = max_len
        self.length = 0
        self.k = self.v = None

    def append(self, k, v):
        """Store k, v (B, kv_heads, T, head_dim) at positions length .. length+T-1; return every position's,
        (B, kv_heads, length+T, head_dim) each. ValueError past max_len."""
        B, H, T, D = k.shape
        if self.length + T > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; cannot add {T} to {self.length}")
        if self.k is None:
            self.k = k.new_empty(B, H, self.max_len, D)
            self.v = v.new_empty(B, H, self.max_len, D)
        self.k[:, :, self.length : self.length + T] = k
        self.v[:, :, self.length : self.length + T] = v
        self.length += T
        return self.k[:, :, : self.length], self.v[:, :, : self.length]


def rope_angles(head_dim, positions, theta, dtype=torch.float32):
    """cos, sin (T, head_dim / 2) in `dtype` of RoPE's angles (RoFormer eq. 34): pair i at position p (positions (T,)
    int) turns p * theta^(-2i / head_dim) radians, computed in float64 (float32 is off by ~p * 1e-7 rad)."""
    inv_freq = theta ** -(torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float64) / head_dim)
    angles = positions.double()[:, None] * inv_freq
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x, cos, sin):
    """x (B, H, T, head_dim) rotated by rope_angles' cos, sin, dimension i paired with i + head_dim / 2; computed in
    cos's precision at least, returned in x's dtype."""
    x1, x2 = x.to(torch.promote_types(x.dtype, cos.dtype)).chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).type_as(x)


class CausalSelfAttention(nn.Module):
    """forward(x, kv_cache=None, rope=None): x (B, T, C), the ln_1 output -> (B, T, C); with a KVCache x is the T
    positions after the cached ones; rope: rope_angles' (cos, sin) for them. c_kv: C -> 2 kv_heads head_dim (GQA:
    query head h uses K, V head h // (n_head / kv_heads)); `fused_qkv` stacks the query's rows under it, except when
    decoding. qk_norm: RMSNorm over head_dim, weight (head_dim,). Softmax scale: attn_scale, else scale_mult (1 with
    qk_norm) / sqrt(head_dim) times attn_scale_mult. attn_gate (Qiu et al. 2025, arXiv:2505.06708, G1): c_gate, W_θ
    (+ b with `bias`) of C -> n_head (headwise) or C -> C (elementwise), and SDPA's output y becomes
    y * sigmoid(x W_θ + b) before c_proj, a head's gate scaling all its head_dim channels (headwise) or channel
    c of y (head c // head_dim) getting gate c (elementwise); c_gate is None with attn_gate='none'."""

    def __init__(self, config):
        super().__init__()
        self.n_head = config.n_head
        self.n_kv_head = config.kv_heads
        self.n_embd = config.n_embd
        self.dropout = config.dropout
        self.fused_qkv = config.fused_qkv
        self.query = QUERY_MODULES[config.query_mode](config)
        head_dim = config.n_embd // config.n_head
        self.c_kv = nn.Linear(config.n_embd, 2 * self.n_kv_head * head_dim, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        # no module at all without the gate: the parameters and the draws of the init stay those of before the gate
        gates = {"headwise": config.n_head, "elementwise": config.n_embd}.get(config.attn_gate)
        self.c_gate = nn.Linear(config.n_embd, gates, bias=config.bias) if gates else None
        self.resid_dropout = nn.Dropout(config.dropout)
        # qk_norm off is the identity, so heads() reads the same either way
        self.q_norm = nn.RMSNorm(head_dim, eps=1e-5) if config.qk_norm else nn.Identity()
        self.k_norm = nn.RMSNorm(head_dim, eps=1e-5) if config.qk_norm else nn.Identity()
        # QK-norm removes any constant factor on q, res_gelu's 1/2 included, so the scale is the plain one
        own_scale = (1.0 if config.qk_norm else self.query.scale_mult) / math.sqrt(head_dim) * config.attn_scale_mult
        self.scale = config.attn_scale or own_scale

    def qkv(self, x, fused):
        """q (B, T, C) and k, v (B, T, kv_heads head_dim) from x: (B, T, C); one input matmul if `fused`."""
        kv = self.c_kv.out_features // 2
        w_query = self.query.fused_weight() if fused else None
        if w_query is None:
            k, v = self.c_kv(x).split(kv, dim=2)
            return self.query(x), k, v
        q, (k, v) = self.query.from_projection(x, F.linear(x, torch.cat([self.c_kv.weight, w_query])), [kv, kv])
        if self.c_kv.bias is not None:  # the stacked matmul has no bias; the query module adds its own
            k, v = k + self.c_kv.bias[:kv], v + self.c_kv.bias[kv:]
        return q, k, v

    def heads(self, q, k, v, rope=None):
        """qkv()'s output in heads, q (B, n_head, T, head_dim) and k, v (B, kv_heads, T, head_dim); q, k qk-normed,
        then rotated."""
        B, T, C = q.size()
        head_dim = C // self.n_head
        q = q.view(B, T, self.n_head, head_dim).transpose(1, 2)
        k, v = (t.view(B, T, self.n_kv_head, head_dim).transpose(1, 2) for t in (k, v))
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:  # after qk_norm: its per-dimension weight then scales unrotated coordinates, so
            # q.k stays a function of the relative position (a weight applied after rotating would break that)
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return q, k, v

    def forward(self, x, kv_cache=None, rope=None):
        B, T, C = x.size()
        # Decoding with a cache moves a few tokens through each weight: the matmuls are
        # bound by reading the weights, and stacking them first would double that read.
        fused = self.fused_qkv and kv_cache is None
        q, k, v = self.heads(*self.qkv(x, fused), rope)
        mask, is_causal = None, True
        if kv_cache is not None:
            past = kv_cache.length
            k, v = kv_cache.append(k, v)
            if past > 0:  # new query i sits at position past + i and sees keys 0 .. past + i
                is_causal = False
                if T > 1:
                    positions = torch.arange(past + T, device=x.device)
                    mask = positions <= positions[past:, None]
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=self.scale,
            dropout_p=self.dropout if self.training else 0.0, enable_gqa=self.n_kv_head != self.n_head,
        )
        y = y.transpose(1, 2)  # (B, T, n_head, head_dim)
        if self.c_gate is not None:  # from this token's x alone, so decoding with the cache needs nothing cached
            y = y * torch.sigmoid(self.c_gate(x)).view(B, T, self.n_head, -1)  # -1: 1 a head, or head_dim
        y = y.contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


def gelu_tanh(x):
    """GELU's tanh approximation 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): GPT-2's `gelu_new`."""
    return F.gelu(x, approximate="tanh")


# activations of the MLP, chosen by `mlp_activation`: applied to c_fc(x) ...
MLP_ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": gelu_tanh, "relu2": relu2}
# ... or gating it: act(c_gate(x)) * c_fc(x) (Shazeer 2020, "GLU Variants Improve Transformer")
GATED_MLP_ACTIVATIONS = {"swiglu": F.silu}


class MLP(nn.Module):
    """x (B, T, C) -> c_proj(act(c_fc(x))), or gated c_proj(act(c_gate(x)) * c_fc(x)), (B, T, C); hidden width
    mlp_hidden."""

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias)
        gated = config.mlp_activation in GATED_MLP_ACTIVATIONS
        self.act = (GATED_MLP_ACTIVATIONS if gated else MLP_ACTIVATIONS)[config.mlp_activation]
        self.c_gate = nn.Linear(config.n_embd, config.mlp_hidden, bias=config.bias) if gated else None
        self.c_proj = nn.Linear(config.mlp_hidden, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        h = self.act(self.c_fc(x)) if self.c_gate is None else self.act(self.c_gate(x)) * self.c_fc(x)
        return self.dropout(self.c_proj(h))


def make_norm(config):
    """LayerNorm or RMSNorm (`norm`) over n_embd, learnable weight, eps 1e-5."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.n_embd, eps=1e-5)
    return nn.LayerNorm(config.n_embd, eps=1e-5, bias=config.bias)


class Block(nn.Module):
    """Pre-norm block: x + attn(ln_1(x)), then + mlp(ln_2(.))."""

    def __init__(self, config):
        super().__init__()
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = MLP(config)

    def forward(self, x, kv_cache=None, rope=None):
        x = x + self.attn(self.ln_1(x), kv_cache, rope)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2 with the query module of config.query_mode (μP under parametrization='mup': docs/width.md).
    forward(idx, targets=None, kv_cache=None, return_logits=True): idx, targets int64 (B, T). Returns (logits
    (B, T, vocab_size), mean cross-entropy in nats), without targets (last position's (B, 1, vocab_size), None),
    with return_logits=False (None, loss) (docs/gpu-path.md). kv_cache: new_kv_cache(), the positions before idx.
    ValueError: past + T > block_size; return_logits=False without targets; under μP, a parameter no rule covers."""

    # the training loss's optional fast path: a function (logits (N, V), targets (N,)) -> F.cross_entropy's mean,
    # whose forward overwrites the logits with their gradient (so no buffer of their size is allocated for it);
    # set by nonlinear_queries.ops.kernels.use_kernels
    cross_entropy = None

    def __init__(self, config):
        super().__init__()
        self.config = config
        # wpe in second place keeps GPT-2's parameter order, hence its init and its optimizer states;
        # RoPE puts the positions into q and k instead
        wpe = dict(wpe=nn.Embedding(config.block_size, config.n_embd)) if config.pos_encoding == "learned" else {}
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                **wpe,
                drop=nn.Dropout(config.dropout),
                h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
                ln_f=make_norm(config),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        # Residual output projections get a depth-scaled std so the residual stream's
        # variance does not grow with n_layer (GPT-2 paper). Matched by module, not by
        # parameter name, so a query module's own layers keep std 0.02, as the official code has them.
        residual_std = 0.02 / math.sqrt(2 * config.n_layer)
        for block in self.transformer.h:
            torch.nn.init.normal_(block.attn.c_proj.weight, mean=0.0, std=residual_std)
            torch.nn.init.normal_(block.mlp.c_proj.weight, mean=0.0, std=residual_std)
        # μP: every parameter gets a role (an unclassified one stops the model here), and the hidden matrices'
        # std shrinks by 1/sqrt(m), the residual projections' 1/sqrt(2 n_layer) kept; skipped at m = 1 (SP's init)
        self.mup_roles = self._mup_roles() if config.parametrization == "mup" else {}
        if config.width_mult != 1.0:
            with torch.no_grad():
                for name, p in self.named_parameters():
                    if self.mup_roles[name] == "hidden":
                        p.mul_(config.width_mult ** -0.5)

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            torch.nn.init.zeros_(module.bias)

    def _mup_roles(self):
        """{parameter name: 'hidden' | 'embedding' | 'output' | 'vector'} (tied ones once), by docs/width.md's table: a
        matrix is hidden when both its dimensions grow in a model of twice n_embd and n_head (built on the meta
        device). ValueError naming a parameter no rule covers."""
        cfg = self.config
        # n_kv_head, when set, and query_rank stay as they are: a count fixed in width
        wider = GPTConfig(**{**{f.name: getattr(cfg, f.name) for f in fields(GPTConfig)}, "n_embd": 2 * cfg.n_embd,
                             "n_head": 2 * cfg.n_head, "parametrization": "sp"})
        with torch.device("meta"):
            probe = dict(GPT(wider).named_parameters())
        embeddings = {id(self.transformer.wte.weight)}
        if "wpe" in self.transformer:
            embeddings.add(id(self.transformer.wpe.weight))
        roles = {}
        for name, p in self.named_parameters():
            grows = [a != b for a, b in zip(p.shape, probe[name].shape)]
            if id(p) in embeddings:
                roles[name] = "embedding"
            elif p is self.lm_head.weight:
                roles[name] = "output"
            elif p.dim() <= 1:
                roles[name] = "vector"
            elif p.dim() == 2 and all(grows):
                roles[name] = "hidden"
            else:
                raise ValueError(
                    f"parametrization='mup' has no rule for {name}, of shape {tuple(p.shape)}, of which "
                    f"{sum(grows)} of {p.dim()} dimensions grow with n_embd: μP classes a matrix as hidden when both "
                    f"its dimensions grow with width (a bottleneck or a head count fixed in width does not). Make "
                    f"its dimensions follow n_embd, or give it a role in GPT._mup_roles (docs/width.md)")
        return roles

    def get_num_params(self, non_embedding=True):
        """Parameters, tied ones once; non_embedding leaves out wte, wpe and an untied lm_head (Table 1's count)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.transformer.wte.weight.numel() + self.wpe_numel()
            if not self.config.tie_weights:
                n -= self.lm_head.weight.numel()
        return n

    def wpe_numel(self):
        """Parameters of the positional embedding: 0 with RoPE, which has none."""
        return self.transformer.wpe.weight.numel() if "wpe" in self.transformer else 0

    def embed(self, idx, past=0):
        """idx int64 (B, T) at positions past .. past + T - 1 -> x (B, T, C) after dropout, and rope_angles' (cos, sin)
        (float32 at least) or None with learned positions."""
        pos = torch.arange(past, past + idx.size(1), dtype=torch.long, device=idx.device)
        x, rope = self.transformer.wte(idx), None
        if self.config.pos_encoding == "rope":
            dtype = torch.promote_types(x.dtype, torch.float32)
            rope = rope_angles(self.config.n_embd // self.config.n_head, pos, self.config.rope_theta, dtype)
        else:
            x = x + self.transformer.wpe(pos)
        return self.transformer.drop(x), rope

    def forward(self, idx, targets=None, kv_cache=None, return_logits=True):
        if targets is None and not return_logits:
            raise ValueError("return_logits=False returns the loss alone, which needs targets")
        x = self.hidden_states(idx, kv_cache)
        if targets is None:
            return self.logits(x[:, [-1], :]), None
        logits = self.logits(x)
        # with return_logits=False nothing reads the logits after the loss, so the fast path (`cross_entropy`, the
        # package's kernel; None = torch's) overwrites them with their gradient in the forward; a caller that asks
        # for the logits gets torch's loss, which leaves them as they are
        loss_fn = F.cross_entropy if self.cross_entropy is None or return_logits else self.cross_entropy
        loss = loss_fn(logits.view(-1, logits.size(-1)), targets.reshape(-1))  # targets may be a slice
        return (logits if return_logits else None), loss

    def logits(self, x):
        """x (..., n_embd) -> logits (..., vocab_size), times μP's 1/m."""
        logits = self.lm_head(x)
        return logits if self.config.width_mult == 1.0 else logits * (1.0 / self.config.width_mult)

    def hidden_states(self, idx, kv_cache=None):
        """idx int64 (B, T) -> the final norm's output (B, T, n_embd), for logits(); ValueError past block_size."""
        T = idx.size(1)
        past = kv_cache[0].length if kv_cache is not None else 0
        if past + T > self.config.block_size:
            raise ValueError(f"sequence length {past + T} exceeds block_size {self.config.block_size}")
        x, rope = self.embed(idx, past)
        for i, block in enumerate(self.transformer.h):
            x = block(x, kv_cache[i] if kv_cache is not None else None, rope)
        return self.transformer.ln_f(x)

    def flops_per_token(self):
        """Training FLOPs per token: 6 N (N: parameters but the lookups wpe, untied wte) + 12 n_layer n_embd block_size
        (PaLM appendix B; docs/gpu-path.md)."""
        cfg = self.config
        n = self.get_num_params(non_embedding=False) - self.wpe_numel()
        if not cfg.tie_weights:
            n -= self.transformer.wte.weight.numel()
        return 6 * n + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size

    def new_kv_cache(self):
        """One empty KVCache of block_size positions per layer."""
        return [KVCache(self.config.block_size) for _ in range(self.config.n_layer)]

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None, use_kv_cache=True):
        """idx int64 (B, T) -> int64 (B, T + max_new_tokens); temperature 0 is greedy, top_k keeps the k likeliest;
        KV cache exact (docs/design.md). Call model.eval() first. ValueError for temperature < 0."""
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        kv_cache = None
        for _ in range(max_new_tokens):
            if not use_kv_cache or idx.size(1) > self.config.block_size:
                logits, _ = self(idx[:, -self.config.block_size :])
            elif kv_cache is None:
                kv_cache = self.new_kv_cache()
                logits, _ = self(idx, kv_cache=kv_cache)
            else:
                logits, _ = self(idx[:, -1:], kv_cache=kv_cache)
            logits = logits[:, -1, :]
            if temperature == 0:
                idx_next = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    v, _ = torch.topk(logits, min(top_k, logits.size(-1)))
                    logits[logits < v[:, [-1]]] = -float("inf")
                idx_next = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx
