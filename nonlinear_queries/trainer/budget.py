"""
What a run will cost, known before its first step: a floor on the memory it needs, checked against
what the device has (a run that cannot fit is refused before any work), and on the CPU a floor on a
step's time, said before the first step when it is long; a run whose steps would take more than
SLOW_RUN_S at that floor is refused unless asked for (train.py's allow_slow).

Both are lower bounds, so neither refuses nor warns about a run that could fit or be quick:

- memory: the weights and gradients in float32 (8 bytes a parameter) and the optimizer's state (AdamW's
  two moments, 8 bytes; Muon's momentum, at least 4), divided over the processes under FSDP; plus one
  micro-batch's logits and their gradient (B x T x vocab_size each, in the compute dtype) and, per
  layer, the block's input and its attention and MLP inputs kept for the backward pass (at least
  MIN_SAVED_PER_LAYER values of n_embd per token; Korthikanti et al. 2022, "Reducing Activation
  Recomputation in Large Transformer Models", eq. 2, count 17 of them in 16-bit without recomputation),
  one per layer with activation checkpointing.
- CPU step time: the step's training FLOPs (GPT.flops_per_token() x tokens per step) at the rate this
  CPU's float32 matmuls reach on torch's threads, measured in a few milliseconds; a training step runs
  below that rate, so the true time is longer.
"""

import os
import sys
import time

import torch

from nonlinear_queries.errors import SetupError

# a week: what a CPU run may take, at least, before train.py asks for allow_slow. A CPU study's run takes minutes to
# hours; the paper's config takes decades on a CPU, a mistaken device or config, not a run anyone waits for
SLOW_RUN_S = 7 * 86400
MIN_SAVED_PER_LAYER = 4  # values of n_embd per token kept per layer: the block input, LN1's, LN2's, MLP's input
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def memory_floor(n_params, cfg, dtype, world_size=1):
    """A lower bound on one process's memory for a training run, in bytes. n_params: the model's parameters
    (all of them); cfg: the TrainConfig (batch_size, eval_batch_size, block_size, vocab_size, n_layer, n_embd,
    optimizer, parallelism, activation_checkpointing); dtype: the compute dtype's name (processes.Runtime.dtype).
    Returns (bytes, what they are: a short text for the error)."""
    state = n_params * (8 + (8 if cfg.optimizer == "adamw" else 4))
    if cfg.parallelism == "fsdp":
        state //= world_size
    tokens = max(cfg.batch_size, cfg.eval_batch_size) * cfg.block_size
    act = BYTES[dtype]
    logits = 2 * tokens * cfg.vocab_size * act
    saved = (1 if cfg.activation_checkpointing else MIN_SAVED_PER_LAYER) * cfg.n_layer * tokens * cfg.n_embd * act
    gib = 2**30
    return state + logits + saved, (f"{state / gib:.1f} GiB of weights, gradients and optimizer state, "
                                    f"{logits / gib:.1f} GiB of one micro-batch's logits and their gradient, "
                                    f"{saved / gib:.1f} GiB of its activations")


def device_memory(device):
    """The memory of `device` in bytes: a GPU's total, or for the CPU the machine's RAM capped by this
    process's cgroup limit (a container's or a SLURM job's), None where it cannot be read."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory
    if dev.type != "cpu":
        return None
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                limit = f.read().strip()
        except OSError:
            continue
        if limit.isdigit():
            total = min(total, int(limit))
    return total


def cpu_matmul_flops(n=512, repeats=4):
    """The FLOP/s of float32 (n x n) @ (n x n) matmuls on the CPU with torch's threads, the best of `repeats`
    after one warm-up: about what a GPT's largest kernels could reach here, so an upper bound on a step's rate."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / max(best, 1e-9)


def describe_duration(seconds):
    """`seconds` in the unit a person reads best: '42 s', '3.5 min', '7.2 h', '12.0 days', '3.1 years'."""
    # (unit, its seconds, from how many seconds on it is used)
    for unit, size, start in (("years", 365 * 86400, 2 * 365 * 86400), ("days", 86400, 2 * 86400),
                              ("h", 3600, 3600), ("min", 60, 60)):
        if seconds >= start:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"


def check_memory(cfg, runtime, model):
    """Refuse, before any work, a run whose memory floor (memory_floor) is above what the device has. cfg: the
    TrainConfig; runtime: processes.setup's processes (device, dtype, world_size); model: the GPT. Raises SetupError
    saying what to lower."""
    have = device_memory(runtime.device)
    need, parts = memory_floor(model.get_num_params(non_embedding=False), cfg, runtime.dtype, runtime.world_size)
    if have is not None and need > have:
        raise SetupError(
            f"this run needs at least {need / 2**30:.1f} GiB of memory per process ({parts}), more than the "
            f"{have / 2**30:.1f} GiB that {runtime.device} has; lower batch_size (a larger gradient_accumulation_steps "
            f"keeps the tokens per step), block_size or the model's size")


def check_cpu_time(cfg, runtime, model, steps):
    """On the CPU, before the run compiles or writes anything: refuse a run whose `steps` would take more than
    SLOW_RUN_S (a week), unless cfg.allow_slow, and say when one step takes more than a minute (on stderr, on rank
    0). The time is a floor: the step's FLOPs (model.flops_per_token() x the tokens per step of the TrainConfig
    cfg) at the rate this CPU's matmuls reach (cpu_matmul_flops), so the true time is longer. runtime: processes.setup's
    processes (device_type, master). Raises SetupError saying what to run instead."""
    if runtime.device_type != "cpu" or not steps:
        return
    step_flops = model.flops_per_token() * cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size
    seconds = step_flops / cpu_matmul_flops()
    step, total = describe_duration(seconds), describe_duration(seconds * steps)
    rate = f"{step_flops:.2g} FLOPs at the rate its float32 matmuls reach on {torch.get_num_threads()} threads"
    if seconds * steps > SLOW_RUN_S and not cfg.allow_slow:
        raise SetupError(f"on this CPU the {steps:,} steps of this run take at least {total} ({step} a step: {rate}), "
                         f"more than a week; this config is meant for a GPU: for a CPU run, use config/quickstart.py "
                         f"(minutes), or pass --allow_slow=True to start it anyway")
    if seconds > 60 and runtime.master:
        print(f"warning: on this CPU a step of this run takes at least {step} ({rate}), the {steps:,} steps left at "
              f"least {total}. For a CPU run, use config/quickstart.py (minutes); this config is meant for a GPU",
              file=sys.stderr)
