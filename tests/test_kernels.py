"""res_gelu's f as Triton kernels (nonlinear_queries/ops/kernels.py), held on the CPU against float64
transcriptions of the same math: each op's outputs and every input gradient, through the Triton
kernels under Triton's interpreter and through the PyTorch path; then the model with the kernels
against the model without.

The interpreter runs where TRITON_INTERPRET=1 was in the environment when triton was imported
(tests/conftest.py sets it on a machine without CUDA); the ops read it at each call, so a test asks
for their PyTorch path by removing it. On a GPU machine tests/test_cuda.py runs the kernels. Under
the interpreter a float32 -> bfloat16 store truncates instead of rounding to nearest, so bfloat16
results are compared with a tolerance of 2 ulps (2^-6 relative); at inputs of RMS 1e-2 and 1e2, where
1/rms(x) and the LayerNorm's 1/std are far from 1, each element is held to 2 ulps of its own float64
reference value (assert_within_ulps).
"""

import collections
import json
import os
import re
import subprocess
import sys

import pytest
import torch
import triton
from torch._inductor.utils import run_and_get_code
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import REPO, losses_by_step, train_in_process, val_losses_by_step
from model import GPT, QUERY_MODULES, GPTConfig, ResGELUQuery
from nonlinear_queries.ops import kernels

EPS = 1e-5
# widths that are not powers of two and a row count that is not a multiple of a program's rows, so every tile's
# masked tail is exercised: at C = 40 a program takes 64 rows, at C = 600 4 rows, and layer_norm_residual's
# backward sums the partials of 3 programs of 32 rows
N = 70
SHAPES = [(40, 21), (600, 300)]
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2 ** -6, atol=2e-2)}


@pytest.fixture(params=["triton", "pytorch"])
def path(request, monkeypatch):
    """Each op through its Triton kernels (under the interpreter) or through its PyTorch path."""
    if request.param == "triton":
        if not triton.knobs.runtime.interpret and torch.cuda.is_available():
            pytest.skip("with CUDA the Triton kernels run natively on the GPU: tests/test_cuda.py holds them there")
        assert triton.knobs.runtime.interpret, ("Triton's interpreter is off: TRITON_INTERPRET=1 must be set before "
                                                "triton is imported (tests/conftest.py sets it where there is no CUDA)")
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return request.param


def rounded(*shape, dtype, scale=1.0):
    """A random tensor in `dtype` that requires grad, and its float64 copy (the same values) that does."""
    t = (torch.randn(*shape, dtype=torch.float64) * scale).to(dtype)
    return t.requires_grad_(), t.detach().double().requires_grad_()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("C, R", SHAPES)
