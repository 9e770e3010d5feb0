"""Helpers shared by the tests: the tiny training run, running the repo's programs as a user
would, readers of what a run writes (metrics.jsonl, markdown tables, .wandb files through wandb's reader), and the
hand-written references the model is held to (random parameters, causal attention written out).
tests/conftest.py keeps the fixtures and the environment every test runs in."""

import contextlib
import glob
import io
import json
import os
import runpy
import signal
import subprocess
import sys
import time

import torch

from nonlinear_queries.trainer.stopping import STOP_SIGNALS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Multithreaded CPU kernels may sum in another order when the machine is loaded: runs that
# are compared across processes, bit for bit or to 1e-6, use one thread.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# A tiny model that still uses the real GPT-2 vocabulary and real Shakespeare tokens.
TINY = [
    "--dataset=shakespeare", "--device=cpu", "--compile=False", "--n_layer=2", "--n_head=2",
    "--n_embd=32", "--block_size=32", "--batch_size=4", "--gradient_accumulation_steps=1",
    "--eval_iters=2", "--log_interval=1", "--warmup_iters=2", "--learning_rate=1e-3",
]


RUN_SCRIPT_TIMEOUT_S = 600


def run_script(script, *args, check=True, env=None, cwd=REPO):
    """Run a repo script (a path from the repo root, or "-m MODULE") with this interpreter, as a
    user would; returns the CompletedProcess (text output). check=True raises with the script's
    output if it exits non-zero; AssertionError, with its output, if it runs past RUN_SCRIPT_TIMEOUT_S
    seconds (it and every process it started are killed)."""
    command = script.split() if script.startswith("-m ") else [os.path.join(REPO, script)]
    # its own session, so that a timeout kills its children too (torchrun's workers, a sweep's points), which would
    # otherwise train on beside the tests that follow
    child = subprocess.Popen([sys.executable, *command, *args], cwd=cwd, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
                             start_new_session=True)
    try:
        out, err = child.communicate(timeout=RUN_SCRIPT_TIMEOUT_S)
    except BaseException as e:  # its timeout, or the test's (pytest-timeout) or a Ctrl-C: the program goes too
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        out, err = child.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            raise AssertionError(f"{script} {' '.join(args)} ran past {RUN_SCRIPT_TIMEOUT_S} s and was killed with "
                                 f"its children:\n{out}\n{err}") from None
        raise
    proc = subprocess.CompletedProcess(child.args, child.returncode, out, err)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_in_process(script, *args):
    """Run a repo script (a path from the repo root) as __main__ in this process with `args` as its command line:
    for its checks of the command line, or a run too short to pay for a subprocess and a second import of torch.
    Returns (exit status, stdout, stderr), the message of sys.exit("...") counted as stderr with status 1, as
    Python reports it."""
    # a root program run as __main__ may install its Ctrl-C handler (interrupt.py), train.py its stop handlers
    # (stopping.py): the test process's are put back, or a signal to it later would reach a program long ended
    out, err, argv = io.StringIO(), io.StringIO(), sys.argv
    handlers = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    sys.argv = [os.path.join(REPO, script), *map(str, args)]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        sys.argv = argv
        for s, handler in handlers.items():
            signal.signal(s, handler)
    if isinstance(code, str):
        return 1, out.getvalue(), err.getvalue() + code + "\n"
    return code or 0, out.getvalue(), err.getvalue()


def train(data_dir, out_dir, *args, check=True, env=None):
    """train.py on the TINY model with data_dir's tokens into out_dir, then `args`; env (e.g.
    ONE_THREAD, for runs compared with other runs to 1e-6) is added to the environment.
    Returns the CompletedProcess (see run_script)."""
    return run_script("train.py", *TINY, f"--data_dir={data_dir}", f"--out_dir={out_dir}", *args, check=check,
                      env=env)


def train_in_process(data_dir, out_dir, *args):
    """train.py's train() on the TINY model with data_dir's tokens into out_dir, then `args`, in this process,
    so that a test can patch what it calls (train.py's names, seen as the module `train`). The signal handlers
    the run installs are put back afterwards. Returns the exit status; raises what train() raises."""
    import importlib

    from nonlinear_queries.config.configurator import parse_config
    from nonlinear_queries.config.train_config import TrainConfig
    from nonlinear_queries.record.runs import RunDir
    from nonlinear_queries.runtime.processes import setup, teardown

    script = importlib.import_module("train")
    cfg, files = parse_config(TrainConfig, [*TINY, f"--data_dir={data_dir}", f"--out_dir={out_dir}", *args])
    runtime = setup(cfg.device, cfg.dtype, cfg.backend, parallelism=cfg.parallelism)
    handlers = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    try:
        return script.train(cfg, files, runtime, RunDir(cfg.out_dir))
    finally:
        teardown(runtime)
        for s, handler in handlers.items():
            signal.signal(s, handler)


def patched_train(path, prelude):
    """Write a script at `path` that runs the Python code `prelude` (which patches what train.py calls), then
    train.py as its __main__ with the script's arguments: a run a test changes from outside, in one process or
    in each of torchrun's. Returns the script's path."""
    with open(path, "w") as f:
        f.write(f"import runpy, sys\n{prelude}\n"
                f"sys.argv[0] = {os.path.join(REPO, 'train.py')!r}\nrunpy.run_path(sys.argv[0], run_name='__main__')\n")
    return str(path)


def read_metrics(out_dir, kind=None):
    """Records of out_dir/metrics.jsonl, optionally only those of one type."""
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if kind is None or r["type"] == kind]


