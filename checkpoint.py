"""
Checkpoints of train.py: listed, written atomically, and read back with every check.

Files in a run's out_dir: ckpt_<step>.pt (6 digits) for the newest keep_last_n steps and
for the save_checkpoint_steps, and ckpt.pt, the newest of them (the same file under a
second name). A checkpoint is a dict of tensors and plain containers, read with
torch.load(weights_only=True), which never unpickles arbitrary objects:

    model, optimizer        state dicts
    model_args              the GPTConfig fields the model was built with
    step                    optimizer updates done
    evaluated               whether the evaluation of `step` is in metrics.jsonl already
    steps_above_threshold   the divergence guard's streak at `step`
    config                  the whole resolved training config
    data                    fingerprints of the token files and index streams (batches.py)
    wandb_id                the wandb run to continue, '' if none
"""

import os
import pickle
import re
import shutil

import torch

from batches import fingerprint_change

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


def read_checkpoint(path, map_location="cpu"):
    """The checkpoint dict of a file written by save_checkpoint, read with
    torch.load(weights_only=True). Raises CheckpointError if the file is missing, truncated,
    corrupt or not a checkpoint of train.py; the message lists the other checkpoints in
    the same directory to resume from instead."""
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
        missing = CHECKPOINT_KEYS - set(ckpt if isinstance(ckpt, dict) else ())
        if missing:
            raise KeyError(f"no {', '.join(sorted(missing))}")
    # a truncated file, a torn zip archive, a pickle that is not a checkpoint of train.py
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, pickle.UnpicklingError) as e:
        out_dir = os.path.dirname(path) or "."
        others = [p for _, p in step_checkpoints(out_dir) if not os.path.samefile(p, path)]
        hint = (f"Checkpoints in {out_dir}: {', '.join(others)}; resume from one with --resume_from=PATH"
                if others else f"There is no other checkpoint in {out_dir}")
        detail = str(e).splitlines()[0] if str(e) else ""
        raise CheckpointError(f"cannot read checkpoint {path}: it is truncated or corrupt "
                              f"({type(e).__name__}: {detail}). {hint}") from None
    return ckpt


def check_resumable(ckpt, path, model_args, data_fingerprint, data_paths):
    """Raise CheckpointError unless the run in `ckpt` (read from `path`) can go on with this
    config: the same model_args (the GPTConfig fields) and the same token files and index
    streams, by the fingerprints of batches.py. data_paths {name: file} names the files in
    the message."""
    for key, value in ckpt["model_args"].items():
        if model_args.get(key) != value:
            raise CheckpointError(f"{path} was trained with {key}={value!r} but the config asks for "
                                  f"{key}={model_args.get(key)!r}; use the run's own config to resume it")
    for name, saved in ckpt["data"].items():
        change = fingerprint_change(saved, data_fingerprint[name])
        if change:
            raise CheckpointError(
                f"{data_paths[name]} changed since {path} was written ({change}), so the run would go on with "
                f"other tokens than it started with. Restore the run's data, or start a new run "
                f"(--init_from=scratch and another --out_dir)")
