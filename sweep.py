"""
Run train.py over a grid of config values, one run after another, one out_dir per point.

    python sweep.py config/mini/res_gelu.py --grid learning_rate=1.5e-3,3e-3,6e-3 --grid seed=1,2,3
    python compare.py out-mini/res_gelu                       # the table of the finished points

Arguments other than sweep.py's own options go to every run as they are: config files
and --key=value overrides, as for train.py. Each `--grid key=v1,v2,...` adds an axis; the
points are the product of the axes, in order. Point `learning_rate=2e-3, seed=1` trains in
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
metrics.jsonl), resumes a point that has a checkpoint, and starts the rest. Ctrl-C or
SIGTERM lets the current run write its checkpoint, then stops the sweep. A run that fails
stops the sweep (exit 1); a run that diverges (train.py's exit status 3) is a result, and
the sweep goes on. SWEEP_DIR/sweep.json records the command and every point's status.
"""

import argparse
import itertools
import os
import shlex
import signal
import subprocess
import sys
import tomllib
from dataclasses import fields

from nonlinear_queries.atomic import write_json
from nonlinear_queries.configurator import ConfigError, parse_config
from nonlinear_queries.runlog import read_metrics
from nonlinear_queries.train_config import TrainConfig

REPO = os.path.dirname(os.path.abspath(__file__))
SET_BY_SWEEP = ("out_dir", "init_from", "resume_from", "overwrite")  # where and how each point's run starts


def parse_grid(specs):
    """[(key, [raw values])] from `key=v1,v2,...` strings, in order. Raises ConfigError for
    a malformed axis, an unknown key, a key given twice or an empty value. Values stay as
    typed (they name the point's directory); train.py parses them."""
    keys = {f.name for f in fields(TrainConfig)}
    axes = []
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not key:
            raise ConfigError(f"--grid {spec!r}: write an axis as key=v1,v2,...")
        if key not in keys:
            raise ConfigError(f"--grid {spec!r}: unknown config key {key!r}")
        if key in SET_BY_SWEEP:
            raise ConfigError(f"--grid {spec!r}: sweep.py sets {key} itself")
        if key in (k for k, _ in axes):
            raise ConfigError(f"--grid {spec!r}: {key} is already an axis")
        raws = values.split(",")
        if not all(raws):
            raise ConfigError(f"--grid {spec!r}: empty value")
        axes.append((key, raws))
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


def point_status(out_dir, max_iters):
    """'done', 'diverged at step k', 'resume' (a checkpoint to continue from), or 'new'."""
    metrics = os.path.join(out_dir, "metrics.jsonl")
    if os.path.isfile(metrics):
        records = read_metrics(metrics, warn=False)  # a damaged line is compare.py's to report, not a status
        diverged = [r["step"] for r in records if r["type"] == "diverged"]
        if diverged:
            return f"diverged at step {diverged[-1]}"
        if any(r["type"] == "eval" and r["step"] == max_iters for r in records):
            return "done"
    return "resume" if any(os.path.exists(os.path.join(out_dir, n)) for n in ("ckpt.pt", "ckpt.dcp")) else "new"


def write_record(sweep_dir, argv, statuses):
    """SWEEP_DIR/sweep.json: the command and {point: status}, replaced atomically."""
    path = os.path.join(sweep_dir, "sweep.json")
    write_json(path, {"command": shlex.join(["python", "sweep.py", *argv]), "points": statuses})


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                        help="an axis of the grid (repeat for more)")
    parser.add_argument("--points", metavar="FILE", help="a TOML file of named points (see above)")
    parser.add_argument("--sweep_dir", default="",
                        help="parent of the points' out_dirs (default: the config's out_dir)")
    parser.add_argument("--launcher", default="python",
                        help="how to start train.py, e.g. 'torchrun --standalone --nproc_per_node=8' (default: python)")
    parser.add_argument("--dry_run", action="store_true", help="print each point's status and command; run nothing")
    args, train_args = parser.parse_known_args(argv)
    try:
        axes = parse_grid(args.grid)
        if not axes and not args.points:
            raise ConfigError("no --grid axis or --points file given; e.g. --grid learning_rate=1e-3,2e-3 "
                              "--grid seed=1,2,3")
        shared, named = read_points(args.points) if args.points else ([], [(None, [])])
        train_args = [*train_args, *(f"--{k}={v}" for k, v in shared if k != "out_dir")]
        base, _ = parse_config(TrainConfig, train_args)
        sweep_dir = args.sweep_dir or dict(shared).get("out_dir", base.out_dir)
        grid = [list(zip([k for k, _ in axes], values)) for values in itertools.product(*(v for _, v in axes))]
        # a named point's run is named after it; its settings, then the grid's, override the config
        points = [([f"--wandb_run_name={label}"] if label else []) + [f"--{k}={v}" for k, v in (*own, *g)]
                  for label, own in named for g in grid]
        names = [",".join(filter(None, [label, point_name(g)])) for label, _ in named for g in grid]
        configs = [parse_config(TrainConfig, [*train_args, *p])[0] for p in points]
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2

    launcher = [sys.executable] if args.launcher == "python" else shlex.split(args.launcher)
    statuses = {}
    # a signal reaches the run in flight (from the terminal, or forwarded below); the sweep
    # waits for it to checkpoint and exit, then stops
    stop = []

    def forward(signum, frame):
        stop.append(signum)
        if child is not None:
            child.send_signal(signum)

    child = None
    signal.signal(signal.SIGINT, forward)
    signal.signal(signal.SIGTERM, forward)
    if not args.dry_run:
        os.makedirs(sweep_dir, exist_ok=True)
    for i, (name, point, cfg) in enumerate(zip(names, points, configs)):
        out_dir = os.path.join(sweep_dir, name)
        status = point_status(out_dir, cfg.max_iters)
        if status == "done" or status.startswith("diverged"):
            statuses[name] = status
            print(f"[{i + 1}/{len(points)}] {name}: {status}, skipped")
            continue
        start = ["--init_from=resume"] if status == "resume" else ["--overwrite=True"]
        cmd = [*launcher, os.path.join(REPO, "train.py"), *train_args, *point, f"--out_dir={out_dir}", *start]
        action = "resuming" if status == "resume" else "starting"
        print(f"[{i + 1}/{len(points)}] {name}: {action}\n  {shlex.join(cmd)}", flush=True)
        if args.dry_run:
            statuses[name] = status
            continue
        child = subprocess.Popen(cmd)
        code = child.wait()
        child = None
        statuses[name] = point_status(out_dir, cfg.max_iters)
        write_record(sweep_dir, argv, statuses)
        if code not in (0, 3) or (code == 0 and statuses[name] != "done"):
            if stop or code == 0:
                print(f"sweep stopped at {name}; run the same command again to continue", file=sys.stderr)
                return 0
            print(f"error: {name} failed (exit status {code}); the sweep stopped. Fix the cause and run the same "
                  f"command again: finished points are skipped", file=sys.stderr)
            return 1
        if stop:
            print(f"sweep stopped after {name}; run the same command again to continue", file=sys.stderr)
            return 0
    if not args.dry_run:
        write_record(sweep_dir, argv, statuses)
    print(f"\n{sum(s == 'done' for s in statuses.values())} of {len(points)} points done, "
          f"{sum(s.startswith('diverged') for s in statuses.values())} diverged. Compare them with:\n"
          f"  python compare.py {shlex.quote(sweep_dir)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
