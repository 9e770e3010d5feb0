"""Faults that clusters make common (issues 26 and 33): a second run started on a live run's out_dir,
a file system without file locks, and a disk that fills while a checkpoint is written, one file or
sharded (FSDP)."""

import contextlib
import errno
import fcntl
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import types

import pytest
import torch
import torch.distributed as dist

from helpers import (
    ONE_THREAD,
    REPO,
    TINY,
    last_logged_step,
    patched_train,
    read_metrics,
    run_in_process,
    train,
    train_in_process,
)
from model import GPT, GPTConfig
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.errors import CheckpointError, DiskFullError, OutDirBusy, OutDirUnwritable, SetupError
from nonlinear_queries.record import lock
from nonlinear_queries.record.lock import hold_out_dir, out_dir_holder
from nonlinear_queries.record.runs import RunDir
from nonlinear_queries.runtime.processes import Runtime, parallelize, setup
from nonlinear_queries.trainer.optimizers import build_optimizers
from nonlinear_queries.trainer.stopping import StopFlag
from nonlinear_queries.weights import checkpoint
from nonlinear_queries.weights.checkpoint import read_checkpoint, save_checkpoint, tensor_bytes
from nonlinear_queries.weights.start import resolve_start

RUN = ["--lr_decay_iters=24", "--eval_interval=4"]


def start_training(data_dir, out_dir, *args):
    with open(f"{out_dir}.log", "w") as log:
        return subprocess.Popen([sys.executable, os.path.join(REPO, "train.py"), *TINY, *RUN, f"--data_dir={data_dir}",
                                 f"--out_dir={out_dir}", *args], cwd=REPO, env={**os.environ, **ONE_THREAD},
                                stdout=log, stderr=subprocess.STDOUT, text=True)


def wait_for_step(out_dir, step, proc, timeout=300):
    start = time.time()
    while last_logged_step(out_dir) < step:
        if proc.poll() is not None or time.time() - start > timeout:
            proc.kill()
            raise AssertionError(f"train.py ended ({proc.wait()}) or ran {timeout} s before step {step}")
        time.sleep(0.01)


@pytest.mark.slow
def test_a_second_run_on_a_live_out_dir_refuses_and_a_killed_run_leaves_no_stale_lock(shakespeare_dir, tmp_path):
    out = tmp_path / "out"
    first = start_training(shakespeare_dir, out, "--max_iters=1000", "--seed=1")
    try:
        wait_for_step(out, 2, first)
        second = train(shakespeare_dir, out, *RUN, "--max_iters=8", "--seed=2", "--overwrite=True", check=False,
                       env=ONE_THREAD)
        assert second.returncode == 1
        assert f"is in use by a running training run: host {socket.gethostname()}, PID {first.pid}, started " \
               in second.stderr, second.stderr
        assert "Traceback" not in second.stderr
        assert out_dir_holder(RunDir(out)).startswith(f"host {socket.gethostname()}, PID {first.pid}")
        first.send_signal(signal.SIGKILL)  # as a scheduler's kill or a node's crash: no chance to clean up
        assert first.wait() == -signal.SIGKILL
    finally:
        first.kill()
    # the first run's metrics are its own alone: one header, every step once, seed 1
    headers = read_metrics(out, "config")
    assert len(headers) == 1 and headers[0]["config"]["seed"] == 1
    steps = [r["step"] for r in read_metrics(out, "train")]
    assert steps == list(range(1, len(steps) + 1))
    # the kill released the lock with the process; the same command again is refused, naming the killed run, and
    # leaves every file as it was, the lock file (the one record of which process died) included
    assert out_dir_holder(RunDir(out)) is None
    before = snapshot(out)
    code, _, stderr = run_in_process("train.py", *TINY, *RUN, f"--data_dir={shakespeare_dir}", f"--out_dir={out}",
                                     "--max_iters=1000", "--seed=1")
    assert code == 1 and f"the run of host {socket.gethostname()}, PID {first.pid}, started " in stderr, stderr
    assert snapshot(out) == before
    # the run resumes at once
    saved = read_checkpoint(str(out / "ckpt.pt"))["step"]
    train(shakespeare_dir, out, *RUN, f"--max_iters={saved + 2}", "--init_from=resume", env=ONE_THREAD)
    assert [r["step"] for r in read_metrics(out, "config")] == [0, saved]
    assert read_metrics(out, "train")[-1]["step"] == saved + 2


