"""
sweep.py's --launcher=slurm: one SLURM job per point of a sweep (sweeps.Point), through submitit, each
requeued from its checkpoint at its time limit or a preemption (see sweep.py's docstring).
"""

import contextlib
import os
import shlex
import shutil
import signal
import subprocess

from nonlinear_queries.errors import ConfigError
from nonlinear_queries.experiments.launch import launcher
from nonlinear_queries.record.atomic import write_json
from nonlinear_queries.record.runs import finished, read_json


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
        attempt = self.point.run_dir.attempt
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


def run_slurm(points, train_args, sweep, on_cuda, record):
    """Submit one job per unfinished point of `sweep` (a sweeps.Sweep: its SLURM options) that is not queued or
    running already, each with `train_args`; `record(point, status)` writes a status to sweep.json. Returns 0."""
    import submitit

    queue = slurm_queue()
    procs = sweep.gpus_per_run or sweep.procs_per_run  # the login node may have no GPU: ask for what is asked
    for i, point in enumerate(points):
        launch = read_json(point.run_dir.launch)
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
            job_name=point.name, time=slurm_minutes(sweep.slurm_time), nodes=sweep.nodes_per_run, ntasks_per_node=1,
            cpus_per_task=sweep.cpus_per_task, stderr_to_stdout=True, signal_delay_s=90,
            **({"gpus_per_node": sweep.gpus_per_run} if sweep.gpus_per_run else {}),
            **{k: v for k, v in (("partition", sweep.slurm_partition), ("account", sweep.slurm_account),
                                 ("qos", sweep.slurm_qos)) if v},
            setup=sweep.slurm_setup, additional_parameters=sweep.sbatch_options)
        os.makedirs(point.out_dir, exist_ok=True)
        job = executor.submit(PointJob(point, train_args, procs))
        log = str(job.paths.stdout)
        write_json(point.run_dir.launch, {"launcher": "slurm", "job_id": job.job_id, "log": log})
        record(point, f"submitted as job {job.job_id}")
        print(f"[{i + 1}/{len(points)}] {point.name}: submitted as job {job.job_id} (log: {log})", flush=True)
    print(f"\nFollow the sweep with:\n  python sweep.py --status {shlex.quote(sweep.sweep_dir)}")
    return 0
