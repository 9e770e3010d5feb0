"""runtime/processes.py (device, dtype, process layout, peak FLOP/s, the stop flag) and runs.py's writing
(metrics.jsonl, the no-op wandb, rank 0 only, the header's git state) without a training run."""

import json
import os
import subprocess
from contextlib import nullcontext

import pytest
import torch

from nonlinear_queries.errors import SetupError
from nonlinear_queries.record.runs import NullWandb, RunLog, git_state, run_header
from nonlinear_queries.runtime import processes
from nonlinear_queries.runtime.processes import mfu, peak_flops, setup


def test_setup_on_the_cpu():
    runtime = setup("auto" if not torch.cuda.is_available() else "cpu")
    assert (runtime.device, runtime.device_type, runtime.dtype, runtime.rank, runtime.world_size) == (
        "cpu", "cpu", "float32", 0, 1)
    assert runtime.master and not runtime.distributed and isinstance(runtime.autocast, nullcontext)
    bf16 = setup("cpu", "bfloat16")
    with bf16.autocast:
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")


@pytest.mark.parametrize("device, dtype, message", [
    ("cpu", "float16", "dtype=float16 is for CUDA; use --dtype=float32 or bfloat16 on the CPU"),
    ("cpu", "float64", "dtype must be auto, float32, bfloat16, float16; got 'float64'"),
])
def test_setup_refuses_what_cannot_work(device, dtype, message):
    with pytest.raises(SetupError, match=message):
        setup(device, dtype)


def test_setup_refuses_cuda_without_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SetupError, match="device=cuda but torch.cuda.is_available"):
        setup("cuda")


def test_torchrun_layout_from_the_environment(monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    runtime = setup("cpu", join_process_group=False)
    assert (runtime.rank, runtime.local_rank, runtime.world_size, runtime.backend, runtime.master,
            runtime.distributed) == (3, 1, 4, "gloo", False, True)
    with pytest.raises(SetupError, match="backend=nccl needs CUDA devices; use --backend=gloo on the CPU"):
        setup("cpu", backend="nccl", join_process_group=False)


@pytest.mark.parametrize("name, flops", [
    ("NVIDIA H100 80GB HBM3", 989e12),  # SXM
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12),  # SXM
    ("NVIDIA H200 NVL", 835e12),
    ("NVIDIA GH200 480GB", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("Tesla T4", None),  # unknown: tokens/s only
])
def test_peak_flops_tells_gpu_variants_apart(monkeypatch, name, flops):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops("cuda:0") == flops
    assert peak_flops("cpu") is None


def test_mfu():
    # 6 N FLOPs per token for N = 1e8 matmul parameters at 1e5 tokens/s on 2 devices of 1e14 FLOP/s
    assert mfu(6e8, 1e5, 1e14, world_size=2) == pytest.approx(0.3)
    assert mfu(6e8, 1e5, None) is None


class RecordingWandb(NullWandb):
    def __init__(self):
        self.calls, self.summary, self.finished = [], {}, None

    def log(self, data, step=None):
        self.calls.append((step, data))

    def finish(self, exit_code=0):
        self.finished = exit_code


def test_run_log_writes_on_rank_0_only(tmp_path, capsys):
    wandb = RecordingWandb()
    master = RunLog(str(tmp_path / "metrics.jsonl"), wandb, master=True)
    other = RunLog(str(tmp_path / "other.jsonl"), RecordingWandb(), master=False)
    header = run_header(0, __file__, config={"n_layer": 2})
    for log in (master, other):
        log.log(header)
        log.log({"type": "eval", "step": 4, "val_loss": 3.5})
        log.log({"type": "diverged", "step": 5, "reason": "the loss is nan"})
        log.print("hello")
        log.finish(3)
    records = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [r["type"] for r in records] == ["config", "eval", "diverged"] and records[0]["config"] == {"n_layer": 2}
    assert len(records[0]["git_commit"]) == 40 and records[0]["argv"]
    assert not os.path.exists(tmp_path / "other.jsonl")
    assert capsys.readouterr().out == "hello\n"
    # wandb gets every record but the header, its keys prefixed by the record type
    assert wandb.calls == [(4, {"eval/val_loss": 3.5}), (5, {"diverged/reason": "the loss is nan"})]
    assert wandb.summary == {"diverged_step": 5} and wandb.finished == 3
    NullWandb().log({"x": 1}, step=0)  # the stand-in takes the same calls and does nothing
    assert processes.all_reduce_sum(torch.ones(2), setup("cpu")).tolist() == [1.0, 1.0]  # one process: unchanged


def test_git_state_leaves_out_results_and_the_runs_own_out_dir(tmp_path, monkeypatch):
    # a study commits its finished runs while others still run: their headers must still say the code is clean
    repo = tmp_path / "repo"
    files = ["train.py", "model.py", "results/study/arm/lr=3e-3,seed=0/metrics.jsonl", "out/run[1]/metrics.jsonl",
             "out/other/metrics.jsonl"]
    for name in files:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("committed\n")

    def git(*args):
        return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "the code and a study's first runs")
    head, script = git("rev-parse", "HEAD"), str(repo / "train.py")
    monkeypatch.chdir(repo)  # train.py's out_dir is relative to the working directory
    assert git_state(script) == (head, False)
    # results/: a committed run resumed (modified) and a new run (untracked)
    (repo / files[2]).write_text("committed\nresumed\n")
    (repo / "results/study/arm/lr=6e-3,seed=0").mkdir()
    (repo / "results/study/arm/lr=6e-3,seed=0/metrics.jsonl").write_text("new\n")
    assert git_state(script) == (head, False)
    # the run's own out_dir, elsewhere, counts only for the run it belongs to ([ ] taken literally, not as a glob)
    (repo / files[3]).write_text("committed\nresumed\n")
    assert git_state(script) == (head, True)
    assert git_state(script, ignore=["out/run[1]"]) == (head, False)
    assert git_state(script, ignore=[str(repo / "out/run[1]")]) == (head, False)
    assert run_header(0, script, config={"out_dir": "out/run[1]"})["git_dirty"] is False
    assert run_header(0, script, config={"out_dir": "out/other"})["git_dirty"] is True
    # a modified file elsewhere is dirty whatever is left out; an untracked one is not
    (repo / "notes.txt").write_text("untracked\n")
    assert git_state(script, ignore=["out/run[1]", str(tmp_path), "/"]) == (head, False)
    for name in ("model.py", files[4]):
        (repo / name).write_text("changed\n")
        assert git_state(script, ignore=["out/run[1]"]) == (head, True)
        git("checkout", "-q", "--", name)
