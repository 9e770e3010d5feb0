"""
Train a GPT whose attention query is chosen by `query_mode` (see model.py).

    python train.py config/res_gelu.py                        # the paper's best run, one GPU
    python train.py config/quickstart.py                      # small res_gelu model, CPU, minutes
    python train.py config/baseline.py --init_from=resume     # continue out_dir/ckpt.pt

Config files in config/ are plain Python assignments; --key=value overrides them (see
configurator.py). Every variant trains on the same pre-generated batches (batches.py),
evaluates train and val loss on the same fixed sequences every eval_interval steps,
appends every metric to out_dir/metrics.jsonl (and to wandb when wandb_log), and writes
out_dir/ckpt.pt atomically after each evaluation.

Step numbering: "step s" is the state after s optimizer updates. Evaluation runs at
every multiple of eval_interval and after the last update (step max_iters), so with
max_iters=60000 the paper's 59k and 60k evaluations are both logged.
"""

import json
import math
import os
import socket
import subprocess
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from urllib.parse import urlparse

import torch

from batches import get_batch, index_file, open_tokens
from configurator import config_from_argv
from model import GPT, GPTConfig, model_config_keys, peak_flops_for


@dataclass
class TrainConfig(GPTConfig):
    """Every training setting; the model fields are inherited from GPTConfig.
    Defaults are the paper's baseline (Table 1, first column) on OpenWebText."""

    # I/O
    out_dir: str = "out"
    overwrite: bool = False  # allow a scratch run to replace an existing run in out_dir
    eval_interval: int = 1000
    log_interval: int = 10
    eval_iters: int = 200  # eval batches of batch_size sequences: 200 x 12 = 2400 (paper §3.1)
    eval_only: bool = False
    init_from: str = "scratch"  # 'scratch' or 'resume' (from out_dir/ckpt.pt)
    # wandb
    wandb_log: bool = False
    wandb_project: str = "nonlinear-queries"
    wandb_group: str = ""
    wandb_run_name: str = ""  # '' = the name of the last config file
    # data
    dataset: str = "openwebtext"
    data_dir: str = ""  # '' = data/<dataset> next to this file
    data_seed: int = 1337  # batch order; the same for every model variant
    batch_size: int = 12  # micro-batch, sequences
    gradient_accumulation_steps: int = 40  # 12 x 40 x 1024 = 491,520 tokens per step
    # AdamW
    learning_rate: float = 6e-4
    max_iters: int = 60000
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping
    # learning-rate schedule: linear warmup, then cosine decay to min_lr at lr_decay_iters
    decay_lr: bool = True
    warmup_iters: int = 2000
    lr_decay_iters: int = 60000
    min_lr: float = 6e-5
    # system
    device: str = "auto"  # 'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1', ...
    dtype: str = "auto"  # 'auto' (bfloat16 on CUDA, float32 on CPU), 'float32', 'bfloat16', 'float16'
    compile: bool = True  # torch.compile the model
    seed: int = 1337  # model init and dropout
    peak_flops: float = 0.0  # device peak FLOP/s for MFU; 0 = look it up by GPU name

    def __post_init__(self):
        super().__post_init__()
        if self.init_from not in ("scratch", "resume"):
            raise ValueError(f"init_from must be 'scratch' or 'resume', got {self.init_from!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        for key in ("eval_interval", "log_interval", "eval_iters", "batch_size", "gradient_accumulation_steps"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")


cfg, config_files = config_from_argv(TrainConfig)
run_name = cfg.wandb_run_name or (os.path.splitext(os.path.basename(config_files[-1]))[0] if config_files else "train")
device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
device_type = "cuda" if device.startswith("cuda") else "cpu"
dtype = cfg.dtype if cfg.dtype != "auto" else ("bfloat16" if device_type == "cuda" else "float32")
if device_type == "cpu" and dtype != "float32":
    sys.exit(f"error: dtype={dtype} is for CUDA; train on the CPU with --dtype=float32")
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
autocast = nullcontext() if dtype == "float32" else torch.autocast(device_type=device_type, dtype=ptdtype)
if device_type == "cuda":
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
tokens_per_iter = cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size

ckpt_path = os.path.join(cfg.out_dir, "ckpt.pt")
if cfg.init_from == "scratch" and os.path.exists(ckpt_path) and not cfg.overwrite:
    sys.exit(
        f"error: {ckpt_path} already holds a run. Continue it with --init_from=resume, "
        f"choose another --out_dir, or pass --overwrite=True to replace it"
    )
