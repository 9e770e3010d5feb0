"""
Train a GPT whose attention query is chosen by `query_mode` (see model.py).

    python train.py config/res_gelu.py                        # the paper's best run, one GPU
    torchrun --standalone --nproc_per_node=8 train.py config/res_gelu.py   # the same run on 8 GPUs
    python train.py config/quickstart.py                      # small res_gelu model, CPU, minutes
    python train.py config/baseline.py --init_from=resume     # continue out_dir/ckpt.pt

Config files in config/ are plain Python assignments; --key=value overrides them (see
configurator.py); every setting, its default and its check is in train_config.py. Every variant trains on the same pre-generated batches (batches.py),
evaluates train and val loss on the same fixed sequences every eval_interval steps,
appends every metric to out_dir/metrics.jsonl (and to wandb when wandb_log), and writes
a checkpoint atomically after each evaluation.

Processes: under torchrun (PyTorch DDP) step i still trains on row i of the train index,
batch_size x gradient_accumulation_steps sequences; rank r of W takes the r-th contiguous
W-th of the row as gradient_accumulation_steps / W micro-batches. Gradients are averaged
over the ranks once per step, the logged loss is the mean over the whole row, the
evaluation batches are shared out over the ranks, and only rank 0 writes. So 1, 2 or 8
processes train on the same tokens and log the same losses.

Faults: SIGTERM or SIGINT finishes the current step, writes a checkpoint and exits 0. A
non-finite loss or gradient norm, or a loss above divergence_threshold for
divergence_patience consecutive steps, stops the run before that step's update with a
`diverged` record in metrics.jsonl; the checkpoints on disk are left as they were.
Exit status: 0 finished, or stopped by a signal with a checkpoint written; 1 error;
2 config error; 3 diverged.

Step numbering: "step s" is the state after s optimizer updates. Evaluation runs at
every multiple of eval_interval and after the last update (step max_iters), so with
max_iters=60000 the paper's 59k and 60k evaluations are both logged.
"""

import json
import math
import os
import pickle
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from urllib.parse import urlparse

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from batches import (
    file_fingerprint,
    fingerprint_change,
    get_batch,
    index_file,
    index_fingerprint,
    open_tokens,
)
from configurator import config_from_argv
from model import GPT, GPTConfig, model_config_keys, peak_flops_for
from train_config import TrainConfig


cfg, config_files = config_from_argv(TrainConfig)
run_name = cfg.wandb_run_name or (os.path.splitext(os.path.basename(config_files[-1]))[0] if config_files else "train")

# processes: torchrun sets RANK, LOCAL_RANK and WORLD_SIZE; `python train.py` is rank 0 of 1
ddp = "RANK" in os.environ
rank, local_rank, world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE")) if ddp else (0, 0, 1)
master = rank == 0


def die(message):
    """Exit with status 1 and an error message, printed once per machine (every rank runs the same checks)."""
    if local_rank == 0:
        print(f"error: {message}", file=sys.stderr)
    if ddp and dist.is_initialized():
        dist.destroy_process_group()
    sys.exit(1)


device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
device_type = "cuda" if device.startswith("cuda") else "cpu"
if ddp and device_type == "cuda":
    device = f"cuda:{local_rank}"
    torch.cuda.set_device(device)
backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device_type == "cuda" else "gloo")
if ddp and backend == "nccl" and device_type != "cuda":
    die("backend=nccl needs CUDA devices; use --backend=gloo on the CPU")
if cfg.gradient_accumulation_steps % world_size:
    die(f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} is not divisible by the {world_size} "
        f"processes; each process runs gradient_accumulation_steps / {world_size} of the step's micro-batches. "
        f"Choose a multiple of {world_size} (and adjust batch_size to keep the tokens per step)")
micro_steps = cfg.gradient_accumulation_steps // world_size  # per process
dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if device_type == "cuda" else "float32")
if device_type == "cpu" and dtype != "float32":
    die(f"dtype={dtype} is for CUDA; train on the CPU with --dtype=float32")
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
autocast = nullcontext() if dtype == "float32" else torch.autocast(device_type=device_type, dtype=ptdtype)
if device_type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size


