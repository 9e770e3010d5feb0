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
   RESULTS_DIR/figure*.png, regenerated on every run (compare.py's report, nonlinear_queries/
   comparison.py, called in this process); the README beside them is a person's.

Every choice (each widening step, each arm's chosen value) is recorded with the val losses it was
based on in RESULTS_DIR/study.json. The runs go through sweep.py's library
(nonlinear_queries/experiments/sweeps.py), in this process, in RUNS_DIR/<horizon>/<arm>/<point>: finished points
are skipped, interrupted ones resume. On this machine its local scheduler (sweeps.schedule, sweep.py's
too) is handed the points as the arms' stages open: with [launcher] jobs = N (1 by default), the arms share N
slots (on CUDA each a set of GPUs of its own), each running one point at a time: a slot that frees
takes the next point waiting in any arm's current stage, so no slot idles while a point waits (each
point's sweep output in its arm directory's sweep.log); Ctrl-C or SIGTERM reaches every point, which
checkpoints. With a launcher that returns before its jobs finish (SLURM), a sweep per stage (sweeps.Sweep,
its options typed) submits, and the study stops after submitting and says so; run the same command again
once they are done. A study that declares tests ([[test]]: a paired contrast over the arms' per-seed gaps) and looks
([sequential]) runs its held-out seeds one look at a time: when the look's runs all exist it evaluates each test
against the look's alpha-spending boundary (nonlinear_queries/experiments/looks.py, analysis/sequential.py),
records the look in study.json and TABLES.md, and stops; the same command runs the next look, until a boundary is
crossed or the last look is done. --dry_run prints the looks (which is current) and, with [power], the seeds each
test needs, its MDE and their cost (docs/studies.md). Once study.json records a look or an arm's tuned value, the
declaration they rest on (arms, seeds, tests, looks, spending, power: recorded there with its fingerprint) is fixed:
a study file that changes it is refused, the dry run too, naming the key that changed and the decision it would
rewrite (nonlinear_queries/experiments/declaration.py); a new question is a new study. Exit status: 0 ok (or
waiting for jobs), 1 a sweep failed (on this machine the other arms run to their end first), 2 a bad study file (or
one that changes a fixed declaration), 128 + N stopped by signal N.
"""

import nonlinear_queries.interrupt  # noqa: F401  (first: Ctrl-C at any moment ends with one line)

import argparse
import contextlib
import io
import math
import os
import shlex
import statistics
import sys
from dataclasses import asdict

from nonlinear_queries.analysis import comparison
from nonlinear_queries.analysis.width import run_flops
from nonlinear_queries.cli import run_main
from nonlinear_queries.errors import ConfigError, RunsError, StudyError
from nonlinear_queries.experiments import declaration, looks, sweeps
from nonlinear_queries.experiments.protocol import (
    advance,
    arm_config,
    arm_dir,
    arms_at,
    final_val_loss,
    held_out_seeds,
    load_study,
    point_dir,
    points_had,
    train_args,
    wandb_args,
    wandb_name,
)
from nonlinear_queries.experiments.sweeps import Point, point_name, write_record
from nonlinear_queries.record.atomic import atomic_write, write_json
from nonlinear_queries.record.runs import RunDir, finished, step_seconds

REPO = os.path.dirname(os.path.abspath(__file__))


def seconds_per_step(paths):
    """The median measured seconds per step over the finished runs in `paths` (None if none has a record)."""
    times = []
    for path in paths:
        times += [r["ms_per_step"] / 1000 for r in RunDir(path).records()
                  if r["type"] == "train" and r.get("ms_per_step")]
    return statistics.median(times) if times else None


def sweep_grid(study, points):
    """The grid axes (sweeps.parse_grid's KEY=V1,V2,...) whose product is `points` (all with the same keys): one
    axis per key, and the seeds with data_seed as one zipped axis when the data order varies with them."""
    keys = list(points[0])
    if keys[-1] == "data_seed":
        values = sorted({p[study.key] for p in points}, key=float)
        return [f"{study.key}={','.join(values)}",
                "seed,data_seed=" + ",".join(str(s) for s in sorted({p["seed"] for p in points}))]
    return [f"{key}={','.join(sorted({str(p[key]) for p in points}, key=float))}" for key in keys]


def sweep_command(study, arm, horizon, points, jobs=None):
    """The sweep.py command that runs `points` (all with the same keys) of `arm`: its grid (sweep_grid), its
    sweep_dir and the study's launcher options; `jobs` replaces the launcher's."""
    launcher = [f"--{k}={x}" for k, v in {**study.launcher, **({"jobs": jobs} if jobs else {})}.items()
                for x in (v if isinstance(v, list) else [v])]  # a list option (slurm_setup) is given once a line
    return [sys.executable, os.path.join(REPO, "sweep.py"), *train_args(study, arm, horizon),
            *wandb_args(study, arm, horizon, points),
            *(arg for axis in sweep_grid(study, points) for arg in ("--grid", axis)),
            f"--sweep_dir={arm_dir(study, arm, horizon)}", *launcher]


def arm_flops(study, arm, horizon):
    """(training FLOPs of one run of `arm` at `horizon`: width.run_flops of its config; the config)."""
    cfg = arm_config(study, arm, horizon, {study.key: arm.value or (arm.grid or study.grid)[0],
                                           "seed": study.tuning_seed})
    return run_flops({**asdict(cfg), "max_iters": horizon.max_iters}), cfg


def arm_run_dirs(study, arm, horizon):
    """The run directories under the arm's directory at `horizon`."""
    base = arm_dir(study, arm, horizon)
    return [os.path.join(base, d) for d in sorted(os.listdir(base)) if os.path.isdir(os.path.join(base, d))] \
        if os.path.isdir(base) else []


def estimated_seconds(study, arm, horizon, n_runs):
    """(seconds for n_runs more runs of `arm`, how it was estimated): the median measured time per step of the
    arm's own finished runs (metrics.jsonl's ms_per_step); else its FLOPs per step at the measured seconds per
    FLOP of the arms with finished runs nearest it in FLOPs per step (those within 5% of the nearest; their
    geometric mean): a small model is slower per FLOP than a wide one, so the same width's arms say most;
    else the study's [cost] seconds_per_step; else its FLOPs at the study's assumed peak and MFU."""
    own = seconds_per_step(arm_run_dirs(study, arm, horizon))
    if own is not None:
        return n_runs * horizon.max_iters * own, "measured"
    flops = arm_flops(study, arm, horizon)[0]
    measured = []  # (distance in log FLOPs per step, seconds per FLOP), one per arm with finished runs
    for h in study.horizons:
        for a in arms_at(study, h):
            per_step = seconds_per_step(arm_run_dirs(study, a, h))
            if per_step is not None:
                step_flops = arm_flops(study, a, h)[0] / h.max_iters
                measured.append((abs(math.log(step_flops * horizon.max_iters / flops)), per_step / step_flops))
    if measured:
        nearest = min(d for d, _ in measured)
        per_flop = [r for d, r in measured if d <= nearest + math.log(1.05)]
        return n_runs * flops * statistics.geometric_mean(per_flop), "scaled"
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
    (big, cfg), (small, source_cfg) = arm_flops(study, arm, horizon), arm_flops(study, source, horizon)
    if cfg.device == "cpu" or big <= small:
        return None, 0.0
    n = len(advance(study, source, horizon).values or set(source.grid or study.grid)) * len(study.tuning_seeds)
    gpu_hours = lambda flops: n * flops / (study.peak_flops * study.mfu) / 3600  # noqa: E731
    saved = gpu_hours(big) - gpu_hours(small)
    return (f"    tuning {arm.value_from} ({n} runs, n_embd={source_cfg.n_embd}) takes about {gpu_hours(small):.1f} "
            f"GPU-hours; the same tuning at n_embd={cfg.n_embd} would take {gpu_hours(big):.1f}: {saved:.1f} "
            f"GPU-hours saved (FLOPs at the study's [cost] peak and MFU)"), saved


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
    done = sum(RunDir(d).has_record() for d in run_dirs_of(study))
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
    if done:
        hours = sum(step_seconds(RunDir(d).records()) for d in run_dirs_of(study)) / 3600
        print(f"the {done} runs' training steps took {hours:.2f} run-hours, measured: each run's logged step laps "
              f"summed (ms_per_step times the steps since the log before it; evaluation, checkpoints and startup "
              f"left out)")
    if saved_in_all:
        print(f"tuning at the smaller widths instead of each arm's own saves about {saved_in_all:.1f} GPU-hours")
    return left


def table_command(study, table, arms):
    """compare.py's command line for `table`: where every arm is tuned in this table's runs, the held-out
    protocol's flags (choose on the tuning seed, report the others, Holm, paired), or with no held-out seeds
    (a study that only tunes) each arm at its best value on the tuning runs; arms at a value fixed or
    chosen by another arm, Holm and paired; at an untuned horizon, the paired column; a width-transfer table over
    the tuning seeds (where rates are chosen; an arm's reused runs may hold its held-out seeds too), a
    width-ladder table over the held-out seeds, or over every run where there are none."""
    horizon = next(h for h in study.horizons if h.max_iters == table.horizon)
    tuned = horizon.tune and not any(arms[a].value or arms[a].value_from for a in table.arms)
    held_out = any(held_out_seeds(arms[a], horizon) for a in table.arms)
    protocol = ([f"--best_over={study.key}", f"--select_on=seed={study.tuning_seed}", "--holm", "--paired"]
                if tuned and held_out else [f"--best_over={study.key}"] if tuned
                else ["--holm", "--paired"] if horizon.tune else ["--paired"])
    if table.kind != "compare":
        seeds = (study.tuning_seeds if table.kind == "width_transfer"
                 else sorted({s for a in table.arms for s in held_out_seeds(arms[a], horizon)}))
        protocol = [f"--{table.kind}", *([f"--seeds={','.join(map(str, seeds))}"] if seeds else [])]
    return ["compare.py", *(arm_dir(study, arms[a], horizon) for a in table.arms), *protocol, *table.args,
            *(["--group_over=seed,data_seed"] if study.vary_data_order else []), "--format=markdown",
            *([f"--plot={table.figure}"] if table.figure else [])]


def write_tables(study):
    """RESULTS_DIR/TABLES.md: per horizon, compare.py's table over the arms (baseline first) with the held-out
    protocol's flags, and its figure, made in this process by compare.py's report
    (nonlinear_queries.analysis.comparison) from the command line printed above it; generated, so it is rewritten
    whole on every run. Raises StudyError where compare.py would fail, with what it would say."""
    os.makedirs(study.results_dir, exist_ok=True)
    sections = [f"# {study.name}: generated tables\n",
                f"Written by `python study.py {study.path}` from the runs under {study.runs_dir}; do not edit "
                f"(a person's notes belong in README.md beside it).\n"]
    arms = {a.name: a for a in study.arms}
    for table in study.tables:
        cmd = table_command(study, table, arms)
        # the command printed above the table is the one that made it: its own arguments, parsed as compare.py's
        out, notes = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(notes):
                comparison.report(comparison.parse_args(cmd[1:]))
        except (RunsError, SystemExit) as e:
            said = f"error: {e}" if isinstance(e, RunsError) else notes.getvalue().strip()
            raise StudyError(f"{shlex.join(['python', *cmd])} failed: {said}") from None
        title = f": {table.title}" if table.title else ""
        printed = "\n".join(line for line in out.getvalue().strip().splitlines() if not line.startswith("wrote "))
        note = f"{table.note}\n\n" if table.note else ""
        sections.append(f"## {table.horizon} steps{title}\n\n{note}```bash\n{shlex.join(['python', *cmd])}\n"
                        f"```\n\n{printed}\n")
    if study.sequential:
        sections.append(looks.tables_section(study))
    with atomic_write(os.path.join(study.results_dir, "TABLES.md")) as f:
        f.write("\n".join(sections))


def record(study, stages):
    """RESULTS_DIR/study.json: every choice and the val losses it was based on (a diverged run's as null); with
    [sequential] looks, each evaluated look's tests, and no held-out loss of a look whose runs do not all exist; and
    the declaration they rest on with its fingerprint (declaration.entry: fixed from the first look or tuning
    choice recorded, declaration.check)."""
    stages = looks.withhold(study, stages)
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
            for max_iters, arms in stages.items()}, **looks.record(study), **declaration.entry(study)})


