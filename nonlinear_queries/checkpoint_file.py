"""
A checkpoint file read: load_checkpoint_file, the repo's one torch.load (weights only: tensors and
plain containers, never arbitrary pickled objects), whose errors name the other checkpoints of the
run (step_checkpoints); upgrade_model_args, what an older version's model_args left implicit; and the
names of a run directory's checkpoints, spelled only here (latest_checkpoint_path, step_checkpoint_path,
has_checkpoint; runs.RunDir holds the run directory's other files).
Both sides read files through here, and neither through the other: checkpoint.py, which writes a
run's checkpoints and resumes from them, and pretrained.load_model, which loads a model from any
source. This module imports torch alone, so a program that only reads a model (sample.py,
export.py) imports no optimizer, batch or DCP code.
"""

import math
import os
import pickle
import re

import torch


class CheckpointError(Exception):
    """A checkpoint that cannot be read or written, or that does not belong to the run being resumed."""


# the newest checkpoint of a run directory as each parallelism writes it: one file (ddp) or a symbolic link to
# the newest sharded checkpoint directory (fsdp)
LATEST = {"ddp": "ckpt.pt", "fsdp": "ckpt.dcp"}
PREFIX = "ckpt"  # every checkpoint's name, and what a crash leaves of one, starts with it


def latest_checkpoint_path(out_dir, parallelism="ddp"):
    """The path of the newest checkpoint in the run directory out_dir as `parallelism` ('ddp' or 'fsdp')
    writes it: out_dir/ckpt.pt or out_dir/ckpt.dcp, whether or not it exists."""
    return os.path.join(out_dir, LATEST[parallelism])


def step_checkpoint_path(out_dir, step, kind=".pt"):
    """The path of the step checkpoint of `step` in out_dir: ckpt_<step, 6 digits><kind> (kind '.pt' or '.dcp')."""
    return os.path.join(out_dir, f"{PREFIX}_{step:06d}{kind}")


def is_partial_checkpoint(name):
    """Whether the file name `name` in a run directory is what a crash left of a checkpoint being written."""
    return name.startswith(PREFIX) and name.endswith((".tmp", ".old"))  # not yet renamed; being replaced


def has_checkpoint(out_dir):
    """Whether the run in out_dir has a checkpoint to resume from: ckpt.pt or ckpt.dcp (a link to a
    checkpoint that is there)."""
    return any(os.path.exists(latest_checkpoint_path(out_dir, p)) for p in LATEST)


def step_checkpoints(out_dir, kinds=(".pt",)):
    """[(step, path)] of the step checkpoints in out_dir, newest first ([] if no out_dir): the
    ckpt_<step>.pt files, and with kinds=(".pt", ".dcp") the ckpt_<step>.dcp directories too."""
    names = os.listdir(out_dir) if os.path.isdir(out_dir) else []
    pattern = rf"{PREFIX}_(\d+)({'|'.join(re.escape(k) for k in kinds)})"
    found = [(int(m[1]), os.path.join(out_dir, n)) for n in names if (m := re.fullmatch(pattern, n))]
    return sorted(found, reverse=True)


def unreadable_checkpoint(path, reason):
    """The CheckpointError `cannot read checkpoint PATH: REASON.`, naming the other checkpoints of its
    directory to resume from instead."""
    out_dir = os.path.dirname(path) or "."
    others = [p for _, p in step_checkpoints(out_dir, (".pt", ".dcp"))
              if not (os.path.exists(path) and os.path.samefile(p, path))]
    hint = (f" Checkpoints in {out_dir}: {', '.join(others)}; resume from one with --resume_from=PATH" if others
            # another file (a Hugging Face directory's pytorch_model.bin) has no checkpoints beside it to offer
            else f" There is no other checkpoint in {out_dir}" if os.path.basename(path).startswith(PREFIX) else "")
    return CheckpointError(f"cannot read checkpoint {path}: {reason}.{hint}")


def load_checkpoint_file(path, map_location="cpu", mmap=False):
    """What torch.load(path, weights_only=True) reads: tensors and plain containers only, never
    arbitrary pickled objects; mmap=True maps the tensors instead of reading them. Raises
    CheckpointError if the file is missing, truncated, corrupt or holds other objects; the
    message says which in our words and lists the other checkpoints in its directory."""
    if not os.path.isfile(path):
        raise CheckpointError(f"no checkpoint at {path}")
    # torch's messages are not passed on: the one for a file weights_only refuses advises loading it with
    # weights_only=False, which runs whatever code the file holds
    try:
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError:  # bytes that are no pickle, or a pickle of objects weights_only refuses
        raise unreadable_checkpoint(path, "it is damaged, not a PyTorch file, or it holds pickled Python objects "
                                          "other than tensors and plain containers, which are never loaded") from None
    except PermissionError as e:
        raise unreadable_checkpoint(path, e.strerror.lower()) from None
    except (RuntimeError, EOFError, OSError, ValueError):  # a truncated file, a torn zip archive
        raise unreadable_checkpoint(path, "it is truncated or corrupt") from None


def upgrade_model_args(model_args):
    """model_args of a checkpoint, with what an older version of this repo left implicit made
    explicit: before `attn_scale` existed, identity and residual used 1/sqrt(head_dim), where
    today's default is their official 1/2 of it (model.py), so such a run keeps its scale."""
    args = dict(model_args)
    if "attn_scale" not in args and args.get("query_mode") in ("identity", "residual") and not args.get("qk_norm"):
        args["attn_scale"] = 1 / math.sqrt(args["n_embd"] // args["n_head"])
    return args
