"""
Checkpoints of train.py: listed, written atomically, and read back with every check.

Files in a run's out_dir: ckpt_<step>.pt (6 digits) for the newest keep_last_n steps and
for the save_checkpoint_steps, and ckpt.pt, the newest of them (the same file under a
second name). A checkpoint is a dict of tensors and plain containers, read with
torch.load(weights_only=True), which never unpickles arbitrary objects:

    model                   the model's state dict
    optimizer               a list of state dicts, one per optimizer of optimizers.py (a
                            single state dict in checkpoints written before Muon was added)
    model_args              the GPTConfig fields the model was built with
    step                    optimizer updates done
    evaluated               whether the evaluation of `step` is in metrics.jsonl already
    steps_above_threshold   the divergence guard's streak at `step`
    config                  the whole resolved training config
    data                    fingerprints of the token files and index streams (batches.py)
    wandb_id                the wandb run to continue, '' if none
"""

import math
import os
import pickle
import re
import shutil
from dataclasses import fields

import torch

from batches import fingerprint_change
from model import GPTConfig

CHECKPOINT_KEYS = {"model", "optimizer", "model_args", "step", "evaluated", "steps_above_threshold", "data", "wandb_id"}


class CheckpointError(Exception):
    """A checkpoint that cannot be read, or that does not belong to the run being resumed."""


def step_checkpoints(out_dir):
    """[(step, path)] of the ckpt_<step>.pt files in out_dir, newest first ([] if no out_dir)."""
    names = os.listdir(out_dir) if os.path.isdir(out_dir) else []
    found = [(int(m[1]), os.path.join(out_dir, n)) for n in names if (m := re.fullmatch(r"ckpt_(\d+)\.pt", n))]
    return sorted(found, reverse=True)


def save_checkpoint(out_dir, ckpt, keep_last_n, keep_steps=()):
    """Write the checkpoint dict `ckpt` (of step ckpt['step']) so that a crash at any moment
    leaves the previous one loadable: torch.save to ckpt.pt.tmp, fsync, rename over ckpt.pt
    (atomic; the previous checkpoint keeps its step name), add the step name as a hard link
    (no second copy on disk), fsync the directory so the renames survive a power loss, and
    only then delete the step checkpoints beyond the newest keep_last_n that are not in
    keep_steps. Checkpoints of later steps than ckpt['step'] are left alone: they belong to
    a run that was resumed from an older checkpoint. Returns the path of ckpt.pt."""
    step = ckpt["step"]
    path = os.path.join(out_dir, "ckpt.pt")
    tmp = path + ".tmp"
    torch.save(ckpt, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    link = path + ".link.tmp"
    if os.path.lexists(link):  # left by a crash in the next three lines
        os.remove(link)
    try:
        os.link(path, link)
    except OSError:  # a file system without hard links: a second copy
        shutil.copyfile(path, link)
        with open(link, "rb") as f:
            os.fsync(f.fileno())
    os.replace(link, os.path.join(out_dir, f"ckpt_{step:06d}.pt"))
    fd = os.open(out_dir, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    older = [(s, p) for s, p in step_checkpoints(out_dir) if s <= step]
    for s, old in older[keep_last_n:]:
        if s not in keep_steps:
            os.remove(old)
    return path


def _unreadable(path, e):
    """The CheckpointError for a file at `path` that torch.load or the key check refused with
    `e`, naming the other checkpoints of its directory to resume from instead."""
    out_dir = os.path.dirname(path) or "."
    others = [p for _, p in step_checkpoints(out_dir) if not os.path.samefile(p, path)]
    hint = (f"Checkpoints in {out_dir}: {', '.join(others)}; resume from one with --resume_from=PATH"
            if others else f"There is no other checkpoint in {out_dir}")
    detail = str(e).splitlines()[0] if str(e) else ""
    objects = (", or it holds Python objects other than tensors and plain containers, which are never unpickled"
               if isinstance(e, pickle.UnpicklingError) else "")
    return CheckpointError(f"cannot read checkpoint {path}: it is truncated or corrupt{objects} "
                           f"({type(e).__name__}: {detail}). {hint}")


def load_checkpoint_file(path, map_location="cpu"):
    """What torch.load(path, weights_only=True) reads: tensors and plain containers only, never
    arbitrary pickled objects. Raises CheckpointError if the file is missing, truncated, corrupt
    or holds other objects; the message lists the other checkpoints in its directory."""
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    # a truncated file, a torn zip archive, a pickle of objects that weights_only refuses
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as e:
        raise _unreadable(path, e) from None


def upgrade_model_args(model_args):
    """model_args of a checkpoint, with what an older version of this repo left implicit made
    explicit: before `attn_scale` existed, identity and residual used 1/sqrt(head_dim), where
    today's default is their official 1/2 of it (model.py), so such a run keeps its scale."""
    args = dict(model_args)
    if "attn_scale" not in args and args.get("query_mode") in ("identity", "residual") and not args.get("qk_norm"):
        args["attn_scale"] = 1 / math.sqrt(args["n_embd"] // args["n_head"])
    return args


def read_checkpoint(path, map_location="cpu"):
    """The checkpoint dict of a file written by save_checkpoint (load_checkpoint_file, then
    upgrade_model_args). Raises CheckpointError if the file is missing, truncated, corrupt or
    not a checkpoint of train.py; the message lists the other checkpoints in its directory."""
    ckpt = load_checkpoint_file(path, map_location)
    missing = CHECKPOINT_KEYS - set(ckpt if isinstance(ckpt, dict) else ())
    if missing:
        raise _unreadable(path, KeyError(f"no {', '.join(sorted(missing))}"))
    ckpt["model_args"] = upgrade_model_args(ckpt["model_args"])
    return ckpt


def check_resumable(ckpt, path, model_settings, data_fingerprint, data_paths):
    """Raise CheckpointError unless the run in `ckpt` (read from `path`) can go on with this
    config: every model setting the config gives (model_settings, {GPTConfig field: value},
    e.g. TrainConfig.model_settings()) equal to the checkpoint's, and the same token files
    and index streams, by the fingerprints of batches.py. data_paths {name: file} names the
    files in the message."""
    trained = {**{f.name: f.default for f in fields(GPTConfig)}, **ckpt["model_args"]}
    for key, value in model_settings.items():
        if trained[key] != value:
            raise CheckpointError(f"{path} was trained with {key}={trained[key]!r} but the config asks for "
                                  f"{key}={value!r}; use the run's own config to resume it")
    for name, saved in ckpt["data"].items():
        change = fingerprint_change(saved, data_fingerprint[name])
        if change:
            raise CheckpointError(
                f"{data_paths[name]} changed since {path} was written ({change}), so the run would go on with "
                f"other tokens than it started with. Restore the run's data, or start a new run "
                f"(--init_from=scratch and another --out_dir)")
