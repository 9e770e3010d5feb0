"""
Training speed of every query mode (and the MLP4.75 control), measured side by side.

    python bench/train_speed.py                                      # CPU: 6 x 384, block 256
    python bench/train_speed.py --size=gpt2 --compile --device=cuda  # GPT-2 small, bf16
    python bench/train_speed.py --recipe=modern                      # RoPE, RMSNorm, ReLU^2, QK-norm, Muon
    python bench/train_speed.py --size=gpt2 --compile --device=cuda --splits=12x40,48x10 --plain --profile
    python bench/train_speed.py --size=gpt2 --compile --device=cuda --with_logits --inductor=online_softmax=False

One full training step per variant and round, as train.py runs it between two log steps:
training.train_step (forward and backward over each of gradient_accumulation_steps
micro-batches of batch_size sequences of random tokens, the gradients accumulating, one
gradient clipping), the divergence guard on the device (training.DivergenceGuard) and the
update it may skip (training.apply_updates) with train.py's own optimizer setup
(optimizers.build_optimizers), nothing read back to the host. The accumulation is the
size preset's (the paper's 40 at --size=gpt2, 2 on the CPU) unless --gradient_accumulation_steps
sets it; --splits=12x4,24x2,48x1 times each variant at each micro-batch x accumulation split of
one global batch (the same sequences, as train.py's index gives them for any split), a row each.
--plain adds a row "linear plain" that takes linear's step (same model, same compiled graph) as
a minimal loop does (nanoGPT's: backward of each loss / accumulation, clip_grad_norm_, the
optimizers' steps; no divergence guard, no float64 norm), the reference train.py's path is held
to (within 1%, issue 44).
--compile_mode is torch.compile's mode (TrainConfig's compile_mode); every variant compiles in
it, with static shapes. --cat_copies adds linear and res_gelu compiled with inductor's cats
lowered as copies (TrainConfig's compile_pointwise_cat=False), the lever measured against the
default. --inductor=NAME=VALUE[,NAME=VALUE] (repeatable) adds linear and res_gelu compiled with
those torch._inductor.config options on top of the mode's, a row each ("res_gelu
online_softmax=False"): a compiler setting tried beside the default in one process, the model
unchanged. --kernels adds linear and res_gelu with the Triton ops of TrainConfig's kernels
(nonlinear_queries/ops/kernels.py: the cross-entropy, and res_gelu's f), "res_gelu kernels cat", the
same ops with the fused projection split by autograd (whose backward cats K's, V's and W1's
gradients, where the ops write them into one buffer), and with --unfused also "res_gelu unfused
kernels", W1 (its gain folded) out of the fused projection. --with_logits adds
linear and res_gelu stepped as before issue 44's change, the
compiled forward returning the logits with the loss (GPT.forward's return_logits: a zero-filled
tangent of the logits' size in every micro-batch's backward). --profile prints, under the table,
each row's top 40 kernels over one step (torch.profiler: self device time per kernel on a GPU, self
CPU time per operator on the CPU), each beside the operator that launched it and that operator's
input shapes, so a cuBLAS kernel names its matmul and a fill its tensor, and a matmul row its TFLOP
(2 M K N per call, over its calls) and TFLOP/s. --recipe picks the
model options and the optimizers: 'gpt2' those of config/baseline.py (the paper's: AdamW), 'modern' those of
config/modern/baseline.py (docs/modern.md: Muon for the blocks' matrices); the
size comes from --size, whichever the recipe. The variants take turns within each round (A B C ... C B A), so a shared
machine's drift falls on all of them alike. With --compile every variant keeps its own
compiled graph (common.fresh_compiler): a variant that would fall back to eager fails the bench. Columns:

- compile s: with --compile, the first (warm-up) step's time less the median step's: mostly compilation
- ms/step: median over rounds (min in brackets); tokens/s = gradient_accumulation_steps *
  batch_size * block_size / median, the one device's
- MFU: the model's training FLOPs per token (GPT.flops_per_token: 6 x its own matmul
  parameters + attention) x tokens/s / the device's peak, from the same timing as tokens/s;
  '-' when the peak is unknown (CPUs; pass --peak_flops to set one). bench/RESULTS.md says
  how it relates to the MFU train.py logs
- peak MiB: CUDA: the step's peak allocation above what the other variants hold, plus
  this variant's parameters and optimizer states; CPU: peak RSS growth of a fresh process
  that builds this variant alone and runs two steps
- vs linear: median over rounds of (this variant's time / linear's time at the same split in
  the same round)

Under it, the targets table scores each query mode (and mlp475, the MLP4.75 control) on its best row
that train.py can run, kernels or not (issue 77; target_mode: the rows of μP, of --with_logits, of
"res_gelu kernels cat" and "linear plain" are not train.py's step): the row of lowest median step time
of each mode, at any split, its MFU, and "vs linear's best", the median over rounds of its time / the
time of linear's best row in the same round. The targets (issue 44): linear at 48% MFU or more,
res_gelu and every other mode at most 1.04 x linear's best, on an H100/H200 (bench/gpu.py scores them).
"""