def test_the_lock_is_held_once_per_process_and_names_its_holder(tmp_path):
    hold_out_dir(RunDir(str(tmp_path)))
    hold_out_dir(RunDir(str(tmp_path)))  # again in the same process: nothing to refuse
    probe = subprocess.run([sys.executable, "-c", "import sys; from nonlinear_queries.record.lock import hold_out_dir; "
                            "from nonlinear_queries.record.runs import RunDir; hold_out_dir(RunDir(sys.argv[1]))",
                            str(tmp_path)], cwd=REPO, capture_output=True, text=True)
    assert probe.returncode == 1 and "OutDirBusy" in probe.stderr and f"PID {os.getpid()}" in probe.stderr
    assert issubclass(OutDirBusy, Exception)


def take_new_out_dir(rank, init_file, out_dir):
    """Process `rank` of 2 (gloo) taking the new out_dir `out_dir` as train.py does (hold_run_dir), rank 0 held up
    for a second between creating its lock file and locking it, rank 1 coming half a second late: a rank 1 that
    read out_dir then would find a lock file no process holds. Writes each rank's outcome to out_dir/../RANK."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    runtime = Runtime(rank, rank, 2, "cpu", "float32", "gloo")
    flock = fcntl.flock
    if rank == 0:
        lock.fcntl.flock = lambda f, op: (time.sleep(1) if op & fcntl.LOCK_EX else None, flock(f, op))[1]
    else:
        time.sleep(0.5)
    cfg = TrainConfig(out_dir=out_dir)
    run_dir = RunDir(out_dir)
    try:
        lock.hold_run_dir(cfg, runtime, run_dir, resolve_start(cfg, run_dir), StopFlag("train.py"))
        outcome = "accepted"
    except CheckpointError as e:
        outcome = str(e)
    with open(os.path.join(os.path.dirname(out_dir), str(rank)), "w") as f:
        f.write(outcome)
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.slow
def test_every_rank_accepts_a_new_out_dir_whenever_rank_0_creates_its_lock_file(tmp_path):
    # CI once saw rank 1 refuse a new run as a killed one's: it read out_dir between rank 0's creating the lock
    # file and locking it
    out_dir = str(tmp_path / "run")
    torch.multiprocessing.spawn(take_new_out_dir, args=(str(tmp_path / "init"), out_dir), nprocs=2)
    assert [(tmp_path / str(rank)).read_text() for rank in (0, 1)] == ["accepted", "accepted"]
    assert os.listdir(out_dir) == [".lock"]


# Lustre mounted without -o flock answers flock with ENOSYS; a file system without lock support EOPNOTSUPP; NFS
# whose lock manager cannot be reached ENOLCK
@pytest.mark.parametrize("code", [errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK])
def test_a_file_system_without_file_locks_is_one_clear_error(tmp_path, monkeypatch, code):
    def no_locks(f, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(lock.fcntl, "flock", no_locks)
    out = str(tmp_path / "out")
    with pytest.raises(SetupError) as e:  # what train.py reports as one line, `error: ...`, exit status 1
        hold_out_dir(RunDir(out))
    assert str(e.value) == (
        f"cannot lock {out}/.lock: its file system has no file locks (flock: {os.strerror(code)}), so train.py cannot "
        f"make sure that no other run writes to {out}. Mount it with locks (Lustre: -o flock), choose an --out_dir "
        f"on another file system, or pass --lock_out_dir=False and see to it yourself that one run at a time uses "
        f"each out_dir")
    assert out not in lock._HELD
    assert out_dir_holder(RunDir(out)) is None  # no process can hold a lock there: sweep.py does not wait for one


def test_lock_out_dir_false_trains_on_a_file_system_without_file_locks(shakespeare_dir, tmp_path, monkeypatch):
    def no_locks(f, operation):
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(lock.fcntl, "flock", no_locks)
    out = tmp_path / "out"
    with pytest.raises(SetupError, match="pass --lock_out_dir=False"):
        train_in_process(shakespeare_dir, out, "--max_iters=2", "--eval_interval=2")
    assert not os.path.exists(out / "metrics.jsonl")  # refused before the run started
    assert train_in_process(shakespeare_dir, out, "--max_iters=2", "--eval_interval=2", "--lock_out_dir=False") == 0
    assert [r["step"] for r in read_metrics(out, "train")] == [1, 2]


# ---------------------------------------------------------------------------------------
# a full disk during a checkpoint


def small_state(n):
    return {"model": {"w": torch.arange(n, dtype=torch.float32)}, "step": n}


def test_a_write_that_runs_out_of_space_raises_one_clear_error_and_leaves_the_previous_checkpoint(tmp_path,
                                                                                                    monkeypatch):
    save_checkpoint(RunDir(str(tmp_path)), small_state(1000), keep_last_n=2)
    before = (tmp_path / "ckpt.pt").read_bytes()
    real_save = torch.save

    def save_then_fail(obj, path):  # half the file, then torch.save's writer gives up as on a full disk
        real_save(obj, path)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 4096 vs 1024")

    monkeypatch.setattr(torch, "save", save_then_fail)
    with pytest.raises(DiskFullError) as e:
        save_checkpoint(RunDir(str(tmp_path)), small_state(2000), keep_last_n=2)
    message = str(e.value)
    assert f"no space to write the checkpoint {tmp_path / 'ckpt.pt'}" in message
    assert "the previous checkpoint" in message and "is intact" in message and "--init_from=resume" in message
    assert "MiB free" in message and "it needs 1.0 MiB" in message
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "ckpt_001000.pt"]  # no .tmp left holding the space
    assert (tmp_path / "ckpt.pt").read_bytes() == before
    assert torch.load(tmp_path / "ckpt.pt", weights_only=True)["step"] == 1000

    def enospc(obj, path):
        open(path, "wb").close()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", enospc)
    with pytest.raises(DiskFullError):
        save_checkpoint(RunDir(str(tmp_path)), small_state(2000), keep_last_n=2)
    monkeypatch.setattr(torch, "save", lambda obj, path: (_ for _ in ()).throw(RuntimeError("another failure")))
    with pytest.raises(RuntimeError, match="another failure"):  # not every error is a full disk
        save_checkpoint(RunDir(str(tmp_path)), small_state(2000), keep_last_n=2)
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "ckpt_001000.pt"]


def test_the_checkpoint_size_counts_each_storage_once():
    w = torch.zeros(100)
    state = {"wte": w, "lm_head": w, "moments": [torch.zeros(10, dtype=torch.float64)], "step": 3}
    assert tensor_bytes(state) == 400 + 80


@contextlib.contextmanager
def tmpfs(path, size):
    """A tmpfs of `size` mounted at path (root only), unmounted afterwards."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root (CI runs as root)")