# checkpoints: out_dir/ckpt_<step>.pt for the newest keep_last_n steps and save_checkpoint_steps,
# and out_dir/ckpt.pt, the newest of them (the same file under a second name)
ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
CHECKPOINT_KEYS = {"model", "optimizer", "model_args", "step", "evaluated", "steps_above_threshold", "data", "wandb_id"}


def step_checkpoints():
    """[(step, path)] of the step checkpoints in out_dir, newest first."""
    names = os.listdir(cfg.out_dir) if os.path.isdir(cfg.out_dir) else []
    found = [(int(m[1]), os.path.join(cfg.out_dir, n)) for n in names if (m := re.fullmatch(r"ckpt_(\d+)\.pt", n))]
    return sorted(found, reverse=True)


if cfg.init_from == "scratch" and (os.path.exists(ckpt_path) or step_checkpoints()) and not cfg.overwrite:
    die(f"{cfg.out_dir} already holds a run ({ckpt_path}). Continue it with --init_from=resume, "
        f"choose another --out_dir, or pass --overwrite=True to replace it")
resume_path = cfg.resume_from or ckpt_path
if cfg.init_from == "resume" and not os.path.isfile(resume_path):
    die(f"--init_from=resume but {resume_path} does not exist; start with --init_from=scratch")

# ----------------------------------------------------------------------------------------
# data: token memmaps and the fixed batch index streams (batches.py)
data_dir = cfg.data_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", cfg.dataset)
prepare_cmd = f"python data/{cfg.dataset}/prepare.py"
try:
    train_data = open_tokens(os.path.join(data_dir, "train.bin"), prepare_cmd)
    val_data = open_tokens(os.path.join(data_dir, "val.bin"), prepare_cmd)
    index_dir, B, T = os.path.join(data_dir, "indices"), cfg.batch_size, cfg.block_size
    train_idx = index_file(index_dir, "train", cfg.data_seed, cfg.max_iters, B * cfg.gradient_accumulation_steps,
                           T, len(train_data))
    train_eval_idx = index_file(index_dir, "train_eval", cfg.data_seed, cfg.eval_iters, B, T, len(train_data))
    val_eval_idx = index_file(index_dir, "val_eval", cfg.data_seed, cfg.eval_iters, B, T, len(val_data))
except (FileNotFoundError, ValueError) as e:
    die(e)
meta_path = os.path.join(data_dir, "meta.json")
if os.path.exists(meta_path):
    with open(meta_path) as f:
        data_vocab = json.load(f)["vocab_size"]
    if data_vocab > cfg.vocab_size:
        die(f"the data uses {data_vocab} token ids but vocab_size={cfg.vocab_size}; raise vocab_size")
# what the run trains and evaluates on, recorded in every checkpoint and compared on resume
data_paths = {"train.bin": train_data.filename, "val.bin": val_data.filename, "train index": train_idx.filename,
              "train_eval index": train_eval_idx.filename, "val_eval index": val_eval_idx.filename}
data_fingerprint = {
    "train.bin": file_fingerprint(train_data.filename), "val.bin": file_fingerprint(val_data.filename),
    "train index": index_fingerprint(train_idx), "train_eval index": index_fingerprint(train_eval_idx),
    "val_eval index": index_fingerprint(val_eval_idx),
}

