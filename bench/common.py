"""Shared pieces of the bench/ scripts: device flags, timing, and the header every table carries.

The scripts run as `python bench/NAME.py` from a checkout that need not be installed (a fresh GPU machine's):
Python puts bench/ on sys.path, and importing this module puts the repo root beside it, so that `model` and
`nonlinear_queries` come from this checkout. Every bench script imports it before either."""

import argparse
import os
import platform
import statistics
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # `python bench/NAME.py` puts bench/ on the path, not the root
    sys.path.insert(1, REPO)

# the root is on the path now
from nonlinear_queries.errors import SetupError  # noqa: E402
from nonlinear_queries.runtime.processes import DTYPES, setup  # noqa: E402


def parser(description, model=True):
    """argparse parser with --device and, for scripts that run a model, --dtype and --compile."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:1, ...")
    if model:
        p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                       help="autocast dtype; auto = bfloat16 on CUDA, float32 on CPU")
        p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                       help="torch.compile each model")
    return p


# the query modes of the paper and the official code; any other of QUERY_MODULES (res_linear, anchored_res_gelu,
# a mode added there) via --modes
DEFAULT_MODES = "linear,identity,res_gelu,residual"


def query_modes(p, args):
    """The list of args.modes (comma-separated); p.error names any that is not a query mode."""
    from model import QUERY_MODULES

    modes = args.modes.split(",")
    unknown = set(modes) - set(QUERY_MODULES)
    if unknown:
        p.error(f"unknown query modes {', '.join(sorted(unknown))}; valid: {', '.join(sorted(QUERY_MODULES))}")
    return modes


def resolve_device(args):
    """(device, dtype name, autocast context) from the parsed flags (processes.setup, in this
    process alone); exits with the message on a bad combination."""
    try:
        runtime = setup(args.device, getattr(args, "dtype", "auto"), join_process_group=False)
    except SetupError as e:
        sys.exit(f"error: {e}")
    return runtime.device, runtime.dtype, runtime.autocast


def fresh_compiler(n_models):
    """Reset torch.compile (torch._dynamo.reset(): no compiled code of an earlier bench in this
    process) and size its recompile limit for n_models compiled models that share GPT.forward.

    Each variant's model differs from the others in what dynamo guards on (its config), so each
    takes one entry of the code's cache; past recompile_limit entries (8 by default) dynamo would
    run the next variant eager, without a word, and time the wrong thing. The limit is raised to
    n_models and a variant past it raises (fail_on_recompile_limit_hit). The variants are timed
    in turns, so every one keeps its compiled code to the end: resetting between them would
    compile again inside the timed rounds."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.config.recompile_limit = max(8, n_models)  # 8: dynamo's default
    torch._dynamo.config.fail_on_recompile_limit_hit = True


def device_name(device):
    """The GPU's name, or the CPU model and the number of threads torch uses."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {torch.get_num_threads()} threads"


def proc_status_kib(field):
    """A memory field of /proc/self/status (VmRSS, VmHWM: peak RSS, ...) in KiB. Linux only."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def sync(device):
    """Wait for queued device work, so wall-clock time covers it."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def timed(fn, device):
    """Seconds that fn() takes, device work included."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def interleaved(fns, rounds, device):
    """Time every fn of the dict once per round, in forward order on even rounds and
    reverse order on odd ones (A B B A), so slow drift of a shared machine hits all
    alike. Returns {name: [seconds per round]}."""
    times = {name: [] for name in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            times[name].append(timed(fns[name], device))
    return times


def paired_ratio(times, name, ref):
    """Median over rounds of times[name][i] / times[ref][i]: a ratio taken within each
    round, so machine-wide slowdowns cancel."""
    return statistics.median(a / b for a, b in zip(times[name], times[ref]))


def header(title, device, dtype, compiled, command):
    """Lines that open every table: what was measured, on what, with what, by which command."""
    return "\n".join([
        f"## {title}",
        (f"device: {device_name(device)} | dtype: {dtype} | compile: {compiled} | "
         f"torch {torch.__version__} | python {platform.python_version()}"),
        f"command: {command}",
        "",
    ])


def command_line():
    """The command that ran this script, as a user would type it."""
    return "python " + " ".join([os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]])