def local_slots(study):
    """The number of points the study runs at a time on this machine: the launcher's `jobs` where it runs
    locally (sweep.py's default launcher), else 0 (SLURM: the scheduler decides)."""
    return int(study.launcher.get("jobs", 1)) if study.launcher.get("launcher", "local") == "local" else 0


def slot_environment(study, slots):
    """The sweeps.Slots of `slots` points at a time on this machine (sweeps.machine_slots): a list of each slot's
    environment overrides. On CUDA each slot is a set of --gpus_per_run GPUs (1 by default) that no other slot
    has, as CUDA_VISIBLE_DEVICES: where the visible GPUs make fewer such sets than `slots`, there are as many slots
    as sets, and a note says so. Every point gets OMP_NUM_THREADS = cores / (slots x its processes), unless it is
    set, as one sweep of --jobs=slots gives each. Raises StudyError if a point needs more GPUs than are visible."""
    on_cuda = any(arm_config(study, a, h, {study.key: (a.grid or study.grid)[0], "seed": study.tuning_seed}).device
                  != "cpu" for h in study.horizons for a in arms_at(study, h))
    try:
        machine = sweeps.machine_slots(slots, int(study.launcher.get("gpus_per_run", 0)),
                                       int(study.launcher.get("procs_per_run", 1)), on_cuda)
    except ConfigError as e:
        raise StudyError(str(e)) from None
    if len(machine) < slots:
        print(f"note: {len(machine.gpus)} visible GPU(s) make {len(machine)} slot(s) of {machine.procs}; the study "
              f"runs {len(machine)} point(s) at a time, not [launcher] jobs = {slots}", flush=True)
    return machine


