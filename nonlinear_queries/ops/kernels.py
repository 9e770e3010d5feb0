"""
res_gelu's f as Triton kernels, registered as custom ops (issue 65): the fast path that
TrainConfig's `kernels` puts into a model (use_kernels), with a plain-PyTorch implementation
of the same ops as the CPU path and the reference.

f of the paper's eq. 2-3, Q = (x + f(x)) / 2 with f(x) = LN(GELU(RMSNorm(x) W1) W2), on the
fused projection (model.py): h = x diag(g) W1 comes out of the [K | V | W1] matmul, and

    rstd = 1 / rms(x)                    rms(x) = sqrt(mean(x^2) + eps)     rms_statistic (PyTorch)
    a = GELU(h rstd + b1)                                                    torch.ops.nlq.rms_gelu
    y = a W2 + b2                        cuBLAS, as before
    q = anchor + LN(y) w + b             anchor x (res_gelu) or x W_Q        torch.ops.nlq.layer_norm_residual

rms(x) is plain PyTorch so that torch.compile computes it in the kernel that makes x (the block's ln_1) and
x's gradient through it where x's gradient is made: rms_gelu reads one float32 a row, not x (float32 under
autocast), and its backward gives rstd's gradient, one float32 a row, not a full (N, C) dx. Under bf16
autocast q comes out in bf16 where the attention would cast it so (use_kernels), half the bytes of the
float32 q torch's LayerNorm gives (issue 77).

Each op is one kernel per direction, each program a tile of whole rows (tokens; TILE_ELEMENTS
elements, 4 rows of 768), so no loop has a runtime bound (triton 3.6's interpreter fails those
under numpy 2.4), with every statistic in float32 and GELU exact (erf). The ½ of eq. 2 stays
folded into the softmax scale (ResGELUQuery.scale_mult).
rms_gelu reads h in place, a strided view of the fused projection's output p = x [W_K | W_V | diag(g) W1],
and its backward writes GELU' times rstd as h's gradient, so no kernel runs GELU's backward over the
K and V columns (bench/RESULTS.md's +21 ms was GELU's backward fused into autograd's cat, over all
2.5 C columns). SplitRMSGELU makes the split of p and rms_gelu one autograd node, K and V views of p:
its backward (split_rms_gelu_backward) allocates p's gradient once, the kernel writes h's gradient into
W1's columns of it, and K's and V's gradients (and W_Q's for anchored_res_gelu) are copied into theirs,
since the attention's backward (and the LayerNorm's, for W_Q's) allocates them itself: no cat.

Why a hook and not an import: model.py is a single file that imports nothing of this package, so
ResGELUQuery has a `kernels` attribute, None by default (plain PyTorch), which use_kernels sets to
res_gelu_f; a query module that never heard of it needs only its forward, as before.

Where each op runs: a CUDA tensor goes to the compiled Triton kernels; a CPU tensor goes to the
same kernels under Triton's interpreter when TRITON_INTERPRET=1 is in the environment (the tests:
tests/conftest.py sets it on a machine without CUDA, before anything imports triton, because
triton.jit reads it when a function is decorated, tl.sum and the other jit'd builtins at triton's
import included), and otherwise to the PyTorch reference (rms_gelu_reference,
layer_norm_residual_reference), which computes the same math in float32.
"""

import dataclasses
import functools
import itertools
import os

import torch
import triton
import triton.language as tl
from torch.nn import functional as F

# constexpr: compiled Triton (not its interpreter) refuses a jit function's read of a plain global
SQRT1_2 = tl.constexpr(0.7071067811865476)  # 1/sqrt(2): GELU(u) = u Phi(u), Phi(u) = (1 + erf(u / sqrt(2))) / 2
INV_SQRT_2PI = tl.constexpr(0.3989422804014327)  # 1/sqrt(2 pi): Phi'(u) = exp(-u^2 / 2) / sqrt(2 pi)
TILE_ELEMENTS = 4096  # elements of a program's tile: BLOCK_M rows of the padded width, 4 rows at C = 768
LN_TILES = 8  # tiles per program of layer_norm_residual's backward, whose partial sums of dw and db it writes


