"""sweep.py beyond one process (issue 26): --launcher=local --jobs=N, --launcher=slurm on a real
one-node SLURM cluster (tests/slurm_cluster.py), requeue mid-run, --status; a multi-process point's
torchrun under SLURM's preemption signal (issue 33), on the CPU as a submitit job would run it."""

import csv
import glob
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from slurm_cluster import slurm_cluster_for_one_test, start_slurm_cluster  # noqa: F401 (the fixtures)

from helpers import (
    ONE_THREAD,
    REPO,
    TINY,
    descendants,
    last_logged_step,
    losses_by_step,
    read_metrics,
    run_script,
    wait_until,
)
from helpers import val_losses_by_step as evals
from nonlinear_queries.config.configurator import parse_config
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.experiments import sweeps

# one worker under pytest-xdist holds the one SLURM cluster (a session fixture) and every test that asks for it
pytestmark = pytest.mark.xdist_group("slurm")

GRID = ["--max_iters=6", "--eval_interval=3", "--lr_decay_iters=12", "--dropout=0.1"]


def sweep(data_dir, sweep_dir, *args, check=True, env=ONE_THREAD):
    return run_script("sweep.py", *TINY, *GRID, f"--data_dir={data_dir}", f"--sweep_dir={sweep_dir}", *args,
                      check=check, env=env)


def status_table(sweep_dir, env=None):
    """{point: {column: cell}} of `sweep.py --status`."""
    lines = run_script("sweep.py", "--status", str(sweep_dir), env=env).stdout.splitlines()
    header = lines[0]
    starts = [header.index(c) for c in ("point", "state", "step", "val loss", "SLURM job", "log of a failed point")]
    cells = [[line[a:b].strip() for a, b in zip(starts, [*starts[1:], None])] for line in lines[1:]]
    return {row[0]: dict(zip(["point", "state", "step", "val loss", "SLURM job", "log"], row)) for row in cells}


