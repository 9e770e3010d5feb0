"""
Run train.py over a grid of config values, one out_dir per point: N points at a time on this
machine, or one SLURM job per point on a cluster.

    python sweep.py config/mini/res_gelu.py --grid learning_rate=1.5e-3,3e-3,6e-3 --grid seed=1,2,3
    python sweep.py config/mini/res_gelu.py --grid seed=1,2,3,4 --jobs=2          # 2 points at a time
    python sweep.py config/res_gelu.py --grid seed=1,2,3 --launcher=slurm --gpus_per_run=8 --slurm_partition=gpu
    python sweep.py --status out-mini/res_gelu                # each point's state, from any shell
    python compare.py out-mini/res_gelu                       # the table of the finished points

Arguments other than sweep.py's own options go to every run as they are: config files
and --key=value overrides, as for train.py. Each `--grid key=v1,v2,...` adds an axis; the
points are the product of the axes, in order (`--grid seed,data_seed=1,2,3` is one axis that
sets both keys to each value). Point `learning_rate=2e-3, seed=1` trains in
SWEEP_DIR/learning_rate=2e-3,seed=1 (SWEEP_DIR: --sweep_dir, by default the out_dir of
the config), so compare.py can read SWEEP_DIR directly.

`--points FILE` gives points that are not a product, each by name: a TOML file whose tables
[NAME] hold a point's settings and whose top-level `key = value` settings go to every run (an
`out_dir` there is the default SWEEP_DIR). Point NAME trains in SWEEP_DIR/NAME with the run
name NAME (wandb_run_name, recorded in its config.json); each is crossed with the --grid axes,
if any (NAME,seed=1, ...). The official res_gelu grid (docs/official.md) is one such file:

    python sweep.py config/res_gelu.py --points config/official/res_gelu_grid.toml

Every point's config is checked before the first run starts. Running the same command
again skips finished points (an evaluation at max_iters, or a divergence, in the point's
metrics.jsonl), resumes a point that has a checkpoint, and starts the rest; with
--launcher=slurm it also skips points whose job is still queued or running. A point given
twice is one point. Two sweeps may share a SWEEP_DIR (the same command in two shells): a point
is launched only under its claim (POINT/.sweep.lock, held while its train.py runs), its status
read again there, so a finished point is never started again and a stopped one resumes; a point
that another sweep runs is passed over and taken up when that sweep lets it go, so each sweep
ends with every point done. A run that diverges (train.py's exit status 3) is a result. A run
that fails is reported with its log and the other points go on; the sweep then exits 1.
SWEEP_DIR/sweep.json records the command and every point's status; each point's directory holds
its log (train.log, or slurm/ for SLURM jobs) and launch.json (the launcher, the SLURM job id,
the log, the exit status).

--launcher=local (the default) runs --jobs points at a time as processes of this machine,
the operating system scheduling them: on the CPU each gets OMP_NUM_THREADS = cores / jobs
unless it is set; on CUDA each gets --gpus_per_run GPUs of its own (CUDA_VISIBLE_DEVICES),
a torchrun of that many processes. Ctrl-C or SIGTERM reaches every running point, each
writes its checkpoint, and the sweep stops.

--launcher=slurm submits one job per point through submitit, its logs in the point's
slurm/ directory: --nodes_per_run nodes with --gpus_per_run GPUs each (a torchrun per node,
the rendezvous on the job's first node, so train.py's DDP and FSDP paths run unchanged).
SLURM sends the job SIGUSR2 90 s before its time limit (and at a preemption where the cluster
sets PreemptParameters=send_user_signal): train.py writes its checkpoint and exits, and
submitit requeues the job, which resumes from that checkpoint; a multi-process point's
torchrun forwards the signal to every worker and waits for their checkpoints (launcher()). A
job that SLURM requeues itself (scontrol requeue, preemption with PreemptMode=REQUEUE) gets
SIGTERM, checkpoints the same way, and resumes when it runs again. The job's state is in
launch.json and SLURM's queue (no accounting database needed).
"""


import nonlinear_queries.interrupt  # noqa: F401  (first: Ctrl-C at any moment ends with one line)