import argparse
import multiprocessing
import os
import statistics
from dataclasses import fields

import torch

from common import (
    DEFAULT_MODES,
    REPO,
    command_line,
    fresh_compiler,
    header,
    interleaved,
    paired_ratio,
    parser,
    proc_status_kib,
    query_modes,
    resolve_device,
    sync,
    timed,
)
from model import GPT, GPTConfig
from nonlinear_queries.config.configurator import parse_config
from nonlinear_queries.config.train_config import COMPILE_MODES, TrainConfig, parse_compile_options
from nonlinear_queries.runtime.processes import compile_kwargs, mfu, peak_flops
from nonlinear_queries.trainer.optimizers import build_optimizers
from nonlinear_queries.trainer.training import DivergenceGuard, apply_updates, train_step

SIZES = {  # n_layer, n_head, n_embd, block_size, batch_size, gradient_accumulation_steps
    "cpu": (6, 6, 384, 256, 4, 2),
    "gpt2": (12, 12, 768, 1024, 12, 40),  # the paper's model, micro-batch and accumulation (config/baseline.py)
}
RECIPES = {"gpt2": "config/baseline.py", "modern": "config/modern/baseline.py"}
SIZE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")


def recipe(name):
    """(model options, training config) of a recipe: the GPTConfig settings in which its config
    file differs from GPTConfig's defaults, the size and the query left out (the bench sets them),
    and its TrainConfig, whose optimizer settings build_optimizers reads."""
    cfg, _ = parse_config(TrainConfig, [os.path.join(REPO, RECIPES[name])])
    options = {f.name: getattr(cfg, f.name) for f in fields(GPTConfig)
               if getattr(cfg, f.name) != f.default and f.name not in (*SIZE_KEYS, "query_mode")}
    return options, cfg


def variants(args):
    """{name: GPTConfig overrides}: the --modes (linear first: the ratios refer to it),
    the MLP4.75 control, with --unfused the unfused projection of linear and res_gelu, and with
    --mup linear and res_gelu under μP (parametrization='mup' at mup_base_width 128: m = 6 at
    GPT-2 small; its own AdamW groups, logits x 1/m), with --cat_copies linear and res_gelu compiled
    with TrainConfig's compile_pointwise_cat=False, with each --inductor linear and res_gelu compiled
    with its inductor options, and with --with_logits linear and res_gelu whose compiled forward
    returns the logits, and with --kernels linear and res_gelu through kernels.use_kernels, res_gelu through
    use_kernels(one_buffer=False) (autograd's split of the fused projection: a cat in the backward), and with
    --unfused too res_gelu unfused with them (K and V in one matmul, W1 with its folded gain in its own)
    (compile_pointwise_cat, inductor_options, return_logits, kernels and one_buffer are keys build() takes out
    of the GPTConfig overrides)."""
    modes = args.modes.split(",")
    out = {mode: {"query_mode": mode} for mode in modes}
    if not args.no_mlp475:
        out["mlp475"] = {"query_mode": "linear", "mlp_ratio": 4.75}
    levers = [("unfused", {"fused_qkv": False})] * args.unfused + [("mup", {"parametrization": "mup"})] * args.mup
    levers += [("cat copies", {"compile_pointwise_cat": False})] * args.cat_copies
    levers += [(text, {"inductor_options": options}) for text, options in args.inductor]
    levers += [("with logits", {"return_logits": True})] * args.with_logits
    levers += [("kernels", {"kernels": True})] * args.kernels
    for suffix, override in levers:  # each lever a row of linear and one of res_gelu
        for mode in [m for m in ("linear", "res_gelu") if m in modes]:
            out[f"{mode} {suffix}"] = {"query_mode": mode, **override}
    if args.kernels and "res_gelu" in modes:  # the backward's one buffer of the projection's gradient, measured
        out["res_gelu kernels cat"] = {"query_mode": "res_gelu", "kernels": True, "one_buffer": False}
    if args.kernels and args.unfused and "res_gelu" in modes:  # W1 out of the fused projection, its gain folded
        out["res_gelu unfused kernels"] = {"query_mode": "res_gelu", "fused_qkv": False, "kernels": True}
    return out