@needs_root
def test_a_real_full_disk_during_the_write_is_the_same_clear_error(tmp_path, monkeypatch):
    with tmpfs(tmp_path / "disk", "2m") as disk:
        save_checkpoint(RunDir(str(disk)), small_state(50_000), keep_last_n=1)  # 200 kB
        # the free-space check believes there is room; the disk says otherwise half way through
        monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=2**40))
        with pytest.raises(DiskFullError, match="the disk filled while it was written"):
            save_checkpoint(RunDir(str(disk)), small_state(1_000_000), keep_last_n=1)  # 4 MB
        assert sorted(os.listdir(disk)) == ["ckpt.pt", "ckpt_050000.pt"]
        assert torch.load(disk / "ckpt.pt", weights_only=True)["step"] == 50_000


@needs_root
@pytest.mark.slow
def test_train_on_a_full_disk_stops_with_the_error_and_resumes_once_space_is_freed(shakespeare_dir, tmp_path):
    # the tiny model's checkpoint is 19.7 MB; keep_last_n=2 holds two: the third does not fit in 50 MB
    with tmpfs(tmp_path / "disk", "50m") as disk:
        out = disk / "out"
        proc = train(shakespeare_dir, out, *RUN, "--max_iters=12", "--wandb_log=True", check=False, env=ONE_THREAD)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in proc.stderr
        assert f"error: no space to write the checkpoint {out / 'ckpt.pt'}: it needs" in errors[0]
        assert "the previous checkpoint" in errors[0] and "--init_from=resume" in errors[0]
        assert len(proc.stderr.splitlines()) < 20, proc.stderr  # no wandb spew
        assert not [n for n in os.listdir(out) if n.endswith(".tmp")]
        saved = int(proc.stdout.rsplit("saved checkpoint to", 1)[1].split("(step ")[1].split(")")[0])
        assert 0 < saved < 12 and read_checkpoint(str(out / "ckpt.pt"))["step"] == saved
        for _, older in RunDir(str(out)).step_checkpoints()[1:]:  # free space, then resume
            os.remove(older)
        train(shakespeare_dir, out, *RUN, "--max_iters=12", "--keep_last_n=1", "--init_from=resume", env=ONE_THREAD)
        assert read_checkpoint(str(out / "ckpt.pt"))["step"] == 12