def test_rms_gelu_matches_float64_eq3_outputs_and_gradients(path, dtype, bias, C, R):
    torch.manual_seed(0)
    x, x64 = rounded(N, C, dtype=dtype)
    # h read in place as the W1 columns of a fused projection's output, (N, 2 C + R), as model.py's fused path has it
    p, p64 = rounded(N, 2 * C + R, dtype=dtype, scale=3.0)
    h, h64 = p[:, 2 * C:], p64[:, 2 * C:]
    b1, b164 = rounded(R, dtype=dtype) if bias else (None, None)
    rstd = kernels.rms_statistic(x, EPS)  # in PyTorch, where x is made; the op reads one number a row
    a = torch.ops.nlq.rms_gelu(h, rstd, b1)
    # eq. 3's GELU(RMSNorm(x) W1) with the gain folded into W1: h / rms(x), in float64
    rstd64 = torch.rsqrt(x64.pow(2).mean(-1) + EPS)
    u64 = h64 * rstd64[:, None] + (b164 if bias else 0)
    a64 = 0.5 * u64 * (1 + torch.erf(u64 / 2 ** 0.5))
    assert a.dtype == dtype and rstd.dtype == torch.float32
    torch.testing.assert_close(a.double(), a64, **TOL[dtype])
    torch.testing.assert_close(rstd.double(), rstd64, rtol=1e-6, atol=0)
    da = torch.randn(N, R, dtype=torch.float64).to(dtype)
    # the op's backward gives rstd's gradient, one float32 a row, where a full dx (N, C) would be written
    dh, du, drstd = torch.ops.nlq.rms_gelu_backward(h.detach(), rstd.detach(), b1, da)
    assert drstd.shape == (N,) and drstd.dtype == torch.float32 and dh.dtype == dtype
    a.backward(da)
    a64.backward(da.double())
    # x's gradient through rms(x): autograd's of rms_statistic from that one number a row
    for got, want in [(x.grad, x64.grad), (p.grad, p64.grad)] + ([(b1.grad, b164.grad)] if bias else []):
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want, **TOL[dtype])
    assert not p.grad[:, :2 * C].any()  # the K and V columns get nothing from f


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("C, R", SHAPES)
@pytest.mark.parametrize("widths", [(2, 2), (1, 1, 2)], ids=["kv", "kv_wq"])
def test_split_rms_gelu_matches_float64_and_gives_the_projection_one_gradient(path, dtype, bias, C, R, widths):
    # the fused projection p (B, T, W + R) of res_gelu (K's and V's columns) or anchored_res_gelu (also W_Q's), the
    # widths in units of C/2; 7 x 10 tokens, rows that no program's tile divides
    torch.manual_seed(7)
    widths = tuple(w * C // 2 for w in widths)
    x, x64 = rounded(7, 10, C, dtype=dtype)
    p, p64 = rounded(7, 10, sum(widths) + R, dtype=dtype, scale=3.0)
    b1, b164 = rounded(R, dtype=dtype) if bias else (None, None)
    *pieces, a = kernels.SplitRMSGELU.apply(p, kernels.rms_statistic(x, EPS), b1, widths)
    *pieces64, h64 = p64.split([*widths, R], dim=-1)
    # eq. 3's GELU(RMSNorm(x) W1) with the gain folded into W1: h / rms(x), in float64
    u64 = h64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) + (b164 if bias else 0)
    a64 = 0.5 * u64 * (1 + torch.erf(u64 / 2 ** 0.5))
    for piece, piece64 in zip(pieces, pieces64):  # views of p: its own values, no copy
        assert piece.untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
        assert torch.equal(piece.double(), piece64)
    assert a.dtype == dtype
    torch.testing.assert_close(a.double(), a64, **TOL[dtype])
    grads = [torch.randn(t.shape, dtype=torch.float64).to(dtype) for t in (*pieces, a)]
    torch.autograd.backward([*pieces, a], grads)
    torch.autograd.backward([*pieces64, a64], [g.double() for g in grads])
    assert torch.equal(p.grad[..., :sum(widths)].double(), p64.grad[..., :sum(widths)])  # the pieces' own, copied
    for got, want in [(x.grad, x64.grad), (p.grad, p64.grad)] + ([(b1.grad, b164.grad)] if bias else []):
        assert got.dtype == dtype
        torch.testing.assert_close(got.double(), want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("C", [c for c, _ in SHAPES])
def test_layer_norm_residual_matches_float64_outputs_and_gradients(path, dtype, bias, C):
    torch.manual_seed(1)
    anchor, anchor64 = rounded(N, C, dtype=dtype)
    y, y64 = rounded(N, C, dtype=dtype, scale=4.0)
    w, w64 = rounded(C, dtype=dtype)
    b, b64 = rounded(C, dtype=dtype) if bias else (None, None)
    out, mean, rstd = torch.ops.nlq.layer_norm_residual(anchor, y, w, b, EPS)
    # anchor + LN(y) w + b, eq. 2-3's x + f(x) with f's closing LayerNorm, written out in float64
    mean64 = y64.mean(-1, keepdim=True)
    rstd64 = torch.rsqrt((y64 - mean64).pow(2).mean(-1, keepdim=True) + EPS)
    out64 = anchor64 + (y64 - mean64) * rstd64 * w64 + (b64 if bias else 0)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), out64, **TOL[dtype])
    torch.testing.assert_close(mean.double(), mean64[:, 0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(rstd.double(), rstd64[:, 0], rtol=1e-5, atol=0)
    dout = torch.randn(N, C, dtype=torch.float64).to(dtype)
    out.backward(dout)
    out64.backward(dout.double())
    pairs = [(anchor.grad, anchor64.grad), (y.grad, y64.grad), (w.grad, w64.grad)]
    for got, want in pairs + ([(b.grad, b64.grad)] if bias else []):
        assert got.dtype == dtype
        # dw and db sum 70 rows of products: bfloat16's rounding of the inputs enters each term once
        torch.testing.assert_close(got.double(), want, **TOL[dtype])


def test_layer_norm_residual_gives_q_in_autocasts_dtype(path):
    # bf16 autocast's tensors: the anchor x float32 (ln_1's output), y bfloat16 (W2's), the LN weight float32; q in
    # bfloat16 is the float32 sum rounded once (as the attention's cast of a float32 q rounds it), and its gradient
    # arrives in bfloat16: the anchor's is that gradient in float32, y's in bfloat16
    torch.manual_seed(5)
    anchor, anchor64 = rounded(N, 600, dtype=torch.float32)
    y, y64 = rounded(N, 600, dtype=torch.bfloat16, scale=4.0)
    w, w64 = rounded(600, dtype=torch.float32)
    out, _, _ = torch.ops.nlq.layer_norm_residual(anchor, y, w, None, EPS, torch.bfloat16)
    mean64 = y64.mean(-1, keepdim=True)
    out64 = anchor64 + (y64 - mean64) * torch.rsqrt((y64 - mean64).pow(2).mean(-1, keepdim=True) + EPS) * w64
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), out64, **TOL[torch.bfloat16])
    dout = torch.randn(N, 600, dtype=torch.float64).to(torch.bfloat16)
    out.backward(dout)
    out64.backward(dout.double())
    assert (anchor.grad.dtype, y.grad.dtype, w.grad.dtype) == (torch.float32, torch.bfloat16, torch.float32)
    assert torch.equal(anchor.grad, dout.float())
    for got, want in [(y.grad, y64.grad), (w.grad, w64.grad)]:
        torch.testing.assert_close(got.double(), want, **TOL[torch.bfloat16])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("V", [64, 5000])
def test_cross_entropy_matches_float64_loss_and_gradient(path, dtype, V):
    # V = 5000: two chunks of 4096 logits, the second masked; rows 3 and 40 ignored (ignore_index, as padding)
    torch.manual_seed(6)
    leaf, leaf64 = rounded(N, V, dtype=dtype, scale=3.0)
    targets = torch.randint(0, V, (N,))
    targets[[3, 40]] = -100
    logits = leaf * 1  # a non-leaf, as the LM head's output is: the forward overwrites it with its gradient
    loss = kernels.cross_entropy(logits, targets)
    kept = targets != -100
    loss64 = (torch.logsumexp(leaf64, -1) - leaf64.gather(1, targets.clamp(min=0)[:, None])[:, 0])[kept].mean()
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), loss64, rtol=1e-6, atol=1e-6)
    (loss / 4).backward()  # 4 micro-steps: the scale reaches the gradient in the backward
    (loss64 / 4).backward()
    assert leaf.grad.dtype == dtype and not leaf.grad[[3, 40]].any()
    torch.testing.assert_close(leaf.grad.double(), leaf64.grad, rtol=TOL[dtype]["rtol"], atol=1e-7)
    assert torch.equal(logits.detach(), leaf.grad)  # the gradient handed on was the logits' own storage