class StageQueue:
    """The protocol's points for the local scheduler (sweeps.schedule), handed out as the arms' stages open: each
    round, the points of every arm's current stage (its tuning runs, a widening run, its held-out seeds) that are
    not running, dealt round the arms in turn (one to each arm with points waiting, then again), the arms with the
    fewest points finished or running first (points_had; ties in the study's order). An arm whose point failed
    takes no new point (`failed`: its (horizon's max_iters, arm name)). What a sweep of a point alone would print
    goes to its arm directory's sweep.log, and the point to its sweep.json."""

    def __init__(self, study):
        self.study, self.failed = study, []
        # where: every point handed out, out_dir -> (horizon, arm); running: those running;
        # elsewhere: the out_dirs of the points another process runs, each said once until a point ends
        self.where, self.running, self.elsewhere = {}, {}, set()

    def waiting(self):
        """The points to try this round, in the order they are dealt (a generator); writes study.json first."""
        study = self.study
        stages = {h.max_iters: {a.name: advance(study, a, h) for a in arms_at(study, h)} for h in study.horizons}
        record(study, stages)
        waiting = [(h, a, [p for p in stages[h.max_iters][a.name].todo
                           if point_dir(study, a, h, p) not in self.running])
                   for h in study.horizons for a in arms_at(study, h) if (h.max_iters, a.name) not in self.failed]
        # the arms that have had the fewest points first (ties in the study's order): a slot that frees takes the
        # next arm's point, not the first arm's again, so a study stopped midway ends with whole seeds (every arm's
        # run on seed s) rather than one arm's seeds all done and another's none
        waiting.sort(key=lambda w: points_had(study, stages[w[0].max_iters][w[1].name])
                     + sum((h.max_iters, a.name) == (w[0].max_iters, w[1].name) for h, a in self.running.values()))
        while any(points for _, _, points in waiting):
            for horizon, arm, points in waiting:
                if points:
                    values = points.pop(0)
                    point = Point(point_name(values), list(values.items()), point_dir(study, arm, horizon, values),
                                  horizon.max_iters, wandb_name(study, arm, horizon, values))
                    self.where[point.out_dir] = (horizon, arm)
                    yield point

    def record_point(self, point, status):
        """The point's status in its arm's sweep.json, with the command of a sweep of that point alone."""
        horizon, arm = self.where[point.out_dir]
        cmd = sweep_command(self.study, arm, horizon, [dict(point.values)], jobs=1)
        write_record(arm_dir(self.study, arm, horizon), cmd[2:], {point.name: status}, [point])

    def passed(self, point, other):
        """Say once, until a point ends, that `other` runs `point`."""
        if point.out_dir not in self.elsewhere:
            self.elsewhere.add(point.out_dir)
            horizon, arm = self.where[point.out_dir]
            print(f"{arm.name} @ {horizon.max_iters} steps: {point.name} is run by {other}; taken up when it ends",
                  flush=True)

    def claimed(self, point, status):
        """Record the claimed point's status in its arm's sweep.json."""
        self.record_point(point, status)

    def starting(self, point, slot):
        """Say where `point` starts; (its arm's train.py arguments, its tag, its arm's sweep.log)."""
        horizon, arm = self.running[point.out_dir] = self.where[point.out_dir]
        cmd = sweep_command(self.study, arm, horizon, [dict(point.values)], jobs=1)
        log = os.path.join(arm_dir(self.study, arm, horizon), "sweep.log")
        print(f"{arm.name} @ {horizon.max_iters} steps: {point.name} in slot {slot} (log: {log})\n  "
              f"{shlex.join(cmd)}", flush=True)
        os.makedirs(os.path.dirname(log), exist_ok=True)
        args = [*train_args(self.study, arm, horizon), *wandb_args(self.study, arm, horizon, [dict(point.values)])]
        return args, f"[1/1] {point.name}", log

    def ended(self, point, code, status, stopping):
        """Record the point, say how it ended in sweep.log, and fail its arm where its train.py failed (exit
        status `code` not 0 or 3) or, unless `stopping`, left its run unfinished."""
        horizon, arm = self.running.pop(point.out_dir)
        self.elsewhere.clear()  # another process's point may have ended too: try them again
        log = os.path.join(arm_dir(self.study, arm, horizon), "sweep.log")
        self.record_point(point, status)
        failed_point = code not in (0, 3)
        with open(log, "a") as f:
            print(f"error: {point.name} failed (exit status {code}); its log: {point.log()}" if failed_point else
                  f"{point.name}: {status if finished(status) else 'stopped at its checkpoint'}", file=f)
        # a point that ends well but undone (stopped from outside) is not started again
        undone = final_val_loss(point.out_dir, horizon.max_iters) is None
        if failed_point or (not stopping and undone):
            if (horizon.max_iters, arm.name) not in self.failed:
                self.failed.append((horizon.max_iters, arm.name))
            # the status of a sweep of this point alone (sweep.py: 1 if its point failed)
            how = "exited with status 1" if failed_point else "left its run unfinished"
            print(f"error: the sweep of {arm.name} @ {horizon.max_iters} steps {how} (point {point.name}, its log: "
                  f"{log}); the other arms go on", file=sys.stderr, flush=True)
        elif not stopping:
            print(f"{arm.name} @ {horizon.max_iters} steps: {point.name} ended", flush=True)


