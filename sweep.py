"""
Run train.py over a grid of config values, one out_dir per point: N points at a time on this
machine, or one SLURM job per point on a cluster.

    python sweep.py config/mini/res_gelu.py --grid learning_rate=1.5e-3,3e-3,6e-3 --grid seed=1,2,3
    python sweep.py config/mini/res_gelu.py --grid seed=1,2,3,4 --jobs=2          # 2 points at a time
    python sweep.py config/res_gelu.py --grid seed=1,2,3 --launcher=slurm --gpus_per_run=8 --slurm_partition=gpu
    python sweep.py --status out-mini/res_gelu                # each point's state, from any shell
    python compare.py out-mini/res_gelu                       # the table of the finished points

Arguments other than sweep.py's own options go to every run as they are: config files
and --key=value overrides, as for train.py (`python train.py --help` lists them). Each
`--grid key=v1,v2,...` adds an axis; the points are the product of the axes, in order
(`--grid seed,data_seed=1,2,3` is one axis that sets both keys to each value). Point
`learning_rate=2e-3, seed=1` trains in SWEEP_DIR/learning_rate=2e-3,seed=1 (SWEEP_DIR:
--sweep_dir, by default the out_dir of the config), so compare.py can read SWEEP_DIR directly.

`--points FILE` gives points that are not a product, each by name: a TOML file whose tables
[NAME] hold a point's settings and whose top-level `key = value` settings go to every run (an
`out_dir` there is the default SWEEP_DIR). Point NAME trains in SWEEP_DIR/NAME with the run
name NAME (wandb_run_name, its label in compare.py's tables, recorded in its config.json); each
is crossed with the --grid axes, if any (NAME,seed=1, ...). In wandb each arm is one group
(SWEEP_DIR/NAME for a named point, SWEEP_DIR/KEY=VALUE,... for a grid's values but seed and
data_seed) unless the config sets wandb_group, and each run is named by its directory under
SWEEP_DIR (NAME,seed=1) and tagged with its point's seed (seed=3; docs/sweeps.md). The
official res_gelu grid (docs/official.md) is one such file:

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
torchrun forwards the signal to every worker and waits for their checkpoints (launch.launcher). A
job that SLURM requeues itself (scontrol requeue, preemption with PreemptMode=REQUEUE) gets
SIGTERM, checkpoints the same way, and resumes when it runs again. The job's state is in
launch.json and SLURM's queue (no accounting database needed).
"""


import nonlinear_queries.interrupt  # noqa: F401  (first: Ctrl-C at any moment ends with one line)

import os
import sys

from nonlinear_queries.cli import run_main
from nonlinear_queries.errors import ConfigError
from nonlinear_queries.experiments.slurm import slurm_queue
from nonlinear_queries.experiments.sweeps import Point, Sweep, point_progress, run_sweep, sweep_parser
from nonlinear_queries.record.runs import RunDir, finished, read_json

# ---------------------------------------------------------------------------------------
# --status


def point_state(point, queue):
    """(state, log) of a point: done, diverged, running, queued, preempted-requeued, failed,
    stopped (a checkpoint to resume from) or not started; log: its log file where it failed."""
    progress = point_progress(point.out_dir, point.max_iters)
    launch = read_json(point.run_dir.launch)
    attempt = read_json(point.run_dir.attempt)
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
        config = read_json(RunDir(os.path.join(sweep_dir, name)).config).get("config", {})
        return max_iters.get(name, config.get("max_iters", -1))

    points = [Point(name, [], os.path.join(sweep_dir, name), planned(name)) for name in record["points"]]
    slurm = any(read_json(p.run_dir.launch).get("launcher") == "slurm" for p in points)
    try:
        queue = slurm_queue() if slurm else {}
    except ConfigError as e:
        print(f"warning: {e}; SLURM states are left out", file=sys.stderr)
        queue = {}
    rows = [("point", "state", "step", "val loss", "SLURM job", "log of a failed point")]
    for point in points:
        state, log = point_state(point, queue)
        progress = point_progress(point.out_dir, point.max_iters)
        job = read_json(point.run_dir.launch).get("job_id") or ""
        val = f"{progress['val_loss']:.4f}" if progress["val_loss"] is not None else ""
        rows.append((point.name, state, f"{progress['step']}/{point.max_iters}", val, job, log or ""))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    return 0

# ---------------------------------------------------------------------------------------


def main(argv):
    args, train_args = sweep_parser(__doc__).parse_known_args(argv)
    if args.status:
        return show_status(args.status)
    options = {k: v for k, v in vars(args).items() if k != "status"}
    return run_sweep(Sweep(train_args=train_args, command=argv, **options))[0]


if __name__ == "__main__":
    sys.exit(run_main(main, sys.argv[1:]))