import argparse
import contextlib
import itertools
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, fields

from nonlinear_queries.atomic import write_json
from nonlinear_queries.cli import run_main
from nonlinear_queries.configurator import ConfigError, parse_config
from nonlinear_queries.lock import exclusive, lock_holder, out_dir_holder, try_lock
from nonlinear_queries.runs import history, read_records, run_status
from nonlinear_queries.train_config import TrainConfig

REPO = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(REPO, "train.py")
SET_BY_SWEEP = ("out_dir", "init_from", "resume_from", "overwrite")  # where and how each point's run starts


def parse_grid(specs):
    """[(keys, [raw values])] from `key=v1,v2,...` strings, in order; `key1,key2=v1,v2,...` is one axis
    whose every value sets all its keys (seed,data_seed=1,2: seed and data_seed move together). Raises
    ConfigError for a malformed axis, an unknown key, a key given twice or an empty value. Values stay as
    typed (they name the point's directory); train.py parses them."""
    known = {f.name for f in fields(TrainConfig)}
    axes, seen = [], set()
    for spec in specs:
        names, sep, values = spec.partition("=")
        keys = tuple(names.split(","))
        if not sep or not all(keys):
            raise ConfigError(f"--grid {spec!r}: write an axis as key=v1,v2,... (or key1,key2=v1,v2,...)")
        for key in keys:
            if key not in known:
                raise ConfigError(f"--grid {spec!r}: unknown config key {key!r}")
            if key in SET_BY_SWEEP:
                raise ConfigError(f"--grid {spec!r}: sweep.py sets {key} itself")
            if key in seen:
                raise ConfigError(f"--grid {spec!r}: {key} is already an axis")
            seen.add(key)
        raws = values.split(",")
        if not all(raws):
            raise ConfigError(f"--grid {spec!r}: empty value")
        axes.append((keys, raws))
    return axes


def read_points(path):
    """(shared, points) of a --points file (TOML): shared, [(key, raw value)], its top-level settings, for every
    run; points, [(name, [(key, raw value)])], one per table [name], in file order. A raw value is the TOML
    value as train.py parses it (a string as it is, else its repr). Raises ConfigError for a file that cannot
    be read or is not TOML, an unknown key, a key sweep.py sets itself (out_dir only at the top level), a
    name that cannot be a directory name, or a file without a point."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"--points {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--points {path}: not a TOML file: {e}") from None
    keys = {f.name for f in fields(TrainConfig)}

    def settings(table, where, own=()):
        for key in table:
            if key not in keys:
                raise ConfigError(f"--points {path}: {where}: unknown config key {key!r}")
            if key in SET_BY_SWEEP and key not in own:
                raise ConfigError(f"--points {path}: {where}: sweep.py sets {key} itself")
        return [(k, v if isinstance(v, str) else repr(v)) for k, v in table.items()]

    shared = settings({k: v for k, v in data.items() if not isinstance(v, dict)}, "top level", own=("out_dir",))
    points = [(name, settings(table, f"[{name}]")) for name, table in data.items() if isinstance(table, dict)]
    for name, _ in points:
        if "/" in name or name.startswith(".") or "=" in name:
            raise ConfigError(f"--points {path}: [{name}]: a point's name is its directory's: no '/', '=' or "
                              f"leading '.'")
    if not points:
        raise ConfigError(f"--points {path}: no point; write each as a table [NAME] of its settings")
    return shared, points


def point_name(point):
    """Directory name of a grid point [(key, raw value)]: 'learning_rate=2e-3,seed=1'."""
    return ",".join(f"{k}={v.replace('/', '-')}" for k, v in point)


def point_progress(out_dir, max_iters):
    """What a point's run dir says (runs.py reads it): {'status': runs.run_status's 'done', 'diverged at
    step k', 'resume' or 'new'; 'step': the last step trained or evaluated (0 if none); 'val_loss': the last
    evaluation's val loss (None if none)}."""
    metrics = os.path.join(out_dir, "metrics.jsonl")
    records = read_records(metrics, warn=False) if os.path.isfile(metrics) else []
    evals = history(records)[0]
    step = max((r["step"] for r in records if r["type"] in ("train", "eval")), default=0)
    return {"status": run_status(out_dir, max_iters), "step": step,
            "val_loss": evals[max(evals)][1] if evals else None}