class Allocations(TorchDispatchMode):
    """The tensors that the aten ops (and custom ops) run under it return in storage they did not get as an
    input: what they allocate."""

    def __init__(self):
        super().__init__()
        self.new = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in torch.utils._pytree.tree_leaves((args, kwargs))
                 if isinstance(t, torch.Tensor)}
        self.new += [(func.name(), tuple(t.shape)) for t in torch.utils._pytree.tree_leaves(out)
                     if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given]
        return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_backward_allocates_nothing_of_the_logits_size(path, dtype):
    # the op that allocated the logits' gradient in the backward kept the saved logits alive beside it: 9.4 GiB more
    # at the backward's peak at 96 x 1024 x 50,304 bf16 (issue 85); the gradient now comes out of the logits'
    # storage, written by the forward and scaled in place by the backward, as the LM head's matmul makes them
    torch.manual_seed(11)
    rows, C, V = 48, 16, 1000
    (x, x64), (w, w64) = rounded(rows, C, dtype=dtype), rounded(C, V, dtype=dtype)
    targets = torch.randint(0, V, (rows,))
    targets[5] = -100
    logits = x @ w
    loss = kernels.cross_entropy(logits, targets)
    with Allocations() as allocations:
        (loss / 4).backward()
    # the LM head's gradients, (rows, C) and (C, V); nothing (rows, V)
    assert allocations.new and all(shape != (rows, V) for _, shape in allocations.new), allocations.new
    loss64 = F.cross_entropy(x64 @ w64, targets)
    (loss64 / 4).backward()
    tol = TOL[dtype] if dtype == torch.float32 else dict(rtol=2 ** -6, atol=2 ** -6 * w64.grad.abs().max().item())
    torch.testing.assert_close(loss.double(), loss64.detach(), **TOL[dtype])
    torch.testing.assert_close(w.grad.double(), w64.grad, **tol)
    torch.testing.assert_close(x.grad.double(), x64.grad, **tol)