def _block_m(width):
    """Rows per program for rows of `width` elements padded to a power of two: TILE_ELEMENTS in all."""
    return max(1, TILE_ELEMENTS // triton.next_power_of_2(width))


@triton.jit
def _rms_gelu_fwd(H, RSTD, B1, A, stride_h, stride_a, N, R,
                  HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < N
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
    cols = tl.arange(0, BLOCK_R)
    mask = row_mask[:, None] & (cols < R)[None, :]
    u = tl.load(H + rows[:, None] * stride_h + cols[None, :], mask=mask, other=0.0).to(tl.float32) * rstd[:, None]
    if HAS_BIAS:
        u += tl.load(B1 + cols, mask=cols < R, other=0.0).to(tl.float32)[None, :]
    a = 0.5 * u * (1.0 + tl.math.erf(u * SQRT1_2))
    tl.store(A + rows[:, None] * stride_a + cols[None, :], a.to(A.dtype.element_ty), mask=mask)


@triton.jit
def _rms_gelu_bwd(H, RSTD, B1, DA, DH, DU, DRSTD, stride_h, stride_da, stride_dh, N, R,
                  HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < N
    rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
    cols = tl.arange(0, BLOCK_R)
    mask = row_mask[:, None] & (cols < R)[None, :]
    h = tl.load(H + rows[:, None] * stride_h + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    u = h * rstd[:, None]
    if HAS_BIAS:
        u += tl.load(B1 + cols, mask=cols < R, other=0.0).to(tl.float32)[None, :]
    # GELU'(u) = Phi(u) + u Phi'(u)
    du = tl.load(DA + rows[:, None] * stride_da + cols[None, :], mask=mask, other=0.0).to(tl.float32) * (
        0.5 * (1.0 + tl.math.erf(u * SQRT1_2)) + u * INV_SQRT_2PI * tl.exp(-0.5 * u * u))
    tl.store(DH + rows[:, None] * stride_dh + cols[None, :], (du * rstd[:, None]).to(DH.dtype.element_ty), mask=mask)
    if HAS_BIAS:
        tl.store(DU + rows[:, None] * R + cols[None, :], du, mask=mask)
    # u = h rstd + b1: rstd's gradient is sum_j du_j h_j, one number a row (x's follows by autograd)
    tl.store(DRSTD + rows, tl.sum(du * h, axis=1), mask=row_mask)


@triton.jit
def _layer_norm_residual_fwd(ANCHOR, Y, W, B, OUT, MEAN, RSTD, stride_anchor, stride_y, stride_out, N, C, eps,
                             HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < N
    cols = tl.arange(0, BLOCK_C)
    mask = row_mask[:, None] & (cols < C)[None, :]
    y = tl.load(Y + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(y, axis=1) / C
    d = tl.where(mask, y - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / C + eps)
    out = d * rstd[:, None] * tl.load(W + cols, mask=cols < C, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        out += tl.load(B + cols, mask=cols < C, other=0.0).to(tl.float32)[None, :]
    out += tl.load(ANCHOR + rows[:, None] * stride_anchor + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    tl.store(OUT + rows[:, None] * stride_out + cols[None, :], out.to(OUT.dtype.element_ty), mask=mask)
    tl.store(MEAN + rows, mean, mask=row_mask)
    tl.store(RSTD + rows, rstd, mask=row_mask)


@triton.jit
def _layer_norm_residual_bwd(DOUT, Y, W, MEAN, RSTD, DY, DW_PART, DB_PART, stride_dout, stride_y, stride_dy, N, C,
                             TILES: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    program = tl.program_id(0)
    cols = tl.arange(0, BLOCK_C)
    mask_c = cols < C
    w = tl.load(W + cols, mask=mask_c, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK_C], dtype=tl.float32)
    db = tl.zeros([BLOCK_C], dtype=tl.float32)
    for t in tl.static_range(TILES):
        rows = (program.to(tl.int64) * TILES + t) * BLOCK_M + tl.arange(0, BLOCK_M)
        row_mask = rows < N
        mask = row_mask[:, None] & mask_c[None, :]
        dout = tl.load(DOUT + rows[:, None] * stride_dout + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        y = tl.load(Y + rows[:, None] * stride_y + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + rows, mask=row_mask, other=0.0)
        rstd = tl.load(RSTD + rows, mask=row_mask, other=0.0)
        yhat = tl.where(mask, (y - mean[:, None]) * rstd[:, None], 0.0)
        g = dout * w[None, :]
        # LayerNorm's backward: dy = rstd (g - mean(g) - yhat mean(g yhat)), means over the C features
        dy = rstd[:, None] * (g - tl.sum(g, axis=1)[:, None] / C - yhat * (tl.sum(g * yhat, axis=1)[:, None] / C))
        tl.store(DY + rows[:, None] * stride_dy + cols[None, :], dy.to(DY.dtype.element_ty), mask=mask)
        dw += tl.sum(dout * yhat, axis=0)
        db += tl.sum(dout, axis=0)
    tl.store(DW_PART + program.to(tl.int64) * C + cols, dw, mask=mask_c)  # 64 bits, as every offset of a row
    tl.store(DB_PART + program.to(tl.int64) * C + cols, db, mask=mask_c)


def use_triton(t):
    """Whether the ops run Triton kernels on t's device: CUDA, or the CPU under TRITON_INTERPRET=1 (read
    at each call, so a test can ask for the PyTorch path by removing it)."""
    return t.device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def _rows(t):
    """t as (rows, last dimension) with unit stride along the last (a view where the strides allow)."""
    t = t.reshape(-1, t.size(-1))
    return t if t.stride(-1) == 1 else t.contiguous()


def rms_statistic(x, eps):
    """1 / rms(x) = rsqrt(mean(x^2) + eps) over x's last dimension (C), float32 (...): the RMSNorm statistic of
    paper eq. 3 (torch.nn.RMSNorm's), in plain PyTorch, so that torch.compile computes it in the kernel that
    produces x (the block's ln_1), and its backward, x's gradient through rms(x), where x's gradient is made;
    rms_gelu then reads one number a row instead of x."""
    return torch.rsqrt(x.float().pow(2).mean(-1) + eps)


def rms_gelu_reference(h, rstd, b1):
    """The PyTorch path of rms_gelu on rows, h (N, r) and rstd (N,): a, computed in float32."""
    u = h.float() * rstd[:, None]
    if b1 is not None:
        u = u + b1.float()
    return F.gelu(u).to(h.dtype)


@torch.library.custom_op("nlq::rms_gelu", mutates_args=())
def rms_gelu(h: torch.Tensor, rstd: torch.Tensor, b1: torch.Tensor | None) -> torch.Tensor:
    """GELU(h rstd + b1) = GELU(h / rms(x) + b1), res_gelu's f up to W2 on the fused projection (paper eq. 3;
    model.py's ResGELUQuery.f_from_fused), GELU exact (erf).

    h: (..., r), x diag(g) W1 (a strided view of the fused projection's output is read in place, its last
    dimension contiguous); rstd: (...), 1 / rms(x) in float32 (rms_statistic); b1: (r,) or None. Returns a
    (..., r) in h's dtype. Raises RuntimeError (torch's) for tensors on different devices."""
    return _rms_gelu_rows(_rows(h), rstd.reshape(-1), b1).view(h.shape)


def _rms_gelu_rows(h, rstd, b1):
    """rms_gelu on h (N, r) and rstd (N,)."""
    if not use_triton(h):
        return rms_gelu_reference(h, rstd, b1)
    N, R = h.shape
    a = torch.empty(N, R, dtype=h.dtype, device=h.device)
    block_m = _block_m(R)
    _rms_gelu_fwd[(triton.cdiv(N, block_m),)](
        h, rstd, h if b1 is None else b1, a, h.stride(0), a.stride(0), N, R, HAS_BIAS=b1 is not None,
        BLOCK_M=block_m, BLOCK_R=triton.next_power_of_2(R))
    return a


@rms_gelu.register_fake
def _(h, rstd, b1):
    return h.new_empty(h.shape)


def rms_gelu_backward_reference(h, rstd, b1, da):
    """The PyTorch path of rms_gelu_backward, in float32."""
    u = h.float() * rstd[:, None]
    if b1 is not None:
        u = u + b1.float()
    du = da.float() * (0.5 * (1 + torch.erf(u * SQRT1_2.value)) + u * INV_SQRT_2PI.value * torch.exp(-0.5 * u * u))
    drstd = (du * h.float()).sum(-1)
    return (du * rstd[:, None]).to(h.dtype), du if b1 is not None else du.new_empty(0, du.size(1)), drstd


@torch.library.custom_op("nlq::rms_gelu_backward", mutates_args=())
def rms_gelu_backward(h: torch.Tensor, rstd: torch.Tensor, b1: torch.Tensor | None,
                      da: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rms_gelu's backward (h, rstd and da with any leading dimensions, read as N rows): da (N, r), the gradient
    of a, to (dh, du, drstd): dh (N, r) = GELU'(u) da rstd in h's dtype, du (N, r) = GELU'(u) da in float32, whose
    column sums are b1's gradient ((0, r) without b1), and drstd (N,) = sum_j du_j h_j in float32, rstd's
    gradient: x's through rms(x) is autograd's of rms_statistic, one number a row here where a full (N, C) dx
    would be written and read again."""
    h, da = _rows(h), _rows(da)
    dh = torch.empty(h.shape, dtype=h.dtype, device=h.device)
    du, drstd = _rms_gelu_backward_into(h, rstd.reshape(-1), b1, da, dh)
    return dh, du, drstd


def _rms_gelu_backward_into(h, rstd, b1, da, dh):
    """rms_gelu's backward on rows, h and da (N, r), rstd (N,), that writes dh = GELU'(u) da rstd into `dh`
    (N, r), which may be a slice of a wider buffer's columns (unit stride along them), and returns (du, drstd)
    as rms_gelu_backward does."""
    if not use_triton(h):
        dh_reference, du, drstd = rms_gelu_backward_reference(h, rstd, b1, da)
        dh.copy_(dh_reference)
        return du, drstd
    N, R = h.shape
    du = torch.empty(N if b1 is not None else 0, R, dtype=torch.float32, device=h.device)
    drstd = torch.empty(N, dtype=torch.float32, device=h.device)
    block_m = _block_m(R)
    _rms_gelu_bwd[(triton.cdiv(N, block_m),)](
        h, rstd, h if b1 is None else b1, da, dh, du, drstd, h.stride(0), da.stride(0), dh.stride(0), N, R,
        HAS_BIAS=b1 is not None, BLOCK_M=block_m, BLOCK_R=triton.next_power_of_2(R))
    return du, drstd


@rms_gelu_backward.register_fake
def _(h, rstd, b1, da):
    N, R = rstd.numel(), h.size(-1)
    du = da.new_empty(N if b1 is not None else 0, R, dtype=torch.float32)
    return h.new_empty(N, R), du, rstd.new_empty(N, dtype=torch.float32)


def _rms_gelu_setup(ctx, inputs, output):
    h, rstd, b1 = inputs
    ctx.save_for_backward(h, rstd, b1)


def _rms_gelu_grad(ctx, da):
    h, rstd, b1 = ctx.saved_tensors
    dh, du, drstd = rms_gelu_backward(h, rstd, b1, da)
    db1 = du.sum(0).to(b1.dtype) if b1 is not None else None
    return dh.view(h.shape), drstd.view(rstd.shape).to(rstd.dtype), db1


rms_gelu.register_autograd(_rms_gelu_grad, setup_context=_rms_gelu_setup)


@torch.library.custom_op("nlq::split_rms_gelu_backward", mutates_args=())
def split_rms_gelu_backward(pieces: list[torch.Tensor], h: torch.Tensor, rstd: torch.Tensor, b1: torch.Tensor | None,
                            da: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """SplitRMSGELU's backward: the gradient of the whole fused projection p (..., W + r) in one buffer,
    W = the pieces' widths summed, with rms_gelu's backward writing h's gradient into its last r columns.

    pieces: the gradients of SplitRMSGELU's pieces, (..., w_i) each, in order; h (..., r), rstd (...) and da
    (..., r) as rms_gelu_backward takes them. Returns (dp, du, drstd): dp (..., W + r) in h's dtype,
    [pieces | GELU'(u) da rstd]; du (N, r) and drstd (N,) as rms_gelu_backward returns them."""
    widths = [piece.size(-1) for piece in pieces]
    dp = torch.empty(*h.shape[:-1], sum(widths) + h.size(-1), dtype=h.dtype, device=h.device)
    # the pieces' gradients come from elsewhere (K's and V's from the attention's backward, which allocates
    # its own), so each is copied into its columns; only h's is computed where it belongs
    for piece, start, width in zip(pieces, itertools.accumulate([0, *widths]), widths):
        dp[..., start:start + width].copy_(piece)
    dh = dp.view(-1, dp.size(-1))[:, sum(widths):]
    du, drstd = _rms_gelu_backward_into(_rows(h), rstd.reshape(-1), b1, _rows(da), dh)
    return dp, du, drstd


@split_rms_gelu_backward.register_fake
def _(pieces, h, rstd, b1, da):
    N, R = rstd.numel(), h.size(-1)
    dp = h.new_empty(*h.shape[:-1], sum(piece.size(-1) for piece in pieces) + R)
    return dp, da.new_empty(N if b1 is not None else 0, R, dtype=torch.float32), rstd.new_empty(N)


class SplitRMSGELU(torch.autograd.Function):
    """The fused projection p = x [W_1 | ... | diag(g) W1] split into its pieces and rms_gelu of its last
    columns, as one autograd node, so that the backward writes p's gradient into one buffer
    (split_rms_gelu_backward) where autograd's split would cat the pieces' gradients with h's.

    apply(p, rstd, b1, widths): p (..., W + r), W = sum(widths); rstd (...), 1 / rms(x) of p's input x
    (rms_statistic); b1 (r,) or None; widths: the pieces' widths (ints), K's and V's (and W_Q's for
    anchored_res_gelu). Returns (*pieces, a): the pieces p[..., :w_0], p[..., w_0:w_0 + w_1], ... as views of p
    (no copy), and a = GELU(h rstd + b1) (..., r) of h = p[..., W:] (rms_gelu; paper eq. 3). Raises RuntimeError
    (torch's) where sum(widths) > p.size(-1)."""

    @staticmethod
    def forward(ctx, p, rstd, b1, widths):
        lead = sum(widths)
        h = p[..., lead:]
        a = torch.ops.nlq.rms_gelu(h, rstd, b1)
        ctx.save_for_backward(h, rstd, b1)
        return (*(p[..., start:start + width] for start, width in zip(itertools.accumulate([0, *widths]), widths)),
                a)

    @staticmethod
    def backward(ctx, *grads):
        h, rstd, b1 = ctx.saved_tensors
        dp, du, drstd = torch.ops.nlq.split_rms_gelu_backward(list(grads[:-1]), h, rstd, b1, grads[-1])
        return dp, drstd.view(rstd.shape), None if b1 is None else du.sum(0).to(b1.dtype), None


def layer_norm_residual_reference(anchor, y, weight, bias, eps, out_dtype=None):
    """The PyTorch path of layer_norm_residual: (out, mean, rstd) as it returns them, in float32."""
    y32 = y.float()
    mean = y32.mean(-1)
    rstd = torch.rsqrt((y32 - mean[:, None]).pow(2).mean(-1) + eps)
    out = anchor.float() + F.layer_norm(y32, y.shape[-1:], weight.float(), None if bias is None else bias.float(), eps)
    return out.to(out_dtype or torch.promote_types(anchor.dtype, weight.dtype)), mean, rstd


@torch.library.custom_op("nlq::layer_norm_residual", mutates_args=())
def layer_norm_residual(anchor: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        eps: float, out_dtype: torch.dtype | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """anchor + LayerNorm(y) (Ba et al. 2016) with weight and bias: the close of res_gelu's query,
    anchor + f(x) (paper eq. 2-3, f's LN over W2's output y; anchor x, or x W_Q for anchored_res_gelu).

    anchor, y: (N, C); weight, bias: (C,) (bias may be None). Returns (out, mean, rstd): out (N, C) in
    out_dtype, by default the promotion of anchor's and weight's dtypes (float32 under autocast, whose
    weights are float32, as torch's LayerNorm gives there; res_gelu_f asks for autocast's bfloat16 where the
    attention would cast q to it anyway, the sum rounded once either way), y's mean and 1 / sqrt(var + eps)
    per row (N,) in float32 for the backward. Statistics and the sum in float32 whatever the dtypes."""
    anchor, y = _rows(anchor), _rows(y)
    if not use_triton(y):
        return layer_norm_residual_reference(anchor, y, weight, bias, eps, out_dtype)
    N, C = y.shape
    out = torch.empty(N, C, dtype=out_dtype or torch.promote_types(anchor.dtype, weight.dtype), device=y.device)
    mean, rstd = (torch.empty(N, dtype=torch.float32, device=y.device) for _ in range(2))
    block_m = _block_m(C)
    _layer_norm_residual_fwd[(triton.cdiv(N, block_m),)](
        anchor, y, weight, weight if bias is None else bias, out, mean, rstd, anchor.stride(0), y.stride(0),
        out.stride(0), N, C, eps, HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_C=triton.next_power_of_2(C))
    return out, mean, rstd


@layer_norm_residual.register_fake
def _(anchor, y, weight, bias, eps, out_dtype=None):
    N = y.numel() // y.size(-1)
    return (y.new_empty(N, y.size(-1), dtype=out_dtype or torch.promote_types(anchor.dtype, weight.dtype)),
            y.new_empty(N, dtype=torch.float32), y.new_empty(N, dtype=torch.float32))


def layer_norm_residual_backward_reference(dout, y, weight, mean, rstd):
    """The PyTorch path of layer_norm_residual_backward, in float32."""
    yhat = (y.float() - mean[:, None]) * rstd[:, None]
    g = dout.float() * weight.float()
    dy = rstd[:, None] * (g - g.mean(-1, keepdim=True) - yhat * (g * yhat).mean(-1, keepdim=True))
    return dy.to(y.dtype), (dout.float() * yhat).sum(0), dout.float().sum(0)


@torch.library.custom_op("nlq::layer_norm_residual_backward", mutates_args=())
def layer_norm_residual_backward(dout: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, mean: torch.Tensor,
                                 rstd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """layer_norm_residual's backward but the anchor's gradient (dout itself): dout (N, C) to dy (N, C)
    in y's dtype, and the float32 gradients of the weight and the bias, (C,) each: the kernel writes the
    partial sums of each program's LN_TILES tiles of rows, summed here."""
    dout, y = _rows(dout), _rows(y)
    if not use_triton(y):
        return layer_norm_residual_backward_reference(dout, y, weight, mean, rstd)
    N, C = y.shape
    block_m = _block_m(C)
    blocks = triton.cdiv(N, LN_TILES * block_m)
    dy = torch.empty_like(y)
    dw_part, db_part = (torch.empty(blocks, C, dtype=torch.float32, device=y.device) for _ in range(2))
    _layer_norm_residual_bwd[(blocks,)](
        dout, y, weight, mean, rstd, dy, dw_part, db_part, dout.stride(0), y.stride(0), dy.stride(0), N, C,
        TILES=LN_TILES, BLOCK_M=block_m, BLOCK_C=triton.next_power_of_2(C))
    return dy, dw_part.sum(0), db_part.sum(0)


@layer_norm_residual_backward.register_fake
def _(dout, y, weight, mean, rstd):
    C = y.size(-1)
    return y.new_empty(y.numel() // C, C), y.new_empty(C, dtype=torch.float32), y.new_empty(C, dtype=torch.float32)


def _layer_norm_residual_setup(ctx, inputs, output):
    anchor, y, weight, bias, _, _ = inputs
    ctx.save_for_backward(y, weight, output[1], output[2])
    ctx.has_bias, ctx.anchor_shape, ctx.anchor_dtype = bias is not None, anchor.shape, anchor.dtype


def _layer_norm_residual_grad(ctx, dout, _mean, _rstd):
    y, weight, mean, rstd = ctx.saved_tensors
    dy, dw, db = layer_norm_residual_backward(dout, y, weight, mean, rstd)
    return (dout.to(ctx.anchor_dtype).view(ctx.anchor_shape), dy.view(y.shape), dw.to(weight.dtype),
            db.to(weight.dtype) if ctx.has_bias else None, None, None)


layer_norm_residual.register_autograd(_layer_norm_residual_grad, setup_context=_layer_norm_residual_setup)


@triton.jit
def _cross_entropy_fwd(LOGITS, TARGETS, SCALE, LOSS, stride_logits, ignore_index, V: tl.constexpr,
                       BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = LOGITS + row * stride_logits
    # the log-sum-exp in one pass over the row, its running maximum rescaling the running sum (online softmax)
    m = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], dtype=tl.float32)
    for start in range(0, V, BLOCK_V):  # V is a constexpr: a loop of fixed trip count
        cols = start + tl.arange(0, BLOCK_V)
        z = tl.load(base + cols, mask=cols < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(z, axis=0))
        total = total * tl.exp(m - m_new) + tl.sum(tl.exp(z - m_new), axis=0)
        m = m_new
    lse = m + tl.log(total)
    target = tl.load(TARGETS + row)
    valid = target != ignore_index
    z_target = tl.load(base + tl.where(valid, target, 0)).to(tl.float32)  # read before the row is overwritten
    tl.store(LOSS + row, tl.where(valid, lse - z_target, 0.0))
    # the mean's gradient over the row's own logits, a second pass over the row (just read, so from the cache):
    # (softmax - onehot) / (valid rows), the count read on the device; 0 on an ignored row
    scale = tl.where(valid, tl.load(SCALE), 0.0)
    for start in range(0, V, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        mask = cols < V
        z = tl.load(base + cols, mask=mask, other=0.0).to(tl.float32)
        grad = (tl.exp(z - lse) - tl.where(cols == target, 1.0, 0.0)) * scale
        tl.store(base + cols, grad.to(LOGITS.dtype.element_ty), mask=mask)


CE_BLOCK_V = 4096  # logits per chunk of a row: 13 chunks of GPT-2's 50,304


def cross_entropy_rows_reference(logits, targets, scale, ignore_index):
    """The PyTorch path of cross_entropy_rows, in float32: (the rows' losses, the gradient it writes)."""
    z = logits.float()
    lse = torch.logsumexp(z, dim=-1)
    valid = targets != ignore_index
    target = torch.where(valid, targets, 0)
    loss = torch.where(valid, lse - z.gather(1, target[:, None])[:, 0], 0.0)
    grad = torch.exp(z - lse[:, None])
    grad[torch.arange(len(targets), device=logits.device), target] -= 1
    return loss, torch.where(valid[:, None], grad * scale, 0.0)


@torch.library.custom_op("nlq::cross_entropy_rows", mutates_args=("logits",))
def cross_entropy_rows(logits: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor,
                       ignore_index: int) -> torch.Tensor:
    """Each row's cross-entropy -log softmax(logits)[target] in nats, (N,) in float32 whatever the logits' dtype
    (0 for a row whose target is ignore_index), and the logits overwritten with (softmax(logits) -
    onehot(target)) * scale, 0 on an ignored row: with scale = 1 / (valid rows), the gradient of the rows' mean
    loss, in the logits' own storage (Liger-Kernel's cross-entropy, Hsu et al. 2024, does the same), so that no
    buffer of their size is allocated in either direction. logits: (N, V), unit stride along V; targets: (N,)
    int64; scale: a float32 scalar tensor, read on the device. One kernel: one pass over each row (online
    log-sum-exp, Milakov & Gimelshein 2018), a read of its target's logit, and a second pass that writes the
    gradient. ValueError for logits that are not (N, V) with unit stride along V, which could not be written
    in place."""
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(f"cross_entropy_rows writes the gradient in place of the logits, so they must be (N, V) "
                         f"with unit stride along V; got shape {tuple(logits.shape)}, strides {logits.stride()}: "
                         f"pass logits.view(-1, V) of contiguous logits")
    if not use_triton(logits):
        loss, grad = cross_entropy_rows_reference(logits, targets, scale, ignore_index)
        logits.copy_(grad)
        return loss
    N, V = logits.shape
    loss = torch.empty(N, dtype=torch.float32, device=logits.device)
    _cross_entropy_fwd[(N,)](logits, targets, scale, loss, logits.stride(0), ignore_index, V=V,
                             BLOCK_V=min(CE_BLOCK_V, triton.next_power_of_2(V)))
    return loss


@cross_entropy_rows.register_fake
def _(logits, targets, scale, ignore_index):
    return logits.new_empty(logits.size(0), dtype=torch.float32)


class CrossEntropy(torch.autograd.Function):
    """The mean cross-entropy over the rows whose target is not ignore_index, its gradient written by the
    forward into the logits (cross_entropy_rows) and scaled in place by the loss's own gradient in the backward
    (1 / micro-steps in training: one 0-dim tensor, read on the device), so that nothing of the logits' size is
    allocated: eager, the backward's mul_ writes into the saved gradient; compiled, the forward's op mutates
    the LM head's output, which inductor then writes in place (no copy), and the backward's multiply reuses the
    saved gradient's buffer (AOTAutograd donates it). The logits are the gradient after the forward, and a
    second backward (retain_graph) would scale it twice: the training loss only (model.py's GPT.forward asks
    for it with return_logits=False, when nothing else reads the logits)."""

    @staticmethod
    def forward(ctx, logits, targets, ignore_index):
        count = (targets != ignore_index).sum()
        loss = torch.ops.nlq.cross_entropy_rows(logits, targets, 1.0 / count.float(), ignore_index)
        ctx.save_for_backward(logits)
        return loss.sum() / count

    @staticmethod
    def backward(ctx, dloss):
        (grad,) = ctx.saved_tensors
        return grad.mul_(dloss), None, None


def cross_entropy(logits, targets, ignore_index=-100):
    """The mean cross-entropy in nats over the rows whose target is not ignore_index, in float32, as
    F.cross_entropy(logits, targets) computes it, through CrossEntropy: the logits are overwritten with their
    gradient (nothing may read them after this call), which the backward hands on, scaled in place. logits:
    (N, V), unit stride along V (model.py's logits.view(-1, V)); targets: (N,) int64. No host read: the count of
    rows is a device tensor. ValueError for logits that are not (N, V) with unit stride along V."""
    return CrossEntropy.apply(logits, targets, ignore_index)


def res_gelu_f(query, x, p, widths, one_buffer=True, autocast_out=False):
    """(anchor + f(x), pieces) for a ResGELUQuery `query` (gelu, with its norms) through the ops: what
    model.py's ResGELUQuery.from_projection computes in plain PyTorch. x: (..., C); p: (..., W + n), x's
    fused projection, W = sum(widths), its last n columns x @ query.fused_weight().T (W_Q's C and then W1's
    r for anchored_res_gelu, W1's r for res_gelu); widths: the leading pieces' widths (K's and V's, or none).
    Returns q (..., C) and the pieces, views of p. one_buffer=False splits p with torch instead of
    SplitRMSGELU, so that the backward cats the pieces' gradients with h's (bench/train_speed.py's row).
    rms(x) comes from rms_statistic, beside x's producer under torch.compile. autocast_out=True: q in
    autocast's dtype while autocast is on (bfloat16: half the bytes written, and read back by the backward),
    for a model whose attention takes q as it comes, which casts it to that dtype itself (use_kernels)."""
    r = query.w1.out_features
    own = p.size(-1) - sum(widths) - r  # W_Q's columns before W1's: anchored_res_gelu's anchor
    widths = [*widths, own] if own else list(widths)
    rstd = rms_statistic(x, query.rms.eps)
    if one_buffer:
        *pieces, a = SplitRMSGELU.apply(p, rstd, query.w1.bias, tuple(widths))
    else:
        *pieces, h = p.split([*widths, r], dim=-1)
        a = torch.ops.nlq.rms_gelu(h, rstd, query.w1.bias)
    anchor = x
    if own:
        anchor = pieces.pop()
        if query.w_q.bias is not None:
            anchor = anchor + query.w_q.bias
    y = F.linear(a, query.w2.weight, query.w2.bias)
    device = x.device.type
    out_dtype = torch.get_autocast_dtype(device) if autocast_out and torch.is_autocast_enabled(device) else None
    out, _, _ = torch.ops.nlq.layer_norm_residual(anchor, y, query.ln.weight, query.ln.bias, query.ln.eps, out_dtype)
    return out.view(anchor.shape[:-1] + out.shape[-1:]), pieces


def use_kernels(model, one_buffer=True):
    """Put the ops into `model` (a GPT): its training loss through cross_entropy (GPT.cross_entropy), and
    f through res_gelu_f in every query module the ops cover; one_buffer=False: res_gelu_f's (autograd's
    split and its cat). q comes out in autocast's dtype (res_gelu_f's autocast_out) where the attention takes
    it as it comes: no QK-norm and no RoPE, whose float32 math on q would otherwise see it rounded. Returns
    the number of query modules changed.
    What the ops cover, and the one way the rest falls back: the classes ResGELUQuery and AnchoredResGELUQuery
    themselves (res_gelu, anchored_res_gelu), with every option their module declares (QueryModule.options:
    query_activation, query_norm) at GPTConfig's default, GELU and f's norms; any other query module (a
    subclass of those two included, whose f may differ) or option value keeps its own PyTorch forward, with
    no warning, and is left out of the count."""
    from model import QUERY_OPTIONS, AnchoredResGELUQuery, GPTConfig, ResGELUQuery

    model.cross_entropy = cross_entropy
    autocast_out = not model.config.qk_norm and model.config.pos_encoding == "learned"
    f = functools.partial(res_gelu_f, one_buffer=one_buffer, autocast_out=autocast_out)
    defaults = {field.name: field.default for field in dataclasses.fields(GPTConfig) if field.name in QUERY_OPTIONS}
    changed = 0
    for module in model.modules():
        if type(module) in (ResGELUQuery, AnchoredResGELUQuery) and all(
                getattr(model.config, option) == defaults[option] for option in module.options):
            module.kernels = f
            changed += 1
    return changed
