"""
Run a whole study with the held-out protocol, and run it again to continue it.

    python study.py studies/ablations.toml --dry_run      # the plan: runs done, runs left, the cost
    python study.py studies/ablations.toml                # run what is left, then write the tables

A study file (TOML, read with the standard library's tomllib) names the arms (a config file
plus overrides each), the tuning axis and its grid, the tuning seed, the held-out seeds, the
horizons and sweep.py's launcher options; studies/*.toml are examples with every key. The
protocol, for each horizon and each arm:

1. tune: the grid on the tuning seed (its own data order: data_seed as configured);
2. widen: while the best value sits at an edge of the grid, the next value beyond that edge
   (x2 or /2) joins the grid, up to `max_widen` values per edge;
3. report: the chosen value on every held-out seed. A held-out seed sets both the init seed
   and data_seed (the same data order for every arm at that seed), so the spread covers the
   data order as well as the initialization (`vary_data_order = false` keeps data_seed as
   configured, as results/ablations was run);
4. tables: compare.py's markdown with --select_on (choose on the tuning seed, report on the
   held-out ones), Holm and paired columns, and its figure, written to RESULTS_DIR/TABLES.md and
   RESULTS_DIR/figure*.png, regenerated on every run; the README beside them is a person's.

Every choice (each widening step, each arm's chosen value) is recorded with the val losses it was
based on in RESULTS_DIR/study.json. The runs go through sweep.py, in RUNS_DIR/<horizon>/<arm>/<point>:
finished points are skipped, interrupted ones resume. On this machine with [launcher] jobs = N > 1,
the arms share N slots (on CUDA each a set of GPUs of its own), each running one point at a time: a
slot that frees takes the next point waiting in any arm's current stage, so no slot idles while a
point waits (each point's sweep output in its arm directory's sweep.log); Ctrl-C or SIGTERM reaches
every point, which checkpoints. With a
launcher that returns before its jobs finish (SLURM), the study stops after submitting and says
so; run the same command again once they are done. Exit status: 0 ok (or waiting for jobs),
1 a sweep failed (on this machine the other arms run to their end first), 2 a bad study file,
128 + N stopped by signal N.
"""

import nonlinear_queries.interrupt  # noqa: F401  (first: Ctrl-C at any moment ends with one line)

import argparse
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field

from nonlinear_queries.atomic import atomic_write, write_json
from nonlinear_queries.cli import run_main
from nonlinear_queries.configurator import parse_config
from nonlinear_queries.runs import history, read_records
from nonlinear_queries.train_config import TrainConfig

REPO = os.path.dirname(os.path.abspath(__file__))
# assumed when no run of the study has finished yet: an H100's dense bf16 peak at a typical MFU
DEFAULT_PEAK_FLOPS, DEFAULT_MFU = 989e12, 0.40


class StudyError(Exception):
    """A study file that cannot be run; the message names the file and the key."""


@dataclass
class Arm:
    name: str
    config: str  # a config file, relative to the repo root
    overrides: dict = field(default_factory=dict)
    grid: list = field(default_factory=list)  # this arm's starting tuning grid; [] = the study's
    value: str = ""  # a value fixed in advance: no tuning, straight to the held-out seeds
    value_from: str = ""  # the name of the arm whose chosen value this one runs (e.g. tuned at a smaller width)
    runs: str = ""  # a directory of another study's runs of this arm, reused as they are: never run here
    seeds: list | None = None  # this arm's held-out seeds; None = the horizon's


@dataclass
class Table:
    """One compare.py table of TABLES.md at one horizon: `arms` in order (the first is the baseline
    unless `args` say otherwise), `args` added to the protocol's flags, and compare.py's figure
    written to `figure` where one is named. `kind`: 'compare' (Table 1 over the arms), 'width_transfer'
    (each arm's val loss against the rate, per width, SP and μP) or 'width_ladder' (the gap to the
    baseline per width and its slope against log width), compare.py's --width_transfer / --width_ladder."""

    horizon: int  # max_iters of the horizon it compares
    title: str
    arms: list
    args: list
    figure: str
    kind: str = "compare"


@dataclass
class Horizon:
    """A training length (lr_decay_iters follows max_iters) and where its runs go. A horizon with
    tune=false tunes nothing: its arms run the held-out seeds at the value chosen at the horizon
    `chosen_from` (results/ablations' long runs were made so; a fair long-horizon answer tunes)."""

    max_iters: int
    subdir: str  # RUNS_DIR/<subdir>/<arm>; "" puts the arms in RUNS_DIR itself
    arms: list  # the names of the arms run at this horizon
    tune: bool
    chosen_from: int  # with tune=false: the max_iters of the horizon whose chosen values are used
    seeds: list  # the held-out seeds at this horizon


@dataclass
class Study:
    """A parsed study file; see the module docstring and studies/*.toml."""

    path: str
    name: str
    runs_dir: str
    results_dir: str
    arms: list
    key: str  # the tuning axis, a TrainConfig key
    grid: list  # its starting values, as written (they name the run directories)
    max_widen: int
    tuning_seeds: list  # the tuning seeds; a value's tuning loss is the mean over them
    vary_data_order: bool
    horizons: list
    launcher: dict
    tables: list  # Table
    peak_flops: float
    mfu: float
    seconds_per_step: float  # the cost of a step where no run of the study has finished yet; 0 = from FLOPs

    @property
    def tuning_seed(self):
        """The first tuning seed: the one a point is checked with, and compare.py's --select_on."""
        return self.tuning_seeds[0]