def finished(status):
    return status == "done" or status.startswith("diverged")


@dataclass
class Point:
    """A grid point: its name, [(key, raw value)], out_dir and max_iters."""

    name: str
    values: list
    out_dir: str
    max_iters: int

    def status(self):
        return point_progress(self.out_dir, self.max_iters)["status"]

    def claim_path(self):
        return os.path.join(self.out_dir, ".sweep.lock")

    def claim(self, holder):
        """Take this point to launch it: the lock of out_dir/.sweep.lock (lock.try_lock), held until the returned
        file is closed or this process ends, with `holder` (who, for the others' messages) written in it. Under
        it the point's status, read again, stays true until its train.py holds out_dir itself, so two sweeps
        (or SLURM jobs) never both launch it. Returns (the lock file, None), or (None, who runs the point: another
        sweep, or a train.py in out_dir started by hand). On a file system without flock(2) the point is taken
        unlocked, with a warning."""
        try:
            lock, other = try_lock(self.claim_path(), holder)
        except OSError as e:
            print(f"warning: {self.out_dir}: the file system does not lock files ({e.strerror}), so nothing keeps "
                  f"another sweep off this point; run one sweep at a time on this sweep_dir", file=sys.stderr)
            return contextlib.ExitStack(), None  # nothing to release
        if lock is None:
            return None, f"another sweep ({other})"
        running = out_dir_holder(self.out_dir)
        if running:
            lock.close()
            return None, f"a training run ({running})"
        return lock, None

    def holder(self):
        """Who runs this point now (a sweep's claim, or a train.py's out_dir lock), None if nobody."""
        other = lock_holder(self.claim_path())
        return f"another sweep ({other})" if other else out_dir_holder(self.out_dir)

    def train_args(self, train_args, resume):
        """train.py's arguments for this point: the sweep's, the point's values, its out_dir, and
        --init_from=resume where it has a checkpoint (else --overwrite=True: a new run)."""
        return [TRAIN, *train_args, *(f"--{k}={v}" for k, v in self.values), f"--out_dir={self.out_dir}",
                "--init_from=resume" if resume else "--overwrite=True"]


# torchrun forwards these signals to its workers (each in a session of its own, which a signal to torchrun's
# process group misses): its defaults, and the warnings a scheduler sends before a time limit or a preemption
# (SIGUSR2 is submitit's and SLURM's here; any other kills torchrun at once and orphans the workers). It then
# waits this long for them to checkpoint and exit before it SIGKILLs them (torchrun's default is 30 s, less than
# a large model's checkpoint takes to write).
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
TORCHRUN_SHUTDOWN_TIMEOUT_S = 600


def launcher(procs, rendezvous=()):
    """The command that starts train.py's `procs` processes on this node: python, or torchrun, which forwards
    TORCHRUN_SIGNALS to the workers and waits TORCHRUN_SHUTDOWN_TIMEOUT_S seconds for them to exit
    (torch.distributed.run's --signals_to_handle and --shutdown_timeout)."""
    if procs == 1 and not rendezvous:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}",
            f"--signals_to_handle={TORCHRUN_SIGNALS}", f"--shutdown_timeout={TORCHRUN_SHUTDOWN_TIMEOUT_S}",
            *(rendezvous or ["--standalone"])]


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def write_record(sweep_dir, argv, statuses, points):
    """SWEEP_DIR/sweep.json: the command, {point: status} and {point: max_iters}, replaced atomically. The points
    another sweep on this sweep_dir recorded stay in it (this sweep's own points as it has them), so --status
    lists every point of both."""
    path = os.path.join(sweep_dir, "sweep.json")
    # two sweeps on one sweep_dir update this file at once: one at a time (read, merge, write), each writing
    # through its own temporary file
    with exclusive(os.path.join(sweep_dir, ".sweep.json.lock")):
        before = read_json(path)
        write_json(path, {"command": shlex.join(["python", "sweep.py", *argv]),
                          "points": {**before.get("points", {}), **statuses},
                          "max_iters": {**before.get("max_iters", {}), **{p.name: p.max_iters for p in points}}},
                   per_process=True)


