"""checkpoint.py without a training run: the atomic writer's files and pruning, the reader's
refusals of corrupt files, and the resume checks."""

import argparse
import errno
import json
import math
import os
from dataclasses import asdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from helpers import run_in_process
from model import GPT, GPTConfig
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.data.batches import index_fingerprint
from nonlinear_queries.errors import CheckpointError, PretrainedError
from nonlinear_queries.record.runs import RunDir
from nonlinear_queries.weights.checkpoint import Checkpointer, check_resumable, read_checkpoint, save_checkpoint
from nonlinear_queries.weights.pretrained import load_model
from nonlinear_queries.weights.start import build_model, resolve_start

NOT_LOADED = ("it is damaged, not a PyTorch file, or it holds pickled Python objects other than tensors and plain "
              "containers, which are never loaded")


def ckpt(step, **extra):
    """A checkpoint dict of train.py's shape for `step`, with a tensor to tell the files apart."""
    return {"model": {"w": torch.full((3,), float(step))}, "optimizer": {}, "model_args": {"n_layer": 2},
            "step": step, "evaluated": True, "steps_above_threshold": 0, "config": {}, "data": {}, "wandb_id": "",
            **extra}


def names(out_dir):
    return sorted(os.listdir(out_dir))


def test_writer_keeps_the_newest_and_the_named_steps(tmp_path):
    for step in (2, 4, 6, 8):
        save_checkpoint(RunDir(str(tmp_path)), ckpt(step), keep_last_n=2, keep_steps=(4,))
    assert names(tmp_path) == ["ckpt.pt", "ckpt_000004.pt", "ckpt_000006.pt", "ckpt_000008.pt"]
    assert os.path.samefile(tmp_path / "ckpt.pt", tmp_path / "ckpt_000008.pt")  # one file, two names
    assert read_checkpoint(str(tmp_path / "ckpt.pt"))["model"]["w"].tolist() == [8.0] * 3
    assert RunDir(str(tmp_path)).step_checkpoints() == [(s, str(tmp_path / f"ckpt_{s:06d}.pt")) for s in (8, 6, 4)]

    # a run resumed from step 6 writes step 7: step 8 belongs to the run it branched from and stays
    save_checkpoint(RunDir(str(tmp_path)), ckpt(7), keep_last_n=1)
    assert names(tmp_path) == ["ckpt.pt", "ckpt_000007.pt", "ckpt_000008.pt"]
    assert read_checkpoint(str(tmp_path / "ckpt.pt"))["step"] == 7


def test_writer_replaces_leftovers_of_a_crash(tmp_path):
    (tmp_path / "ckpt.pt.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / "ckpt.pt.link.tmp").write_bytes(b"")
    save_checkpoint(RunDir(str(tmp_path)), ckpt(3), keep_last_n=2)
    assert names(tmp_path) == ["ckpt.pt", "ckpt_000003.pt"]


@pytest.mark.parametrize("damage, reason", [
    ("truncate", "it is truncated or corrupt"),
    ("not a checkpoint", "it is not a checkpoint of train.py: it has no data, evaluated, model, model_args, "
                         "optimizer, steps_above_threshold, wandb_id"),
    ("arbitrary object", NOT_LOADED),
])
def test_reader_refuses_a_damaged_file_and_names_the_others(tmp_path, damage, reason):
    for step in (2, 4):
        save_checkpoint(RunDir(str(tmp_path)), ckpt(step), keep_last_n=2)
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
    assert str(e.value).startswith(f"cannot read checkpoint {path}: {reason}. Checkpoints in"), str(e.value)
    assert str(e.value).endswith(f"Checkpoints in {tmp_path}: {tmp_path / 'ckpt_000002.pt'}; resume from one with "
                                 f"--resume_from=PATH")
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        read_checkpoint(str(tmp_path / "missing.pt"))


def test_a_checkpoint_this_user_may_not_read_says_so(tmp_path, monkeypatch):
    for step in (2, 4):
        save_checkpoint(RunDir(str(tmp_path)), ckpt(step), keep_last_n=2)

    def refuse(path, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), path)

    monkeypatch.setattr(torch, "load", refuse)
    with pytest.raises(CheckpointError) as e:
        read_checkpoint(str(tmp_path / "ckpt.pt"))
    assert str(e.value) == (f"cannot read checkpoint {tmp_path / 'ckpt.pt'}: permission denied. Checkpoints in "
                            f"{tmp_path}: {tmp_path / 'ckpt_000002.pt'}; resume from one with --resume_from=PATH")


