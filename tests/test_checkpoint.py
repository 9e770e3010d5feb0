"""checkpoint.py without a training run: the atomic writer's files and pruning, the reader's
refusals of corrupt files, and the resume checks."""

import os

import numpy as np
import pytest
import torch

from nonlinear_queries.batches import index_fingerprint
from nonlinear_queries.checkpoint import (
    CheckpointError,
    check_resumable,
    read_checkpoint,
    save_checkpoint,
    step_checkpoints,
)


def ckpt(step, **extra):
    """A checkpoint dict of train.py's shape for `step`, with a tensor to tell the files apart."""
    return {"model": {"w": torch.full((3,), float(step))}, "optimizer": {}, "model_args": {"n_layer": 2},
            "step": step, "evaluated": True, "steps_above_threshold": 0, "config": {}, "data": {}, "wandb_id": "",
            **extra}


def names(out_dir):
    return sorted(os.listdir(out_dir))


def test_writer_keeps_the_newest_and_the_named_steps(tmp_path):
    for step in (2, 4, 6, 8):
        save_checkpoint(str(tmp_path), ckpt(step), keep_last_n=2, keep_steps=(4,))
    assert names(tmp_path) == ["ckpt.pt", "ckpt_000004.pt", "ckpt_000006.pt", "ckpt_000008.pt"]
    assert os.path.samefile(tmp_path / "ckpt.pt", tmp_path / "ckpt_000008.pt")  # one file, two names
    assert read_checkpoint(str(tmp_path / "ckpt.pt"))["model"]["w"].tolist() == [8.0] * 3
    assert step_checkpoints(str(tmp_path)) == [(s, str(tmp_path / f"ckpt_{s:06d}.pt")) for s in (8, 6, 4)]

    # a run resumed from step 6 writes step 7: step 8 belongs to the run it branched from and stays
    save_checkpoint(str(tmp_path), ckpt(7), keep_last_n=1)
    assert names(tmp_path) == ["ckpt.pt", "ckpt_000007.pt", "ckpt_000008.pt"]
    assert read_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == 7


def test_writer_replaces_leftovers_of_a_crash(tmp_path):
    (tmp_path / "ckpt.pt.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / "ckpt.pt.link.tmp").write_bytes(b"")
    save_checkpoint(str(tmp_path), ckpt(3), keep_last_n=2)
    assert names(tmp_path) == ["ckpt.pt", "ckpt_000003.pt"]


@pytest.mark.parametrize("damage, detail", [
    ("truncate", "it is truncated or corrupt (RuntimeError"),
    ("not a checkpoint", "(KeyError: 'no data, evaluated, model, model_args, optimizer, steps_above_threshold, "
                         "wandb_id')"),
    ("arbitrary object", "(UnpicklingError: Weights only load failed"),
])
def test_reader_refuses_a_damaged_file_and_names_the_others(tmp_path, damage, detail):
    for step in (2, 4):
        save_checkpoint(str(tmp_path), ckpt(step), keep_last_n=2)
    path = tmp_path / "ckpt.pt"
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    elif damage == "not a checkpoint":
        torch.save({"step": 4}, path)
    else:
        torch.save({**ckpt(4), "extra": np.random.default_rng(0)}, path)  # unpickling it would run code
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(str(path))
    assert str(e.value).startswith(f"cannot read checkpoint {path}: it is truncated or corrupt")
    assert detail in str(e.value), str(e.value)
    assert str(e.value).endswith(f"Checkpoints in {tmp_path}: {tmp_path / 'ckpt_000002.pt'}; resume from one with "
                                 f"--resume_from=PATH")
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        read_checkpoint(str(tmp_path / "missing.pt"))


def test_resume_checks_name_what_changed():
    index = np.arange(40, dtype=np.int64).reshape(10, 4)
    saved = ckpt(4, data={"train index": index_fingerprint(index)})
    files = {"train index": "indices/train.npy"}
    check_resumable(saved, "ckpt.pt", {"n_layer": 2}, {"train index": index_fingerprint(index)}, files)
    with pytest.raises(CheckpointError, match=r"ckpt.pt was trained with n_layer=2 but the config asks for n_layer=3"):
        check_resumable(saved, "ckpt.pt", {"n_layer": 3}, {}, files)
    changed = index_fingerprint(index[::-1])
    with pytest.raises(CheckpointError, match=r"indices/train.npy changed since ckpt.pt was written \(row 0 holds"):
        check_resumable(saved, "ckpt.pt", {"n_layer": 2}, {"train index": changed}, files)
