"""
A checkpoint file read: load_checkpoint_file, the repo's one torch.load (weights only: tensors and
plain containers, never arbitrary pickled objects), whose errors name the other checkpoints of the
run (runs.RunDir.step_checkpoints); upgrade_model_args, what an older version's model_args left implicit.
The names of a run directory's checkpoints are runs.RunDir's.
Both sides read files through here, and neither through the other: checkpoint.py, which writes a
run's checkpoints and resumes from them, and pretrained.load_model, which loads a model from any
source. Of what is not the standard library this module imports torch alone (errors and runs import
nothing else), so a program that only reads a model (sample.py, export.py) imports no optimizer, batch or
DCP code.
"""

import math
import os
import pickle

import torch

from nonlinear_queries.errors import CheckpointError
from nonlinear_queries.record.runs import RunDir


def unreadable_checkpoint(path, reason):
    """The CheckpointError `cannot read checkpoint PATH: REASON.`, naming the other checkpoints of its
    directory to resume from instead."""
    out_dir = os.path.dirname(path) or "."
    others = [p for _, p in RunDir(out_dir).step_checkpoints((".pt", ".dcp"))
              if not (os.path.exists(path) and os.path.samefile(p, path))]
    hint = (f" Checkpoints in {out_dir}: {', '.join(others)}; resume from one with --resume_from=PATH" if others
            # another file (a Hugging Face directory's pytorch_model.bin) has no checkpoints beside it to offer
            else f" There is no other checkpoint in {out_dir}" if RunDir.is_checkpoint_name(path) else "")
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
    today's default is their official 1/2 of it (model.py), so such a run keeps its scale. The other
    modes are out of its scope: linear's scale never changed, res_gelu and res_linear had their 1/2
    from the start, and anchored_res_gelu and any mode added since came with attn_scale."""
    args = dict(model_args)
    if "attn_scale" not in args and args.get("query_mode") in ("identity", "residual") and not args.get("qk_norm"):
        args["attn_scale"] = 1 / math.sqrt(args["n_embd"] // args["n_head"])
    return args
