"""
A sweep of train.py over a grid of config values, one out_dir per point, as a library: a sweep's
points from its options (`plan`: parse_grid, read_points, point_name), their state and claims
(Point), the local scheduler (`schedule`: claiming, starting, polling, ending and recording points
on this machine's GPU and thread slots, `machine_slots`, with signals forwarded to them) and SLURM
jobs (slurm.py), and a whole sweep (`Sweep`, its options typed; `sweep_parser`, `run_sweep`; the behaviour:
sweep.py's docstring). The scheduler takes a queue of points: a fixed list (SweepQueue), or one handed points
as they open (a study's stages).
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
from dataclasses import dataclass, field, fields

from nonlinear_queries.config.configurator import parse_config, train_config_class
from nonlinear_queries.errors import ConfigError
from nonlinear_queries.experiments.launch import launcher
from nonlinear_queries.experiments.slurm import parse_sbatch_options, run_slurm, slurm_minutes, slurm_queue
from nonlinear_queries.record.atomic import write_json
from nonlinear_queries.record.lock import exclusive, lock_holder, out_dir_holder, try_lock
from nonlinear_queries.record.runs import RunDir, finished, history, read_json

# the repo root, above the package and its room
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN = os.path.join(REPO, "train.py")
SET_BY_SWEEP = ("out_dir", "init_from", "resume_from", "overwrite")  # where and how each point's run starts
SEED_KEYS = ("seed", "data_seed")  # the keys whose values are an arm's seeds, not another arm


def parse_grid(specs):
    """[(keys, [raw values])] from `key=v1,v2,...` strings, in order; `key1,key2=v1,v2,...` is one axis
    whose every value sets all its keys (seed,data_seed=1,2: seed and data_seed move together). Raises
    ConfigError for a malformed axis, an unknown key, a key given twice or an empty value. Values stay as
    typed (they name the point's directory); train.py parses them."""
    known = {f.name for f in fields(train_config_class())}
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
    TrainConfig = train_config_class()
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


def arm_name(label, point):
    """The arm of a sweep's point: its named point's `label` (None for a plain grid) and its grid values
    [(key, raw value)] but for the seeds (SEED_KEYS), named as point_name names them: 'res_gelu,learning_rate=2e-3';
    '' for a grid over the seeds alone."""
    return ",".join(filter(None, [label, point_name([(k, v) for k, v in point if k not in SEED_KEYS])]))


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
    """A grid point: its name, [(key, raw value)], out_dir, max_iters and its run's wandb_name ('' = train.py's
    default)."""

    name: str
    values: list
    out_dir: str
    max_iters: int
    wandb_name: str = ""

    def status(self):
        return point_progress(self.out_dir, self.max_iters)["status"]

    @property
    def run_dir(self):
        """Its out_dir as a runs.RunDir, which spells the names of the files in it."""
        return RunDir(self.out_dir)

    def log(self):
        """Its train.py's output on this machine (SLURM's logs are in out_dir/slurm/)."""
        return self.run_dir.log

    def claim_path(self):
        return self.run_dir.claim

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
        running = out_dir_holder(self.run_dir)
        if running:
            lock.close()
            return None, f"a training run ({running})"
        return lock, None

    def holder(self):
        """Who runs this point now (a sweep's claim, or a train.py's out_dir lock), None if nobody."""
        other = lock_holder(self.claim_path())
        return f"another sweep ({other})" if other else out_dir_holder(self.run_dir)

    def train_args(self, train_args, resume):
        """train.py's arguments for this point: its seed as a wandb tag (seed=N, where the point sets one; first,
        so that the sweep's own wandb_tags win), the sweep's, the point's values, its out_dir, its wandb_name (last:
        it is unique to the point, where the sweep's own is a prefix of it), and --init_from=resume where it has a
        checkpoint (else --overwrite=True: a new run)."""
        tags = [f"--wandb_tags=seed={v}" for k, v in self.values if k == "seed"]
        return [TRAIN, *tags, *train_args, *(f"--{k}={v}" for k, v in self.values), f"--out_dir={self.out_dir}",
                *([f"--wandb_name={self.wandb_name}"] if self.wandb_name else []),
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
# the local scheduler: points on this machine's slots, N at a time, the operating system scheduling them


def visible_gpus():
    """Indices of the CUDA devices this process may use ([] without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return []
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    return listed.split(",") if listed else [str(i) for i in range(torch.cuda.device_count())]


class Slots(list):
    """This machine's slots for points: a list of each slot's environment overrides (OMP_NUM_THREADS, and on CUDA
    CUDA_VISIBLE_DEVICES, GPUs that no other slot has), with `procs`, the processes of a point (its torchrun), and
    `gpus`, the visible GPUs ([] on the CPU)."""

    def __init__(self, env, procs, gpus):
        super().__init__(env)
        self.procs, self.gpus = procs, gpus


def machine_slots(jobs, gpus_per_run=0, procs_per_run=1, on_cuda=False):
    """The Slots of `jobs` points at a time on this machine. On CUDA (`on_cuda` and a GPU visible) a slot is a set
    of `gpus_per_run` GPUs (1 if 0), a process each, and there are no more slots than the visible GPUs make; on the
    CPU a point has `procs_per_run` processes. Each point gets OMP_NUM_THREADS = cores / (slots x its processes)
    unless it is set. Raises ConfigError if a point needs more GPUs than are visible."""
    gpus = visible_gpus() if on_cuda else []  # imports torch: only points that may run on GPUs need it
    procs = max(gpus_per_run, 1) if gpus else procs_per_run
    if gpus:
        if len(gpus) < procs:
            raise ConfigError(f"a point needs {procs} GPUs (gpus_per_run) and {len(gpus)} are visible")
        jobs = min(jobs, len(gpus) // procs)
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, len(os.sched_getaffinity(0)) // (jobs * procs)))
    return Slots([{"OMP_NUM_THREADS": threads,
                   **({"CUDA_VISIBLE_DEVICES": ",".join(gpus[slot * procs:(slot + 1) * procs])} if gpus else {})}
                  for slot in range(jobs)], procs, gpus)


def start_point(point, train_args, resume, procs, env, tag, out=None):
    """Start train.py for `point`, claimed by the caller (Point.claim) and not finished: `procs` processes
    (launcher), resuming from its checkpoint if `resume`, in os.environ updated by `env`, its output appended to
    the point's train.log, its launch.json written. Says so, with the command, on `out` (default: stdout) as
    `tag: starting`. Returns its Popen."""
    cmd = [*launcher(procs), *point.train_args(train_args, resume)]
    print(f"{tag}: {'resuming' if resume else 'starting'} (log: {point.log()})\n  {shlex.join(cmd)}", file=out,
          flush=True)
    os.makedirs(point.out_dir, exist_ok=True)
    write_json(point.run_dir.launch, {"launcher": "local", "log": point.log()})
    with open(point.log(), "a") as f:
        return subprocess.Popen(cmd, env={**os.environ, **env}, stdout=f, stderr=subprocess.STDOUT)


def end_point(child, point):
    """Record the exit status of a point's train.py (`child`, a Popen that has exited) in its launch.json.
    Returns (that exit status, the point's status now)."""
    write_json(point.run_dir.launch, {"launcher": "local", "log": point.log(), "exit_status": child.returncode})
    return child.returncode, point.status()


def wait_any(children, timeout=None):
    """The first of `children` (Popen objects) to exit, waiting for it; None where none has after `timeout`
    seconds (counted in time.sleep's steps of 0.5 s)."""
    waited = 0.0
    while True:
        for child in children:
            if child.poll() is not None:
                return child
        if timeout is not None and waited >= timeout:
            return None
        time.sleep(0.5)
        waited += 0.5


def schedule(queue, slots, program):
    """The local scheduler: run the points `queue` hands out on `slots` (machine_slots), one point's train.py a
    slot, until none waits and none runs. Returns the number of the signal (SIGINT or SIGTERM) that stopped it, or
    None.

    `queue` is the caller's (SweepQueue: a sweep's fixed list; study.py's: its protocol's points as its stages
    open), with five methods. Each round, queue.waiting() gives the points to try in order (an iterable, read up
    to the free slots). Each is taken under its claim (Point.claim, the holder `program` on this host and PID): one
    that another process runs goes to queue.passed(point, who runs it) and is tried again the next round, half a
    second on; a claimed one goes to queue.claimed(point, its status read again under the claim), and unless it is
    finished it is started (start_point) in the lowest free slot, resumed from its checkpoint where it has one,
    with queue.starting(point, slot)'s (train.py arguments, tag, a file the starting line is appended to, or None
    for stdout).
    A point whose train.py exits has its exit status written to its launch.json, its claim and slot let go, and
    goes to queue.ended(point, exit status, status, whether a signal stopped the scheduler). SIGINT and SIGTERM are
    forwarded to every running point, which writes its checkpoint and exits; nothing new starts after one, and the
    scheduler returns once the running points have ended, its signal handlers put back (study.py runs it in its
    own process)."""
    holder = f"{program}, host {socket.gethostname()}, PID {os.getpid()}"
    free, running, stop = list(range(len(slots))), {}, []  # running: Popen -> (point, its slot, its claim)

    def forward(signum, frame):  # every running point checkpoints and exits; nothing new starts
        stop.append(signum)
        for child in running:
            child.send_signal(signum)

    handlers = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            passed = False  # a point passed over or found finished: look again soon, the next round may differ
            for point in queue.waiting():
                if stop or not free:
                    break
                claim, other = point.claim(holder)
                if claim is None:
                    queue.passed(point, other)
                    passed = True
                    continue
                status = point.status()
                queue.claimed(point, status)
                if finished(status):
                    claim.close()
                    passed = True
                    continue
                slot = free.pop(0)
                train_args, tag, log = queue.starting(point, slot)
                with open(log, "a") if log else contextlib.nullcontext() as out:
                    child = start_point(point, train_args, status == "resume", slots.procs, slots[slot], tag, out)
                running[child] = (point, slot, claim)
            if not running and (stop or not passed):
                break
            child = wait_any(running, timeout=0.5 if passed else None)
            if child is None:
                continue
            point, slot, claim = running.pop(child)
            claim.close()
            free = sorted(free + [slot])
            code, status = end_point(child, point)
            queue.ended(point, code, status, bool(stop))
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    return stop[0] if stop else None


class SweepQueue:
    """A sweep's points for `schedule`: a fixed list, tried in order, each started once no other process runs it
    (one that another sweep finished meanwhile is skipped, one it stopped is resumed); `record(point, status)`
    writes a status to sweep.json. `failed` names the points whose train.py failed."""

    def __init__(self, points, train_args, record):
        self.points, self.train_args, self.record = points, train_args, record
        self.queue, self.said, self.failed = list(points), set(), []  # said: the points passed over, each said once

    def tag(self, point):
        """How the sweep's output names `point`: '[i/n] NAME'."""
        return f"[{self.points.index(point) + 1}/{len(self.points)}] {point.name}"

    def waiting(self):
        """The points not yet claimed, in the sweep's order."""
        return list(self.queue)

    def passed(self, point, other):
        """Say once that `other` runs `point`, which is tried again later."""
        if point.name not in self.said:
            self.said.add(point.name)
            print(f"{self.tag(point)}: run by {other}; taken up when it ends", flush=True)

    def claimed(self, point, status):
        """Take `point` off the list; record and say it where another process finished it meanwhile."""
        self.queue.remove(point)
        if finished(status):
            self.record(point, status)
            print(f"{self.tag(point)}: {status} (run meanwhile by another process), skipped", flush=True)

    def starting(self, point, slot):
        """(the sweep's train.py arguments, the point's tag, None: the starting line goes to stdout)."""
        return self.train_args, self.tag(point), None

    def ended(self, point, code, status, stopping):
        """Record the point's status and say how it ended (exit status `code`; 0 or 3, a divergence, is no
        failure)."""
        self.record(point, status)
        if code not in (0, 3):
            self.failed.append(point.name)
            print(f"error: {point.name} failed (exit status {code}); its log: {point.log()}", file=sys.stderr)
        else:
            print(f"{point.name}: {status if finished(status) else 'stopped at its checkpoint'}", flush=True)


def run_local(points, train_args, sweep, on_cuda, record):
    """Run a sweep's `points` on this machine, sweep.jobs at a time (schedule, on machine_slots of the Sweep's
    options; `on_cuda`: its runs may use GPUs), each with `train_args`; `record(point, status)` writes a status to
    sweep.json. Returns (the exit status: 0, or 1 if a point failed or needs more GPUs than are visible; the number
    of the signal that stopped it, or None)."""
    try:
        slots = machine_slots(sweep.jobs, sweep.gpus_per_run, sweep.procs_per_run, on_cuda)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1, None
    queue = SweepQueue(points, train_args, record)
    stopped_by = schedule(queue, slots, "sweep.py")
    if stopped_by:
        print("sweep stopped; every running point wrote its checkpoint. Run the same command again to continue",
              file=sys.stderr)
    if queue.failed:
        print(f"error: {len(queue.failed)} point(s) failed: {', '.join(queue.failed)}. Fix the cause and run the same "
              f"command again: finished points are skipped", file=sys.stderr)
        return 1, stopped_by
    return 0, stopped_by


# ---------------------------------------------------------------------------------------
# a whole sweep: its options, its points, their runs


@dataclass
class Launcher:
    """How a sweep's points run (sweep.py's launcher options, a study's [launcher]): `launcher` 'local' (this
    machine, `jobs` points at a time) or 'slurm' (a job per point); a point's GPUs per node (0: 1 on CUDA),
    processes per node on the CPU, nodes, and CPUs per task; SLURM's partition, time limit (as SLURM writes it),
    account, quality of service, shell lines run in the job before train.py, and other sbatch options
    (KEY=VALUE)."""

    launcher: str = "local"
    jobs: int = 1
    gpus_per_run: int = 0
    procs_per_run: int = 1
    nodes_per_run: int = 1
    cpus_per_task: int | None = None
    slurm_partition: str = ""
    slurm_time: str = "4:00:00"
    slurm_account: str = ""
    slurm_qos: str = ""
    slurm_setup: list = field(default_factory=list)
    slurm_option: list = field(default_factory=list)


@dataclass
class Sweep(Launcher):
    """A sweep, its options typed: `train_args` (config files and --key=value overrides for every run), `grid`
    (parse_grid's axes, KEY=V1,V2,...), `points` (a --points file, or None), `sweep_dir` (the parent of the
    points' out_dirs; '' for the config's out_dir), `dry_run`, and `command`, the arguments recorded in
    SWEEP_DIR/sweep.json as `python sweep.py COMMAND`; with Launcher's options. plan() sets `sbatch_options`."""

    train_args: list = field(default_factory=list)
    grid: list = field(default_factory=list)
    points: str | None = None
    sweep_dir: str = ""
    dry_run: bool = False
    command: list = field(default_factory=list)
    sbatch_options: dict = field(default_factory=dict, init=False)


def sweep_parser(description=None):
    """The argparse parser of sweep.py's options, Sweep's fields (their defaults Sweep's) and --status; the
    arguments it leaves (parse_known_args) go to every run."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--grid", action="append", metavar="KEY=V1,V2,...",
                        help="an axis of the grid (repeat for more)")
    parser.add_argument("--points", metavar="FILE", help="a TOML file of named points (see above)")
    parser.add_argument("--sweep_dir", help="parent of the points' out_dirs (default: the config's out_dir)")
    parser.add_argument("--status", metavar="SWEEP_DIR", help="print the state of every point of a sweep, and exit")
    parser.add_argument("--launcher", help="local (this machine) or slurm (default: local)")
    parser.add_argument("--jobs", type=int, help="local: points run at a time (default: 1)")
    parser.add_argument("--gpus_per_run", type=int,
                        help="GPUs of a point (per node), one process each (default: 1 on CUDA)")
    parser.add_argument("--procs_per_run", type=int,
                        help="processes of a point on the CPU (gloo), per node (default: 1)")
    parser.add_argument("--nodes_per_run", type=int, help="slurm: nodes of a point (default: 1)")
    parser.add_argument("--cpus_per_task", type=int, help="slurm: CPUs of a point's job on each node")
    parser.add_argument("--slurm_partition", help="slurm: the partition")
    parser.add_argument("--slurm_time",
                        help="slurm: a job's time limit; a point that needs longer is requeued from its checkpoint "
                             "(default: 4:00:00)")
    parser.add_argument("--slurm_account", help="slurm: the account to charge")
    parser.add_argument("--slurm_qos", help="slurm: the quality of service")
    parser.add_argument("--slurm_setup", action="append", metavar="LINE",
                        help="slurm: a shell line run in the job before train.py, e.g. 'module load cuda' (repeat)")
    parser.add_argument("--slurm_option", action="append", metavar="KEY=VALUE",
                        help="slurm: any other sbatch option, e.g. mem=64G or constraint=h100 (repeat)")
    parser.add_argument("--dry_run", action="store_true", help="print each point's status and command; run nothing")
    defaults = Sweep()
    parser.set_defaults(**{f.name: getattr(defaults, f.name) for f in fields(Sweep)
                           if f.init and f.name not in ("train_args", "command")})
    return parser


def plan(sweep):
    """The points of `sweep` (a Sweep), every point's config checked (and, for --launcher=slurm, SLURM's
    controller answering): (the Points, in order, a point given twice once; the train.py arguments of every run, a
    --points file's shared settings added; the config they share). Sets sweep.sweep_dir (by default the config's
    out_dir) and sweep.sbatch_options. Raises ConfigError for a bad option, axis, points file or config."""
    TrainConfig = train_config_class()
    if sweep.launcher not in ("local", "slurm"):
        raise ConfigError(f"--launcher={sweep.launcher!r}: choose local or slurm (a point's torchrun is "
                          f"--gpus_per_run=N, or --procs_per_run=N on the CPU)")
    if min(sweep.jobs, sweep.procs_per_run, sweep.nodes_per_run) < 1 or sweep.gpus_per_run < 0:
        raise ConfigError("--jobs, --procs_per_run and --nodes_per_run are at least 1, --gpus_per_run at least 0")
    sweep.sbatch_options = parse_sbatch_options(sweep.slurm_option)
    slurm_minutes(sweep.slurm_time)
    axes = parse_grid(sweep.grid)
    if not axes and not sweep.points:
        raise ConfigError("no --grid axis or --points file given; e.g. --grid learning_rate=1e-3,2e-3 "
                          "--grid seed=1,2,3")
    shared, named = read_points(sweep.points) if sweep.points else ([], [(None, [])])
    train_args = [*sweep.train_args, *(f"--{k}={v}" for k, v in shared if k != "out_dir")]
    base, _ = parse_config(TrainConfig, train_args)
    sweep.sweep_dir = sweep.sweep_dir or dict(shared).get("out_dir", base.out_dir)
    grid = [[(k, v) for (keys, _), v in zip(axes, combo) for k in keys]
            for combo in itertools.product(*(raws for _, raws in axes))]
    # a named point's run is labelled after it in compare.py's tables; its settings, then the grid's, override the
    # config. Each arm (a named point and the grid's values but for the seeds: SWEEP_DIR/NAME,KEY=VALUE...) is one
    # wandb group, unless the sweep's config or command names one
    group = None if "wandb_group" in base.set_keys else os.path.normpath(sweep.sweep_dir)
    values = [([("wandb_group", "/".join(filter(None, [group, arm_name(label, g)])))] if group else [])
              + ([("wandb_run_name", label)] if label else []) + [*own, *g] for label, own in named for g in grid]
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
    if sweep.launcher == "slurm" and not sweep.dry_run:
        slurm_queue()  # sbatch there and the controller answering, before anything is submitted
    # each run's wandb name is its directory's under the sweep's, after the sweep's own wandb_name where it sets one
    # (study.py: the arm's directory under the study's), so that no two runs of a sweep or study share one
    prefix = base.wandb_name if "wandb_name" in base.set_keys else ""
    points = [Point(name, v, os.path.join(sweep.sweep_dir, name), c.max_iters, "/".join(filter(None, [prefix, name])))
              for name, v, c in zip(names, values, configs)]
    return points, train_args, base


def run_sweep(sweep):
    """Run `sweep` (a Sweep) to its end: check every point's config, skip the finished points, launch the others
    (sweep.launcher: run_local, or slurm.run_slurm), and record them in SWEEP_DIR/sweep.json with its command.
    Returns (the exit status: 0, 1 if a point failed, 2 for a config error, said on stderr; the number of the
    signal, SIGINT or SIGTERM, that stopped it, or None)."""
    try:
        points, train_args, base = plan(sweep)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2, None

    statuses = {p.name: p.status() for p in points}
    todo = []
    for i, point in enumerate(points):
        status = statuses[point.name]
        if finished(status):
            print(f"[{i + 1}/{len(points)}] {point.name}: {status}, skipped")
        elif sweep.dry_run:
            print(f"[{i + 1}/{len(points)}] {point.name}: {'resuming' if status == 'resume' else 'starting'}\n  "
                  f"{shlex.join(point.train_args(train_args, status == 'resume'))}")
        else:
            todo.append(point)
    if sweep.dry_run:
        return 0, None
    os.makedirs(sweep.sweep_dir, exist_ok=True)

    def record(point, status):
        statuses[point.name] = status
        write_record(sweep.sweep_dir, sweep.command, statuses, points)

    write_record(sweep.sweep_dir, sweep.command, statuses, points)
    on_cuda = base.device != "cpu"  # 'auto' or 'cuda...': the GPUs this machine has, if any
    if sweep.launcher == "slurm":
        code, stopped_by = run_slurm(todo, train_args, sweep, on_cuda, record), None
    else:
        code, stopped_by = run_local(todo, train_args, sweep, on_cuda, record)
    if sweep.launcher == "local":
        print(f"\n{sum(s == 'done' for s in statuses.values())} of {len(points)} points done, "
              f"{sum(s.startswith('diverged') for s in statuses.values())} diverged. Compare them with:\n"
              f"  python compare.py {shlex.quote(sweep.sweep_dir)}")
    return code, stopped_by