def test_cross_entropy_under_compile_copies_and_allocates_no_logits():
    # torch.compile: an op that wrote the gradient in place of the saved logits in the backward made inductor copy
    # them first (issue 77: a read and a write of N x V elements, 4 ms a micro-batch at 96 x 5 on an H200), and one
    # that allocated the gradient kept the logits alive beside it (issue 85); now the forward's op writes into the
    # LM head's output (inductor writes it in place: a mutated intermediate, no clone), and the backward scales that
    # same buffer (the saved tensor donated to it), seen in inductor's generated code (CPU here)
    torch.manual_seed(7)
    rows, C, V = 48, 16, 1000  # N x V = 48,000 elements: a size no other tensor of the graph has
    (x, x64), (w, w64) = rounded(rows, C, dtype=torch.float32), rounded(C, V, dtype=torch.float32)
    targets = torch.randint(0, V, (rows,))
    targets[5] = -100
    torch._dynamo.reset()
    # compiled afresh: AOTAutograd's cache keys the backward by the forward graph, blind to a change of the op's
    # backward, so a cached backward of another version of kernels.py could come back
    compiled = torch.compile(lambda x, w: kernels.cross_entropy(x @ w, targets), backend="inductor")

    def step():
        loss = compiled(x, w)
        loss.backward()
        return loss.detach()

    with torch._inductor.config.patch(force_disable_caches=True):
        loss, codes = run_and_get_code(step)
    forward, backward = ([code.split("def call(self, args):")[1].split("def get_args")[0] for code in codes
                          if ("tangents_1" in code) == is_backward] for is_backward in (False, True))
    assert len(forward) == len(backward) == 1
    forward, backward = forward[0], backward[0]
    # the forward: one buffer of the logits' size, the matmul's, which the op writes in place; no copy of it
    made = re.findall(rf"(\w+) = empty_strided_cpu\(\({rows}, {V}\)", forward)
    assert len(made) == 1 and f"torch.ops.nlq.cross_entropy_rows.default({made[0]}, " in forward, forward
    assert not re.search(r"aten\.(copy_|clone)|\.clone\(", forward), forward
    # the backward: the saved gradient's buffer reused for its scaling, nothing of its size allocated
    assert f"empty_strided_cpu(({rows}, {V})" not in backward, backward
    assert not re.search(r"aten\.(copy_|clone)|\.clone\(", backward), backward
    saved = re.findall(rf"assert_size_stride\((\w+), \({rows}, {V}\)", backward)
    assert len(saved) == 1 and f" = {saved[0]}; del {saved[0]}  # reuse" in backward, backward
    loss64 = F.cross_entropy(x64 @ w64, targets)
    loss64.backward()
    torch.testing.assert_close(loss.double(), loss64.detach(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w.grad.double(), w64.grad, rtol=1e-5, atol=1e-6)


def test_cross_entropy_rows_refuses_logits_it_cannot_write_in_place():
    with pytest.raises(ValueError, match="must be \\(N, V\\) with unit stride along V"):
        kernels.cross_entropy(torch.randn(8, 6).T, torch.zeros(6, dtype=torch.long))


# Compiles each recorded launch for Hopper (sm_90) with the Triton installed here, in a process without the
# interpreter (triton.compile needs no GPU, and ptxas ships in triton's wheel), specialized as triton's JIT
# specializes the launch: its binder (create_function_from_signature) and JITFunction._pack_args, run against a
# Hopper backend, give the signature, the constexprs and the attributes (divisibility by 16 of each pointer and
# integer) that JITFunction.run compiles with. Writes each launch's signature, its arguments divisible by 16 and
# its TTIR to argv[2] as JSON.
COMPILE_FOR_HOPPER = """
import json, sys
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.jit import create_function_from_signature
from nonlinear_queries.ops import kernels
sys.path.insert(0, sys.argv[1])
import planted


class Pointer:  # a tensor argument as the binder reads it: its dtype and its address
    def __init__(self, dtype, address):
        self.dtype, self.address = getattr(torch, dtype), address

    def data_ptr(self):
        return self.address


target = GPUTarget("cuda", 90, 32)
backend = make_backend(target)
out = []
for module, name, args, kwargs in json.load(sys.stdin):
    kernel = getattr(planted if module == "planted" else kernels, name)
    args = [Pointer(*arg[1:]) if arg[0] == "tensor" else arg[1] for arg in args]
    bound, specialization, options = create_function_from_signature(kernel.signature, kernel.params, backend)(
        *args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    try:
        compiled = triton.compile(triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=constexprs,
                                                            attrs=attrs), target=target, options=options.__dict__)
    except Exception as e:
        sys.exit(f"{name} {signature} {constexprs}: {type(e).__name__}: {e}")
    divisible = [kernel.arg_names[path[0]] for path, attr in attrs.items() if ["tt.divisibility", 16] in attr]
    out.append({"name": name, "signature": signature, "divisible_by_16": divisible, "ttir": compiled.asm["ttir"]})
with open(sys.argv[2], "w") as f:
    json.dump(out, f)
"""
# a kernel that computes its row offset in 32 bits, for the check of the int64 offsets to find
PLANTED = """
import triton
import triton.language as tl


@triton.jit
def row_offset_in_int32(X, Y, stride):
    row = tl.program_id(0)
    tl.store(Y + row * stride, tl.load(X + row * stride))
"""
INTEGER_ARITHMETIC = {"arith.addi", "arith.subi", "arith.muli", "arith.divsi", "arith.remsi", "arith.shli"}


def offsets_from_the_program_id(ttir):
    """(narrow, wide) of a kernel's TTIR: narrow, the lines that compute in 32-bit integers from a value that
    depends on the program id (a row offset that wraps past 2^31 elements: the logits at 96 x 5 hold 4.9e9), a
    pointer offset among them; wide, the number of pointer offsets (tt.addptr) that depend on it in 64 bits."""
    depends, narrow, wide = set(), [], 0
    for line in ttir.splitlines():
        found = re.match(r"\s*(%\w+)(?::\d+)? = \"?([\w.]+)\"?(.*)", line)
        if not found:
            continue
        result, op, rest = found.groups()
        rest = rest.split(" loc(")[0]
        types = rest.rsplit(" : ", 1)[-1]
        operands = re.findall(r"%\w+", rest.split(" : ")[0])
        if op == "tt.get_program_id" or depends.intersection(operands):
            depends.add(result)
        else:
            continue
        if op in INTEGER_ARITHMETIC and re.fullmatch(r"i32|tensor<.*xi32>", types.strip()):
            narrow.append(line.strip())
        if op == "tt.addptr" and operands[1] in depends:
            if re.fullmatch(r"i64|tensor<.*xi64>", types.split(", ")[-1].strip()):
                wide += 1
            else:
                narrow.append(line.strip())
    return narrow, wide


@pytest.mark.slow
def test_every_launch_compiles_for_hopper_outside_the_interpreter(monkeypatch, tmp_path):
    """The interpreter runs what compiled Triton refuses: the H200 run of 2026-12-04 (bench/RESULTS.md) failed
    every res_gelu kernel on a plain-float global that the tests here had run for days. So each op's launches are
    recorded here, with the arguments the GPU run gives them, and compiled to sm_90 machine code in a subprocess
    as triton's JIT compiles them (COMPILE_FOR_HOPPER: the same specialization, divisibility by 16 included), by
    the Triton installed here (3.9 from PyPI; the GPU image has 3.6, so this finds what both refuse). The launches:
    the model's own at GPT-2 small's widths (C = 768, r = 384, V = 50,304) under bf16 autocast, res_gelu and
    anchored_res_gelu, at 2 x 64 rows, a multiple of 16 as 96 x 1024 is (so the same binary: a launch's
    specialization sees only types and divisibility), and each op alone in bf16 and fp32, with and without biases,
    at 100 rows. Then, in what they compile to (TTIR), every offset that depends on the program id is computed in
    64 bits, as the rows past 2^31 elements of the logits at 96 x 5 need (4.9e9 of them); a kernel planted with a
    32-bit row offset is caught."""
    launches = {}

    def describe(arg):
        if isinstance(arg, torch.Tensor):
            return ["tensor", str(arg.dtype).removeprefix("torch."), arg.data_ptr()]
        return ["float" if isinstance(arg, float) else "int", arg]

    class Recorded:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            def launch(*args, **kwargs):  # recorded, not run: no output of it is read here
                args = [describe(arg) for arg in args]
                # one launch per specialization the JIT would tell apart: types, divisibility by 16, ones
                key = json.dumps([self.name, [a[:2] + [a[2] % 16 == 0] if a[0] == "tensor" else
                                              [a[0], a[1] % 16 == 0 if a[0] == "int" else None, a[1] == 1]
                                              for a in args], kwargs])
                launches.setdefault(key, ["kernels", self.name, args, kwargs])
            return launch

    names = [name for name, f in vars(kernels).items() if callable(getattr(f, "fn", None))]
    for name in names:
        monkeypatch.setattr(kernels, name, Recorded(name))
    for query_mode in ("res_gelu", "anchored_res_gelu"):
        model = GPT(GPTConfig(n_layer=1, n_head=12, n_embd=768, block_size=64, vocab_size=50304,
                              query_mode=query_mode))
        kernels.use_kernels(model)
        idx = torch.randint(0, 50304, (2, 64))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(idx, idx, return_logits=False)[1]
        loss.backward()
    model_launches = len(launches)
    C, R, V, rows = 768, 384, 50304, 100
    for dtype in (torch.float32, torch.bfloat16):
        for bias in (False, True):
            x, p, da = (torch.randn(rows, n, dtype=dtype, requires_grad=True) for n in (C, 2 * C + R, R))
            b1 = torch.randn(R, dtype=dtype, requires_grad=True) if bias else None
            *_, a = kernels.SplitRMSGELU.apply(p, kernels.rms_statistic(x, EPS), b1, (C, C))
            a.backward(da)
            anchor, y, dout = (torch.randn(rows, C, dtype=dtype, requires_grad=True) for _ in range(3))
            w, b = torch.randn(C, dtype=dtype, requires_grad=True), torch.randn(C, dtype=dtype) if bias else None
            torch.ops.nlq.layer_norm_residual(anchor, y, w, b, EPS)[0].backward(dout)
        logits = torch.randn(rows, V, dtype=dtype, requires_grad=True)
        kernels.cross_entropy(logits * 1, torch.randint(0, V, (rows,))).backward()
    recorded = list(launches.values())
    assert {name for _, name, _, _ in recorded[:model_launches]} == set(names) and len(names) == 5
    recorded.append(["planted", "row_offset_in_int32", [["tensor", "float32", 1024], ["tensor", "float32", 2048],
                                                         ["int", 50304]], {}])
    (tmp_path / "planted.py").write_text(PLANTED)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_DEFAULT_FP_FUSION="1")
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_HOPPER, str(tmp_path), str(tmp_path / "out.json")],
                          input=json.dumps(recorded), capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = json.loads((tmp_path / "out.json").read_text())
    assert len(compiled) == len(recorded)
    by_name = collections.defaultdict(list)
    for launch in compiled[:model_launches]:
        by_name[launch["name"]].append(launch)
    # the model's launches as the GPU makes them: h a bf16 view of the projection, rms(x) float32, the anchor x the
    # float32 LayerNorm output under autocast, and every pointer, stride and size divisible by 16, so specialized
    # as such
    fwd = by_name["_rms_gelu_fwd"][0]
    assert (fwd["signature"]["H"], fwd["signature"]["RSTD"], fwd["signature"]["A"]) == ("*bf16", "*fp32", "*bf16")
    assert {"H", "RSTD", "A", "stride_h", "stride_a", "N", "R"} <= set(fwd["divisible_by_16"])
    ln = by_name["_layer_norm_residual_fwd"][0]  # q out in bf16, as the attention takes it
    assert (ln["signature"]["ANCHOR"], ln["signature"]["Y"], ln["signature"]["OUT"]) == ("*fp32", "*bf16", "*bf16")
    ce = by_name["_cross_entropy_fwd"][0]
    assert ce["signature"]["LOGITS"] == "*bf16" and {"LOGITS", "stride_logits"} <= set(ce["divisible_by_16"])
    # the cross-entropy's kernel takes no row count (the rows are the grid): at 96 x 5 the binary is this one
    assert all("N" not in launch["signature"] for launch in by_name["_cross_entropy_fwd"])
    for launch in compiled:
        narrow, wide = offsets_from_the_program_id(launch["ttir"])
        if launch["name"] == "row_offset_in_int32":
            assert narrow and wide == 0, narrow
        else:
            assert not narrow and wide > 0, (launch["name"], launch["signature"], narrow)