# ----------------------------------------------------------------------------------------
# model, optimizer, and the checkpoint to resume from
model_args = {k: getattr(cfg, k) for k in model_config_keys()}
torch.manual_seed(cfg.seed)
raw_model = GPT(GPTConfig(**model_args)).to(device)
optimizer = raw_model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type)
start_step, wandb_id, resumed_after_eval, steps_above_threshold = 0, None, False, 0
if cfg.init_from == "resume":
    try:
        ckpt = torch.load(resume_path, map_location=device, weights_only=True)
        missing = CHECKPOINT_KEYS - set(ckpt if isinstance(ckpt, dict) else ())
        if missing:
            raise KeyError(f"no {', '.join(sorted(missing))}")
    # a truncated file, a torn zip archive, a pickle that is not a checkpoint of train.py
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, pickle.UnpicklingError) as e:
        others = [p for _, p in step_checkpoints() if not os.path.samefile(p, resume_path)]
        hint = (f"Checkpoints in {cfg.out_dir}: {', '.join(others)}; resume from one with --resume_from=PATH"
                if others else f"There is no other checkpoint in {cfg.out_dir}")
        die(f"cannot read checkpoint {resume_path}: it is truncated or corrupt ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''}). {hint}")
    for key, value in ckpt["model_args"].items():
        if model_args.get(key) != value:
            die(f"{resume_path} was trained with {key}={value!r} but the config asks for "
                f"{key}={model_args.get(key)!r}; use the run's own config to resume it")
    for name, saved in ckpt["data"].items():
        change = fingerprint_change(saved, data_fingerprint[name])
        if change:
            die(f"{data_paths[name]} changed since {resume_path} was written ({change}), so the run would go on "
                f"with other tokens than it started with. Restore the run's data, or start a new run "
                f"(--init_from=scratch and another --out_dir)")
    raw_model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    start_step, wandb_id = ckpt["step"], ckpt["wandb_id"] or None
    resumed_after_eval, steps_above_threshold = ckpt["evaluated"], ckpt["steps_above_threshold"]
    del ckpt
if start_step > cfg.max_iters:
    die(f"the checkpoint is at step {start_step}, past max_iters={cfg.max_iters}")
model = torch.compile(raw_model) if cfg.compile else raw_model
train_model = model  # what the training step calls: under torchrun, the DDP wrapper
if ddp:
    dist.init_process_group(backend=backend, device_id=torch.device(device) if device_type == "cuda" else None)
    train_model = DDP(model, device_ids=[local_rank] if device_type == "cuda" else None)
scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
peak_flops = cfg.peak_flops or (peak_flops_for(torch.cuda.get_device_name(device)) if device_type == "cuda" else None)
flops_per_iter = raw_model.flops_per_token() * tokens_per_iter

# ----------------------------------------------------------------------------------------
# logging: metrics.jsonl always, wandb when asked (never blocking on a missing network); rank 0 only
os.makedirs(cfg.out_dir, exist_ok=True)
metrics_path = os.path.join(cfg.out_dir, "metrics.jsonl")
if master and cfg.init_from == "scratch":
    # a scratch run replaces the run in out_dir (allowed by --overwrite=True above)
    for path in [metrics_path, ckpt_path, *(p for _, p in step_checkpoints())]:
        if os.path.exists(path):
            os.remove(path)


def git_state():
    """(commit, dirty) of the code being run, or (None, None) outside a git checkout."""
    try:
        git = ["git", "-C", os.path.dirname(os.path.abspath(__file__))]
        commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
        status = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10).stdout.strip()
        return (commit, bool(status)) if commit else (None, None)
    except (OSError, subprocess.SubprocessError):
        return None, None