# ---------------------------------------------------------------------------------------
# a full disk during a sharded (FSDP) checkpoint


@needs_root
def test_a_full_disk_during_a_sharded_checkpoint_is_the_same_clear_error(tmp_path, monkeypatch):
    cfg = TrainConfig(n_layer=2, n_head=2, n_embd=32, block_size=8, device="cpu")
    runtime = setup("cpu", "float32", parallelism="fsdp")  # a process group of one, as train.py runs FSDP alone
    try:
        torch.manual_seed(0)
        model = parallelize(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=8)), runtime, "fsdp")[0]
        optimizers = build_optimizers(model, cfg, "cpu")
        x = torch.randint(0, 64, (2, 8))
        model(x, x)[1].backward()
        optimizers[0].step()

        def meta(step):
            return {"model_args": model.config.__dict__, "step": step, "evaluated": True, "steps_above_threshold": 0,
                    "config": {}, "data": {}, "wandb_id": ""}

        with tmpfs(tmp_path / "disk", "40m") as disk:  # the checkpoint takes 25 MB (the GPT-2 vocabulary)
            checkpoint.save_sharded_checkpoint(RunDir(str(disk)), model, optimizers, meta(1), keep_last_n=2)
            # too little space for a second: refused before anything is written
            with pytest.raises(DiskFullError) as e:
                checkpoint.save_sharded_checkpoint(RunDir(str(disk)), model, optimizers, meta(2), keep_last_n=2)
            assert str(e.value).startswith(f"no space to write the checkpoint {disk / 'ckpt.dcp'}: it needs 26.1 MiB "
                                           f"and {disk} has ")
            assert f"the previous checkpoint, {disk / 'ckpt.dcp'}, is intact" in str(e.value)
            assert sorted(os.listdir(disk)) == ["ckpt.dcp", "ckpt_000001.dcp"]
            # the free-space check believes there is room; the disk fills while DCP writes the shards
            monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: types.SimpleNamespace(free=2**40))
            with pytest.raises(DiskFullError, match="the disk filled while it was written") as e:
                checkpoint.save_sharded_checkpoint(RunDir(str(disk)), model, optimizers, meta(2), keep_last_n=2)
            assert "--init_from=resume" in str(e.value) and "nothing was left half written" in str(e.value)
            assert sorted(os.listdir(disk)) == ["ckpt.dcp", "ckpt_000001.dcp"]  # no .tmp left holding the space
            assert read_checkpoint(str(disk / "ckpt.dcp"))["step"] == 1
    finally:
        dist.destroy_process_group()


@needs_root
@pytest.mark.slow
def test_fsdp_on_a_full_disk_stops_every_process_with_the_error_and_resumes(shakespeare_dir, tmp_path):
    # two processes shard the tiny model; each sharded checkpoint takes 25 MB, keep_last_n=2 holds two of them
    # in 64 MB, and the third fills the disk while it is written (the free-space check is patched to see room)
    script = patched_train(tmp_path / "train_full_disk.py",
                           "import types\nfrom nonlinear_queries.weights import checkpoint\n"
                           "checkpoint.shutil.disk_usage = lambda path: types.SimpleNamespace(free=2**40)")
    fsdp = [*RUN, "--parallelism=fsdp", "--batch_size=2", "--gradient_accumulation_steps=4"]
    with tmpfs(tmp_path / "disk", "64m") as disk:
        out = disk / "out"
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                               script, *TINY, *fsdp, f"--data_dir={shakespeare_dir}", f"--out_dir={out}",
                               "--max_iters=12"], cwd=REPO, env={**os.environ, **ONE_THREAD}, capture_output=True,
                              text=True, timeout=600)
        output = proc.stdout + proc.stderr
        assert proc.returncode == 1, output
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, output  # every rank stopped; rank 0 of the machine said why
        assert errors[0].startswith(f"error: no space to write the checkpoint {out / 'ckpt.dcp'} (the disk filled "
                                    f"while it was written: "), errors[0]
        assert "it needs 26.1 MiB" in errors[0] and "--init_from=resume" in errors[0]
        assert f"the previous checkpoint, {out / 'ckpt.dcp'}, is intact" in errors[0]
        assert "CheckpointException" not in output and "]: Traceback" not in output  # no worker's traceback
        assert sorted(os.listdir(out)) == [".lock", "ckpt.dcp", "ckpt_000004.dcp", "ckpt_000008.dcp", "config.json",
                                           "metrics.jsonl"]  # no ckpt_000012.dcp.tmp holding the space
        assert read_checkpoint(str(out / "ckpt.dcp"))["step"] == 8 and last_logged_step(out) == 12
        shutil.rmtree(out / "ckpt_000004.dcp")  # free space, then resume (in one process: DCP reshards)
        train(shakespeare_dir, out, *fsdp, "--max_iters=12", "--keep_last_n=1", "--init_from=resume",
              env=ONE_THREAD)
        assert read_checkpoint(str(out / "ckpt.dcp"))["step"] == 12