def test_ops_pass_torch_library_opcheck():
    """The fake (meta) implementations, the schemas and the autograd registrations agree with the ops,
    which is what torch.compile and FSDP rely on (torch.library.opcheck, on the PyTorch path)."""
    torch.manual_seed(2)
    # (B, T, C) inputs, as the model passes them, and h a slice of the fused projection's output
    p, rstd = torch.randn(2, 3, 20), torch.rand(2, 3) + 0.5
    b1 = torch.randn(4, requires_grad=True)
    torch.library.opcheck(torch.ops.nlq.rms_gelu, (p[..., 16:].requires_grad_(), rstd.requires_grad_(), b1))
    for out_dtype in (None, torch.bfloat16):  # bfloat16: q as the attention takes it under autocast
        torch.library.opcheck(torch.ops.nlq.layer_norm_residual,
                              (torch.randn(2, 3, 8, requires_grad=True), torch.randn(6, 8, requires_grad=True),
                               torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True), EPS, out_dtype))
    targets = torch.tensor([0, 7, -100, 3, 3, 1])  # one row ignored, the scale 1 / 5 a float32 scalar tensor
    torch.library.opcheck(torch.ops.nlq.cross_entropy_rows, (torch.randn(6, 8), targets, torch.tensor(0.2), -100))
    # the gradients of K's and V's pieces (one strided, as the attention's backward may give it), h, rstd and da
    torch.library.opcheck(torch.ops.nlq.split_rms_gelu_backward,
                          ([torch.randn(2, 3, 8), torch.randn(3, 2, 8).transpose(0, 1)], p[..., 16:].detach(),
                           rstd.detach(), b1.detach(), torch.randn(2, 3, 4)))


TINY = dict(n_layer=2, n_head=2, n_embd=24, block_size=16, vocab_size=64)


def one_step(model, idx, targets):
    """The logits, the gradients of one training step on (idx, targets), and the loss after it (SGD: AdamW's
    first step would turn a gradient that is zero up to rounding, as K's bias has, into a step of its sign).
    The step asks for the loss alone, as train_step does, which is when the cross-entropy kernel runs."""
    logits = model(idx, targets)[0].detach()
    model(idx, targets, return_logits=False)[1].backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    return logits, {k: v.grad for k, v in model.named_parameters()}, model(idx, targets)[1].detach()


@pytest.mark.parametrize("query_mode, attn_gate", [(m, "none") for m in sorted(QUERY_MODULES)]
                         + [("res_gelu", "elementwise"), ("anchored_res_gelu", "headwise")])
@pytest.mark.parametrize("fused_qkv", [True, False])
def test_model_with_kernels_computes_what_the_model_without_does(path, query_mode, attn_gate, fused_qkv):
    """Logits and one training step, every query mode, fused and unfused projection, and the output gate
    beside the kernels' f: use_kernels changes res_gelu and anchored_res_gelu only, and not what they compute."""
    cfg = GPTConfig(**TINY, query_mode=query_mode, fused_qkv=fused_qkv, bias=query_mode == "anchored_res_gelu",
                    attn_gate=attn_gate)
    torch.manual_seed(3)
    plain = GPT(cfg)
    if query_mode == "anchored_res_gelu":  # f starts at zero there; move its LN off zero so f is seen
        with torch.no_grad():
            for block in plain.transformer.h:
                block.attn.query.ln.weight.normal_()
    fast = GPT(cfg)
    fast.load_state_dict(plain.state_dict())
    assert kernels.use_kernels(fast) == (cfg.n_layer if query_mode in ("res_gelu", "anchored_res_gelu") else 0)
    idx, targets = torch.randint(0, 64, (2, 2, 11)).unbind(0)
    want_logits, want_grads, want_loss = one_step(plain, idx, targets)
    got_logits, got_grads, got_loss = one_step(fast, idx, targets)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-5, atol=1e-5)
    for name, want in want_grads.items():
        torch.testing.assert_close(got_grads[name], want, rtol=1e-4, atol=1e-6, msg=name)
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-5, atol=1e-6)