if cfg.init_from == "resume" and not os.path.exists(ckpt_path):
    sys.exit(f"error: --init_from=resume but {ckpt_path} does not exist; start with --init_from=scratch")

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
    sys.exit(f"error: {e}")
meta_path = os.path.join(data_dir, "meta.json")
if os.path.exists(meta_path):
    with open(meta_path) as f:
        data_vocab = json.load(f)["vocab_size"]
    if data_vocab > cfg.vocab_size:
        sys.exit(f"error: the data uses {data_vocab} token ids but vocab_size={cfg.vocab_size}; raise vocab_size")

# ----------------------------------------------------------------------------------------
# model, optimizer, and the checkpoint to resume from
model_args = {k: getattr(cfg, k) for k in model_config_keys()}
torch.manual_seed(cfg.seed)
raw_model = GPT(GPTConfig(**model_args)).to(device)
optimizer = raw_model.configure_optimizers(cfg.weight_decay, cfg.learning_rate, (cfg.beta1, cfg.beta2), device_type)
start_step, wandb_id = 0, None
if cfg.init_from == "resume":
    ckpt = torch.load(ckpt_path, map_location=device, weights_only=True)
    for key, value in ckpt["model_args"].items():
        if model_args.get(key) != value:
            sys.exit(
                f"error: {ckpt_path} was trained with {key}={value!r} but the config asks for "
                f"{key}={model_args.get(key)!r}; use the run's own config to resume it"
            )
    raw_model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    start_step, wandb_id = ckpt["step"], ckpt["wandb_id"] or None
    torch.set_rng_state(ckpt["rng"]["cpu"].cpu())
    if device_type == "cuda" and ckpt["rng"]["cuda"] is not None:
        torch.cuda.set_rng_state(ckpt["rng"]["cuda"].cpu(), device)
    del ckpt
if start_step > cfg.max_iters:
    sys.exit(f"error: the checkpoint is at step {start_step}, past max_iters={cfg.max_iters}")
model = torch.compile(raw_model) if cfg.compile else raw_model
scaler = torch.amp.GradScaler(device_type, enabled=dtype == "float16")
peak_flops = cfg.peak_flops or (peak_flops_for(torch.cuda.get_device_name(device)) if device_type == "cuda" else None)
flops_per_iter = raw_model.flops_per_token() * tokens_per_iter

# ----------------------------------------------------------------------------------------
# logging: metrics.jsonl always, wandb when asked (never blocking on a missing network)
os.makedirs(cfg.out_dir, exist_ok=True)
metrics_path = os.path.join(cfg.out_dir, "metrics.jsonl")
if cfg.init_from == "scratch" and os.path.exists(metrics_path):
    os.remove(metrics_path)


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
    """Append one metrics record to metrics.jsonl and, if enabled, to wandb."""
    with open(metrics_path, "a") as f:
        f.write(json.dumps(record) + "\n")
    if wandb_run is not None and record["type"] in ("train", "eval"):
        wandb_run.log({f"{record['type']}/{k}": v for k, v in record.items() if k not in ("type", "step")},
                      step=record["step"])


wandb_run = None
if cfg.wandb_log:
    import wandb

    wandb_run = wandb.init(project=cfg.wandb_project, group=cfg.wandb_group or None, name=run_name,
                           config=asdict(cfg), dir=cfg.out_dir, mode=wandb_mode(), id=wandb_id, resume="allow")
    wandb_id = wandb_run.id

commit, dirty = git_state()
header = {
    "type": "config", "step": start_step, "run_name": run_name, "config_files": config_files, "argv": sys.argv,
    "git_commit": commit, "git_dirty": dirty, "torch": torch.__version__, "device": device,
    "dtype": dtype, "tokens_per_iter": tokens_per_iter, "non_embedding_params": raw_model.get_num_params(),
    "config": asdict(cfg),
}
log(header)
with open(os.path.join(cfg.out_dir, "config.json"), "w") as f:
    json.dump(header, f, indent=2)
print(json.dumps(asdict(cfg), indent=2))
print(f"{run_name}: query_mode={cfg.query_mode}, {raw_model.get_num_params():,} non-embedding parameters, "
      f"{tokens_per_iter:,} tokens per step, device {device} ({dtype})")