def wandb_mode():
    """WANDB_MODE if set; else 'online' only with an API key and a reachable server."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    import netrc

    url = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))
    host, port = url.hostname, url.port or (80 if url.scheme == "http" else 443)
    try:
        has_key = bool(os.environ.get("WANDB_API_KEY")) or netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        has_key = False
    if not has_key:
        print("wandb: no API key found, logging offline (sync later with `wandb sync`)")
        return "offline"
    try:
        socket.create_connection((host, port), timeout=3).close()
    except OSError:
        print(f"wandb: {host} unreachable, logging offline (sync later with `wandb sync`)")
        return "offline"
    return "online"


def log(record):
    """Append one metrics record to metrics.jsonl and, if enabled, to wandb (rank 0 only)."""
    if not master:
        return
    with open(metrics_path, "a") as f:
        f.write(json.dumps(record) + "\n")
    if wandb_run is not None and record["type"] != "config":
        wandb_run.log({f"{record['type']}/{k}": v for k, v in record.items() if k not in ("type", "step")},
                      step=record["step"])
        if record["type"] == "diverged":
            wandb_run.summary["diverged_step"] = record["step"]


wandb_run = None
if cfg.wandb_log and master:
    import wandb

    wandb_run = wandb.init(project=cfg.wandb_project, group=cfg.wandb_group or None, name=run_name,
                           config=asdict(cfg), dir=cfg.out_dir, mode=wandb_mode(), id=wandb_id, resume="allow")
    wandb_id = wandb_run.id

if master:
    commit, dirty = git_state()
    header = {
        "type": "config", "step": start_step, "run_name": run_name, "config_files": config_files, "argv": sys.argv,
        "git_commit": commit, "git_dirty": dirty, "torch": torch.__version__, "device": device,
        "world_size": world_size, "dtype": dtype, "tokens_per_iter": tokens_per_iter,
        "non_embedding_params": raw_model.get_num_params(), "config": asdict(cfg),
        "data": data_fingerprint,  # runs with equal fingerprints trained and evaluated on the same batches
    }
    log(header)
    with open(os.path.join(cfg.out_dir, "config.json"), "w") as f:
        json.dump(header, f, indent=2)
    print(json.dumps(asdict(cfg), indent=2))
    print(f"{run_name}: query_mode={cfg.query_mode}, {raw_model.get_num_params():,} non-embedding parameters, "
          f"{tokens_per_iter:,} tokens per step, device {device} ({dtype})"
          + (f" x {world_size} processes ({backend})" if ddp else ""))
    if cfg.init_from == "resume":
        print(f"resuming from {resume_path} at step {start_step}")

# ----------------------------------------------------------------------------------------


def get_lr(step):
    """Learning rate for the update that takes step -> step + 1: linear warmup over
    warmup_iters, then `lr_schedule`: cosine decay to min_lr at lr_decay_iters and min_lr
    after (SPEC §3), or linear decay to 0 at lr_decay_iters and 0 after (decay-to-zero)."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / (cfg.warmup_iters + 1)
    if step >= cfg.lr_decay_iters:
        return 0.0 if cfg.lr_schedule == "linear_to_zero" else cfg.min_lr
    ratio = (step - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    if cfg.lr_schedule == "linear_to_zero":
        return cfg.learning_rate * (1.0 - ratio)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


def dropout_seed(step, micro):
    """Seed of the dropout masks of global micro-batch `micro` of `step`: a function of
    (seed, step, micro) only, so the masks are the same for any number of processes and
    a resumed run needs no generator state."""
    return int(np.random.SeedSequence([cfg.seed, step, micro]).generate_state(1, np.uint64)[0])


@torch.no_grad()
def evaluate():
    """Mean loss over the fixed train_eval and val_eval batches (the same at every eval);
    rank r of W evaluates batches r, r + W, ... and the sums are all-reduced."""
    model.eval()
    out = {}
    for split, data, idx in (("train", train_data, train_eval_idx), ("val", val_data, val_eval_idx)):
        total = torch.zeros((), device=device)
        for k in range(rank, cfg.eval_iters, world_size):
            x, y = get_batch(data, idx[k], T, device)
            with autocast:
                _, loss = model(x, y)
            total += loss.float()
        if ddp:
            dist.all_reduce(total)
        out[split] = total.item() / cfg.eval_iters
    model.train()
    return out


def save_checkpoint(step, evaluated):
    """Write the checkpoint of `step` so that a crash at any moment leaves the previous one
    loadable: torch.save to ckpt.pt.tmp, fsync, rename over ckpt.pt (atomic; the previous
    checkpoint keeps its step name), add the step name as a hard link (no second copy on
    disk), fsync the directory so the renames survive a power loss, and only then delete
    the step checkpoints that keep_last_n and save_checkpoint_steps no longer keep."""
    ckpt = {
        "model": raw_model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "model_args": model_args,
        "step": step,
        "evaluated": evaluated,  # whether the eval of this step is in metrics.jsonl already
        "steps_above_threshold": steps_above_threshold,
        "config": asdict(cfg),
        "data": data_fingerprint,
        "wandb_id": wandb_id or "",
    }
    tmp = ckpt_path + ".tmp"
    torch.save(ckpt, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, ckpt_path)
    link = ckpt_path + ".link.tmp"
    if os.path.lexists(link):  # left by a crash in the next three lines
        os.remove(link)
    try:
        os.link(ckpt_path, link)
    except OSError:  # a file system without hard links: a second copy
        shutil.copyfile(ckpt_path, link)
        with open(link, "rb") as f:
            os.fsync(f.fileno())
    os.replace(link, os.path.join(cfg.out_dir, f"ckpt_{step:06d}.pt"))
    fd = os.open(cfg.out_dir, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    # checkpoints past `step` are left alone: they belong to a run resumed from an older checkpoint
    older = [(s, p) for s, p in step_checkpoints() if s <= step]
    for s, path in older[cfg.keep_last_n:]:
        if s not in cfg.save_checkpoint_steps:
            os.remove(path)


def resume_command():
    """The command line that continues this run from its checkpoint."""
    args = [a for a in sys.argv[1:] if not a.startswith(("--init_from=", "--resume_from=", "--overwrite="))]
    launcher = (f"torchrun --nproc_per_node={os.environ.get('LOCAL_WORLD_SIZE', world_size)} "
                "[your other torchrun options] " if ddp else "python ")
    return launcher + shlex.join([sys.argv[0], *args, "--init_from=resume"])


def shutdown(exit_code):
    """Close wandb and the process group, and exit."""
    if wandb_run is not None:
        wandb_run.finish(exit_code=exit_code)
    if ddp:
        dist.barrier()
        dist.destroy_process_group()
    sys.exit(exit_code)


# SIGTERM (preemption, a scheduler's time limit) and SIGINT (Ctrl-C) only raise a flag:
# the step in flight is finished, then every rank stops at the same step (see below)
stop_signal = None


def request_stop(signum, frame):
    """Signal handler: remember the signal; the training loop acts on it after the step."""
    global stop_signal
    stop_signal = signal.Signals(signum).name


signal.signal(signal.SIGTERM, request_stop)
signal.signal(signal.SIGINT, request_stop)

# ----------------------------------------------------------------------------------------
# training loop
step = start_step
last_ckpt_step = start_step if cfg.init_from == "resume" else None
t_start = t_last = time.time()
steps_since_log = 0
stopping = False
while True:
    # evaluate (unless the checkpoint we resumed from was written after this step's eval,
    # or a signal asks to stop fast) and checkpoint
    evaluated = False
    due = step % cfg.eval_interval == 0 or step == cfg.max_iters or cfg.eval_only
    if due and not stopping and not (step == start_step and resumed_after_eval and not cfg.eval_only):
        losses = evaluate()
        evaluated = True
        if master:
            print(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        log({"type": "eval", "step": step, "train_loss": losses["train"], "val_loss": losses["val"]})
    if (evaluated or stopping or step in cfg.save_checkpoint_steps) and step > start_step and not cfg.eval_only:
        if master:
            save_checkpoint(step, evaluated)
            print(f"saved checkpoint to {ckpt_path} (step {step})")
        last_ckpt_step = step
        t_last = time.time()
    if stopping:
        if master:
            print(f"stopped by {stop_signal or 'a signal to another process'} after step {step}; "
                  f"the checkpoint is {ckpt_path}. Resume with:\n  {resume_command()}")
        shutdown(0)
    if step >= cfg.max_iters or cfg.eval_only:
        break

    lr = get_lr(step)
    for group in optimizer.param_groups:
        group["lr"] = lr
    # this rank's contiguous share of the step's global batch (the whole row in one process)
    row = train_idx[step][rank * micro_steps * B : (rank + 1) * micro_steps * B]
    x, y = get_batch(train_data, row[:B], T, device)
    loss_sum = torch.zeros((), device=device)
    for micro in range(micro_steps):
        torch.manual_seed(dropout_seed(step, rank * micro_steps + micro))
        last = micro + 1 == micro_steps
        # gradients are all-reduced once per step, during the last micro-batch's backward
        with train_model.no_sync() if ddp and not last else nullcontext():
            with autocast:
                logits, loss = train_model(x, y)
            objective = loss  # the logged loss stays the cross-entropy; z-loss only joins the gradient
            if cfg.z_loss:  # PaLM's z-loss: pulls log Z, the log-partition of the softmax, towards 0
                objective = loss + cfg.z_loss * torch.logsumexp(logits.float(), dim=-1).pow(2).mean()
            del logits  # (B, T, vocab): not held through the next micro-batch's forward
            if not last:
                # fetch the next micro-batch while the device works on this one
                x, y = get_batch(train_data, row[(micro + 1) * B : (micro + 2) * B], T, device)
            loss_sum += loss.detach().float()
            # DDP averages over the ranks, so the mean over all micro-batches needs / micro_steps here
            scaler.scale(objective / micro_steps).backward()
    scaler.unscale_(optimizer)
    grads = [p.grad for p in raw_model.parameters() if p.grad is not None]
    grad_norm = torch.nn.utils.get_total_norm(grads)  # also without clipping: the divergence guard reads it
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grads_with_norm_(raw_model.parameters(), cfg.grad_clip, grad_norm)

    # One all-reduce: the global batch's loss (the logged loss is the mean over all its
    # micro-batches, so any accumulation or process count logs the same) and whether any
    # rank got a signal. Every rank then takes the same decisions.
    stats = torch.stack([loss_sum, torch.tensor(float(stop_signal is not None), device=device)])
    if ddp:
        dist.all_reduce(stats)
    loss_total, stop_votes = stats.tolist()
    train_loss, norm, stopping = loss_total / cfg.gradient_accumulation_steps, grad_norm.item(), stop_votes > 0

    # divergence guard, before the update, so a diverged step never reaches the weights
    above = cfg.divergence_threshold > 0 and train_loss > cfg.divergence_threshold
    steps_above_threshold = steps_above_threshold + 1 if above else 0
    if not math.isfinite(train_loss):
        diverged = f"the loss is {train_loss}"
    elif not math.isfinite(norm) and not scaler.is_enabled():  # float16's GradScaler skips such steps itself
        diverged = f"the gradient norm is {norm}"
    elif steps_above_threshold >= cfg.divergence_patience:
        diverged = (f"the loss has been above divergence_threshold={cfg.divergence_threshold} for "
                    f"{steps_above_threshold} steps (now {train_loss:.4f})")
    else:
        diverged = None
    if diverged:
        log({"type": "diverged", "step": step + 1, "reason": diverged, "loss": train_loss, "grad_norm": norm,
             "lr": lr, "last_checkpoint_step": last_ckpt_step})
        if master:
            kept = (f"the last checkpoint, {ckpt_path} (step {last_ckpt_step}), is untouched"
                    if last_ckpt_step is not None else "no checkpoint was written")
            print(f"diverged at step {step + 1}: {diverged}. The run stopped before applying that update; {kept}. "
                  f"A lower learning_rate or a larger warmup_iters may avoid it; metrics.jsonl records it as "
                  f"'diverged'.", file=sys.stderr)
        shutdown(3)

    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    steps_since_log += 1

    if step % cfg.log_interval == 0:
        dt = (time.time() - t_last) / steps_since_log
        t_last, steps_since_log = time.time(), 0
        record = {"type": "train", "step": step, "loss": train_loss, "lr": lr, "grad_norm": norm,
                  "ms_per_step": 1000 * dt, "tokens_per_s": tokens_per_iter / dt}
        line = (f"step {step}: loss {train_loss:.4f}, lr {lr:.3e}, {1000 * dt:.0f} ms/step, "
                f"{tokens_per_iter / dt:,.0f} tokens/s")
        if peak_flops:
            record["mfu"] = flops_per_iter / dt / (peak_flops * world_size)
            line += f", MFU {100 * record['mfu']:.1f}%"
        if master:
            print(line)
        log(record)

if master:
    print(f"done: step {step}, {time.time() - t_start:.0f} s of training and evaluation")
shutdown(0)
