"""
Training speed of every query mode (and the MLP4.75 control), measured side by side.

    python bench/train_speed.py                                      # CPU: 6 x 384, block 256
    python bench/train_speed.py --size=gpt2 --compile --device=cuda  # GPT-2 small, bf16
    python bench/train_speed.py --recipe=modern                      # RoPE, RMSNorm, ReLU^2, QK-norm, Muon

One full training step per variant and round, as train.py runs it (training.train_step):
forward and backward over each of gradient_accumulation_steps micro-batches of batch_size
sequences of random tokens (the gradients accumulate), one gradient clipping, and the optimizer
step of train.py's own optimizer setup (optimizers.build_optimizers). The accumulation is the
size preset's (the paper's 40 at --size=gpt2, 2 on the CPU) unless --gradient_accumulation_steps
sets it. --recipe picks the model options and the
optimizers: 'gpt2' those of config/baseline.py (the paper's: AdamW), 'modern' those of
config/modern/baseline.py (README "The modern recipe": Muon for the blocks' matrices); the
size comes from --size, whichever the recipe. The variants take turns within each round (A B C ... C B A), so a shared
machine's drift falls on all of them alike. With --compile every variant keeps its own
compiled graph (common.fresh_compiler): a variant that would fall back to eager fails the bench. Columns:

- ms/step: median over rounds (min in brackets); tokens/s = gradient_accumulation_steps *
  batch_size * block_size / median, the one device's
- MFU: the model's training FLOPs per token (GPT.flops_per_token: 6 x its own matmul
  parameters + attention) x tokens/s / the device's peak, from the same timing as tokens/s;
  '-' when the peak is unknown (CPUs; pass --peak_flops to set one). bench/RESULTS.md says
  how it relates to the MFU train.py logs
- peak MiB: CUDA: the step's peak allocation above what the other variants hold, plus
  this variant's parameters and optimizer states; CPU: peak RSS growth of a fresh process
  that builds this variant alone and runs two steps
- vs linear: median over rounds of (this variant's time / linear's time in the same
  round); the target for res_gelu is at most 1.05 on the CPU, and at least 0.97x
  linear's tokens/s (ratio <= 1.03) on an H100/H200
"""

import multiprocessing
import os
import statistics

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
)
from model import GPT, GPTConfig
from nonlinear_queries.configurator import parse_config
from nonlinear_queries.optimizers import build_optimizers
from nonlinear_queries.runtime import mfu, peak_flops
from nonlinear_queries.train_config import TrainConfig
from nonlinear_queries.training import train_step

SIZES = {  # n_layer, n_head, n_embd, block_size, batch_size, gradient_accumulation_steps
    "cpu": (6, 6, 384, 256, 4, 2),
    "gpt2": (12, 12, 768, 1024, 12, 40),  # the paper's model, micro-batch and accumulation (config/baseline.py)
}
RECIPES = {"gpt2": "config/baseline.py", "modern": "config/modern/baseline.py"}
SIZE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size")


def recipe(name):
    """(model options, training config) of a recipe: the GPTConfig settings its config file
    gives, the size and the query left out (the bench sets them), and its TrainConfig, whose
    optimizer settings build_optimizers reads."""
    cfg, _ = parse_config(TrainConfig, [os.path.join(REPO, RECIPES[name])])
    options = {k: v for k, v in cfg.model_settings().items() if k not in (*SIZE_KEYS, "query_mode")}
    return options, cfg


def variants(args):
    """{name: GPTConfig overrides}: the --modes (linear first: the ratios refer to it),
    the MLP4.75 control, with --unfused the unfused projection of linear and res_gelu, and with
    --mup linear and res_gelu under μP (parametrization='mup' at mup_base_width 128: m = 6 at
    GPT-2 small; its own AdamW groups, logits x 1/m)."""
    modes = args.modes.split(",")
    out = {mode: {"query_mode": mode} for mode in modes}
    if not args.no_mlp475:
        out["mlp475"] = {"query_mode": "linear", "mlp_ratio": 4.75}
    if args.unfused:
        for mode in [m for m in ("linear", "res_gelu") if m in modes]:
            out[f"{mode} unfused"] = {"query_mode": mode, "fused_qkv": False}
    if args.mup:
        for mode in [m for m in ("linear", "res_gelu") if m in modes]:
            out[f"{mode} mup"] = {"query_mode": mode, "parametrization": "mup"}
    return out


def build(args, overrides, device):
    """(model, compiled model, optimizers) of one variant under args.recipe; every variant
    starts from seed 0."""
    options, cfg = recipe(args.recipe)
    n_layer, n_head, n_embd, block_size, _, _ = SIZES[args.size]
    config = GPTConfig(**{**options, **overrides}, n_layer=args.n_layer or n_layer, n_head=args.n_head or n_head,
                       n_embd=args.n_embd or n_embd, block_size=args.block_size or block_size,
                       vocab_size=args.vocab_size or 50304)
    torch.manual_seed(0)
    model = GPT(config).to(device)
    optimizers = build_optimizers(model, cfg, "cuda" if device.startswith("cuda") else "cpu")
    return model, torch.compile(model) if args.compile else model, optimizers