def target_mode(name, overrides):
    """The mode whose target the variant `name` (overrides: its GPTConfig overrides, as variants() gives them)
    counts for: its query_mode, 'mlp475' for the MLP4.75 control (mlp_ratio 4.75); None for a variant train.py
    does not run as its step: 'linear plain' (a minimal loop), μP (another parametrization), the logits returned
    (before issue 44's change) and the ops with autograd's split of the projection (one_buffer=False; train.py's
    kernels take the one buffer)."""
    if name == "linear plain" or overrides.get("parametrization") == "mup" or overrides.get("return_logits"):
        return None
    if not overrides.get("one_buffer", True):
        return None
    return "mlp475" if overrides.get("mlp_ratio") == 4.75 else overrides["query_mode"]


def best_of_modes(row_modes, times):
    """[(mode, row, ratio)]: each mode's row of lowest median time, linear's first, then in the order of the rows;
    ratio = paired_ratio of that row against linear's best row (1.0 for linear). row_modes: {row: its mode, or None
    for a row that counts for none (target_mode)}; times: {row: [seconds per round]}. Raises ValueError when no row
    counts for linear."""
    best = {}
    for row, mode in row_modes.items():
        if mode is not None and (mode not in best or statistics.median(times[row]) <
                                 statistics.median(times[best[mode]])):
            best[mode] = row
    if "linear" not in best:
        raise ValueError("no linear row counts for the targets: every ratio is taken against linear's best")
    linear = best["linear"]
    return [(mode, best[mode], paired_ratio(times, best[mode], linear))
            for mode in ["linear", *(m for m in best if m != "linear")]]


def inductor_options(text):
    """({name: value}, text) of --inductor's NAME=VALUE[,NAME=VALUE], as TrainConfig's compile_options
    (train_config.parse_compile_options). Raises argparse.ArgumentTypeError for a malformed pair, or for a
    name or a type that inductor refuses (checked by compiling a Linear with them, as torch.compile checks them)."""
    try:
        options = parse_compile_options(text, "--inductor")
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    try:
        torch.compile(torch.nn.Linear(1, 1), options=options)
    except RuntimeError as e:  # torch.compile's own check of each option's name and type
        raise argparse.ArgumentTypeError(f"{e} (--inductor={text}; the names are torch._inductor.config's)") from None
    return text, options


def build(args, overrides, device):
    """(model, compiled model, optimizers) of one variant under args.recipe; every variant
    starts from seed 0 and compiles (with --compile) in args.compile_mode, with static shapes, with
    inductor's cats as copies where overrides has compile_pointwise_cat=False and with the inductor options
    of overrides' inductor_options (processes.compile_kwargs); return_logits=True returns the logits
    (returning_logits); kernels=True puts in the Triton ops (nonlinear_queries/ops/kernels.py: res_gelu's f and
    the cross-entropy) as TrainConfig's kernels does, one_buffer=False with autograd's split of the fused
    projection (use_kernels')."""
    overrides = dict(overrides)
    pointwise_cat = overrides.pop("compile_pointwise_cat", True)
    extra = overrides.pop("inductor_options", None)
    return_logits = overrides.pop("return_logits", False)
    kernels = overrides.pop("kernels", False)
    one_buffer = overrides.pop("one_buffer", True)
    options, cfg = recipe(args.recipe)
    n_layer, n_head, n_embd, block_size, _, _ = SIZES[args.size]
    config = GPTConfig(**{**options, **overrides}, n_layer=args.n_layer or n_layer, n_head=args.n_head or n_head,
                       n_embd=args.n_embd or n_embd, block_size=args.block_size or block_size,
                       vocab_size=args.vocab_size or 50304)
    torch.manual_seed(0)
    model = GPT(config).to(device)
    if kernels:
        from nonlinear_queries.ops.kernels import use_kernels

        use_kernels(model, one_buffer=one_buffer)
    optimizers = build_optimizers(model, cfg, "cuda" if device.startswith("cuda") else "cpu")
    compiled = model
    if args.compile:
        compiled = torch.compile(model, dynamic=False, **compile_kwargs(args.compile_mode, pointwise_cat=pointwise_cat,
                                                                        options=extra))
    if return_logits:
        compiled = returning_logits(compiled)
    return model, compiled, optimizers