# ---------------------------------------------------------------------------------------
# out_dir that cannot hold a run, and the lock file at a run's clean end


def test_an_out_dir_that_is_a_file_is_one_sentence_and_leaves_it_as_it_was(tmp_path):
    path = tmp_path / "results.txt"
    path.write_text("a user's file\n")
    for out in (path, path / "run"):
        code, stdout, stderr = run_in_process("train.py", *TINY, f"--data_dir={tmp_path}", f"--out_dir={out}")
        assert code == 1 and stdout == ""
        assert stderr == (f"error: out_dir {out} cannot be a run directory: {path if out == path else out} is a "
                          f"file, not a directory; choose another --out_dir, or move the file away\n")
    assert path.read_text() == "a user's file\n"


@pytest.mark.parametrize("code, says", [
    (errno.EACCES, "permission denied on {where} (its permissions, an immutable attribute or another user's "
                   "directory); choose an --out_dir you can write to, or change its permissions"),
    (errno.EPERM, "permission denied on {where} (its permissions, an immutable attribute or another user's "
                  "directory); choose an --out_dir you can write to, or change its permissions"),
    (errno.EROFS, "its file system is read-only; choose an --out_dir on a writable file system"),
])
@pytest.mark.parametrize("fails", ["makedirs", "lock file"])
def test_an_out_dir_that_cannot_be_written_is_one_sentence(tmp_path, monkeypatch, code, says, fails):
    # root writes through any mode bits, so the kernel's refusals are made here
    out = tmp_path / "new" / "run"
    if fails == "makedirs":
        where = out

        def refuse(path, *args, **kwargs):
            raise OSError(code, os.strerror(code), str(path))
        monkeypatch.setattr(lock.os, "makedirs", refuse)
    else:
        where = RunDir(str(out)).lock
        real_open = open

        def refuse(path, *args, **kwargs):
            if str(path) == where:
                raise OSError(code, os.strerror(code), str(path))
            return real_open(path, *args, **kwargs)
        monkeypatch.setattr(lock, "open", refuse, raising=False)
    with pytest.raises(OutDirUnwritable) as e:
        hold_out_dir(RunDir(str(out)))
    assert str(e.value) == f"cannot write in out_dir {out}: " + says.format(where=where)
    assert not out.exists()  # nothing that hold_out_dir made is left


@pytest.mark.slow
def test_a_finished_run_says_what_it_trains_first_and_leaves_no_lock_file(shakespeare_dir, tmp_path):
    out = tmp_path / "out"
    code, stdout, _ = run_in_process("train.py", *TINY, f"--data_dir={shakespeare_dir}", f"--out_dir={out}",
                                     "--max_iters=2", "--eval_interval=2", "--wandb_run_name=tiny")
    assert code == 0
    # the one-line summary first, the full config in config.json (no 80-line dump above it)
    assert stdout.splitlines()[0] == (f"tiny: query_mode=linear, 24,736 non-embedding parameters, 128 tokens per step, "
                                      f"device cpu (float32); the full config is in {out / 'config.json'}")
    assert not (out / ".lock").exists() and out_dir_holder(RunDir(str(out))) is None
    # a run that opened the lock file before it was removed finds it gone and locks the new one
    hold_out_dir(RunDir(str(out)))
    stale = open(RunDir(str(out)).lock)
    lock.release_out_dir(RunDir(str(out)))
    assert not lock._same_file(stale, RunDir(str(out)).lock)
    f, holder = lock.try_lock(RunDir(str(out)).lock, "the next run")
    assert holder is None and lock._same_file(f, RunDir(str(out)).lock)
    assert out_dir_holder(RunDir(str(out))) == "the next run"
    f.close()
    stale.close()


