"""
A sweep of train.py over a grid of config values, one out_dir per point, as a library: a sweep's
points from its options (`plan`: parse_grid, read_points, point_name), their state and claims
(Point), their runs on this machine (`run_local`; start_point and end_point one at a time) or as
SLURM jobs (slurm.py), and a whole sweep (`parser`, `run`). sweep.py is its command line (see its
docstring for the behaviour); study.py runs its protocol's points through it, in its own process.
"""

import argparse
import contextlib
import itertools
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, fields

from nonlinear_queries.atomic import write_json
from nonlinear_queries.configurator import ConfigError, parse_config
from nonlinear_queries.lock import exclusive, lock_holder, out_dir_holder, try_lock
from nonlinear_queries.runs import RunDir, finished, history, read_json
from nonlinear_queries.runtime import launcher
from nonlinear_queries.slurm import parse_sbatch_options, run_slurm, slurm_minutes, slurm_queue
from nonlinear_queries.train_config import TrainConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    """Directory name of a grid point [(key, raw value)] (or {key: raw value}, in order):
    'learning_rate=2e-3,seed=1'; a '/' in a value becomes '-'."""
    items = point.items() if isinstance(point, dict) else point
    return ",".join(f"{k}={str(v).replace('/', '-')}" for k, v in items)


def point_progress(out_dir, max_iters):
    """What a point's run dir says (runs.py reads it): {'status': runs.RunDir.status's 'done', 'diverged at
    step k', 'resume' or 'new'; 'step': the last step trained or evaluated (0 if none); 'val_loss': the last
    evaluation's val loss (None if none)}."""
    run_dir = RunDir(out_dir)
    records = run_dir.records(warn=False)
    evals = history(records)[0]
    step = max((r["step"] for r in records if r["type"] in ("train", "eval")), default=0)
    return {"status": run_dir.status(max_iters), "step": step,
            "val_loss": evals[max(evals)][1] if evals else None}


@dataclass
class Point:
    """A grid point: its name, [(key, raw value)], out_dir and max_iters."""

    name: str
    values: list
    out_dir: str
    max_iters: int

    def status(self):
        return point_progress(self.out_dir, self.max_iters)["status"]

    def log(self):
        """Its train.py's output on this machine (SLURM's logs are in out_dir/slurm/)."""
        return os.path.join(self.out_dir, "train.log")

    def claim_path(self):
        return RunDir(self.out_dir).claim

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


def start_point(point, train_args, resume, procs, env, tag, out=None):
    """Start train.py for `point`, claimed by the caller (Point.claim) and not finished: `procs` processes
    (launcher), resuming from its checkpoint if `resume`, in os.environ updated by `env`, its output appended to
    the point's train.log, its launch.json written. Says so, with the command, on `out` (default: stdout) as
    `tag: starting`. Returns its Popen."""
    cmd = [*launcher(procs), *point.train_args(train_args, resume)]
    print(f"{tag}: {'resuming' if resume else 'starting'} (log: {point.log()})\n  {shlex.join(cmd)}", file=out,
          flush=True)
    os.makedirs(point.out_dir, exist_ok=True)
    write_json(os.path.join(point.out_dir, "launch.json"), {"launcher": "local", "log": point.log()})
    with open(point.log(), "a") as f:
        return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT)


def end_point(child, point):
    """Record the exit status of a point's train.py (`child`, a Popen that has exited) in its launch.json.
    Returns (that exit status, the point's status now)."""
    write_json(os.path.join(point.out_dir, "launch.json"), {"launcher": "local", "log": point.log(),
                                                            "exit_status": child.returncode})
    return child.returncode, point.status()