# ----------------------------------------------------------------------------------------


def get_lr(step):
    """Learning rate for the update that takes step -> step + 1: linear warmup over
    warmup_iters, cosine decay to min_lr at lr_decay_iters, then min_lr (SPEC §3)."""
    if not cfg.decay_lr:
        return cfg.learning_rate
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / (cfg.warmup_iters + 1)
    if step >= cfg.lr_decay_iters:
        return cfg.min_lr
    ratio = (step - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


@torch.no_grad()
def evaluate():
    """Mean loss over the fixed train_eval and val_eval batches (the same at every eval)."""
    model.eval()
    out = {}
    for split, data, idx in (("train", train_data, train_eval_idx), ("val", val_data, val_eval_idx)):
        total = torch.zeros((), device=device)
        for k in range(cfg.eval_iters):
            x, y = get_batch(data, idx[k], T, device)
            with autocast:
                _, loss = model(x, y)
            total += loss.float()
        out[split] = total.item() / cfg.eval_iters
    model.train()
    return out


def save_checkpoint(step):
    """Write out_dir/ckpt.pt atomically: a temp file, fsynced, then renamed over the old one."""
    ckpt = {
        "model": raw_model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "model_args": model_args,
        "step": step,
        "config": asdict(cfg),
        "wandb_id": wandb_id or "",
        "rng": {"cpu": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state(device) if device_type == "cuda" else None},
    }
    tmp = ckpt_path + ".tmp"
    torch.save(ckpt, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, ckpt_path)


# ----------------------------------------------------------------------------------------
# training loop
step = start_step
t_start = t_last = time.time()
steps_since_log = 0
while True:
    # evaluate and checkpoint (a resumed run already logged its first step before saving)
    already_logged = cfg.init_from == "resume" and step == start_step and not cfg.eval_only
    if (step % cfg.eval_interval == 0 or step == cfg.max_iters or cfg.eval_only) and not already_logged:
        losses = evaluate()
        print(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        log({"type": "eval", "step": step, "train_loss": losses["train"], "val_loss": losses["val"]})
        if step > 0 and not cfg.eval_only:
            save_checkpoint(step)
            print(f"saved checkpoint to {ckpt_path}")
        t_last = time.time()
    if step >= cfg.max_iters or cfg.eval_only:
        break

    lr = get_lr(step)
    for group in optimizer.param_groups:
        group["lr"] = lr
    row = train_idx[step]
    x, y = get_batch(train_data, row[:B], T, device)
    loss_sum = torch.zeros((), device=device)
    for micro in range(cfg.gradient_accumulation_steps):
        with autocast:
            _, loss = model(x, y)
        if micro + 1 < cfg.gradient_accumulation_steps:
            # fetch the next micro-batch while the device works on this one
            x, y = get_batch(train_data, row[(micro + 1) * B : (micro + 2) * B], T, device)
        loss_sum += loss.detach().float()
        scaler.scale(loss / cfg.gradient_accumulation_steps).backward()
    if cfg.grad_clip > 0:
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(raw_model.parameters(), cfg.grad_clip)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    step += 1
    steps_since_log += 1

    if step % cfg.log_interval == 0:
        # the logged loss is the mean over all micro-batches of the step, so runs with
        # different gradient accumulation are comparable
        train_loss = loss_sum.item() / cfg.gradient_accumulation_steps
        dt = (time.time() - t_last) / steps_since_log
        t_last, steps_since_log = time.time(), 0
        record = {"type": "train", "step": step, "loss": train_loss, "lr": lr,
                  "ms_per_step": 1000 * dt, "tokens_per_s": tokens_per_iter / dt}
        if cfg.grad_clip > 0:
            record["grad_norm"] = grad_norm.item()
        line = (f"step {step}: loss {train_loss:.4f}, lr {lr:.3e}, {1000 * dt:.0f} ms/step, "
                f"{tokens_per_iter / dt:,.0f} tokens/s")
        if peak_flops:
            record["mfu"] = flops_per_iter / dt / peak_flops
            line += f", MFU {100 * record['mfu']:.1f}%"
        print(line)
        log(record)

print(f"done: step {step}, {time.time() - t_start:.0f} s of training and evaluation")
if wandb_run is not None:
    wandb_run.finish()