def random_bytes(path):
    path.write_bytes(np.random.default_rng(0).bytes(4096))


def pickled_object(path):
    torch.save(argparse.Namespace(model={}), path)  # unpickling an object of a class could run any code


def resume(path):
    """train.py --init_from=resume on the run directory of `path`: its Checkpointer."""
    cfg = SimpleNamespace(init_from="resume", resume_from="", out_dir=str(path.parent), parallelism="ddp")
    run_dir = RunDir(cfg.out_dir)
    Checkpointer(cfg, SimpleNamespace(master=True, device="cpu"), run_dir, resolve_start(cfg, run_dir))


def program(script, *args):
    """A root program run in this process (helpers.run_in_process); its stderr as the error."""
    code, _, err = run_in_process(script, *args)
    assert code == 1, err
    raise CheckpointError(err.removeprefix("error: ").strip())


def hf_directory(path):
    """load_model of a Hugging Face directory whose pytorch_model.bin is `path`."""
    (path.parent / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 32}))
    load_model(str(path.parent))


@pytest.mark.parametrize("write", [random_bytes, pickled_object], ids=lambda f: f.__name__)
@pytest.mark.parametrize("name, read", [
    ("ckpt.pt", resume),
    ("ckpt.pt", lambda path: load_model(str(path.parent))),  # sample.py, eval.py, export.py on a run's out_dir
    ("model.pt", lambda path: load_model(str(path))),  # --init_from=FILE, fine-tuning included
    ("pytorch_model.bin", hf_directory),
    ("ckpt.pt", lambda path: program("sample.py", f"--out_dir={path.parent}", "--device=cpu")),
    ("ckpt.pt", lambda path: program("export.py", f"--out_dir={path.parent}", f"--to={path.parent / 'hf'}")),
], ids=["resume", "load_model(out_dir)", "load_model(file)", "pytorch_model.bin", "sample.py", "export.py"])
def test_a_file_that_is_no_checkpoint_is_one_sentence_of_ours(tmp_path, write, name, read):
    path = tmp_path / name
    write(path)
    with pytest.raises((CheckpointError, PretrainedError)) as e:
        read(path)
    message = str(e.value)
    # never torch's text, whose advice to load with weights_only=False would run the file's code
    assert f"cannot read checkpoint {path}: {NOT_LOADED}." in message, message
    assert not any(text in message for text in ("weights_only", "Weights only", "torch.load", "GLOBAL", "\x1b",
                                                "\n")), message


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


def test_a_checkpoint_whose_model_args_predate_todays_settings_resumes_and_loads(tmp_path):
    # model_args as train.py wrote them before GPTConfig grew attn_scale, qk_norm, attn_gate, rope, GQA, μP ...:
    # what it leaves out is the config's (resume) or the default (load_model), and attn_scale is upgraded
    # (checkpoint_file.upgrade_model_args): residual then scaled by 1/sqrt(head_dim), today by its official 1/2
    old_args = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "bias": False, "vocab_size": 64,
                "dropout": 0.0, "query_mode": "residual"}
    torch.manual_seed(0)
    trained = GPT(GPTConfig(**old_args, attn_scale=1 / math.sqrt(16)))
    save_checkpoint(RunDir(str(tmp_path)), ckpt(4, model=trained.state_dict(), model_args=old_args), keep_last_n=1)
    # resumed as train.py does it: the checkpoint read, its model built, its weights put in (all of them)
    cfg = TrainConfig(out_dir=str(tmp_path), init_from="resume", n_layer=12)
    run_dir = RunDir(cfg.out_dir)
    start = resolve_start(cfg, run_dir)
    checkpoints = Checkpointer(cfg, SimpleNamespace(master=True, device="cpu"), run_dir, start)
    run_cfg, model = build_model(cfg, SimpleNamespace(device="cpu"), start, checkpoints.model_args)
    model.load_state_dict(checkpoints.ckpt["model"])  # strict: the same parameters, named the same
    assert asdict(model.config) == asdict(trained.config)  # the model_args its next checkpoint records
    assert run_cfg.model_config() is model.config and (run_cfg.n_layer, run_cfg.attn_scale) == (2, 0.25)
    # loaded by sample.py, eval.py, export.py and fine-tuning
    loaded = load_model(str(tmp_path))
    assert asdict(loaded.config) == asdict(trained.config)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in trained.state_dict().items())