# ---------------------------------------------------------------------------------------
# --launcher=local: N processes at a time, scheduled by the operating system


def visible_gpus():
    """Indices of the CUDA devices this process may use ([] without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    return listed.split(",") if listed else [str(i) for i in range(torch.cuda.device_count())]


def run_local(points, train_args, args, on_cuda, record):
    """Run the points `args.jobs` at a time; returns the exit status (0, or 1 if a point failed). Each point is
    launched under its claim (Point.claim), its status read again there: one that another process finished
    meanwhile is skipped, one it stopped is resumed, and one it is running is passed over for the next point
    and taken up again once that process lets it go, so the sweep ends with every point done (or failed)."""
    gpus = visible_gpus() if on_cuda else []
    procs = max(args.gpus_per_run, 1) if gpus else args.procs_per_run
    jobs = min(args.jobs, len(gpus) // procs) if gpus else args.jobs
    if gpus and jobs < 1:
        print(f"error: a point needs {procs} GPUs and {len(gpus)} are visible", file=sys.stderr)
        return 1
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, len(os.sched_getaffinity(0)) // (jobs * procs)))
    running, failed, stop = {}, [], []  # running: Popen -> (point, its GPUs, its claim)

    def forward(signum, frame):  # every running point checkpoints and exits; nothing new starts
        stop.append(signum)
        for child in running:
            child.send_signal(signum)

    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    queue, waiting = list(points), set()  # waiting: the points another process runs, each said once
    me = f"sweep.py, host {socket.gethostname()}, PID {os.getpid()}"
    while (queue and not stop) or running:
        for point in list(queue):
            if stop or len(running) >= jobs:
                break
            tag = f"[{points.index(point) + 1}/{len(points)}] {point.name}"
            claim, other = point.claim(me)
            if claim is None:
                if point.name not in waiting:
                    waiting.add(point.name)
                    print(f"{tag}: run by {other}; taken up when it ends", flush=True)
                continue
            queue.remove(point)
            status = point.status()
            if finished(status):
                claim.close()
                record(point, status)
                print(f"{tag}: {status} (run meanwhile by another process), skipped", flush=True)
                continue
            mine, gpus = gpus[:procs], gpus[procs:]
            resume = status == "resume"
            cmd = [*launcher(procs), *point.train_args(train_args, resume)]
            log = os.path.join(point.out_dir, "train.log")
            print(f"{tag}: {'resuming' if resume else 'starting'} (log: {log})\n  {shlex.join(cmd)}", flush=True)
            os.makedirs(point.out_dir, exist_ok=True)
            env = {**os.environ, "OMP_NUM_THREADS": threads}
            if mine:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
            write_json(os.path.join(point.out_dir, "launch.json"), {"launcher": "local", "log": log})
            with open(log, "a") as f:
                running[subprocess.Popen(cmd, env=env, stdout=f, stderr=subprocess.STDOUT)] = (point, mine, claim)
        time.sleep(0.2)
        for child in [c for c in running if c.poll() is not None]:
            point, mine, claim = running.pop(child)
            claim.close()
            gpus += mine
            code, status = child.returncode, point.status()
            log = os.path.join(point.out_dir, "train.log")
            write_json(os.path.join(point.out_dir, "launch.json"), {"launcher": "local", "log": log,
                                                                    "exit_status": code})
            record(point, status)
            if code not in (0, 3):
                failed.append(point.name)
                print(f"error: {point.name} failed (exit status {code}); its log: {log}", file=sys.stderr)
            else:
                print(f"{point.name}: {status if finished(status) else 'stopped at its checkpoint'}", flush=True)
    if stop:
        print("sweep stopped; every running point wrote its checkpoint. Run the same command again to continue",
              file=sys.stderr)
    if failed:
        print(f"error: {len(failed)} point(s) failed: {', '.join(failed)}. Fix the cause and run the same command "
              f"again: finished points are skipped", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------------
# --launcher=slurm: one SLURM job per point, through submitit


class PointJob:
    """What a SLURM job of a point runs (submitit pickles it): train.py, resuming from the
    point's checkpoint if it has one, so that a requeued job continues where it stopped.
    Raises RuntimeError if train.py fails, which submitit records as the job's failure."""

    def __init__(self, point, train_args, procs):
        self.point, self.train_args, self.procs, self.child, self.torchrun = point, train_args, procs, None, False

    def __call__(self):
        import submitit

        env = submitit.JobEnvironment()
        claim = None
        if env.node == 0:  # the point's claim, held while train.py runs (Point.claim); the status read under it
            claim, other = self.point.claim(f"SLURM job {env.job_id}, host {env.hostname}")
            if claim is None:
                print(f"{self.point.name}: run by {other}; this job leaves it to that one", flush=True)
                return f"run by {other}"
        status = self.point.status()
        if finished(status):
            return status
        rendezvous = ()
        if env.num_nodes > 1:  # a torchrun per node; the rendezvous on the job's first node
            rendezvous = [f"--nnodes={env.num_nodes}", f"--node_rank={env.node}", f"--master_addr={env.hostnames[0]}",
                          f"--master_port={20000 + int(env.job_id.split('_')[0]) % 20000}"]
        launch = launcher(self.procs, rendezvous)
        self.torchrun = len(launch) > 1
        cmd = [*launch, *self.point.train_args(self.train_args, status == "resume")]
        attempt = os.path.join(self.point.out_dir, "attempt.json")
        starts = read_json(attempt).get("starts", 0) + 1
        if env.node == 0:
            write_json(attempt, {"job_id": env.job_id, "starts": starts, "host": env.hostname})
        threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, int(os.environ.get("SLURM_CPUS_PER_TASK", "1"))
                                                               // self.procs))
        print(f"{self.point.name}: {'resuming' if status == 'resume' else 'starting'} (start {starts} of job "
              f"{env.job_id})\n  {shlex.join(cmd)}", flush=True)
        self.child = subprocess.Popen(cmd, env={**os.environ, "OMP_NUM_THREADS": threads})
        code = self.child.wait()
        if env.node == 0:
            write_json(attempt, {"job_id": env.job_id, "starts": starts, "host": env.hostname, "exit_status": code})
            claim.close()
        if code not in (0, 3):
            raise RuntimeError(f"train.py exited with status {code}")
        return self.point.status()

    def checkpoint(self):
        """Called by submitit on the scheduler's warning signal (SIGUSR2), before it requeues the
        job: train.py got the signal too; it writes its checkpoint and exits, then the requeued
        job resumes from it. SLURM signals the job step's processes (the task's process group at
        the least, which the child shares), so a torchrun child got it too and forwards it to its
        workers; it is not signalled again, as a second signal would interrupt torchrun's wait for
        them. A train.py child is (a repeat is harmless to it)."""
        import submitit

        if self.child is not None and self.child.returncode is None:
            if not self.torchrun:
                self.child.send_signal(signal.SIGUSR2)
            # wait for it to exit without reaping it: __call__'s wait, which this signal handler
            # interrupted, reaps it (Popen.wait here would deadlock on that wait's lock)
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, self.child.pid, os.WEXITED | os.WNOWAIT)
        return submitit.helpers.DelayedSubmission(PointJob(self.point, self.train_args, self.procs))