def returning_logits(compiled):
    """`compiled` called as train_step called the model before issue 44's change: the logits returned with the
    loss, whatever the caller asks for (GPT.forward's return_logits)."""
    return lambda x, y, return_logits=True: compiled(x, y)


def make_step(model, compiled, optimizers, micro_batches, dtype, autocast):
    """One training step as train.py takes it between two log steps: training.train_step over the
    micro-batches [(x, y), ...] (forward and backward of each, the gradients accumulated, then one
    clipping to norm 1.0), the divergence guard on the device, and the optimizers' steps through
    training.apply_updates, with no host read. dtype: the autocast dtype's name (float16 scales
    the loss, as in train.py)."""
    params = list(model.parameters())
    device = params[0].device
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == "float16")
    seeds = list(range(len(micro_batches)))
    cfg = TrainConfig()  # train.py's divergence threshold and patience
    guard = DivergenceGuard(0, cfg.divergence_threshold, cfg.divergence_patience, not scaler.is_enabled(), device)

    def step():
        loss_sum, grad_norm = train_step(compiled, params, optimizers, scaler, lambda k: micro_batches[k],
                                         len(micro_batches), autocast, seeds, grad_clip=1.0)
        skip = guard.check(1, loss_sum.double() / len(micro_batches), grad_norm)
        apply_updates(optimizers, scaler, skip)

    return step


def make_plain_step(model, compiled, optimizers, micro_batches, dtype, autocast):
    """The step of make_step as a minimal training loop takes it (nanoGPT's train.py): forward (the loss alone, as
    train_step asks for it) and backward of each micro-batch's loss / accumulation, torch.nn.utils.clip_grad_norm_
    to 1.0, every optimizer's step through a GradScaler (enabled for float16 only), the gradients cleared; no
    dropout seeds, no divergence guard, no float64 norm, nothing read back. The reference that train.py's path is
    measured against."""
    params = list(model.parameters())
    scaler = torch.amp.GradScaler(params[0].device.type, enabled=dtype == "float16")

    def step():
        for x, y in micro_batches:
            with autocast:
                _, loss = compiled(x, y, return_logits=False)
            scaler.scale(loss / len(micro_batches)).backward()
        for optimizer in optimizers:
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        for optimizer in optimizers:
            scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        scaler.update()

    return step


def micro_batches(split, config, device):
    """The micro-batches (x, y) of split (batch_size, accumulation): accumulation of them, int64 (batch_size,
    block_size) each, of random tokens. The global batch is the same sequences for every variant and every
    split of it."""
    batch_size, accumulation = split
    g = torch.Generator().manual_seed(0)
    xy = torch.randint(0, min(config.vocab_size, 50257), (accumulation * batch_size, config.block_size + 1),
                       generator=g).view(accumulation, batch_size, -1).to(device)
    return [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in xy]


def splits(args, p):
    """[(batch_size, accumulation)]: --splits's, or the one of --batch_size and --gradient_accumulation_steps
    (the size preset's by default); p.error for a malformed list or splits of different global batches."""
    if not args.splits:
        _, _, _, _, batch_size, accumulation = SIZES[args.size]
        return [(args.batch_size or batch_size, args.gradient_accumulation_steps or accumulation)]
    try:
        out = [tuple(int(n) for n in s.split("x")) for s in args.splits.split(",")]
    except ValueError:
        out = []
    if not out or any(len(s) != 2 or min(s) < 1 for s in out):
        p.error(f"--splits takes micro-batch x accumulation pairs, e.g. 12x4,24x2,48x1; got {args.splits!r}")
    if len({b * a for b, a in out}) > 1:
        p.error(f"--splits must share one global batch (micro-batch x accumulation); got {args.splits!r}")
    return out


def input_shapes(event):
    """A profiled operator's tensor inputs as '98304x768, 768x384' (recorded with record_shapes; scalars and
    non-tensors, recorded as [], left out)."""
    return ", ".join("x".join(map(str, shape)) for shape in event.input_shapes if shape)