def _take(table, key, kind, where, default=None):
    """table[key] checked to be of `kind`; `default` when absent (None: required). Raises StudyError."""
    if key not in table:
        if default is None:
            raise StudyError(f"{where}: '{key}' is missing")
        return default
    value = table.pop(key)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise StudyError(f"{where}: '{key}' must be {kind.__name__}, got {value!r}")
    return value


def _no_more(table, where):
    if table:
        raise StudyError(f"{where}: unknown key(s) {', '.join(sorted(table))}")


def load_study(path):
    """Parse and check the study file at `path`. Returns a Study. Raises StudyError naming the file and key
    (a missing or unknown key, a wrong type, an unknown config key, a config file that does not exist)."""
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise StudyError(f"{path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise StudyError(f"{path} is not valid TOML: {e}") from None
    name = _take(raw, "name", str, path, os.path.splitext(os.path.basename(path))[0])
    results_dir = _take(raw, "results_dir", str, path, os.path.join("results", name))
    runs_dir = _take(raw, "runs_dir", str, path, results_dir)
    tuning = _take(raw, "tuning", dict, path)
    where = f"{path} [tuning]"
    key = _take(tuning, "key", str, where)
    grid = [str(v) for v in _take(tuning, "grid", list, where)]
    max_widen = _take(tuning, "max_widen", int, where, 3)
    if ("seed" in tuning) == ("seeds" in tuning):
        raise StudyError(f"{where}: give the tuning seed as 'seed' or several as 'seeds', one of the two")
    tuning_seeds = [_take(tuning, "seed", int, where)] if "seed" in tuning else _take(tuning, "seeds", list, where)
    if not tuning_seeds or not all(isinstance(x, int) and not isinstance(x, bool) for x in tuning_seeds):
        raise StudyError(f"{where}: 'seeds' must be a non-empty list of integers, got {tuning_seeds!r}")
    _no_more(tuning, where)
    held_out = _take(raw, "held_out", dict, path)
    where = f"{path} [held_out]"
    seeds = _take(held_out, "seeds", list, where)
    vary = _take(held_out, "vary_data_order", bool, where, True)
    _no_more(held_out, where)
    if set(tuning_seeds) & set(seeds):
        raise StudyError(f"{path}: the tuning seed {sorted(set(tuning_seeds) & set(seeds))[0]} is also a held-out "
                         f"seed; a value chosen on a seed must not be reported on it")
    raw_horizons = _take(raw, "horizon", list, path)
    arms = []
    for i, a in enumerate(_take(raw, "arm", list, path)):
        where = f"{path} [[arm]] {i + 1}"
        arm = Arm(_take(a, "name", str, where), _take(a, "config", str, where), _take(a, "overrides", dict, where, {}),
                  [str(v) for v in _take(a, "grid", list, where, [])], _take(a, "value", str, where, ""),
                  _take(a, "value_from", str, where, ""), _take(a, "runs", str, where, ""),
                  _take(a, "seeds", list, where, None) if "seeds" in a else None)
        _no_more(a, where)
        if arm.value and arm.value_from:
            raise StudyError(f"{where}: 'value' fixes the arm's {key} and 'value_from' takes another arm's; give one")
        if arm.seeds is not None and set(arm.seeds) & set(tuning_seeds):
            raise StudyError(f"{where}: its held-out seeds include a tuning seed")
        for value in [*(arm.grid or grid), *([arm.value] if arm.value else [])]:
            try:
                float(value)
            except ValueError:
                raise StudyError(f"{where}: the tuning grid holds {value!r}; the tuning axis must be numeric") from None
        if not os.path.isfile(os.path.join(REPO, arm.config)):
            raise StudyError(f"{where}: config {arm.config} does not exist")
        arms.append(arm)
    if len({a.name for a in arms}) != len(arms):
        raise StudyError(f"{path}: two arms share a name")
    names = [a.name for a in arms]
    for i, arm in enumerate(arms):
        source = next((a for a in arms if a.name == arm.value_from), None) if arm.value_from else None
        if arm.value_from and (source is None or source.value_from):
            raise StudyError(f"{path} [[arm]] {i + 1}: value_from = {arm.value_from!r} must name an arm that is "
                             f"tuned or has a fixed value")
    horizons = []
    for i, h in enumerate(raw_horizons):
        where = f"{path} [[horizon]] {i + 1}"
        horizon = Horizon(_take(h, "max_iters", int, where), _take(h, "subdir", str, where, ""),
                          _take(h, "arms", list, where, names), _take(h, "tune", bool, where, True),
                          _take(h, "chosen_from", int, where, 0), _take(h, "seeds", list, where, seeds))
        _no_more(h, where)
        if set(tuning_seeds) & set(horizon.seeds):
            raise StudyError(f"{where}: a tuning seed is also a held-out seed")
        if set(horizon.arms) - set(names):
            raise StudyError(f"{where}: no arm is named {', '.join(sorted(set(horizon.arms) - set(names)))}")
        tuned = {x.max_iters: x for x in horizons if x.tune}
        if not horizon.tune and (horizon.chosen_from not in tuned or set(horizon.arms) - set(
                tuned.get(horizon.chosen_from, horizon).arms)):
            raise StudyError(f"{where}: tune = false needs chosen_from = the max_iters of an earlier tuned horizon "
                             f"that runs the same arms")
        horizons.append(horizon)
    launcher = _take(raw, "launcher", dict, path, {})
    tables = []
    default_tables = [{"horizon": h.max_iters, "arms": h.arms,
                       "figure": os.path.join(results_dir, f"figure_{h.max_iters}.png")} for h in horizons]
    for i, tb in enumerate(_take(raw, "table", list, path, default_tables)):
        where = f"{path} [[table]] {i + 1}"
        table = Table(_take(tb, "horizon", int, where, horizons[0].max_iters), _take(tb, "title", str, where, ""),
                      _take(tb, "arms", list, where, names), [str(x) for x in _take(tb, "args", list, where, [])],
                      _take(tb, "figure", str, where, ""), _take(tb, "kind", str, where, "compare"))
        _no_more(tb, where)
        if table.kind not in ("compare", "width_transfer", "width_ladder"):
            raise StudyError(f"{where}: kind must be 'compare', 'width_transfer' or 'width_ladder', got {table.kind!r}")
        horizon = next((h for h in horizons if h.max_iters == table.horizon), None)
        if horizon is None or set(table.arms) - set(horizon.arms):
            raise StudyError(f"{where}: its horizon {table.horizon} is not one of the study's, or does not run every "
                             f"arm it names")
        tables.append(table)
    cost = _take(raw, "cost", dict, path, {})
    peak = _take(cost, "peak_flops", float, f"{path} [cost]", DEFAULT_PEAK_FLOPS)
    mfu = _take(cost, "mfu", float, f"{path} [cost]", DEFAULT_MFU)
    per_step = _take(cost, "seconds_per_step", float, f"{path} [cost]", 0.0)
    _no_more(cost, f"{path} [cost]")
    _no_more(raw, path)
    study = Study(path, name, runs_dir, results_dir, arms, key, grid, max_widen, tuning_seeds, vary, horizons,
                  launcher, tables, peak, mfu, per_step)
    for arm in arms:  # every arm's config, with the study's settings, must be one train.py accepts
        for horizon in (h for h in horizons if arm.name in h.arms):
            try:
                arm_config(study, arm, horizon, {key: arm.value or (arm.grid or grid)[0], "seed": tuning_seeds[0]})
            except Exception as e:
                raise StudyError(f"{path}: arm {arm.name}: {e}") from None
            if arm.runs:  # reused runs are read, never run: every one the protocol asks for must be there
                missing = advance(study, arm, horizon).todo
                if missing or not os.path.isdir(arm.runs):
                    raise StudyError(f"{path}: arm {arm.name} reuses the runs in {arm.runs}, which lack "
                                     f"{len(missing) or 'all'} the protocol asks for (e.g. "
                                     f"{point_dir(study, arm, horizon, missing[0]) if missing else arm.runs}); "
                                     f"finish them in their own study first")
    return study


def format_value(value):
    """A widened grid value as a run directory names it: the shortest mantissa and a power of ten
    (0.012 -> '1.2e-2', 0.00075 -> '7.5e-4'), as the committed grids are written."""
    exponent = math.floor(math.log10(value))
    mantissa = round(value / 10**exponent, 10)
    return f"{mantissa:g}e{exponent}"


def train_args(study, arm, horizon):
    """The train.py arguments every run of `arm` at `horizon` shares: its config file, its overrides, and the
    horizon (max_iters, with lr_decay_iters following it)."""
    overrides = {**arm.overrides, "max_iters": horizon.max_iters, "lr_decay_iters": horizon.max_iters}
    return [os.path.join(REPO, arm.config), *(f"--{k}={v}" for k, v in overrides.items())]


def arm_config(study, arm, horizon, point):
    """The TrainConfig of one run (raises ConfigError for a setting train.py would refuse)."""
    args = [*train_args(study, arm, horizon), *(f"--{k}={v}" for k, v in point.items())]
    return parse_config(TrainConfig, args)[0]


def arm_dir(study, arm, horizon):
    """The directory of the arm's runs at `horizon`: RUNS_DIR/<subdir>/<arm>, or the reused runs' directory."""
    return arm.runs or os.path.join(study.runs_dir, horizon.subdir, arm.name)


def held_out_point(study, value, seed):
    """The point (an ordered dict of axis values, as sweep.py names its directory) of a held-out run."""
    point = {study.key: value, "seed": seed}
    if study.vary_data_order:
        point["data_seed"] = seed
    return point


def point_dir(study, arm, horizon, point):
    return os.path.join(arm_dir(study, arm, horizon), ",".join(f"{k}={v}" for k, v in point.items()))


def final_val_loss(path, max_iters):
    """A run's val loss at max_iters; inf for a run that diverged; None while it is missing or unfinished."""
    if not os.path.isfile(os.path.join(path, "metrics.jsonl")):
        return None
    evals, diverged, _, _ = history(read_records(os.path.join(path, "metrics.jsonl")))
    if diverged is not None:
        return math.inf
    return evals[max_iters][1] if max_iters in evals else None


def seconds_per_step(paths):
    """The median measured seconds per step over the finished runs in `paths` (None if none has a record)."""
    times = []
    for path in paths:
        if os.path.isfile(os.path.join(path, "metrics.jsonl")):
            times += [r["ms_per_step"] / 1000 for r in read_records(os.path.join(path, "metrics.jsonl"))
                      if r["type"] == "train" and r.get("ms_per_step")]
    return statistics.median(times) if times else None


@dataclass
class Stage:
    """What the protocol has reached for one arm at one horizon (see `advance`)."""

    values: list  # the tuning grid so far, sorted by value
    # value -> val loss at max_iters, the mean over the tuning seeds (None: not finished, inf: one diverged)
    tuning: dict
    widening: list  # the widening steps taken: {"edge", "added", "best", "because": {value: val loss}}
    chosen: str | None  # the chosen value, once the tuning runs are done and the best is inside the grid
    held_out: dict  # seed -> val loss (None: not finished)
    todo: list  # the points to run next: tuning points, then held-out points; empty once the arm is done


def advance(study, arm, horizon):
    """Follow the protocol as far as the finished runs of `arm` allow, widening where the best tuning value is at
    an edge. Returns a Stage whose `todo` lists the points to run next: tuning points while the tuning is open,
    held-out points once a value is chosen, none when the arm is done (or while the arm or horizon it takes its
    value from has not chosen one). A value's tuning loss is the mean over the tuning seeds."""
    source = None
    if not horizon.tune:
        source = advance(study, arm, next(h for h in study.horizons if h.max_iters == horizon.chosen_from))
    elif arm.value_from:
        source = advance(study, next(a for a in study.arms if a.name == arm.value_from), horizon)
    if source is not None or arm.value:
        chosen = source.chosen if source is not None else arm.value
        if chosen is None:
            return Stage([], {}, [], None, {s: None for s in held_out_seeds(arm, horizon)}, [])
        return held_out_stage(study, arm, horizon, [], {}, [], chosen)
    values = sorted(set(arm.grid or study.grid), key=float)
    widening = []
    while True:
        tuning = {v: tuning_loss(study, arm, horizon, v) for v in values}
        missing = [{study.key: v, "seed": s} for v in values for s in study.tuning_seeds
                   if final_val_loss(point_dir(study, arm, horizon, {study.key: v, "seed": s}), horizon.max_iters)
                   is None]
        if missing:
            return Stage(values, tuning, widening, None, {}, missing)
        best = min(values, key=lambda v: (tuning[v], float(v)))
        edge = 0 if best == values[0] else len(values) - 1 if best == values[-1] else None
        widened_here = sum(1 for w in widening if w["edge"] == ("low" if edge == 0 else "high"))
        if edge is None or widened_here >= study.max_widen:
            break
        added = format_value(float(best) / 2 if edge == 0 else float(best) * 2)
        widening.append({"edge": "low" if edge == 0 else "high", "added": added, "best": best,
                         "because": {v: tuning[v] for v in values}})
        values = sorted({*values, added}, key=float)
    return held_out_stage(study, arm, horizon, values, tuning, widening, best)


def tuning_loss(study, arm, horizon, value):
    """The mean val loss at max_iters of `value`'s runs on the tuning seeds: None while one is missing, inf if
    one diverged."""
    losses = [final_val_loss(point_dir(study, arm, horizon, {study.key: value, "seed": s}), horizon.max_iters)
              for s in study.tuning_seeds]
    return None if None in losses else statistics.fmean(losses) if all(map(math.isfinite, losses)) else math.inf


def held_out_seeds(arm, horizon):
    """The arm's held-out seeds at `horizon`: its own `seeds` where given, else the horizon's."""
    return horizon.seeds if arm.seeds is None else arm.seeds


def held_out_stage(study, arm, horizon, values, tuning, widening, chosen):
    """The Stage of an arm whose value is chosen: its held-out runs, done or to do."""
    seeds = held_out_seeds(arm, horizon)
    held_out = {s: final_val_loss(point_dir(study, arm, horizon, held_out_point(study, chosen, s)),
                                  horizon.max_iters) for s in seeds}
    return Stage(values, tuning, widening, chosen, held_out,
                 [held_out_point(study, chosen, s) for s in seeds if held_out[s] is None])


def sweep_command(study, arm, horizon, points, jobs=None):
    """The sweep.py command that runs `points` (all with the same keys) of `arm`: one axis per key, and the seeds
    with data_seed as one zipped axis when the data order varies with them; `jobs` replaces the launcher's."""
    keys = list(points[0])
    grid = []
    if keys[-1] == "data_seed":
        values = sorted({p[study.key] for p in points}, key=float)
        grid += ["--grid", f"{study.key}={','.join(values)}"]
        grid += ["--grid", "seed,data_seed=" + ",".join(str(s) for s in sorted({p["seed"] for p in points}))]
    else:
        for key in keys:
            values = sorted({str(p[key]) for p in points}, key=float)
            grid += ["--grid", f"{key}={','.join(values)}"]
    launcher = [f"--{k}={v}" for k, v in {**study.launcher, **({"jobs": jobs} if jobs else {})}.items()]
    return [sys.executable, os.path.join(REPO, "sweep.py"), *train_args(study, arm, horizon), *grid,
            f"--sweep_dir={arm_dir(study, arm, horizon)}", *launcher]


def run_flops(study, arm, horizon):
    """(training FLOPs of one run of `arm` at `horizon`, model.GPT.flops_per_token times its tokens; its config)."""
    cfg = arm_config(study, arm, horizon, {study.key: arm.value or (arm.grid or study.grid)[0],
                                           "seed": study.tuning_seed})
    # imported here: only a cost estimate needs the model
    import torch

    from model import GPT, GPTConfig, model_config_keys
    with torch.device("meta"):
        model = GPT(GPTConfig(**{k: getattr(cfg, k) for k in model_config_keys()}))
    return model.flops_per_token() * cfg.batch_size * cfg.gradient_accumulation_steps * cfg.block_size \
        * horizon.max_iters, cfg


def arm_run_dirs(study, arm, horizon):
    """The run directories under the arm's directory at `horizon`."""
    base = arm_dir(study, arm, horizon)
    return [os.path.join(base, d) for d in sorted(os.listdir(base)) if os.path.isdir(os.path.join(base, d))] \
        if os.path.isdir(base) else []


def estimated_seconds(study, arm, horizon, n_runs):
    """(seconds for n_runs more runs of `arm`, how it was estimated): the median measured time per step of the
    arm's own finished runs; else the time per step that the arms with finished runs give at its FLOPs per step
    (a power law fitted in log-log to their medians, where their sizes differ by 1.5x or more: a small model's step
    costs more than its FLOPs on a CPU; else proportional to the FLOPs); else the study's [cost]
    seconds_per_step; else its FLOPs at the study's assumed peak and MFU."""
    own = seconds_per_step(arm_run_dirs(study, arm, horizon))
    if own is not None:
        return n_runs * horizon.max_iters * own, "measured"
    measured = {}  # FLOPs per step -> the median seconds per step of an arm with finished runs of that size
    for h in study.horizons:
        for a in arms_at(study, h):
            per_step = seconds_per_step(arm_run_dirs(study, a, h))
            if per_step is not None:
                measured[run_flops(study, a, h)[0] / h.max_iters] = per_step
    flops = run_flops(study, arm, horizon)[0]
    if measured:
        x, y = [math.log(f) for f in measured], [math.log(t) for t in measured.values()]
        # a fit needs sizes apart (arms of one width differ by a query module's few FLOPs)
        slope = statistics.linear_regression(x, y).slope if max(x) - min(x) > math.log(1.5) else 1.0
        anchor = statistics.fmean(y) - slope * statistics.fmean(x)
        return n_runs * horizon.max_iters * math.exp(anchor + slope * math.log(flops / horizon.max_iters)), "scaled"
    if study.seconds_per_step:
        return n_runs * horizon.max_iters * study.seconds_per_step, "given"
    return n_runs * flops / (study.peak_flops * study.mfu), "flops"


def tuning_saved(study, arm, horizon):
    """For an arm on CUDA whose value comes from a smaller arm (value_from, e.g. μP's proxy width): (a line with
    the GPU-hours of that arm's tuning runs against the same tuning at this arm's size, the GPU-hours saved);
    (None, 0) otherwise."""
    if not arm.value_from:
        return None, 0.0
    source = next(a for a in study.arms if a.name == arm.value_from)
    (big, cfg), (small, source_cfg) = run_flops(study, arm, horizon), run_flops(study, source, horizon)
    if cfg.device == "cpu" or big <= small:
        return None, 0.0
    n = len(advance(study, source, horizon).values or set(source.grid or study.grid)) * len(study.tuning_seeds)
    gpu_hours = lambda flops: n * flops / (study.peak_flops * study.mfu) / 3600  # noqa: E731
    saved = gpu_hours(big) - gpu_hours(small)
    return (f"    tuning {arm.value_from} ({n} runs, n_embd={source_cfg.n_embd}) takes about {gpu_hours(small):.1f} "
            f"GPU-hours; the same tuning at n_embd={cfg.n_embd} would take {gpu_hours(big):.1f}: {saved:.1f} "
            f"GPU-hours saved (FLOPs at the study's [cost] peak and MFU)"), saved


def arms_at(study, horizon):
    """The Arms run at `horizon`, in the study's order."""
    return [a for a in study.arms if a.name in horizon.arms]


def run_dirs_of(study):
    """Every run directory of the study, reused ones included."""
    return [d for h in study.horizons for a in arms_at(study, h) for d in arm_run_dirs(study, a, h)]


def plan(study):
    """Print, per horizon and arm, the runs done and the runs to do next with their estimated cost; returns the
    number of runs still to do (at least: widening can add more)."""
    left, seconds, how, saved_in_all = 0, 0.0, set(), 0.0
    for horizon in study.horizons:
        how_chosen = "tuned" if horizon.tune else f"at the value chosen at {horizon.chosen_from} steps"
        print(f"horizon {horizon.max_iters} steps, {how_chosen} ({os.path.join(study.runs_dir, horizon.subdir)}):")
        for arm in arms_at(study, horizon):
            stage = advance(study, arm, horizon)
            tuned = sum(v is not None for v in stage.tuning.values())
            held = sum(v is not None for v in stage.held_out.values())
            chosen = f"chosen {study.key}={stage.chosen}" if stage.chosen else "not chosen yet"
            seeds = held_out_seeds(arm, horizon)
            remaining = len(stage.todo) + (0 if stage.chosen else len(seeds))
            how_tuned = (f"reuses {arm.runs}, " if arm.runs else "") + (
                f"{study.key} fixed" if arm.value else f"{study.key} from {arm.value_from}" if arm.value_from
                else f"tuning {tuned}/{len(stage.values)} done")
            print(f"  {arm.name}: {how_tuned}, held-out {held}/{len(seeds)} done, {chosen}; {remaining} run(s) left"
                  + (f" (widened: {', '.join(w['added'] for w in stage.widening)})" if stage.widening else ""))
            line, saved = tuning_saved(study, arm, horizon)
            if line:
                print(line)
                saved_in_all += saved
            if remaining:
                s, kind = estimated_seconds(study, arm, horizon, remaining)
                seconds += s
                how.add(kind)
            left += remaining
    done = sum(os.path.isfile(os.path.join(d, "metrics.jsonl")) for d in run_dirs_of(study))
    print(f"\n{done} run directories exist; at least {left} run(s) left", end="")
    if left:
        basis = {"measured": "the median measured time per step of each arm's finished runs",
                 "scaled": "the measured times per step against FLOPs per step, for arms with none yet",
                 "given": f"{study.seconds_per_step} s per step, the study's [cost] seconds_per_step",
                 "flops": f"its FLOPs at {study.peak_flops / 1e12:.0f} TFLOP/s and {study.mfu:.0%} MFU per GPU, "
                          f"the study's [cost]"}
        # FLOPs give GPU time; a measured step is the wall time of one run, whatever its devices
        slots = local_slots(study)
        unit = ("GPU-hours" if how == {"flops"} else
                f"run-hours, about {seconds / 3600 / slots:.1f} hours of wall time at {slots} runs at a time"
                if slots > 1 else "run-hours (one run at a time; the wall time divides by the runs in parallel)")
        print(f", about {seconds / 3600:.1f} {unit}, from {' and '.join(basis[k] for k in sorted(how))} "
              f"(widening may add runs)")
    else:
        print()
    if saved_in_all:
        print(f"tuning at the smaller widths instead of each arm's own saves about {saved_in_all:.1f} GPU-hours")
    return left


def table_command(study, table, arms):
    """compare.py's command line for `table`: where every arm is tuned in this table's runs, the held-out
    protocol's flags (choose on the tuning seed, report the others, Holm, paired); arms at a value fixed or
    chosen by another arm, Holm and paired; at an untuned horizon, the paired column; a width table (Table.kind)
    over the held-out seeds, or over the tuning runs where there are none."""
    horizon = next(h for h in study.horizons if h.max_iters == table.horizon)
    tuned = horizon.tune and not any(arms[a].value or arms[a].value_from for a in table.arms)
    protocol = ([f"--best_over={study.key}", f"--select_on=seed={study.tuning_seed}", "--holm", "--paired"]
                if tuned else ["--holm", "--paired"] if horizon.tune else ["--paired"])
    if table.kind != "compare":
        seeds = sorted({s for a in table.arms for s in held_out_seeds(arms[a], horizon)})
        protocol = [f"--{table.kind}", *([f"--seeds={','.join(map(str, seeds))}"] if seeds else [])]
    return ["compare.py", *(arm_dir(study, arms[a], horizon) for a in table.arms), *protocol, *table.args,
            *(["--group_over=seed,data_seed"] if study.vary_data_order else []), "--format=markdown",
            *([f"--plot={table.figure}"] if table.figure else [])]


def write_tables(study):
    """RESULTS_DIR/TABLES.md: per horizon, compare.py's table over the arms (baseline first) with the held-out
    protocol's flags, and its figure; generated, so it is rewritten whole on every run."""
    os.makedirs(study.results_dir, exist_ok=True)
    sections = [f"# {study.name}: generated tables\n",
                f"Written by `python study.py {study.path}` from the runs under {study.runs_dir}; do not edit "
                f"(a person's notes belong in README.md beside it).\n"]
    arms = {a.name: a for a in study.arms}
    for table in study.tables:
        cmd = table_command(study, table, arms)
        proc = subprocess.run([sys.executable, *cmd], cwd=REPO, capture_output=True, text=True)
        if proc.returncode:
            raise StudyError(f"{shlex.join(['python', *cmd])} failed: {proc.stderr.strip()}")
        title = f": {table.title}" if table.title else ""
        printed = "\n".join(line for line in proc.stdout.strip().splitlines() if not line.startswith("wrote "))
        sections.append(f"## {table.horizon} steps{title}\n\n```bash\n{shlex.join(['python', *cmd])}\n"
                        f"```\n\n{printed}\n")
    with atomic_write(os.path.join(study.results_dir, "TABLES.md")) as f:
        f.write("\n".join(sections))


def record(study, stages):
    """RESULTS_DIR/study.json: every choice and the val losses it was based on (a diverged run's as null)."""
    finite = lambda losses: {str(k): v if v is None or math.isfinite(v) else None for k, v in losses.items()}  # noqa: E731
    write_json(os.path.join(study.results_dir, "study.json"), {
        "study": study.path, "key": study.key,
        **({"tuning_seed": study.tuning_seed} if len(study.tuning_seeds) == 1
           else {"tuning_seeds": study.tuning_seeds}),
        "vary_data_order": study.vary_data_order,
        "horizons": {str(max_iters): {name: {
            "grid": s.values, "tuning_val_loss": finite(s.tuning), "chosen": s.chosen,
            "widening": [{**w, "because": finite(w["because"])} for w in s.widening],
            "held_out_val_loss": finite(s.held_out)} for name, s in arms.items()}
            for max_iters, arms in stages.items()}})


def local_slots(study):
    """The number of points the study runs at a time on this machine: the launcher's `jobs` where it runs
    locally (sweep.py's default launcher), else 0 (SLURM: the scheduler decides)."""
    return int(study.launcher.get("jobs", 1)) if study.launcher.get("launcher", "local") == "local" else 0


def slot_environment(study, slots):
    """[the environment overrides of a point running in each slot], one entry a slot. On CUDA each slot is a set
    of --gpus_per_run GPUs (1 by default) that no other slot has, as CUDA_VISIBLE_DEVICES (sweep.py's
    visible_gpus): where the visible GPUs make fewer such sets than `slots`, there are as many slots as sets,
    and a note says so. Every point gets OMP_NUM_THREADS = cores / (slots x its processes), unless it is set, as
    one sweep of --jobs=slots gives each. Raises StudyError if a point needs more GPUs than are visible."""
    on_cuda = any(arm_config(study, a, h, {study.key: (a.grid or study.grid)[0], "seed": study.tuning_seed}).device
                  != "cpu" for h in study.horizons for a in arms_at(study, h))
    gpus = []
    if on_cuda:
        from sweep import visible_gpus  # imports torch: only a study that may run on GPUs needs it

        gpus = visible_gpus()
    procs = max(int(study.launcher.get("gpus_per_run", 0)), 1) if gpus else int(study.launcher.get("procs_per_run", 1))
    if gpus:
        if len(gpus) < procs:
            raise StudyError(f"a point needs {procs} GPUs (gpus_per_run) and {len(gpus)} are visible")
        if len(gpus) // procs < slots:
            print(f"note: {len(gpus)} visible GPU(s) make {len(gpus) // procs} slot(s) of {procs}; the study runs "
                  f"{len(gpus) // procs} point(s) at a time, not [launcher] jobs = {slots}", flush=True)
        slots = len(gpus) // procs
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, len(os.sched_getaffinity(0)) // (slots * procs)))
    env = [{"OMP_NUM_THREADS": threads} for _ in range(slots)]
    if gpus:
        for slot, overrides in enumerate(env):
            overrides["CUDA_VISIBLE_DEVICES"] = ",".join(gpus[slot * procs:(slot + 1) * procs])
    return env


def run_pooled(study, slots):
    """Run the protocol on this machine with `slots` points at a time (slot_environment: on CUDA, as many as the
    GPUs make) across arms and stages. Each slot runs one point, a sweep.py of that point alone in the slot's
    environment, and when it ends it takes the next point waiting in any arm: a point of an arm's current stage
    (its tuning runs, a widening run, its held-out seeds) waits only for a free slot, never for the rest of its
    stage or another arm, so no slot idles while a point waits. The waiting points are dealt round the arms in
    turn (one to each arm with points waiting, then again), the arms with the fewest points finished or running
    first (points_had; ties in the study's order), so arms that reach their held-out seeds together run them in
    step, and an arm that an earlier, stopped command left a seed behind catches up first; an arm's next stage
    begins when every point of its last one is done. Each sweep's output goes to its arm
    directory's sweep.log. SIGINT/SIGTERM reach every running sweep (each point writes its checkpoint). Returns 0
    when every arm is done, 1 if a point failed (its arm takes no new point; the other arms go on to their end) or
    the GPUs are too few, 128 + the signal number if stopped."""
    try:
        env = slot_environment(study, slots)
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    free, running, failed, stop = list(range(len(env))), {}, [], []  # running: Popen -> (horizon, arm, point, slot)

    def forward(signum, frame):
        stop.append(signum)
        for child in running:
            child.send_signal(signum)

    def launch(horizon, arm, point, slot):
        cmd = sweep_command(study, arm, horizon, [point], jobs=1)
        log = os.path.join(arm_dir(study, arm, horizon), "sweep.log")
        os.makedirs(os.path.dirname(log), exist_ok=True)
        name = os.path.basename(point_dir(study, arm, horizon, point))
        print(f"{arm.name} @ {horizon.max_iters} steps: {name} in slot {slot} (log: {log})\n  {shlex.join(cmd)}",
              flush=True)
        with open(log, "a") as f:
            child = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **env[slot]})
        running[child] = (horizon, arm, point, slot)

    handlers = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            stages = {h.max_iters: {a.name: advance(study, a, h) for a in arms_at(study, h)} for h in study.horizons}
            record(study, stages)
            started = {point_dir(study, a, h, p) for h, a, p, _ in running.values()}
            waiting = [(h, a, [p for p in stages[h.max_iters][a.name].todo if point_dir(study, a, h, p) not in started])
                       for h in study.horizons for a in arms_at(study, h) if (h.max_iters, a.name) not in failed]
            # the arms that have had the fewest points first (ties in the study's order): a slot that frees takes
            # the next arm's point, not the first arm's again, so a study stopped midway ends with whole seeds
            # (every arm's run on seed s) rather than one arm's seeds all done and another's none
            waiting.sort(key=lambda w: points_had(study, stages[w[0].max_iters][w[1].name])
                         + sum((h.max_iters, a.name) == (w[0].max_iters, w[1].name) for h, a, _, _ in running.values()))
            while free and not stop and any(points for _, _, points in waiting):
                for horizon, arm, points in waiting:
                    if points and free:
                        launch(horizon, arm, points.pop(0), free.pop(0))
            if not running:
                break
            child = wait_any(running)
            horizon, arm, point, slot = running.pop(child)
            free = sorted(free + [slot])
            name = os.path.basename(point_dir(study, arm, horizon, point))
            log = os.path.join(arm_dir(study, arm, horizon), "sweep.log")
            # a sweep that ends well but leaves its point undone (stopped from outside) is not started again
            undone = final_val_loss(point_dir(study, arm, horizon, point), horizon.max_iters) is None
            if child.returncode != 0 or (not stop and undone):
                if (horizon.max_iters, arm.name) not in failed:
                    failed.append((horizon.max_iters, arm.name))
                how = f"exited with status {child.returncode}" if child.returncode else "left its run unfinished"
                print(f"error: the sweep of {arm.name} @ {horizon.max_iters} steps {how} (point {name}, its log: "
                      f"{log}); the other arms go on", file=sys.stderr, flush=True)
            elif not stop:
                print(f"{arm.name} @ {horizon.max_iters} steps: {name} ended", flush=True)
    finally:
        for s, handler in handlers.items():
            signal.signal(s, handler)
    if stop:
        print("study stopped; every running point wrote its checkpoint. Run the same command again to continue",
              file=sys.stderr)
        return 128 + stop[0]
    if failed:
        print(f"error: the sweeps of {', '.join(f'{a} @ {h} steps' for h, a in failed)} failed; fix the cause and "
              f"run the same command again (finished runs are kept)", file=sys.stderr)
        return 1
    return 0