# What a run that stopped can leave in its out_dir (issue 74): the record alone (a kill right after its header), its
# header and lock (a second Ctrl-C before the first checkpoint), wandb's files, a lock no process holds (a kill during
# setup), a checkpoint half written, and checkpoints of every kind with or without the rest.
LEFT_BY_A_STOPPED_RUN = {
    "record": ["metrics.jsonl"],
    "header": ["config.json"],
    "wandb": ["wandb/"],
    "lock": [".lock"],
    "record, header, lock": ["metrics.jsonl", "config.json", ".lock"],
    "record, header, wandb, lock": ["metrics.jsonl", "config.json", "wandb/", ".lock"],
    "a checkpoint half written": ["metrics.jsonl", "config.json", "ckpt.pt.tmp"],
    "checkpoint": ["ckpt.pt"],
    "checkpoint and record": ["ckpt.pt", "ckpt_000004.pt", "metrics.jsonl", "config.json"],
    "checkpoint, record, wandb, lock": ["ckpt.pt", "metrics.jsonl", "config.json", "wandb/", ".lock"],
    "step checkpoints alone": ["ckpt_000004.pt", "ckpt_000008.pt", "metrics.jsonl"],
    "sharded checkpoint": ["ckpt.dcp/", "metrics.jsonl", "config.json"],
}


KILLED = "host node7, PID 4242, started 2026-12-01T09:30:00+00:00"  # what a killed run's lock file names


def leave(out_dir, names):
    """Files named as a stopped run leaves them in out_dir (a name ending in / a directory holding one file; the
    lock file naming its holder, KILLED)."""
    os.makedirs(out_dir)
    for name in names:
        path = os.path.join(out_dir, name)
        if name.endswith("/"):
            os.makedirs(path)
            path = os.path.join(path, "run-1.wandb" if name == "wandb/" else "meta.pt")
        with open(path, "w") as f:
            f.write(f"{KILLED}\n" if name == ".lock" else f"{name} of the stopped run\n")


def snapshot(out_dir):
    """{path: (bytes, modification time in ns)} of every file under out_dir, its lock file included."""
    files = {}
    for root, _, names in os.walk(out_dir):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                files[path] = f.read(), os.stat(path).st_mtime_ns
    return files


@pytest.mark.parametrize("state", LEFT_BY_A_STOPPED_RUN)
def test_a_new_run_refuses_whatever_a_stopped_run_left_and_says_how_to_go_on(tmp_path, state):
    out = str(tmp_path / "run")
    left = LEFT_BY_A_STOPPED_RUN[state]
    leave(out, left)
    before = snapshot(out)
    args = [*TINY, f"--data_dir={tmp_path / 'no data'}", f"--out_dir={out}", "--max_iters=2"]
    code, stdout, stderr = run_in_process("train.py", *args)
    assert (code, stdout) == (1, ""), stderr
    # nothing was replaced, appended to or removed; the refusal comes before the missing data is looked at
    assert snapshot(out) == before
    if any(name.startswith(("ckpt_", "ckpt.")) and not name.endswith(".tmp") for name in left):
        resume = "python " + shlex.join([os.path.join(REPO, "train.py"), *args, "--init_from=resume"])
        if state == "step checkpoints alone":
            resume += f" --resume_from={out}/ckpt_000008.pt"  # the newest
        ways = f"continue it with `{resume}`, pass --overwrite=True to replace it, or choose another --out_dir"
    else:
        ways = "pass --overwrite=True to replace it, or choose another --out_dir"
    order = {"ckpt.pt": 0, "ckpt.dcp/": 0, "ckpt_000008.pt": 1, "ckpt_000004.pt": 2, "ckpt.pt.tmp": 3,
             "metrics.jsonl": 4, "config.json": 5, "wandb/": 6, ".lock": 7}
    what = ", ".join(sorted(left, key=order.get))
    if ".lock" in left:  # the killed run named, its lock file left as it was
        what += f", a lock file no process holds: the run of {KILLED} was killed or crashed here"
    run = "a run" if "continue it" in ways else "a run with no checkpoint to resume"
    assert stderr == f"error: {out} already holds {run} ({what}); {ways}\n"