def matmul_flops(name, shapes):
    """FLOPs of one call of a matmul operator from its input shapes (2 M K N for (M, K) @ (K, N), times the
    batch for bmm): aten::mm, aten::addmm (bias first) and aten::bmm; None for any other operator."""
    if name == "aten::mm" and len(shapes) >= 2:
        (m, k), (_, n) = shapes[0], shapes[1]
        return 2 * m * k * n
    if name == "aten::addmm" and len(shapes) >= 3:
        (m, k), (_, n) = shapes[1], shapes[2]
        return 2 * m * k * n
    if name == "aten::bmm" and len(shapes) >= 2:
        (b, m, k), (_, _, n) = shapes[0], shapes[1]
        return 2 * b * m * k * n
    return None


def launched_by(events):
    """{(kernel, launcher): [calls, device us, FLOPs]} from a profile's CPU operators (torch.autograd.
    profiler_util.FunctionEvent): each kernel that an operator launched (its .kernels, linked by the profiler's
    correlation ids), under the operator's name and input shapes, e.g. ('nvjet_..._splitK_NTN', 'aten::mm
    (768x98304, 98304x384)'); a Triton kernel, whose launch inductor records under the kernel's own name with
    its arguments, under its arguments' shapes alone. FLOPs: a matmul operator's (matmul_flops) go to its
    first kernel, the product's (a split-K's reduction, launched second, gets none); 0 for the rest."""
    out = {}
    for event in events:
        flops = matmul_flops(event.name, [s for s in event.input_shapes if s]) or 0
        for i, kernel in enumerate(event.kernels):
            shapes = input_shapes(event)
            launcher = shapes if event.name == kernel.name else f"{event.name} ({shapes})"
            row = out.setdefault((kernel.name, launcher), [0, 0.0, 0])
            row[0] += 1
            row[1] += kernel.duration
            row[2] += flops if i == 0 else 0
    return out