def points_had(study, stage):
    """How many of an arm's points at one horizon are finished, from its Stage (see `advance`): its tuning runs
    (every one once a value is chosen; else the grid's less those still to run) and its finished held-out seeds."""
    tuning = len(stage.values) * len(study.tuning_seeds) - (len(stage.todo) if stage.chosen is None else 0)
    return tuning + sum(loss is not None for loss in stage.held_out.values())


def wait_any(children):
    """The first of `children` (Popen objects) to exit, waiting for it."""
    while True:
        for child in children:
            if child.poll() is not None:
                return child
        time.sleep(0.5)


def run_sequential(study):
    """Run the protocol one sweep at a time (on SLURM the sweeps submit and return). Returns 0 when every arm is
    done or the remaining runs are submitted and not finished, 1 if a sweep failed."""
    while True:
        stages = {h.max_iters: {a.name: advance(study, a, h) for a in arms_at(study, h)} for h in study.horizons}
        pending = [(h, a, stages[h.max_iters][a.name]) for h in study.horizons for a in arms_at(study, h)
                   if stages[h.max_iters][a.name].todo]
        os.makedirs(study.results_dir, exist_ok=True)
        record(study, stages)
        if not pending:
            return 0
        progressed = False
        for horizon, arm, stage in pending:
            cmd = sweep_command(study, arm, horizon, stage.todo)
            print(f"{arm.name} @ {horizon.max_iters} steps: {len(stage.todo)} run(s)\n  {shlex.join(cmd)}", flush=True)
            code = subprocess.run(cmd, cwd=REPO).returncode
            if code != 0:
                print(f"error: the sweep of {arm.name} exited with status {code}; fix the cause and run the same "
                      f"command again (finished runs are kept)", file=sys.stderr)
                return 1
            after = advance(study, arm, horizon)
            progressed |= after.todo != stage.todo
        if not progressed:
            print("the remaining runs were submitted and have not finished; run the same command again once they "
                  "have (python sweep.py --status DIR shows them)")
            return 0