def assert_within_ulps(got, want, dtype, ulps=2, name=""):
    """|got - want| <= `ulps` units in the last place of `dtype` at each element's own float64 reference value
    (its rounding to dtype is within half of one; the interpreter's truncating store within one), with a floor of
    2^-16 of the largest |want| for elements that float32's sums cancel to near 0 (an ulp of a near-0 value is
    not what float32 arithmetic on the terms of a sum can hold)."""
    want = want.detach()
    ulp = torch.finfo(dtype).eps * torch.exp2(torch.floor(torch.log2(want.abs().clamp(min=1e-300))))
    tol = ulps * ulp + 2.0 ** -16 * want.abs().max()
    err = (got.detach().double() - want).abs()
    worst = int((err / tol).argmax())
    assert (err <= tol).all(), (f"{name}: {int((err > tol).sum())} of {err.numel()} elements beyond {ulps} "
                                f"ulps; worst {got.flatten()[worst].item():.6g} against {want.flatten()[worst]:.6g}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("scale", [1e-2, 1e2])
def test_ops_match_float64_within_ulps_at_input_scales_far_from_1(path, dtype, scale):
    """f's ops at inputs of RMS 1e-2 and 1e2, so 1/rms(x) and LayerNorm's 1/std are 1e2 and 1e-2: an op whose
    statistic entered with a wrong power (its gradient, say, times rstd twice) agrees with the reference at x of
    RMS 1, where rstd is 1, and not here. Every output and gradient within 2 ulps of dtype of the float64
    reference's own values, not a tolerance of the tensor's scale."""
    torch.manual_seed(12)
    C, R = 600, 300
    # res_gelu's fused projection p = x [W_K | W_V | diag(g) W1] scales with x; u = h rstd stays O(1)
    x, x64 = rounded(N, C, dtype=dtype, scale=scale)
    p, p64 = rounded(N, 2 * C + R, dtype=dtype, scale=3.0 * scale)
    b1, b164 = rounded(R, dtype=dtype)
    *pieces, a = kernels.SplitRMSGELU.apply(p, kernels.rms_statistic(x, EPS), b1, (C, C))
    *pieces64, h64 = p64.split([C, C, R], dim=-1)
    u64 = h64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS) + b164
    a64 = 0.5 * u64 * (1 + torch.erf(u64 / 2 ** 0.5))
    assert_within_ulps(a, a64, dtype, name="a")
    grads = [torch.randn(t.shape, dtype=torch.float64).to(dtype) for t in (*pieces, a)]
    torch.autograd.backward([*pieces, a], grads)
    torch.autograd.backward([*pieces64, a64], [g.double() for g in grads])
    for name, got, want in [("x", x.grad, x64.grad), ("p", p.grad, p64.grad), ("b1", b1.grad, b164.grad)]:
        assert_within_ulps(got, want, dtype, name=name)
    # f's closing LayerNorm over y = a W2 + b2, of any scale, and the residual
    anchor, anchor64 = rounded(N, C, dtype=dtype, scale=scale)
    y, y64 = rounded(N, C, dtype=dtype, scale=4.0 * scale)
    (w, w64), (b, b64) = rounded(C, dtype=dtype), rounded(C, dtype=dtype)
    out, mean, rstd = torch.ops.nlq.layer_norm_residual(anchor, y, w, b, EPS)
    mean64 = y64.mean(-1, keepdim=True)
    rstd64 = torch.rsqrt((y64 - mean64).pow(2).mean(-1, keepdim=True) + EPS)
    out64 = anchor64 + (y64 - mean64) * rstd64 * w64 + b64
    assert_within_ulps(out, out64, dtype, name="out")
    assert_within_ulps(rstd, rstd64[:, 0], torch.float32, ulps=8, name="rstd")
    dout = torch.randn(N, C, dtype=torch.float64).to(dtype)
    out.backward(dout)
    out64.backward(dout.double())
    for name, got, want in [("anchor", anchor.grad, anchor64.grad), ("y", y.grad, y64.grad), ("w", w.grad, w64.grad),
                            ("b", b.grad, b64.grad)]:
        assert_within_ulps(got, want, dtype, name=name)


@pytest.mark.parametrize("query_mode", ["res_gelu", "anchored_res_gelu"])
@pytest.mark.parametrize("scale", [1e-2, 1e2])
def test_model_with_kernels_computes_what_the_model_without_does_at_scales_far_from_1(path, query_mode, scale):
    """test_model_with_kernels_computes_what_the_model_without_does with ln_1's gain and W2 times `scale`, so the
    query's x (ln_1's output) and f's y (W2's) have RMS near `scale`, not 1, and 1/rms(x) and the LayerNorm's
    1/std are far from 1: the plain model's gradients, each within 1e-4 of its own largest entry."""
    cfg = GPTConfig(**TINY, query_mode=query_mode, bias=query_mode == "anchored_res_gelu")
    torch.manual_seed(13)
    plain = GPT(cfg)
    with torch.no_grad():
        for block in plain.transformer.h:
            block.ln_1.weight.mul_(scale)
            block.attn.query.w2.weight.mul_(scale)
            block.attn.query.ln.weight.normal_()  # anchored_res_gelu's starts at zero: f is seen
    fast = GPT(cfg)
    fast.load_state_dict(plain.state_dict())
    assert kernels.use_kernels(fast) == cfg.n_layer
    idx, targets = torch.randint(0, 64, (2, 2, 11)).unbind(0)
    x = plain.transformer.h[0].ln_1(plain.transformer.wte(idx) + plain.transformer.wpe(torch.arange(11)))
    assert x.pow(2).mean().sqrt().item() == pytest.approx(scale, rel=0.5)
    want_logits, want_grads, want_loss = one_step(plain, idx, targets)
    got_logits, got_grads, got_loss = one_step(fast, idx, targets)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-5, atol=1e-5)
    for name, want in want_grads.items():
        torch.testing.assert_close(got_grads[name], want, rtol=1e-4, atol=1e-4 * want.abs().max().item(), msg=name)
    # SGD's step at lr 0.1 on gradients of W2's scale 1e2 is far from small: float32's differences grow in it
    torch.testing.assert_close(got_loss, want_loss, rtol=1e-3, atol=0)