def top_kernels(step, device, top=40):
    """[(name, launched by, calls, self ms, share of the step's self time, FLOPs)] of the `top` rows of one step(),
    by self device time on a GPU (a row per CUDA kernel and the operator that launched it, with that
    operator's input shapes: launched_by), by self CPU time on the CPU (a row per operator and its input
    shapes); torch.profiler with record_shapes.

    On a GPU only the device's own events count: a CPU operator's self device time is that of the kernels it
    launched (aten::mm's cuBLAS kernels, a Triton kernel's launch), which are rows of their own, so counting
    both would give those kernels twice (torch.autograd.profiler_util.FunctionEvent.self_device_time_total).
    A kernel's time that no operator claims (none seen so far) is its own row, launched by '-'. FLOPs: a
    matmul row's over its calls (matmul_flops), 0 for any other row."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.startswith("cuda")
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else []),
                 record_shapes=True) as prof:
        step()
        sync(device)
    if cuda:
        kernels = {e.key: (e.count, e.self_device_time_total) for e in prof.key_averages()
                   if e.device_type == DeviceType.CUDA and e.self_device_time_total > 0}
        rows = launched_by(e for e in prof.events() if e.device_type == DeviceType.CPU)
        for name, (calls, us) in kernels.items():  # what no operator claimed
            claimed = [row for (kernel, _), row in rows.items() if kernel == name]
            left = [calls - sum(row[0] for row in claimed), us - sum(row[1] for row in claimed), 0]
            if left[0] > 0:
                rows[(name, "-")] = left
        total = sum(us for _, us in kernels.values())
    else:
        rows = {(e.key, input_shapes(e)): [e.count, e.self_cpu_time_total,
                                           e.count * (matmul_flops(e.key, [s for s in e.input_shapes if s]) or 0)]
                for e in prof.key_averages(group_by_input_shape=True) if e.self_cpu_time_total > 0}
        total = sum(row[1] for row in rows.values())
    ranked = sorted(rows.items(), key=lambda item: item[1][1], reverse=True)[:top]
    return [(name, by, calls, us / 1000, us / total, flops) for (name, by), (calls, us, flops) in ranked]


def cpu_peak_mib(args, overrides, split, plain=False):
    """Peak RSS growth (MiB) of building one variant and running two steps of `split` (make_plain_step's if
    `plain`), in this (fresh) process."""
    torch.set_num_threads(1)  # memory, not speed, is measured here
    before = proc_status_kib("VmRSS")
    model, compiled, optimizers = build(args, overrides, "cpu")
    _, dtype, autocast = resolve_device(args)
    step = (make_plain_step if plain else make_step)(model, compiled, optimizers,
                                                      micro_batches(split, model.config, "cpu"), dtype, autocast)
    step()
    step()
    # VmHWM, not ru_maxrss: a spawned process inherits its parent's ru_maxrss across exec
    return (proc_status_kib("VmHWM") - before) / 1024


def main():
    p = parser(__doc__.split("\n\n")[1].strip())
    p.add_argument("--recipe", choices=RECIPES, default="gpt2",
                   help="model options and optimizers: the paper's (gpt2) or the modern recipe's")
    p.add_argument("--size", choices=SIZES, default=None, help="model and batch size; default cpu or gpt2 by device")
    for key in ("n_layer", "n_head", "n_embd", "block_size", "batch_size", "gradient_accumulation_steps",
                "vocab_size"):
        p.add_argument(f"--{key}", type=int, default=0, help="override the size preset")
    p.add_argument("--rounds", type=int, default=0, help="timed rounds (default 5 on CPU, 30 on CUDA)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per variant (compilation happens here)")
    p.add_argument("--modes", default=DEFAULT_MODES, help="comma-separated query modes; linear first")
    p.add_argument("--no_mlp475", action="store_true", help="leave out the MLP4.75 control (linear, mlp_ratio 4.75)")
    p.add_argument("--unfused", action="store_true", help="also time linear and res_gelu with fused_qkv=False")
    p.add_argument("--mup", action="store_true", help="also time linear and res_gelu under μP (parametrization=mup)")
    p.add_argument("--cat_copies", action="store_true", help="also time linear and res_gelu compiled with "
                   "compile_pointwise_cat=False (inductor's cats as copies; needs --compile)")
    p.add_argument("--inductor", type=inductor_options, action="append", default=[], metavar="NAME=VALUE,...",
                   help="also time linear and res_gelu compiled with these torch._inductor.config options (needs "
                   "--compile; repeatable, a row each)")
    p.add_argument("--with_logits", action="store_true", help="also time linear and res_gelu with the compiled "
                   "forward returning the logits, as before issue 44's change")
    p.add_argument("--kernels", action="store_true", help="also time linear and res_gelu with the Triton ops "
                   "(TrainConfig's kernels: res_gelu's f and the cross-entropy); with --unfused also res_gelu "
                   "unfused with them (W1 out of the fused projection)")
    p.add_argument("--peak_flops", type=float, default=0.0, help="device peak FLOP/s for MFU; 0 = from the GPU's name")
    p.add_argument("--compile_mode", choices=COMPILE_MODES, default="default", help="torch.compile's mode")
    p.add_argument("--splits", default="", help="micro-batch x accumulation splits of one global batch, a row "
                   "each, e.g. 12x4,24x2,48x1; default: --batch_size x --gradient_accumulation_steps")
    p.add_argument("--profile", action="store_true", help="print each row's top 40 kernels over one "
                   "step, a matmul's with its FLOPs and TFLOP/s")
    p.add_argument("--plain", action="store_true", help="add 'linear plain': linear's model and compiled graph "
                   "stepped by a minimal loop, the reference for train.py's path")
    args = p.parse_args()
    if not args.modes.startswith("linear"):
        p.error("--modes must start with linear: every ratio is taken against it")
    if (args.cat_copies or args.inductor) and not args.compile:
        p.error(f"{'--cat_copies' if args.cat_copies else '--inductor'} changes how inductor compiles: add --compile")
    query_modes(p, args)
    device, dtype, autocast = resolve_device(args)
    cuda = device.startswith("cuda")
    args.size = args.size or ("gpt2" if cuda else "cpu")
    rounds = args.rounds or (30 if cuda else 5)
    peak = args.peak_flops or peak_flops(device)

    specs, split_list = variants(args), splits(args, p)
    at = lambda name, b, a: f"{name} {b}x{a}" if args.splits else name  # noqa: E731
    rows = {at(name, b, a): (name, (b, a)) for name in specs for b, a in split_list}
    if args.plain:  # after linear's rows, whose models they share
        rows = {**rows, **{at("linear plain", b, a): ("linear plain", (b, a)) for b, a in split_list}}
    fresh_compiler(len(specs) * len(split_list))
    models, steps, persistent, first, built = {}, {}, {}, {}, {}
    for row, (name, split) in rows.items():
        if name == "linear plain":
            model, compiled, optimizers = built[at("linear", *split)]
            step = make_plain_step(model, compiled, optimizers, micro_batches(split, model.config, device), dtype,
                                   autocast)
        else:
            model, compiled, optimizers = built[row] = build(args, specs[name], device)
            step = make_step(model, compiled, optimizers, micro_batches(split, model.config, device), dtype, autocast)
        for _ in range(args.warmup):
            first.setdefault(row, timed(step, device))
        models[row], steps[row] = model, step
        if cuda:  # parameters + the optimizers' states, which the step's own peak does not show
            persistent[row] = sum(t.numel() * t.element_size() for t in model.parameters()) + sum(
                t.numel() * t.element_size() for opt in optimizers for s in opt.state.values() for t in s.values()
                if torch.is_tensor(t))
    times = interleaved(steps, rounds, device)

    peak_mib = {}
    for row, (name, split) in rows.items():
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            steps[row]()
            peak_mib[row] = (torch.cuda.max_memory_allocated(device) - base + persistent[row]) / 2**20
        else:
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                peak_mib[row] = pool.apply(cpu_peak_mib, (args, specs.get(name, specs["linear"]), split,
                                                            name == "linear plain"))

    cfg = next(iter(models.values())).config
    batch_size, accumulation = split_list[0]
    tokens = accumulation * batch_size * cfg.block_size  # per step, the same for every split
    batches = (", ".join(f"{b} x {a}" for b, a in split_list) + f" (micro-batch x accumulation) of "
               f"{batch_size * accumulation} sequences" if args.splits
               else f"{accumulation} micro-batches of {batch_size} sequences")
    print(header(f"Training step, {args.recipe} recipe: {cfg.n_layer} layers, d={cfg.n_embd}, block {cfg.block_size}, "
                 f"{batches}, {rounds} rounds", device, dtype,
                 f"True, mode {args.compile_mode}" if args.compile else False, command_line()))
    print("| variant | non-emb params | compile s | ms/step (min) | tokens/s | MFU | peak MiB | vs linear |")
    print("|---|---|---|---|---|---|---|---|")
    utils = {}
    for row, model in models.items():
        name, (b, a) = rows[row]
        med, low = statistics.median(times[row]), min(times[row])
        util = mfu(model.flops_per_token(), tokens / med, peak)
        util = utils[row] = f"{100 * util:.1f}%" if util is not None else "-"
        compile_s = f"{first[row] - med:.1f}" if args.compile and row in first else "-"
        linear = f"linear {b}x{a}" if args.splits else "linear"
        print(f"| {row} | {model.get_num_params():,} | {compile_s} | {1000 * med:.1f} ({1000 * low:.1f}) "
              f"| {tokens / med:,.0f} | {util} | {peak_mib[row]:,.0f} | {paired_ratio(times, row, linear):.3f} |")
    print("\n### targets: each mode's best row that train.py can run, kernels or not\n")
    print("| mode | best row | ms/step | MFU | vs linear's best |")
    print("|---|---|---|---|---|")
    row_modes = {row: target_mode(name, specs.get(name, {})) for row, (name, _) in rows.items()}
    for mode, row, ratio in best_of_modes(row_modes, times):
        print(f"| {mode} | {row} | {1000 * statistics.median(times[row]):.1f} | {utils[row]} | {ratio:.3f} |")
    if args.profile:  # every row profiled before any is printed: the profiler's own lines go out first
        what = "self CUDA time per kernel" if cuda else "self CPU time per operator"
        for row, kernels in {row: top_kernels(step, device) for row, step in steps.items()}.items():
            print(f"\n### top kernels: {row} (one step, {what})\n")
            print("| kernel | launched by (input shapes) | calls | self ms | share | TFLOP | TFLOP/s |")
            print("|---|---|---|---|---|---|---|")
            for kernel, by, calls, ms, share, flops in kernels:
                rate = f"{flops / 1e12:.4g} | {flops / ms / 1e9:.4g}" if flops else "- | -"  # tiny or GPT-2 sized
                print(f"| {kernel.replace('|', '/')[:100]} | {by.replace('|', '/')[:100]} | {calls} | {ms:.2f} "
                      f"| {100 * share:.1f}% | {rate} |")


if __name__ == "__main__":
    main()