def run_pooled(study, slots):
    """Run the protocol on this machine with `slots` points at a time (slot_environment: on CUDA, as many as the
    GPUs make) across arms and stages, through the local scheduler (sweeps.schedule) with a StageQueue. Each slot
    runs one point's train.py in the slot's environment, as a sweep.py of that point alone would (under its claim,
    sweeps.Point.claim; one that another process runs is passed over until it lets it go), and when it ends it
    takes the next point waiting in any arm: a point of an arm's current stage waits only for a free slot, never
    for the rest of its stage or another arm, so no slot idles while a point waits; the arms are dealt in turn, the
    arms with the fewest points first, so arms that reach their held-out seeds together run them in step, and an
    arm that an earlier, stopped command left a seed behind catches up first; an arm's next stage begins when every
    point of its last one is done. SIGINT/SIGTERM reach every running point (each writes its checkpoint). Returns 0
    when every arm is done, 1 if a point failed (its arm takes no new point; the other arms go on to their end) or
    the GPUs are too few, 128 + the signal number if stopped."""
    try:
        env = slot_environment(study, slots)
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    queue = StageQueue(study)
    stopped_by = sweeps.schedule(queue, env, "study.py")
    if stopped_by:
        print("study stopped; every running point wrote its checkpoint. Run the same command again to continue",
              file=sys.stderr)
        return 128 + stopped_by
    if queue.failed:
        print(f"error: the sweeps of {', '.join(f'{a} @ {h} steps' for h, a in queue.failed)} failed; fix the cause "
              f"and run the same command again (finished runs are kept)", file=sys.stderr)
        return 1
    return 0