class CountOps(TorchDispatchMode):
    """Counts the aten ops that run under it and, for aten.cat, the widths of what it makes."""

    def __init__(self):
        super().__init__()
        self.calls, self.cat_widths = collections.Counter(), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.calls[func.overloadpacket.__name__] += 1
        if func.overloadpacket is torch.ops.aten.cat:
            self.cat_widths.append(out.size(-1))
        return out


@pytest.mark.parametrize("query_mode", ["res_gelu", "anchored_res_gelu"])
@pytest.mark.parametrize("fused_qkv", [True, False])
def test_backward_with_kernels_writes_the_projection_gradient_without_a_cat(path, query_mode, fused_qkv):
    """With the ops, the backward writes the fused projection's gradient into one buffer (SplitRMSGELU):
    no aten.cat over it and no slice_backward runs, where the plain model's cats the gradients of K, V (W_Q)
    and W1's columns into the projection's whole width (2.5 C; 3.5 C for anchored_res_gelu; 1.5 C unfused)."""
    cfg = GPTConfig(**TINY, query_mode=query_mode, fused_qkv=fused_qkv)
    width = (2 * cfg.n_embd if fused_qkv else 0) + (cfg.n_embd if query_mode == "anchored_res_gelu" else 0) + \
        cfg.query_bottleneck
    idx, targets = torch.randint(0, 64, (2, 2, 11)).unbind(0)
    counts = {}
    for one_buffer in (True, False, None):  # None: the plain model, no ops
        torch.manual_seed(8)
        model = GPT(cfg)
        if one_buffer is not None:
            kernels.use_kernels(model, one_buffer=one_buffer)
        loss = model(idx, targets, return_logits=False)[1]
        with CountOps() as counts[one_buffer]:
            loss.backward()
    # the ops with autograd's split cat always (W1's columns alone a cat of one); so does the plain model where it
    # takes the fused projection (unfused, its res_gelu and anchored_res_gelu compute f and x W_Q from x apart)
    for before, cats in ((False, True), (None, fused_qkv)):
        assert counts[before].cat_widths.count(width) == cfg.n_layer * cats, counts[before].cat_widths
    # unfused, K and V come out of c_kv by autograd's split, whose cat (2 C wide) the ops leave as it was
    assert counts[True].cat_widths == ([] if fused_qkv else [2 * cfg.n_embd] * cfg.n_layer), counts[True].cat_widths
    assert counts[True].calls["slice_backward"] == 0, counts[True].calls
    assert counts[True].calls["split_rms_gelu_backward"] == cfg.n_layer


def plain_and_fast(seed, query_mode="res_gelu"):
    """Two TINY GPTs with the same weights (init seeded by `seed`): the plain one, and one with the kernels."""
    torch.manual_seed(seed)
    plain = GPT(GPTConfig(**TINY, query_mode=query_mode))
    fast = GPT(GPTConfig(**TINY, query_mode=query_mode))
    fast.load_state_dict(plain.state_dict())
    kernels.use_kernels(fast)
    return plain, fast


def test_model_with_kernels_under_autocast_and_aot_autograd():
    """bf16 autocast (the GPU's setting: x float32, the projection bfloat16) and dynamo with AOTAutograd,
    which traces the ops through their fake implementations: the same loss and gradients as the plain model."""
    plain, fast = plain_and_fast(seed=4)
    compiled = torch.compile(fast, backend="aot_eager", fullgraph=True)
    idx, targets = torch.randint(0, 64, (2, 2, 11)).unbind(0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, want = plain(idx, targets)
        _, got = compiled(idx, targets, return_logits=False)  # the loss alone, as train_step: the CE kernel too
    want.backward()
    got.backward()
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    for (name, p), q in zip(plain.named_parameters(), fast.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=5e-2, atol=5e-3, msg=name)


@pytest.mark.parametrize("settings, dtype", [({}, torch.bfloat16), ({"qk_norm": True}, torch.float32),
                                             ({"pos_encoding": "rope"}, torch.float32)],
                         ids=["plain", "qk_norm", "rope"])
def test_q_comes_out_in_autocasts_dtype_where_the_attention_casts_it(path, settings, dtype):
    # under bf16 autocast the plain query module's q is float32 (torch's LayerNorm), which the attention casts to
    # bfloat16; with the ops q comes out in bfloat16 (the same rounding, half the bytes) unless QK-norm or RoPE
    # computes on q in float32 first, where a rounded q would change what they compute; without autocast, float32
    torch.manual_seed(9)
    model = GPT(GPTConfig(**TINY, query_mode="res_gelu", **settings))
    kernels.use_kernels(model)
    query, x = model.transformer.h[0].attn.query, torch.randn(2, 5, TINY["n_embd"])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        q = query(x)
        fast, query.kernels = query.kernels, None
        want = query(x)
    assert (q.dtype, want.dtype) == (dtype, torch.float32)
    # the matmuls round to bfloat16 under autocast either way, a and y at their own places: bf16's tolerance
    torch.testing.assert_close(q.double(), want.to(dtype).double(), **TOL[torch.bfloat16])
    query.kernels = fast
    assert query(x).dtype == torch.float32


def test_compile_computes_rms_x_in_the_kernel_that_makes_x_and_its_gradient_in_x_s():
    # rms(x) is PyTorch's (rms_statistic), so inductor fuses it into the kernel of the LayerNorm that makes x (the
    # block's ln_1), and rstd's gradient (one float32 a row from the op) into the kernel of that LayerNorm's
    # backward, which makes x's gradient: no pass over x of its own either way (CPU inductor's generated code, its
    # kernels named after what they fuse)
    torch.manual_seed(10)
    model = GPT(GPTConfig(**TINY, query_mode="res_gelu"))
    kernels.use_kernels(model)
    ln_1, query = model.transformer.h[0].ln_1, model.transformer.h[0].attn.query
    stream, dq = torch.randn(2, 16, TINY["n_embd"], requires_grad=True), torch.randn(2, 16, TINY["n_embd"])

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            x = ln_1(stream)
            q = query.from_projection(x, F.linear(x, query.fused_weight()), [])[0]
        q.backward(dq.to(q.dtype))

    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):  # this version's graphs, compiled afresh
        _, codes = run_and_get_code(torch.compile(step))
    forward, backward = (re.findall(r"^\s+(cpp_fused\w+)\(", code, re.MULTILINE) for code in codes)

    def fuses(name, *ops):
        return all(f"_{op}_" in f"{name}_" for op in ops)

    assert any(fuses(name, "native_layer_norm", "pow", "mean", "rsqrt") for name in forward), forward
    assert not any(fuses(name, "pow") and not fuses(name, "native_layer_norm") for name in forward), forward
    assert any(fuses(name, "native_layer_norm_backward", "pow") for name in backward), backward
    assert "torch.ops.nlq.rms_gelu.default(" in codes[0] and "split_rms_gelu_backward.default(" in codes[1]