def run_local(points, train_args, args, on_cuda, record):
    """Run the points `args.jobs` at a time; returns the exit status (0, or 1 if a point failed), and sets
    args.stopped_by to the signal's number where SIGINT or SIGTERM stopped it (each running point checkpoints).
    Each point is launched under its claim (Point.claim), its status read again there: one that another process
    finished meanwhile is skipped, one it stopped is resumed, and one it is running is passed over for the next
    point and taken up again once that process lets it go, so the sweep ends with every point done (or failed)."""
    gpus = visible_gpus() if on_cuda else []
    procs = max(args.gpus_per_run, 1) if gpus else args.procs_per_run
    jobs = min(args.jobs, len(gpus) // procs) if gpus else args.jobs
    if gpus and jobs < 1:
        print(f"error: a point needs {procs} GPUs and {len(gpus)} are visible", file=sys.stderr)
        return 1
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, len(os.sched_getaffinity(0)) // (jobs * procs)))
    running, stop = {}, []  # running: Popen -> (point, its GPUs, its claim)

    def forward(signum, frame):  # every running point checkpoints and exits; nothing new starts
        stop.append(signum)
        for child in running:
            child.send_signal(signum)

    # put back when the sweep ends: study.py runs sweeps in its own process
    handlers = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _run_queue(points, train_args, args, record, jobs, procs, gpus, threads, running, stop)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)


def _run_queue(points, train_args, args, record, jobs, procs, gpus, threads, running, stop):
    """run_local's loop, under its signal handlers: `running` and `stop` are what they see."""
    failed = []
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
            env = {"OMP_NUM_THREADS": threads, **({"CUDA_VISIBLE_DEVICES": ",".join(mine)} if mine else {})}
            running[start_point(point, train_args, status == "resume", procs, env, tag)] = (point, mine, claim)
        time.sleep(0.2)
        for child in [c for c in running if c.poll() is not None]:
            point, mine, claim = running.pop(child)
            claim.close()
            gpus += mine
            code, status = end_point(child, point)
            record(point, status)
            if code not in (0, 3):
                failed.append(point.name)
                print(f"error: {point.name} failed (exit status {code}); its log: {point.log()}", file=sys.stderr)
            else:
                print(f"{point.name}: {status if finished(status) else 'stopped at its checkpoint'}", flush=True)
    if stop:
        args.stopped_by = stop[0]  # for a caller that runs more than this sweep (study.py): it stops too
        print("sweep stopped; every running point wrote its checkpoint. Run the same command again to continue",
              file=sys.stderr)
    if failed:
        print(f"error: {len(failed)} point(s) failed: {', '.join(failed)}. Fix the cause and run the same command "
              f"again: finished points are skipped", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------------
# a whole sweep: its options, its points, their runs


def parser(description=None):
    """The argparse parser of a sweep's own options (sweep.py's, and a study's [launcher]); the arguments it
    leaves (parse_known_args) go to every run."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
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
    parser.set_defaults(stopped_by=None)  # run_local's: the signal that stopped the sweep
    return parser


def plan(args, train_args):
    """The points of the sweep of `args` (parser()'s) over `train_args`, every point's config checked (and, for
    --launcher=slurm, SLURM's controller answering): (the Points, in order, a point given twice once; the
    train.py arguments of every run, a --points file's shared settings added; the config they share). Sets
    args.sweep_dir (by default the config's out_dir) and args.sbatch_options. Raises ConfigError for a bad
    option, axis, points file or config."""

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
    points = [Point(name, v, os.path.join(args.sweep_dir, name), c.max_iters)
              for name, v, c in zip(names, values, configs)]
    return points, train_args, base


def run_sweep(args, train_args, argv):
    """Run the sweep of `args` (parser()'s) over `train_args` (config files and --key=value overrides for every
    run) to its end: check every point's config, skip the finished points, launch the others (args.launcher),
    and record them in SWEEP_DIR/sweep.json with the command `python sweep.py argv`. Returns the exit status:
    0, 1 if a point failed, 2 for a config error (said on stderr); args.stopped_by is the signal's number where
    SIGINT or SIGTERM stopped it (run_local)."""

    try:
        points, train_args, base = plan(args, train_args)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2

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
    launch = run_slurm if args.launcher == "slurm" else run_local
    code = launch(todo, train_args, args, on_cuda, record)
    if args.launcher == "local":
        print(f"\n{sum(s == 'done' for s in statuses.values())} of {len(points)} points done, "
              f"{sum(s.startswith('diverged') for s in statuses.values())} diverged. Compare them with:\n"
              f"  python compare.py {shlex.quote(args.sweep_dir)}")
    return code