def slurm_queue():
    """{job id: state} of SLURM's queue (squeue; PENDING, RUNNING, ...). Raises ConfigError
    if squeue is missing or the controller does not answer."""
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        raise ConfigError("--launcher=slurm needs SLURM's sbatch and squeue on PATH; run sweep.py on a login node of "
                          "the cluster (or load its slurm module)")
    try:
        proc = subprocess.run(["squeue", "--noheader", "--format=%i %T"], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        proc = subprocess.CompletedProcess([], 1, "", "no answer in 60 s")
    if proc.returncode:
        raise ConfigError(f"SLURM's controller does not answer (squeue: {proc.stderr.strip()}); check that slurmctld "
                          f"runs and SLURM_CONF names its config")
    return dict(line.split() for line in proc.stdout.splitlines() if line.strip())


def parse_sbatch_options(specs):
    """{option: value} from --slurm_option KEY=VALUE (an sbatch option without its dashes; a bare KEY is a flag)."""
    options = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not key:
            raise ConfigError(f"--slurm_option {spec!r}: write an sbatch option as key=value, e.g. mem=64G")
        options[key.lstrip("-")] = value if sep else True
    return options


def slurm_minutes(spec):
    """Minutes of a SLURM time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (seconds rounded
    up). Raises ConfigError for anything else."""
    days, _, clock = spec.rpartition("-")
    try:
        parts = [int(p) for p in clock.split(":")]
        if days:
            hms = (parts + [0, 0])[:3]
        else:
            hms = {1: [0, parts[0], 0], 2: [0, *parts], 3: parts}[len(parts)]
        total = int(days or 0) * 1440 + hms[0] * 60 + hms[1] + (hms[2] > 0)
    except (ValueError, KeyError):
        total = 0
    if total <= 0 or len(clock.split(":")) > 3:
        raise ConfigError(f"--slurm_time={spec!r}: write a time limit as SLURM does, e.g. 240, 4:00:00 or 1-00:00:00")
    return total


def run_slurm(points, train_args, args, on_cuda, record):
    """Submit one job per unfinished point that is not queued or running already; returns 0."""
    import submitit

    queue = slurm_queue()
    procs = args.gpus_per_run or args.procs_per_run  # the login node may have no GPU: ask for what is asked
    for i, point in enumerate(points):
        launch = read_json(os.path.join(point.out_dir, "launch.json"))
        job_id = launch.get("job_id")
        if job_id in queue:
            print(f"[{i + 1}/{len(points)}] {point.name}: job {job_id} is {queue[job_id].lower()}, not submitted again")
            continue
        status, other = point.status(), point.holder()  # again: another sweep may have run it meanwhile
        if finished(status) or other:
            if finished(status):
                record(point, status)
            print(f"[{i + 1}/{len(points)}] {point.name}: {status if finished(status) else f'run by {other}'}, "
                  f"not submitted", flush=True)
            continue
        executor = submitit.SlurmExecutor(folder=os.path.join(point.out_dir, "slurm"), max_num_timeout=1000)
        executor.update_parameters(
            job_name=point.name, time=slurm_minutes(args.slurm_time), nodes=args.nodes_per_run, ntasks_per_node=1,
            cpus_per_task=args.cpus_per_task, stderr_to_stdout=True, signal_delay_s=90,
            **({"gpus_per_node": args.gpus_per_run} if args.gpus_per_run else {}),
            **{k: v for k, v in (("partition", args.slurm_partition), ("account", args.slurm_account),
                                 ("qos", args.slurm_qos)) if v},
            setup=args.slurm_setup, additional_parameters=args.sbatch_options)
        os.makedirs(point.out_dir, exist_ok=True)
        job = executor.submit(PointJob(point, train_args, procs))
        log = str(job.paths.stdout)
        write_json(os.path.join(point.out_dir, "launch.json"), {"launcher": "slurm", "job_id": job.job_id,
                                                                "log": log})
        record(point, f"submitted as job {job.job_id}")
        print(f"[{i + 1}/{len(points)}] {point.name}: submitted as job {job.job_id} (log: {log})", flush=True)
    print(f"\nFollow the sweep with:\n  python sweep.py --status {shlex.quote(args.sweep_dir)}")
    return 0


# ---------------------------------------------------------------------------------------
# --status


def point_state(point, queue):
    """(state, log) of a point: done, diverged, running, queued, preempted-requeued, failed,
    stopped (a checkpoint to resume from) or not started; log: its log file where it failed."""
    progress = point_progress(point.out_dir, point.max_iters)
    launch = read_json(os.path.join(point.out_dir, "launch.json"))
    attempt = read_json(os.path.join(point.out_dir, "attempt.json"))
    exit_status = attempt.get("exit_status", launch.get("exit_status"))
    state = queue.get(launch.get("job_id"), "") if launch.get("launcher") == "slurm" else ""
    if finished(progress["status"]):
        return progress["status"].split(" at ")[0], None
    if state in ("RUNNING", "COMPLETING", "CONFIGURING") or (not state and point.holder()):
        return "running", None
    if state:  # PENDING, REQUEUED, REQUEUE_HOLD, SUSPENDED...
        return ("preempted-requeued" if attempt.get("starts") else "queued"), None
    if exit_status not in (None, 0, 3):
        return f"failed (exit status {exit_status})", launch.get("log")
    if launch.get("launcher") == "slurm" and attempt.get("starts") and exit_status is None:
        return "failed (the job ended without train.py's exit status)", launch.get("log")
    return ("stopped" if progress["status"] == "resume" else "not started"), None


def show_status(sweep_dir):
    """Print the table of a sweep's points (SWEEP_DIR/sweep.json); returns the exit status."""
    record = read_json(os.path.join(sweep_dir, "sweep.json"))
    if not record:
        print(f"error: {sweep_dir} holds no sweep.json: give the --sweep_dir of a sweep", file=sys.stderr)
        return 2
    max_iters = record.get("max_iters", {})
    def planned(name):  # a sweep.json of an older sweep.py has no max_iters: the run's config.json has
        config = read_json(os.path.join(sweep_dir, name, "config.json")).get("config", {})
        return max_iters.get(name, config.get("max_iters", -1))

    points = [Point(name, [], os.path.join(sweep_dir, name), planned(name)) for name in record["points"]]
    slurm = any(read_json(os.path.join(p.out_dir, "launch.json")).get("launcher") == "slurm" for p in points)
    try:
        queue = slurm_queue() if slurm else {}
    except ConfigError as e:
        print(f"warning: {e}; SLURM states are left out", file=sys.stderr)
        queue = {}
    rows = [("point", "state", "step", "val loss", "SLURM job", "log of a failed point")]
    for point in points:
        state, log = point_state(point, queue)
        progress = point_progress(point.out_dir, point.max_iters)
        job = read_json(os.path.join(point.out_dir, "launch.json")).get("job_id") or ""
        val = f"{progress['val_loss']:.4f}" if progress["val_loss"] is not None else ""
        rows.append((point.name, state, f"{progress['step']}/{point.max_iters}", val, job, log or ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0


# ---------------------------------------------------------------------------------------


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="an axis of the grid (repeat for more)")
    parser.add_argument("--points", metavar="FILE", help="a TOML file of named points (see above)")
    parser.add_argument("--sweep_dir", default="",
                        help="parent of the points' out_dirs (default: the config's out_dir)")
    parser.add_argument("--status", metavar="SWEEP_DIR", help="print the state of every point of a sweep, and exit")
    parser.add_argument("--launcher", default="local", help="local (this machine) or slurm (default: local)")
    parser.add_argument("--jobs", type=int, default=1, help="local: points run at a time (default: 1)")
    parser.add_argument("--gpus_per_run", type=int, default=0,
                        help="GPUs of a point (per node), one process each (default: 1 on CUDA)")
    parser.add_argument("--procs_per_run", type=int, default=1,
                        help="processes of a point on the CPU (gloo), per node (default: 1)")
    parser.add_argument("--nodes_per_run", type=int, default=1, help="slurm: nodes of a point (default: 1)")
    parser.add_argument("--cpus_per_task", type=int, default=None, help="slurm: CPUs of a point's job on each node")
    parser.add_argument("--slurm_partition", default="", help="slurm: the partition")
    parser.add_argument("--slurm_time", default="4:00:00",
                        help="slurm: a job's time limit; a point that needs longer is requeued from its checkpoint "
                             "(default: 4:00:00)")
    parser.add_argument("--slurm_account", default="", help="slurm: the account to charge")
    parser.add_argument("--slurm_qos", default="", help="slurm: the quality of service")
    parser.add_argument("--slurm_setup", action="append", default=[], metavar="LINE",
                        help="slurm: a shell line run in the job before train.py, e.g. 'module load cuda' (repeat)")
    parser.add_argument("--slurm_option", action="append", default=[], metavar="KEY=VALUE",
                        help="slurm: any other sbatch option, e.g. mem=64G or constraint=h100 (repeat)")
    parser.add_argument("--dry_run", action="store_true", help="print each point's status and command; run nothing")
    args, train_args = parser.parse_known_args(argv)
    if args.status:
        return show_status(args.status)
    try:
        if args.launcher not in ("local", "slurm"):
            raise ConfigError(f"--launcher={args.launcher!r}: choose local or slurm (a point's torchrun is "
                              f"--gpus_per_run=N, or --procs_per_run=N on the CPU)")
        if min(args.jobs, args.procs_per_run, args.nodes_per_run) < 1 or args.gpus_per_run < 0:
            raise ConfigError("--jobs, --procs_per_run and --nodes_per_run are at least 1, --gpus_per_run at least 0")
        args.sbatch_options = parse_sbatch_options(args.slurm_option)
        slurm_minutes(args.slurm_time)
        axes = parse_grid(args.grid)
        if not axes and not args.points:
            raise ConfigError("no --grid axis or --points file given; e.g. --grid learning_rate=1e-3,2e-3 "
                              "--grid seed=1,2,3")
        shared, named = read_points(args.points) if args.points else ([], [(None, [])])
        train_args = [*train_args, *(f"--{k}={v}" for k, v in shared if k != "out_dir")]
        base, _ = parse_config(TrainConfig, train_args)
        args.sweep_dir = args.sweep_dir or dict(shared).get("out_dir", base.out_dir)
        grid = [[(k, v) for (keys, _), v in zip(axes, combo) for k in keys]
                for combo in itertools.product(*(raws for _, raws in axes))]
        # a named point's run is named after it; its settings, then the grid's, override the config
        values = [([("wandb_run_name", label)] if label else []) + [*own, *g] for label, own in named for g in grid]
        names = [",".join(filter(None, [label, point_name(g)])) for label, _ in named for g in grid]
        unique = {}  # a point given twice (--grid seed=1,1) is one point: one directory, one run
        for name, point in zip(names, values):
            if unique.setdefault(name, point) != point:
                raise ConfigError(f"two points would train in one directory, {name!r}: {unique[name]} and {point}; "
                                  f"give them values that name distinct directories")
        for name in (n for n in unique if names.count(n) > 1):
            print(f"note: point {name} is given {names.count(name)} times; it is one point, run once")
        names, values = list(unique), list(unique.values())
        configs = [parse_config(TrainConfig, [*train_args, *(f"--{k}={v}" for k, v in p)])[0] for p in values]
        if args.launcher == "slurm" and not args.dry_run:
            slurm_queue()  # sbatch there and the controller answering, before anything is submitted
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2

    points = [Point(name, v, os.path.join(args.sweep_dir, name), c.max_iters)
              for name, v, c in zip(names, values, configs)]
    statuses = {p.name: p.status() for p in points}
    todo = []
    for i, point in enumerate(points):
        status = statuses[point.name]
        if finished(status):
            print(f"[{i + 1}/{len(points)}] {point.name}: {status}, skipped")
        elif args.dry_run:
            print(f"[{i + 1}/{len(points)}] {point.name}: {'resuming' if status == 'resume' else 'starting'}\n  "
                  f"{shlex.join(point.train_args(train_args, status == 'resume'))}")
        else:
            todo.append(point)
    if args.dry_run:
        return 0
    os.makedirs(args.sweep_dir, exist_ok=True)

    def record(point, status):
        statuses[point.name] = status
        write_record(args.sweep_dir, argv, statuses, points)

    write_record(args.sweep_dir, argv, statuses, points)
    on_cuda = base.device != "cpu"  # 'auto' or 'cuda...': the GPUs this machine has, if any
    run = run_slurm if args.launcher == "slurm" else run_local
    code = run(todo, train_args, args, on_cuda, record)
    if args.launcher == "local":
        print(f"\n{sum(s == 'done' for s in statuses.values())} of {len(points)} points done, "
              f"{sum(s.startswith('diverged') for s in statuses.values())} diverged. Compare them with:\n"
              f"  python compare.py {shlex.quote(args.sweep_dir)}")
    return code


if __name__ == "__main__":
    sys.exit(run_main(main, sys.argv[1:]))