def test_compiled_model_with_kernels_allocates_the_logits_once():
    # the training step as train.py compiles it (bf16 autocast, inductor, the loss alone): the forward's one buffer
    # of the logits' size is the LM head's matmul, which the cross-entropy op overwrites with their gradient, and the
    # backward allocates none, scaling that saved buffer in place (issue 85: the allocating backward kept the logits
    # alive beside their gradient, 9.4 GiB at 96 x 1024 x 50,304)
    torch.manual_seed(14)
    V, rows = 1000, 3 * 16
    model = GPT(GPTConfig(**{**TINY, "vocab_size": V, "n_layer": 1}, query_mode="res_gelu"))
    kernels.use_kernels(model)
    compiled = torch.compile(model, backend="inductor")
    idx, targets = torch.randint(0, V, (2, 3, 16)).unbind(0)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = compiled(idx, targets, return_logits=False)[1]
        loss.backward()

    torch._dynamo.reset()
    with torch._inductor.config.patch(force_disable_caches=True):
        _, codes = run_and_get_code(step)
    calls = {("tangents_1" in code): code.split("def call(self, args):")[1].split("def get_args")[0] for code in codes}
    made = re.findall(rf"(\w+) = empty_strided_cpu\(\({rows}, {V}\)", calls[False])
    assert len(made) == 1 and f"torch.ops.nlq.cross_entropy_rows.default({made[0]}, " in calls[False], calls[False]
    assert f"empty_strided_cpu(({rows}, {V})" not in calls[True]
    saved = re.findall(rf"assert_size_stride\((\w+), \({rows}, {V}\)", calls[True])
    assert len(saved) == 1 and f" = {saved[0]}; del {saved[0]}  # reuse" in calls[True], calls[True]
    for call in calls.values():
        assert not re.search(r"aten\.(copy_|clone)|\.clone\(", call)


def test_use_kernels_leaves_other_activations_unnormed_f_and_subclasses_to_pytorch(monkeypatch):
    for settings in (dict(query_activation="relu"), dict(query_norm=False)):
        model = GPT(GPTConfig(**TINY, query_mode="res_gelu", **settings))
        assert kernels.use_kernels(model) == 0
        assert all(block.attn.query.kernels is None for block in model.transformer.h)

    # a res_gelu subclass, registered as the docs say, may change f: the ops, which compute res_gelu's own, pass it
    # by, and it computes its own f (here doubled) where the ops would have computed res_gelu's
    class DoubledF(ResGELUQuery):
        def f(self, x):
            return 2 * super().f(x)

    monkeypatch.setitem(QUERY_MODULES, "res_gelu_doubled", DoubledF)
    torch.manual_seed(0)
    plain = GPT(GPTConfig(**TINY, query_mode="res_gelu_doubled"))
    fast = GPT(GPTConfig(**TINY, query_mode="res_gelu_doubled"))
    fast.load_state_dict(plain.state_dict())
    assert kernels.use_kernels(fast) == 0
    assert all(block.attn.query.kernels is None for block in fast.transformer.h)
    idx = torch.randint(0, 64, (2, 11))
    torch.testing.assert_close(fast(idx, idx)[0], plain(idx, idx)[0], rtol=0, atol=0)


@pytest.mark.slow
def test_train_py_with_kernels_trains_as_without(shakespeare_dir, tmp_path, monkeypatch):
    """TrainConfig's `kernels` reaches the model through train.py: the same losses, step for step. The ops take
    their PyTorch path here (the interpreter's cross-entropy over GPT-2's 50,304 logits takes minutes); the tests
    above hold the kernels to it."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    changed = []
    monkeypatch.setattr(kernels, "use_kernels", lambda model, put=kernels.use_kernels: changed.append(put(model)))
    runs = {}
    for flag in ("False", "True"):
        out = tmp_path / flag
        assert train_in_process(shakespeare_dir, out, "--query_mode=res_gelu", f"--kernels={flag}", "--max_iters=3",
                                "--eval_interval=3") == 0
        runs[flag] = losses_by_step(out), val_losses_by_step(out)
    assert changed == [2] and list(runs["True"][0]) == [1, 2, 3]  # both layers' res_gelu, once
    for got, want in zip(runs["True"], runs["False"]):
        assert got == pytest.approx(want, rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("parallelism", ["ddp", "fsdp"])
def test_kernels_under_sharding_checkpointing_and_compile(parallelism):
    """The ops in a model that parallelize() checkpoints, compiles (dynamo and AOTAutograd) and shards as
    train.py does, FSDP2 in a process group of one included: the plain model's loss and gradients."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from nonlinear_queries.runtime.processes import parallelize, setup

    runtime = setup("cpu", "float32", parallelism="fsdp")  # a group of one; under ddp, DDP around the model
    try:
        plain, fast = plain_and_fast(seed=5)
        model, train_model = parallelize(fast, runtime, parallelism, compile=True, activation_checkpointing=True,
                                         backend="aot_eager")
        idx, targets = torch.randint(0, 64, (2, 2, 11)).unbind(0)
        want = plain(idx, targets)[1]
        got = train_model(idx, targets, return_logits=False)[1]
        want.backward()
        got.backward()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        for (name, p), q in zip(plain.named_parameters(), model.parameters()):
            grad = q.grad.full_tensor() if isinstance(q.grad, DTensor) else q.grad
            torch.testing.assert_close(grad, p.grad, rtol=1e-4, atol=1e-6, msg=name)
    finally:
        dist.destroy_process_group()