def last_logged_step(out_dir):
    """The last train step in out_dir/metrics.jsonl while a run is writing it (0 before the first);
    a line not yet finished is left out."""
    path = os.path.join(out_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        records = [json.loads(line) for line in f if line.endswith("\n")]
    return max([r["step"] for r in records if r["type"] == "train"], default=0)


def wait_until(condition, timeout, what):
    """Poll `condition()` every 0.5 s until it is true; AssertionError naming `what` after `timeout` seconds."""
    start = time.time()
    while not condition():
        if time.time() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.5)


def losses_by_step(out_dir):
    """{step: logged training loss} of a run (a resumed run's later record of a step wins)."""
    return {r["step"]: r["loss"] for r in read_metrics(out_dir, "train")}


def val_losses_by_step(out_dir):
    """{step: val loss} of a run's evaluations."""
    return {r["step"]: r["val_loss"] for r in read_metrics(out_dir, "eval")}


def markdown_rows(stdout, first_header):
    """[{header: cell}] of the markdown table in stdout whose header row starts with
    `first_header`: its rows in order, up to the first line that is not one."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    headers = [c.strip() for c in lines[start].split("|")[1:-1]]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(headers, [c.strip() for c in line.split("|")[1:-1]])))
    return rows


def markdown_table(stdout, first_header):
    """{first cell: {header: cell}} of the markdown table in stdout whose header row starts
    with `first_header` (markdown_rows; a first cell repeated keeps its last row)."""
    return {row[first_header]: row for row in markdown_rows(stdout, first_header)}


def wandb_records(run_file):
    """The records of a .wandb file as wandb's own reader prints them, offline (`wandb leet inspect --json`: one
    JSON object a line, {"type": "run", "run": {...}}, {"type": "history", "history": {"item": {...}}}, ...)."""
    proc = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_file)],
                          capture_output=True, text=True, timeout=120, check=True)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def read_wandb_history(run_file):
    """History rows of a .wandb file, {key: value} with wandb's _step, read by wandb's reader (wandb_records)."""
    return [r["history"]["item"] for r in wandb_records(run_file) if r["type"] == "history"]


def randomize(module, seed=0, biases=True):
    """Give every parameter of `module` random values from `seed`, so that nothing is trivially 1 or 0:
    matrices N(0, 0.3^2), norm weights 1 + N(0, 0.3^2), biases N(0, 0.05^2) (constant over positions, large
    ones would swamp what differs from token to token), or zero with biases=False. Drawn in each
    parameter's dtype. Returns the module."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.05 if biases else torch.zeros_like(p))
            else:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return module


def reference_attention_logits(attn, x, q, scale, qk_norm=False, rope_theta=None):
    """The attention logits of one model.py attention layer (CausalSelfAttention) written out from
    its weights, independently of its forward: keys and values x W_K, x W_V from c_kv (its bias
    included); with qk_norm, q and k RMS-normalized per head (eps 1e-5) with q_norm's and k_norm's
    weights; with rope_theta, each head's dimension pairs (i, i + head_dim/2) turned as complex
    numbers by position * rope_theta^(-2i/head_dim) radians (RoPE); with grouped-query attention,
    each key/value head repeated for its n_head / n_kv_head query heads; then q k^T * scale, the
    future masked to -inf.

    x, q: (B, T, C), q being the query the caller writes out (for res_gelu, paper eq. 2-3's
    Q = (x + f(x)) / 2 with scale 1/sqrt(head_dim)). Returns logits (B, n_head, T, T) and
    v (B, n_head, T, head_dim)."""
    B, T, C = x.shape
    H, Hkv = attn.n_head, attn.n_kv_head
    D = C // H
    k, v = torch.nn.functional.linear(x, attn.c_kv.weight, attn.c_kv.bias).split(Hkv * D, dim=2)
    q = q.view(B, T, H, D).transpose(1, 2)
    k, v = (t.view(B, T, Hkv, D).transpose(1, 2) for t in (k, v))
    if qk_norm:
        q = q / torch.sqrt(q.pow(2).mean(-1, keepdim=True) + 1e-5) * attn.q_norm.weight
        k = k / torch.sqrt(k.pow(2).mean(-1, keepdim=True) + 1e-5) * attn.k_norm.weight
    if rope_theta is not None:
        angle = torch.arange(T, dtype=torch.float64)[:, None] * rope_theta ** -(torch.arange(0, D, 2) / D)
        turn = torch.polar(torch.ones_like(angle), angle)

        def rotate(t):
            z = torch.complex(t[..., : D // 2], t[..., D // 2 :])
            z = z * turn.to(z.dtype)
            return torch.cat([z.real, z.imag], dim=-1)

        q, k = rotate(q), rotate(k)
    k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
    future = ~torch.ones(T, T, dtype=torch.bool).tril()
    return (q @ k.transpose(-2, -1) * scale).masked_fill(future, -torch.inf), v


def reference_attention(attn, x, q, scale, qk_norm=False, rope_theta=None):
    """Causal softmax attention of one model.py attention layer written out: softmax of
    reference_attention_logits (same arguments) times v, heads joined, then c_proj.
    x, q: (B, T, C) -> (B, T, C)."""
    B, T, C = x.shape
    logits, v = reference_attention_logits(attn, x, q, scale, qk_norm, rope_theta)
    return attn.c_proj((torch.softmax(logits, dim=-1) @ v).transpose(1, 2).reshape(B, T, C))


def descendants(pid):
    """Process ids of every process that `pid` started, and those they started, from /proc's parent ids."""
    parents = {}
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                parents.setdefault(int(f.read().rsplit(")", 1)[1].split()[1]), []).append(int(stat.split("/")[2]))
        except OSError:  # a process that ended meanwhile
            continue
    family, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        family += children
        todo += children
    return family