def test_overwrite_replaces_everything_a_stopped_run_left(shakespeare_dir, tmp_path):
    out = str(tmp_path / "run")
    leave(out, LEFT_BY_A_STOPPED_RUN["checkpoint, record, wandb, lock"] + ["ckpt_000004.pt", "ckpt.pt.tmp"])
    assert train_in_process(shakespeare_dir, out, "--max_iters=2", "--eval_interval=2", "--overwrite=True") == 0
    # the new run's files alone: one header, its own checkpoints, no wandb files (wandb_log is off)
    assert sorted(os.listdir(out)) == [".lock", "ckpt.pt", "ckpt_000002.pt", "config.json", "metrics.jsonl"]
    assert [r["step"] for r in read_metrics(out, "config")] == [0]
    assert read_checkpoint(os.path.join(out, "ckpt.pt"))["step"] == 2


# What runs leave, made from a real run of 4 steps (checkpoints at steps 2 and 4): (what to remove, what to add).
STARTS = {
    "a run with its checkpoint": ([], []),
    "step checkpoints alone": (["ckpt.pt"], []),
    "a record, no checkpoint": (["ckpt.pt", "ckpt_000002.pt", "ckpt_000004.pt"], []),
    "a record, a checkpoint half written and a killed run's lock": (
        ["ckpt.pt", "ckpt_000002.pt", "ckpt_000004.pt"], ["ckpt.pt.tmp", ".lock"]),
    "nothing": (None, []),
}


@pytest.fixture(scope="module")
def four_steps_run(shakespeare_dir, tmp_path_factory):
    """A run of 4 steps, checkpointed at steps 2 and 4, to copy."""
    out = tmp_path_factory.mktemp("four_steps") / "run"
    assert train_in_process(shakespeare_dir, out, "--max_iters=4", "--eval_interval=2") == 0
    return out


def hints(stderr, args):
    """The command lines a refusal's message suggests, as train.py arguments: each `python train.py ...` in
    backticks, and the refused command `args` with each flag it says to pass (`pass --overwrite=True`)."""
    commands = [shlex.split(c)[2:] for c in re.findall(r"`([^`]+)`", stderr)]
    return commands + [[*args, flag] for flag in re.findall(r"pass (--\w+=\S+) ", stderr)]


@pytest.mark.slow
@pytest.mark.parametrize("start", ["scratch", "resume"])
@pytest.mark.parametrize("left", STARTS)
def test_every_way_on_that_a_refusal_suggests_is_accepted(four_steps_run, shakespeare_dir, tmp_path, left, start):
    # issue 82: --init_from=resume into a record without a checkpoint said to start with --init_from=scratch, which
    # was refused in turn. Each command a refusal suggests is followed once, from the same out_dir, and must train.
    out = tmp_path / "run"
    remove, add = STARTS[left]

    def restore():
        shutil.rmtree(out, ignore_errors=True)
        if remove is not None:
            shutil.copytree(four_steps_run, out)
            for name in remove:
                os.remove(out / name)
            shutil.rmtree(tmp_path / "left", ignore_errors=True)
            leave(tmp_path / "left", add)
            for name in add:
                shutil.copy(tmp_path / "left" / name, out / name)

    restore()
    args = [*TINY, f"--data_dir={shakespeare_dir}", f"--out_dir={out}", "--max_iters=6", "--eval_interval=2",
            f"--init_from={start}"]
    code, _, stderr = run_in_process("train.py", *args)
    if (left, start) in [("nothing", "scratch"), ("a run with its checkpoint", "resume")]:  # nothing to refuse
        assert code == 0, stderr
        return
    assert code == 1, stderr
    ways = hints(stderr, args)
    assert len(ways) == {"a run with its checkpoint": 2, "step checkpoints alone": 2}.get(left, 1), stderr
    for way in ways:
        restore()
        code, _, followed = run_in_process("train.py", *way)
        assert code == 0, f"{stderr}\nfollowed: {shlex.join(way)}\n{followed}"
        assert read_metrics(out, "train")[-1]["step"] == 6