def run_sequential(study):
    """Run the protocol one sweep at a time, in this process: on SLURM, where the sweeps submit and return. Returns 0
    when every arm is done or the remaining runs are submitted and not finished, 1 if a sweep failed (a point, or
    its config), 128 + the signal number if SIGINT or SIGTERM stopped a sweep (each point writes its checkpoint)."""
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
            code, stopped_by = sweeps.run_sweep(sweeps.Sweep(
                train_args=[*train_args(study, arm, horizon), *wandb_args(study, arm, horizon, stage.todo)],
                grid=sweep_grid(study, stage.todo),
                sweep_dir=arm_dir(study, arm, horizon), command=cmd[2:], **study.launcher))
            if stopped_by:
                print("study stopped; every running point wrote its checkpoint. Run the same command again to "
                      "continue", file=sys.stderr)
                return 128 + stopped_by
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
    """Run the protocol to its end (or until submitted jobs must finish first); returns the exit status. On this
    machine the arms share [launcher] jobs slots (run_pooled; with one slot too, so that a stopped study leaves
    whole seeds), on SLURM one sweep at a time submits its points."""
    os.makedirs(study.results_dir, exist_ok=True)
    slots = local_slots(study)
    return run_pooled(study, slots) if slots else run_sequential(study)


def run_fixed(study):
    """A study without looks: run(study), then, once every run exists, write the tables and say so."""
    code = run(study)
    if code:
        return code
    if any(advance(study, a, h).todo for h in study.horizons for a in arms_at(study, h)):
        return 0  # submitted jobs still to finish (run_sequential said so)
    write_tables(study)
    print(f"done: every arm tuned and run on its held-out seeds; tables in "
          f"{os.path.join(study.results_dir, 'TABLES.md')}")
    return 0