@pytest.mark.slow
def test_two_jobs_at_a_time_equal_two_sequential_runs_and_a_failing_point_stops_nothing(shakespeare_dir, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    sweep(shakespeare_dir, one, "--grid", "seed=1,2")
    start = time.time()
    proc = sweep(shakespeare_dir, two, "--grid", "seed=1,2", "--jobs=2", env={})  # threads: 2 cores / 2 jobs
    assert time.time() - start < 600
    for name in ("seed=1", "seed=2"):
        assert losses_by_step(two / name) == losses_by_step(one / name)  # bit for bit
        assert sorted(losses_by_step(two / name)) == [1, 2, 3, 4, 5, 6]
        assert f"{name}: done" in proc.stdout
    # both ran at once: the scheduler started the second before the first ended (its own order of events; the
    # runs' file times are not used: under load a run's start-up can outlast the other's six steps)
    first_end = min(proc.stdout.index(f"{name}: done") for name in ("seed=1", "seed=2"))
    assert all(proc.stdout.index(f"[{i}/2] seed={i}: starting") < first_end for i in (1, 2))
    assert losses_by_step(one / "seed=1") != losses_by_step(one / "seed=2")
    assert status_table(two)["seed=2"]["state"] == "done"

    # a point that fails (its data dir is missing) is reported with its log; the other finishes
    bad = sweep(shakespeare_dir, tmp_path / "bad", "--grid", f"data_dir={shakespeare_dir},/nonexistent", "--jobs=2",
                check=False)
    assert bad.returncode == 1
    names = sorted(n for n in os.listdir(tmp_path / "bad") if os.path.isdir(tmp_path / "bad" / n))  # the points
    failed = next(n for n in names if "nonexistent" in n)
    log = tmp_path / "bad" / failed / "train.log"
    assert f"error: data_dir={shakespeare_dir.replace('/', '-')}" not in bad.stderr
    assert f"failed (exit status 1); its log: {log}" in bad.stderr and "nonexistent" in log.read_text()
    good = next(n for n in names if n != failed)
    assert read_metrics(tmp_path / "bad" / good, "eval")[-1]["step"] == 6
    table = status_table(tmp_path / "bad")
    assert table[failed]["state"] == "failed (exit status 1)" and table[failed]["log"] == str(log)
    assert table[good]["state"] == "done" and table[good]["step"] == "6/6"


@pytest.mark.slow
def test_sigterm_to_a_sweep_lets_every_running_point_write_its_checkpoint(shakespeare_dir, tmp_path):
    sweep_dir = tmp_path / "sweep"
    long = ["--max_iters=1000", "--eval_interval=500", "--grid", "seed=1,2,3", "--jobs=2"]
    with open(tmp_path / "sweep.log", "w") as log:
        proc = subprocess.Popen([os.sys.executable, "sweep.py", *TINY, f"--data_dir={shakespeare_dir}",
                                 f"--sweep_dir={sweep_dir}", *long], cwd=os.path.dirname(os.path.dirname(__file__)),
                                env={**os.environ, **ONE_THREAD}, stdout=log, stderr=subprocess.STDOUT)
    running = [sweep_dir / "seed=1", sweep_dir / "seed=2"]
    try:
        wait_until(lambda: all((d / "metrics.jsonl").exists() and read_metrics(d, "train") for d in running), 300,
                   "both points training")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        proc.kill()
    for point in running:  # each finished its step and checkpointed it; nothing after the signal started
        assert torch.load(point / "ckpt.pt", weights_only=True)["step"] == read_metrics(point, "train")[-1]["step"]
    assert not (sweep_dir / "seed=3").exists()
    assert "every running point wrote its checkpoint" in (tmp_path / "sweep.log").read_text()
    table = status_table(sweep_dir)
    assert [table[f"seed={s}"]["state"] for s in (1, 2, 3)] == ["stopped", "stopped", "not started"]


@pytest.mark.slow
def test_two_sweeps_on_one_sweep_dir_run_each_point_once(shakespeare_dir, tmp_path):
    # started together, before either has finished a point, in opposite orders, one with a point given twice:
    # whatever the interleaving, each point is started once, and no finished run is trained again
    sweep_dir = tmp_path / "sweep"
    procs = [subprocess.Popen([os.sys.executable, "sweep.py", *TINY, *GRID, f"--data_dir={shakespeare_dir}",
                               f"--sweep_dir={sweep_dir}", "--grid", grid], cwd=REPO,
                              env={**os.environ, **ONE_THREAD}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for grid in ("seed=1,1,2", "seed=2,1")]
    try:
        outs = [proc.communicate(timeout=300)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
    assert [proc.returncode for proc in procs] == [0, 0], outs
    out = "".join(outs)
    for point in ("seed=1", "seed=2"):
        assert out.count(f"] {point}: starting") == 1, out
        assert [r["step"] for r in read_metrics(sweep_dir / point, "config")] == [0]  # one run, never restarted
        assert read_metrics(sweep_dir / point, "eval")[-1]["step"] == 6
    assert "note: point seed=1 is given 2 times; it is one point, run once" in outs[0]
    assert json.loads((sweep_dir / "sweep.json").read_text())["points"] == {"seed=1": "done", "seed=2": "done"}


def test_a_claimed_point_is_refused_to_a_second_claim_and_shown_running_until_it_is_let_go(tmp_path):
    from sweep import Point, point_state

    point = Point("seed=1", [("seed", "1")], str(tmp_path / "seed=1"), 6)
    claim, other = point.claim("sweep A")
    assert other is None
    assert point.claim("sweep B") == (None, "another sweep (sweep A)")  # flock: even from this process's 2nd open
    assert point.holder() == "another sweep (sweep A)" and point_state(point, {}) == ("running", None)
    claim.close()
    assert point.holder() is None and point_state(point, {}) == ("not started", None)
    claim, other = point.claim("sweep B")
    assert other is None and point.holder() == "another sweep (sweep B)"
    claim.close()


def test_a_point_given_twice_is_one_point_and_two_points_in_one_directory_are_refused(tmp_path, capsys):
    import sweep

    args = [os.path.join(REPO, "config", "mini", "baseline.py"), f"--sweep_dir={tmp_path}", "--dry_run"]
    assert sweep.main([*args, "--grid", "seed=1,2,1"]) == 0
    out = capsys.readouterr().out
    assert out.count(": starting") == 2 and "[2/2] seed=2: starting" in out
    assert sweep.main([*args, "--grid", "data_dir=a/b,a-b"]) == 2
    assert "two points would train in one directory, 'data_dir=a-b'" in capsys.readouterr().err


def test_a_local_sweep_makes_each_arm_one_wandb_group_names_each_run_by_its_directory_and_tags_its_seed(tmp_path):
    config = os.path.join(REPO, "config", "mini", "baseline.py")

    def wandb_of(**options):
        points, train_args, _ = sweeps.plan(sweeps.Sweep(**options))
        configs = [parse_config(TrainConfig, p.train_args(train_args, False)[1:])[0] for p in points]
        return [{**c.wandb_init(), "label": c.wandb_run_name} for c in configs]

    # a grid: every combination of the axes but the seeds is an arm, one group; a run's name is its directory's
    grid = ["learning_rate=1e-3,2e-3", "seed,data_seed=1,2"]
    runs = wandb_of(train_args=[config], grid=grid, sweep_dir=str(tmp_path / "lr"))
    assert [(r["group"], r["name"], r["tags"]) for r in runs] == [
        (str(tmp_path / "lr" / f"learning_rate={lr}"), f"learning_rate={lr},seed={seed},data_seed={seed}",
         [f"seed={seed}"]) for lr in ("1e-3", "2e-3") for seed in (1, 2)]
    runs = wandb_of(train_args=[config], grid=["seed=1,2"], sweep_dir=str(tmp_path / "seeds"))
    assert [(r["group"], r["name"]) for r in runs] == [(str(tmp_path / "seeds"), f"seed={s}") for s in (1, 2)]
    # named points are arms: each its own group under the sweep's; its runs are labelled by the point in
    # compare.py's tables (wandb_run_name) and named by their directories in wandb, unique
    points = tmp_path / "arms.toml"
    points.write_text('[baseline]\n[res_gelu]\nquery_mode = "res_gelu"\n')
    runs = wandb_of(train_args=[config], grid=["seed=1,2"], points=str(points), sweep_dir=str(tmp_path / "arms"))
    assert [(r["group"], r["name"], r["label"]) for r in runs] == [
        (str(tmp_path / "arms" / arm), f"{arm},seed={seed}", arm)
        for arm in ("baseline", "res_gelu") for seed in (1, 2)]
    runs = wandb_of(train_args=[config], grid=["learning_rate=1e-3,2e-3", "seed=1"], points=str(points),
                    sweep_dir=str(tmp_path / "a"))
    assert [r["group"] for r in runs] == [str(tmp_path / "a" / f"{arm},learning_rate={lr}")
                                          for arm in ("baseline", "res_gelu") for lr in ("1e-3", "2e-3")]
    # a group the sweep's config or command names is kept, and so are its own tags; its own wandb_name comes first
    runs = wandb_of(train_args=[config, "--wandb_group=mine", "--wandb_tags=a", "--wandb_name=mine"],
                    grid=["seed=1,2"], sweep_dir=str(tmp_path / "own"))
    assert [(r["group"], r["name"], r["tags"]) for r in runs] == [("mine", f"mine/seed={s}", ["a"]) for s in (1, 2)]
    # a run of train.py alone: wandb_run_name, else out_dir's last component (a config file's name is every run's)
    assert [TrainConfig(out_dir="out/a-1", **kw).wandb_init()["name"] for kw in (
        {}, {"wandb_run_name": "label"}, {"wandb_run_name": "label", "wandb_name": "arm/seed=1"})] == [
        "a-1", "label", "arm/seed=1"]


def test_bad_launcher_options_are_config_errors_before_anything_runs(tmp_path):
    proc = run_script("sweep.py", *TINY, "--grid", "seed=1,2", f"--sweep_dir={tmp_path / 's'}",
                      "--launcher=torchrun --standalone", check=False)
    assert proc.returncode == 2 and "--launcher='torchrun --standalone': choose local or slurm" in proc.stderr
    env = {"PATH": "/nonexistent"}  # no sbatch on PATH
    proc = subprocess.run([os.sys.executable, "sweep.py", *TINY, "--grid", "seed=1,2",
                           f"--sweep_dir={tmp_path / 's'}", "--launcher=slurm"],
                          capture_output=True, text=True, env={**os.environ, **env},
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 2 and "--launcher=slurm needs SLURM's sbatch and squeue on PATH" in proc.stderr
    assert not os.path.exists(tmp_path / "s")
    proc = run_script("sweep.py", "--status", str(tmp_path), check=False)
    assert proc.returncode == 2 and "holds no sweep.json" in proc.stderr


# ---------------------------------------------------------------------------------------
# a multi-process point's torchrun and the preemption signal


def alive(pid):
    """Whether process `pid` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_all(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.slow
def test_sigusr2_to_a_two_process_slurm_job_checkpoints_every_rank_and_the_resumed_run_is_unbroken(
        shakespeare_dir, tmp_path):
    # A point of 2 processes sharding the model (FSDP over gloo: every rank writes its own shard of each
    # checkpoint), run as SLURM runs a submitit job: `python -m submitit.core._submit FOLDER` in a process
    # group of its own, with SLURM's environment, and SIGUSR2 (SLURM's warning before a time limit) to that
    # process group, as slurmstepd sends it with proctrack/pgid: submitit's process and torchrun get it, the
    # workers (in sessions of their own) only from torchrun. submitit's handler calls PointJob.checkpoint,
    # then requeues the job (scontrol, recorded here) and exits.
    from submitit.core.utils import DelayedSubmission, JobPaths

    from nonlinear_queries.experiments.slurm import PointJob
    from nonlinear_queries.experiments.sweeps import Point

    run = ["--eval_interval=4", "--lr_decay_iters=12", "--dropout=0.1", "--batch_size=2",
           "--gradient_accumulation_steps=4", "--parallelism=fsdp"]
    sweep(shakespeare_dir, tmp_path / "unbroken", *run, "--max_iters=12", "--procs_per_run=2", "--grid", "seed=1")
    sweep_dir, job_id = tmp_path / "sweep", "4242"
    out = sweep_dir / "seed=1"
    train_args = [*TINY, *GRID, f"--data_dir={shakespeare_dir}", *run, "--max_iters=1000"]
    folder = out / "slurm"
    os.makedirs(folder)
    delayed = DelayedSubmission(PointJob(Point("seed=1", [("seed", "1")], str(out), 1000), train_args, 2))
    delayed.set_timeout(10, 1000)
    paths = JobPaths(folder, job_id=job_id, task_id=0)
    delayed.dump(paths.submitted_pickle)
    bin_dir = tmp_path / "bin"
    os.makedirs(bin_dir)
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.calls"}\n')
    os.chmod(bin_dir / "scontrol", 0o755)
    slurm_env = {"SUBMITIT_EXECUTOR": "slurm", "SLURM_JOB_ID": job_id, "SLURM_NTASKS": "1",
                 "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                 "SLURM_JOB_NODELIST": socket.gethostname(), "SLURM_CPUS_PER_TASK": "2",
                 "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    with open(tmp_path / "job.log", "w") as log:
        job = subprocess.Popen([sys.executable, "-m", "submitit.core._submit", str(folder)], cwd=REPO,
                               env={**os.environ, **slurm_env}, stdout=log, stderr=subprocess.STDOUT,
                               start_new_session=True)
    family = []
    try:
        wait_until(lambda: last_logged_step(out) >= 5 or job.poll() is not None, 300, "the job at step 5")
        family = descendants(job.pid)  # torchrun and its two workers
        assert len(family) == 3, (family, (tmp_path / "job.log").read_text())
        os.killpg(job.pid, signal.SIGUSR2)
        code = job.wait(timeout=300)
        left = [pid for pid in family if alive(pid)]
    finally:
        kill_all([job.pid, *family])
    log = (tmp_path / "job.log").read_text()
    assert code == 255, log  # submitit's exit after a requeue, sys.exit(-1)
    assert not left, f"workers {left} still run after the job ended:\n{log}"
    assert (tmp_path / "scontrol.calls").read_text() == f"requeue {job_id}\n"
    # every rank finished the step in flight and wrote its shard of that step's checkpoint
    stopped = last_logged_step(out)
    assert 5 <= stopped < 12
    assert f"stopped by SIGUSR2 after step {stopped}" in log, log[-4000:]
    assert os.readlink(out / "ckpt.dcp") == f"ckpt_{stopped:06d}.dcp"
    assert sorted(os.path.basename(p) for p in glob.glob(str(out / "ckpt.dcp" / "*.distcp"))) == [
        "__0_0.distcp", "__1_0.distcp"]
    # the requeued job runs the same point again; the same command resumes it to the unbroken run
    requeued = DelayedSubmission.load(paths.submitted_pickle).function
    assert isinstance(requeued, PointJob) and requeued.point.out_dir == str(out) and requeued.procs == 2
    proc = sweep(shakespeare_dir, sweep_dir, *run, "--max_iters=12", "--procs_per_run=2", "--grid", "seed=1")
    assert "seed=1: resuming" in proc.stdout
    assert losses_by_step(out) == losses_by_step(tmp_path / "unbroken" / "seed=1")  # bit for bit
    assert sorted(losses_by_step(out)) == list(range(1, 13))
    assert evals(out) == evals(tmp_path / "unbroken" / "seed=1")


WORKER = """import os, signal, sys, time
got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
open(os.path.join(sys.argv[1], f"{os.environ['RANK']}.started"), "w").close()
while not got:
    time.sleep(0.05)
time.sleep(35)  # a checkpoint that takes longer to write than torchrun's default shutdown timeout (30 s)
open(os.path.join(sys.argv[1], f"{os.environ['RANK']}.saved"), "w").close()
"""


@pytest.mark.slow
def test_a_point_s_torchrun_waits_for_a_checkpoint_longer_than_its_default_30_s(tmp_path):
    # two workers that take 35 s to save after SIGTERM; torchrun, signalled as a scheduler or sweep.py
    # does, must let them finish rather than SIGKILL them after its default 30 s
    from nonlinear_queries.experiments.launch import launcher

    (tmp_path / "worker.py").write_text(WORKER)
    with open(tmp_path / "torchrun.log", "w") as log:
        proc = subprocess.Popen([*launcher(2), str(tmp_path / "worker.py"), str(tmp_path)], cwd=tmp_path,
                                stdout=log, stderr=subprocess.STDOUT)
    family = []
    try:
        wait_until(lambda: all((tmp_path / f"{r}.started").exists() for r in (0, 1)), 120, "both workers started")
        family = descendants(proc.pid)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        kill_all([proc.pid, *family])
    assert [(tmp_path / f"{r}.saved").exists() for r in (0, 1)] == [True, True], (tmp_path / "torchrun.log").read_text()


# ---------------------------------------------------------------------------------------
# SLURM


def job_id(point_dir):
    return json.loads((point_dir / "launch.json").read_text())["job_id"]


@pytest.mark.slow
def test_a_grid_on_slurm_finishes_compare_reads_it_and_a_failing_point_stops_nothing(slurm_cluster, shakespeare_dir,
                                                                                     tmp_path):
    sweep_dir = tmp_path / "sweep"
    grid = ["--grid", "learning_rate=1e-3,2e-3", "--launcher=slurm", "--cpus_per_task=1", "--slurm_time=10"]
    proc = sweep(shakespeare_dir, sweep_dir, *grid, env={**ONE_THREAD, **slurm_cluster.env})
    assert proc.stdout.count("submitted as job") == 2
    names = ["learning_rate=1e-3", "learning_rate=2e-3"]
    # submitting again while they are queued or running submits nothing
    again = sweep(shakespeare_dir, sweep_dir, *grid, env={**ONE_THREAD, **slurm_cluster.env}).stdout
    assert again.count("submitted as job") + again.count("done, skipped") == 0 or "not submitted again" in again
    assert "submitted as job" not in again
    wait_until(lambda: all(status_table(sweep_dir, slurm_cluster.env)[n]["state"] == "done" for n in names), 300,
               "both points done")
    table = status_table(sweep_dir, slurm_cluster.env)
    for name in names:
        assert table[name]["step"] == "6/6" and table[name]["SLURM job"] == job_id(sweep_dir / name)
        assert (sweep_dir / name / "slurm").is_dir()
    rows = list(csv.DictReader(run_script("compare.py", str(sweep_dir), "--format=csv").stdout.splitlines()))
    assert [(r["learning_rate"], r["step"]) for r in rows] == [("0.001", "6"), ("0.002", "6")]

    # a failing point is reported with its log; the other point finishes
    bad_dir = tmp_path / "bad"
    sweep(shakespeare_dir, bad_dir, "--grid", f"data_dir={shakespeare_dir},/nonexistent", "--launcher=slurm",
          "--cpus_per_task=1", "--slurm_time=10", env={**ONE_THREAD, **slurm_cluster.env})
    names = sorted(n for n in os.listdir(bad_dir) if os.path.isdir(bad_dir / n))  # the points
    failed = next(n for n in names if "nonexistent" in n)

    def settled():
        states = [row["state"] for row in status_table(bad_dir, slurm_cluster.env).values()]
        return all(s == "done" or s.startswith("failed") for s in states)

    wait_until(settled, 300, "one point done, one failed")
    table = status_table(bad_dir, slurm_cluster.env)
    assert table[failed]["state"] == "failed (exit status 1)"
    log = table[failed]["log"]
    assert log.startswith(str(bad_dir / failed / "slurm")) and "nonexistent" in open(log).read()
    assert [row["state"] for n, row in table.items() if n != failed] == ["done"]


def preempt_and_resume(cluster, sweep_dir, name, preemption):
    """Preempt point `name`'s SLURM job once it has trained 7 steps, check that train.py checkpointed and,
    where submitit requeues the job, that it did so only after train.py had exited, start the job again
    at once and wait until the point is done. preemption: "requeue" (SLURM requeues the job: SIGTERM to its
    processes) or "warning" (SIGUSR2 to the job step's processes, as SLURM sends before a time limit or a
    preemption: train.py checkpoints, submitit requeues the job). Returns the step the job stopped after."""
    point = sweep_dir / name
    job = job_id(point)
    metrics = point / "metrics.jsonl"
    wait_until(lambda: metrics.exists() and any(r["type"] == "train" and r["step"] >= 7
                                                for r in read_metrics(point)), 300, "the job at step 7")
    if preemption == "requeue":
        cluster.scontrol("requeue", job)
    else:
        cluster.command("scancel", "--signal=USR2", job)
    wait_until(lambda: status_table(sweep_dir, cluster.env)[name]["state"] == "preempted-requeued", 120,
               "the job requeued")
    stopped_at = max(r["step"] for r in read_metrics(point, "train"))
    with open(json.loads((point / "launch.json").read_text())["log"]) as f:
        log = f.read()
    stopped = f"stopped by {'SIGTERM' if preemption == 'requeue' else 'SIGUSR2'} after step {stopped_at}"
    assert stopped in log, log
    if preemption == "warning":
        assert log.index(stopped) < log.index(f"Requeued job {job}"), log
    # else SLURM waits ~2 min to start it again. Not "now": slurmd refuses a job's launch while its credential is
    # no newer than the kill's, counted in whole seconds, so a start in the kill's second fails the job at once
    # ("Job credential revoked"); the queue shows the job requeued only once the kill is done
    cluster.scontrol("update", f"JobId={job}", "StartTime=now+2")
    wait_until(lambda: status_table(sweep_dir, cluster.env)[name]["state"] == "done", 300, "the job done")
    starts = [r["step"] for r in read_metrics(point, "config")]
    assert len(starts) == 2 and 0 < starts[1] <= stopped_at  # resumed from its checkpoint, not restarted
    assert json.loads((point / "attempt.json").read_text())["starts"] == 2
    return stopped_at


@pytest.mark.slow
@pytest.mark.parametrize("preemption", ["requeue", "warning"])
def test_a_job_requeued_mid_run_resumes_to_the_losses_of_a_local_run(slurm_cluster, shakespeare_dir, tmp_path,
                                                                     preemption):
    long = ["--max_iters=40", "--eval_interval=5", "--lr_decay_iters=40"]
    local = tmp_path / "local"
    sweep(shakespeare_dir, local, "--grid", "seed=3", *long)
    sweep_dir = tmp_path / "slurm"
    sweep(shakespeare_dir, sweep_dir, "--grid", "seed=3", *long, "--launcher=slurm", "--cpus_per_task=1",
          "--slurm_time=10", env={**ONE_THREAD, **slurm_cluster.env})
    assert preempt_and_resume(slurm_cluster, sweep_dir, "seed=3", preemption) < 40
    assert losses_by_step(sweep_dir / "seed=3") == losses_by_step(local / "seed=3")  # bit for bit


@pytest.mark.slow
def test_a_two_process_point_on_slurm_equals_its_one_process_run_through_a_preemption_warning(
        slurm_cluster, shakespeare_dir, tmp_path):
    # the point is a torchrun of 2 processes. SLURM's warning goes to the job step's processes (this
    # cluster's proctrack/linuxproc: every one, the workers too); torchrun forwards it to its workers and
    # waits for them, so submitit requeues the job only after rank 0 wrote the checkpoint and every rank exited
    batch = ["--batch_size=2", "--gradient_accumulation_steps=4", "--max_iters=40", "--eval_interval=5",
             "--lr_decay_iters=40", "--grid", "seed=1"]
    sweep(shakespeare_dir, tmp_path / "one", *batch)
    sweep_dir = tmp_path / "two"
    sweep(shakespeare_dir, sweep_dir, *batch, "--launcher=slurm", "--procs_per_run=2", "--cpus_per_task=2",
          "--slurm_time=10", env={**ONE_THREAD, **slurm_cluster.env})
    assert preempt_and_resume(slurm_cluster, sweep_dir, "seed=1", "warning") < 40
    log = json.loads((sweep_dir / "seed=1" / "launch.json").read_text())["log"]
    assert "x 2 processes (gloo)" in open(log).read()
    one, two = losses_by_step(tmp_path / "one" / "seed=1"), losses_by_step(sweep_dir / "seed=1")
    assert sorted(two) == list(range(1, 41))
    for step in two:
        assert abs(one[step] - two[step]) <= 1e-5, (step, one[step], two[step])


def test_slurm_time_limits_are_read_as_slurm_writes_them():
    from nonlinear_queries.experiments.slurm import slurm_minutes

    assert [slurm_minutes(t) for t in ("10", "30:30", "4:00:00", "1-02", "1-00:00:00")] == [10, 31, 240, 1560, 1440]
    for bad in ("", "0", "4h", "1:2:3:4"):
        with pytest.raises(Exception, match="write a time limit as SLURM does"):
            slurm_minutes(bad)