def run(study):
    """Run the protocol to its end (or until submitted jobs must finish first); then write the tables. On this
    machine with [launcher] jobs > 1 the arms share the slots (run_pooled), else one sweep at a time."""
    os.makedirs(study.results_dir, exist_ok=True)
    slots = local_slots(study)
    code = run_pooled(study, slots) if slots > 1 else run_sequential(study)
    if code:
        return code
    stages = {h.max_iters: {a.name: advance(study, a, h) for a in arms_at(study, h)} for h in study.horizons}
    if any(s.todo for arms in stages.values() for s in arms.values()):
        return 0  # submitted jobs still to finish (run_sequential said so)
    write_tables(study)
    print(f"done: every arm tuned and run on its held-out seeds; tables in "
          f"{os.path.join(study.results_dir, 'TABLES.md')}")
    return 0


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", help="a study file, e.g. studies/ablations.toml")
    parser.add_argument("--dry_run", action="store_true", help="print the plan and its cost; run nothing")
    args = parser.parse_args(argv)
    path = os.path.relpath(os.path.abspath(args.study), REPO)
    path = os.path.abspath(args.study) if path.startswith("..") else path
    os.chdir(REPO)  # a study file's paths (configs, runs_dir, results_dir) are relative to the repo root
    try:
        study = load_study(path)
    except StudyError as e:
        print(f"study error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        plan(study)
        return 0
    return run(study)


if __name__ == "__main__":
    sys.exit(run_main(main, sys.argv[1:]))