def cost_of(study):
    """cost(n) -> (floor, with widening and one rerun per arm), as text, of n held-out seeds of every arm: looks'
    cost_text with this program's estimate (estimated_seconds)."""
    return lambda n: looks.cost_text(study, lambda arm, horizon, runs: estimated_seconds(study, arm, horizon, runs), n)


def plan_declared(study):
    """--dry_run: the plan (at the current look's seeds where the study has looks), then the looks and the power
    planning of its declared tests where it declares them."""
    if study.sequential is None:
        plan(study)
    else:
        s = looks.state(study)
        plan(looks.at_look(study, s.current if s.current is not None else s.stopped_at))
        print("\n".join(looks.describe_looks(study)))
    if study.power:
        print("\n".join(looks.describe_power(study, cost_of(study))))


def run_looks(study):
    """Run a sequential study's current look (run, on its seeds), evaluate it once its runs all exist, record it
    and write the tables; the same command again runs the next look, until a boundary is crossed or the last look
    is done."""
    s = looks.state(study)
    if s.current is None:
        write_tables(study)
        print(f"the study stopped at look {s.stopped_at + 1}; nothing is left to run (tables in "
              f"{os.path.join(study.results_dir, 'TABLES.md')})")
        return 0
    code = run(looks.at_look(study, s.current))
    after = looks.state(study)
    if code or after.current == s.current:
        return code
    stages = {h.max_iters: {a.name: advance(study, a, h) for a in arms_at(study, h)} for h in study.horizons}
    record(study, stages)
    write_tables(study)
    for e in (e for e in after.evaluated if e.look == s.current + 1):
        print(f"look {e.look}, {e.test}: {e.mean:+.3f} points, t = {e.t:+.2f} on {e.df} df against |t| >= "
              f"{e.t_bound:.2f}: {e.decision}; sign-flip p {e.sign_flip_p:.3g}")
    print(f"the study stopped at look {after.stopped_at + 1}" if after.current is None else
          (f"the pilot stage is done and sets the looks at {', '.join(map(str, looks.planned_looks(study)[0]))} seeds "
           f"an arm; " if s.current == looks.PILOT else "") +
          f"look {after.current + 1} is next: run the same command again to start it")
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
        declaration.check(study)  # a recorded decision fixes the declaration: refused before planning or running
    except StudyError as e:
        print(f"study error: {e}", file=sys.stderr)
        return 2
    try:
        if args.dry_run:
            plan_declared(study)
            return 0
        return run_looks(study) if study.sequential else run_fixed(study)
    except StudyError as e:
        print(f"study error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(run_main(main, sys.argv[1:]))