def make_step(model, compiled, optimizers, micro_batches, dtype, autocast):
    """One training step as train.py takes it: training.train_step over the micro-batches
    [(x, y), ...] (forward and backward of each, the gradients accumulated, then one clipping
    to norm 1.0), reading the loss and the norm back as train.py logs them, then each
    optimizer's step. dtype: the autocast dtype's name (float16 scales the loss, as in train.py)."""
    params = list(model.parameters())
    device_type = params[0].device.type
    scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
    seeds = list(range(len(micro_batches)))

    def step():
        loss_sum, grad_norm = train_step(compiled, params, optimizers, scaler, lambda k: micro_batches[k],
                                         len(micro_batches), autocast, seeds, grad_clip=1.0)
        loss_sum.item(), grad_norm.item()
        for optimizer in optimizers:
            scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        scaler.update()

    return step


def micro_batches(args, config, device):
    """gradient_accumulation_steps micro-batches (x, y) of random tokens, int64 (batch_size, block_size)
    each, the same for every variant."""
    g = torch.Generator().manual_seed(0)
    _, _, _, _, batch_size, accumulation = SIZES[args.size]
    batch_size, accumulation = args.batch_size or batch_size, args.gradient_accumulation_steps or accumulation
    xy = torch.randint(0, min(config.vocab_size, 50257), (accumulation, batch_size, config.block_size + 1),
                       generator=g).to(device)
    return [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in xy]


def cpu_peak_mib(args, overrides):
    """Peak RSS growth (MiB) of building one variant and running two steps, in this (fresh) process."""
    torch.set_num_threads(1)  # memory, not speed, is measured here
    before = proc_status_kib("VmRSS")
    model, compiled, optimizers = build(args, overrides, "cpu")
    _, dtype, autocast = resolve_device(args)
    step = make_step(model, compiled, optimizers, micro_batches(args, model.config, "cpu"), dtype, autocast)
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
    p.add_argument("--peak_flops", type=float, default=0.0, help="device peak FLOP/s for MFU; 0 = from the GPU's name")
    args = p.parse_args()
    if not args.modes.startswith("linear"):
        p.error("--modes must start with linear: every ratio is taken against it")
    query_modes(p, args)
    device, dtype, autocast = resolve_device(args)
    cuda = device.startswith("cuda")
    args.size = args.size or ("gpt2" if cuda else "cpu")
    rounds = args.rounds or (30 if cuda else 5)
    peak = args.peak_flops or peak_flops(device)

    specs = variants(args)
    fresh_compiler(len(specs))
    models, steps, persistent = {}, {}, {}
    for name, overrides in specs.items():
        model, compiled, optimizers = build(args, overrides, device)
        step = make_step(model, compiled, optimizers, micro_batches(args, model.config, device), dtype, autocast)
        for _ in range(args.warmup):
            step()
        models[name], steps[name] = model, step
        if cuda:  # parameters + the optimizers' states, which the step's own peak does not show
            persistent[name] = sum(t.numel() * t.element_size() for t in model.parameters()) + sum(
                t.numel() * t.element_size() for opt in optimizers for s in opt.state.values() for t in s.values()
                if torch.is_tensor(t))
    times = interleaved(steps, rounds, device)

    peak_mib = {}
    for name in specs:
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
            steps[name]()
            peak_mib[name] = (torch.cuda.max_memory_allocated(device) - base + persistent[name]) / 2**20
        else:
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                peak_mib[name] = pool.apply(cpu_peak_mib, (args, specs[name]))

    cfg = models["linear"].config
    batch_size = args.batch_size or SIZES[args.size][4]
    accumulation = args.gradient_accumulation_steps or SIZES[args.size][5]
    tokens = accumulation * batch_size * cfg.block_size  # per step
    print(header(f"Training step, {args.recipe} recipe: {cfg.n_layer} layers, d={cfg.n_embd}, block {cfg.block_size}, "
                 f"{accumulation} micro-batches of {batch_size} sequences, {rounds} rounds", device, dtype,
                 args.compile, command_line()))
    print("| variant | non-emb params | ms/step (min) | tokens/s | MFU | peak MiB | vs linear |")
    print("|---|---|---|---|---|---|---|")
    for name, model in models.items():
        med, low = statistics.median(times[name]), min(times[name])
        util = mfu(model.flops_per_token(), tokens / med, peak)
        util = f"{100 * util:.1f}%" if util is not None else "-"
        print(f"| {name} | {model.get_num_params():,} | {1000 * med:.1f} ({1000 * low:.1f}) | {tokens / med:,.0f} "
              f"| {util} | {peak_mib[name]:,.0f} | {paired_ratio(times, name, 'linear'):.3f} |")


if __name__ == "__main__":
    main()
