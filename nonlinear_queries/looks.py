"""
A study's declared tests ([[test]]), run look by look ([sequential]) and planned by power ([power]): study.py's side
of nonlinear_queries/sequential.py and power.py.

Looks. Look k holds the first looks[k] held-out seeds of the horizon, in the order the study file writes them, for
every arm. study.py runs one look at a time (`at_look`: the study with its seeds cut to that look's). A look is
evaluated only once every run of every declared test's arms at its seeds has finished (`state`); until then no loss
of its runs is shown or recorded (`withhold` keeps them out of study.json). At an evaluated look each test's
statistic is the paired t of its per-seed contrast on the look's seeds (n - 1 degrees of freedom), against the
look's boundary: the Lan-DeMets z boundary carried to t by the same nominal p-value (sequential.t_boundaries). A
test rejects at the first look where |t| reaches its boundary; with a declared futility bound it stops without
rejecting at an earlier look where |t| falls below it (non-binding: the rejection bounds do not count on it). The
study stops at the look where every test has stopped, or at the last look. Beside each, the exact sign-flip p of the
same per-seed contrasts (sequential.sign_flip_p), reported and never a substitute for the declared test, and the
repeated confidence interval, estimate +- t_k x SE (Jennison & Turnbull 2000, ch. 9: it covers the contrast at every
look at once with probability 1 - level).

A diverged run is never dropped: its val loss counts as the test's declared `diverged_val_loss` (power.contrast_values).
"""

import functools
import math
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as sps

from nonlinear_queries import power, sequential
from nonlinear_queries.protocol import StudyError, advance, arms_at, point_dir
from nonlinear_queries.runs import RunDir, RunsError, find_run_dirs, finished, history

SPENDING_NAMES = {"obrien_fleming": "O'Brien-Fleming-type", "pocock": "Pocock-type"}


@functools.lru_cache(maxsize=64)
def _z_bounds(looks, level, spending):
    return tuple(sequential.spending_bounds([n / looks[-1] for n in looks], level, spending))


def boundaries(study, test):
    """(z boundaries, t boundaries, t futility bounds or []) of `test` at the study's looks: Lan-DeMets at the
    fractions looks[k] / looks[-1], carried to t on looks[k] - 1 degrees of freedom."""
    looks = study.sequential.looks
    z = list(_z_bounds(tuple(looks), test.level, study.sequential.spending))
    dfs = [n - 1 for n in looks]
    return z, sequential.t_boundaries(z, dfs), sequential.t_boundaries(study.sequential.futility, dfs)


def _horizon(study, test):
    return next(h for h in study.horizons if h.max_iters == test.horizon)


def look_seeds(study, k):
    """The held-out seeds of look k (0-based) at the first declared test's horizon."""
    return _horizon(study, study.tests[0]).seeds[:study.sequential.looks[k]]


def at_look(study, k):
    """The study with every horizon's (and arm's own) held-out seeds cut to the first looks[k]: what study.py
    plans and runs while look k is current."""
    n = study.sequential.looks[k]
    return replace(study, horizons=[replace(h, seeds=h.seeds[:n]) for h in study.horizons],
                   arms=[replace(a, seeds=a.seeds[:n]) if a.seeds is not None else a for a in study.arms])


def _losses(study, test, k):
    """{arm: {seed: val loss}} of the test's arms on look k's seeds, or None while one run is missing or unfinished
    (its status read, not its loss)."""
    cut, horizon = at_look(study, k), _horizon(study, test)
    if len(horizon.seeds) < study.sequential.looks[k]:
        return None
    arms = [a for a in arms_at(cut, _horizon(cut, test)) if a.name in {test.baseline, *test.contrast}]
    seeds = horizon.seeds[:study.sequential.looks[k]]
    # every run's status first: no loss is read while one run of the look is missing or unfinished
    points = [(a, _points(study, a, test, seeds)) for a in arms]
    if any(len(p) != len(seeds) or not all(finished(RunDir(point_dir(study, a, horizon, x)).status(test.horizon))
                                           for x in p) for a, p in points):
        return None
    losses = {}
    for arm in arms:
        stage = advance(cut, arm, _horizon(cut, test))
        if stage.chosen is None or any(v is None for v in stage.held_out.values()):
            return None
        losses[arm.name] = stage.held_out
    return losses


@dataclass
class Evaluation:
    """One declared test at one look: n seeds, the contrast's mean (points) and SE, t on df, its two-sided p, the
    look's boundaries (z, and |t| at this df; futility |t| or None), the decision ('reject', 'futility', 'continue',
    'not rejected' at the last look), the repeated confidence interval, the sign-flip p and how it was computed, and
    the diverged runs counted at diverged_val_loss."""

    test: str
    look: int
    seeds: list
    mean: float
    se: float
    t: float
    df: int
    p: float
    z_bound: float
    t_bound: float
    futility_t: float | None
    decision: str
    interval: tuple
    sign_flip_p: float
    sign_flip: str
    diverged: int


def evaluate(study, test, k, losses):
    """The Evaluation of `test` at look k from `losses` ({arm: {seed: val loss}}, every run of the look finished)."""
    seeds, d = power.contrast_values(losses, test.baseline, test.contrast, test.diverged_val_loss)
    n = len(d)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    se = sd / math.sqrt(n)
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else 0.0
    z, tb, ft = boundaries(study, test)
    last = k == len(study.sequential.looks) - 1
    futility = ft[k] if ft and not last else None
    decision = ("reject" if abs(t) >= tb[k] else "futility" if futility is not None and abs(t) < futility
                else "not rejected" if last else "continue")
    p_flip, how = sequential.sign_flip_p(d, draws=study.sequential.sign_flip_draws)
    diverged = sum(math.isinf(losses[a][s]) for a in losses for s in seeds)
    return Evaluation(test.name, k + 1, seeds, mean, se, t, n - 1, float(2 * sps.t.sf(abs(t), n - 1)), z[k], tb[k],
                      futility, decision, (mean - tb[k] * se, mean + tb[k] * se), p_flip, how, diverged)


@dataclass
class LookState:
    """Where a sequential study stands: `evaluated` (Evaluations of the looks whose runs all exist, in order),
    `current` (the 0-based look to run now, None once the study has stopped) and `stopped_at` (the 0-based look at
    which it stopped, None while it goes on)."""

    evaluated: list
    current: int | None
    stopped_at: int | None


def state(study):
    """The LookState of a sequential study: each look in turn is evaluated once its runs all exist; a test stops at
    its first rejection or futility, the study at the look where every test has stopped or at the last look."""
    evaluated, open_tests = [], list(study.tests)
    for k in range(len(study.sequential.looks)):
        results = []
        for test in open_tests:
            losses = _losses(study, test, k)
            if losses is None:
                return LookState(evaluated, k, None)
            results.append(evaluate(study, test, k, losses))
        evaluated += results
        open_tests = [t for t, e in zip(open_tests, results) if e.decision == "continue"]
        if not open_tests or k == len(study.sequential.looks) - 1:
            return LookState(evaluated, None, k)
    raise AssertionError("unreachable: the last look stops the study")


def withhold(study, stages):
    """The stages ({max_iters: {arm: Stage}}) with the held-out losses of seeds past the last evaluated look left
    out, for study.json: no loss of a look whose runs do not all exist is written."""
    if study.sequential is None:
        return stages
    shown = set()
    for k in range(len(study.sequential.looks)):
        if any(_losses(study, t, k) is None for t in study.tests):
            break
        shown = set(look_seeds(study, k))
    return {h: {a: replace(s, held_out={seed: v for seed, v in s.held_out.items() if seed in shown})
                for a, s in arms.items()} for h, arms in stages.items()}


def record(study):
    """study.json's 'sequential' entry: the looks, spending and, per evaluated look and test, its statistic, df,
    boundary and decision; {} for a study without looks."""
    if study.sequential is None:
        return {}
    s = state(study)
    plan = study.sequential
    return {"sequential": {
        "looks": plan.looks, "spending": plan.spending, "futility_z": plan.futility,
        "boundaries": {t.name: {"z": boundaries(study, t)[0], "t": boundaries(study, t)[1], "level": t.level}
                       for t in study.tests},
        "current_look": None if s.current is None else s.current + 1,
        "stopped_at_look": None if s.stopped_at is None else s.stopped_at + 1,
        "evaluated": [{"test": e.test, "look": e.look, "seeds": e.seeds, "estimate": e.mean, "se": e.se, "t": e.t,
                       "df": e.df, "p": e.p, "z_boundary": e.z_bound, "t_boundary": e.t_bound,
                       "futility_t": e.futility_t, "decision": e.decision, "repeated_ci": list(e.interval),
                       "sign_flip_p": e.sign_flip_p, "sign_flip": e.sign_flip, "diverged_runs": e.diverged}
                      for e in s.evaluated]}}


def _contrast_text(test):
    terms = " ".join(f"{'+' if c > 0 else '-'} {abs(c):g} g({a})" for a, c in test.contrast.items())
    return f"{test.name} = {terms.removeprefix('+ ')}, each g against {test.baseline}"


def describe_looks(study):
    """The lines --dry_run prints for a sequential study: per test its boundaries, per look its seeds, whether its
    runs all exist (counted by status: no loss is read until they do) and, for evaluated looks, the decision."""
    s = state(study)
    plan = study.sequential
    lines = [f"\nlooks ({SPENDING_NAMES[plan.spending]} Lan-DeMets spending, two-sided; each look's z boundary carried "
             f"to its t by the same nominal p; the first n of the held-out seeds in the study file's order):"]
    for test in study.tests:
        z, tb, ft = boundaries(study, test)
        lines.append(f"  {_contrast_text(test)}, level {test.level:g}:")
        for k, n in enumerate(plan.looks):
            seeds = _horizon(study, test).seeds[:n]
            done = sum(finished(RunDir(point_dir(study, a, _horizon(study, test), p)).status(test.horizon))
                       for a in arms_at(study, _horizon(study, test)) if a.name in {test.baseline, *test.contrast}
                       for p in _points(study, a, test, seeds))
            total = n * (1 + len(test.contrast))
            result = next((e for e in s.evaluated if e.test == test.name and e.look == k + 1), None)
            where = ("  <- current" if s.current == k else "")
            futility = f", stop for futility if |t| < {ft[k]:.2f}" if ft and k < len(plan.looks) - 1 and \
                plan.futility[k] > 0 else ""
            outcome = (f"; t = {result.t:+.2f}, {result.decision}" if result else
                       f"; {done}/{total} runs exist" + ("" if s.current != k else
                                                         " (no loss of this look is read until all exist)")
                       if s.stopped_at is None or k < s.stopped_at else "; not run (stopped earlier)")
            lines.append(f"    look {k + 1}: {n} seeds an arm ({_seed_ranges(seeds)}), reject if |z| >= {z[k]:.3f}: "
                         f"|t| >= {tb[k]:.2f} on {n - 1} df (nominal p <= {2 * sps.norm.sf(z[k]):.2g}){futility}"
                         f"{outcome}{where}")
    if s.stopped_at is not None:
        lines.append(f"  the study stopped at look {s.stopped_at + 1}")
    return lines


def _points(study, arm, test, seeds):
    """The held-out points of `arm` at `seeds` (its value as the protocol chooses it, without reading held-out
    losses: a fixed value, or the tuning's choice)."""
    from_stage = advance(replace(study, horizons=[replace(h, seeds=[]) for h in study.horizons]), arm,
                         _horizon(study, test)).chosen
    if from_stage is None:
        return []
    point = {study.key: from_stage, "seed": None}
    return [{**point, "seed": s, **({"data_seed": s} if study.vary_data_order else {})} for s in seeds]


def _seed_ranges(seeds):
    return f"seeds {seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1)) else \
        "seeds " + ", ".join(map(str, seeds))


def pilot_contrast(study, test, target):
    """(the pilot's paired seeds, their per-seed contrasts, shape (n,), how many of their runs diverged): from
    target.pilot's finished runs (run or arm directories per arm, each run's seed from its config.json), paired by
    seed. Raises StudyError for a pilot run that is unfinished, seeds that pair fewer than 3 times, or a directory
    that holds no run."""
    losses = {}
    for arm, dirs in target.pilot.items():
        try:
            runs = find_run_dirs(dirs)
        except RunsError as e:
            raise StudyError(f"[power.{test.name}] pilot: {e}") from None
        losses[arm] = {}
        for run in runs:
            evals, diverged, _, _ = history(RunDir(run).records(warn=False))
            if diverged is None and test.horizon not in evals:
                raise StudyError(f"[power.{test.name}] pilot: {run} has not reached step {test.horizon}")
            try:
                seed = power.run_seed(run)
            except power.PilotError as e:
                raise StudyError(f"[power.{test.name}] pilot: {e}") from None
            if seed in losses[arm]:
                raise StudyError(f"[power.{test.name}] pilot: two runs of {arm} have seed {seed}")
            losses[arm][seed] = math.inf if diverged is not None else evals[test.horizon][1]
    seeds, d = power.contrast_values(losses, test.baseline, test.contrast, test.diverged_val_loss)
    if len(d) < 3:
        raise StudyError(f"[power.{test.name}] pilot: its arms' runs pair on {len(d)} seed(s); at least 3 are needed")
    return seeds, d, sum(math.isinf(losses[a][s]) for a in losses for s in seeds)


def pilot_spread(study, test, target):
    """(the sample sd of the pilot's per-seed contrasts (ddof 1), its seeds): pilot_contrast's."""
    seeds, d, _ = pilot_contrast(study, test, target)
    return float(np.std(d, ddof=1)), seeds


def describe_power(study, cost):
    """The lines --dry_run prints for [power]: per declared test the spread, the seeds a fixed-n paired t-test needs
    for the effect at the level and power, its MDE at the planned seeds (the last look's, or the held-out seeds),
    and with looks each look's MDE at its nominal level and the sequential procedure's simulated level, power and
    expected seeds; and the cost of each n from `cost(n)` -> (text of the floor, text with widening and one rerun
    per arm)."""
    plan = study.power
    lines = [f"\npower (two-sided, {plan.power:.0%} power; the paired t-test on each test's per-seed contrast):"]
    for test in study.tests:
        target = plan.targets.get(test.name)
        if target is None:
            continue
        if target.sd:
            sd, basis = target.sd, "given"
        else:
            seeds, d, diverged = pilot_contrast(study, test, target)
            sd = float(np.std(d, ddof=1))
            basis = (f"from the pilot's {len(seeds)} paired seeds ({_seed_ranges(seeds)}; {diverged} diverged "
                     f"run(s) among them)")
        planned = study.sequential.looks[-1] if study.sequential else len(_horizon(study, test).seeds)
        needed = power.seeds_for_power(target.effect, sd, test.level, plan.power)
        mde = power.detectable_effect(sd, planned, test.level, plan.power)
        lines += [f"  {test.name}: sd {sd:.3f} points {basis}; effect to detect {target.effect:g} points at level "
                  f"{test.level:g}",
                  f"    a fixed-n test needs {needed} seeds an arm; cost {cost(needed)[0]}, with widening and one "
                  f"rerun per arm {cost(needed)[1]}",
                  f"    at the planned {planned} seeds an arm its MDE is {mde:.2f} points; cost {cost(planned)[0]}, "
                  f"with widening and one rerun per arm {cost(planned)[1]}"]
        if study.sequential:
            z, tb, ft = boundaries(study, test)
            looks = study.sequential.looks
            mdes = power.look_detectable_effects(sd, looks, z, plan.power)
            lines.append("    each look alone detects (MDE at its nominal level): " + ", ".join(
                f"look {k + 1} ({n} seeds) {m:.2f} points" for k, (n, m) in enumerate(zip(looks, mdes))))
            lines.append(f"    were the look's spread sd {sd:.3f}, it rejects where |estimate| >= " + ", ".join(
                f"{b * sd / math.sqrt(n):.2f}" for b, n in zip(tb, looks)) + " points" + ("".join(
                    f"; look {k + 1} stops for futility where |estimate| < {f * sd / math.sqrt(looks[k]):.2f}"
                    for k, (f, z_f) in enumerate(zip(ft, study.sequential.futility)) if z_f > 0)))
            for effect in (0.0, target.effect):
                oc = sequential.operating_characteristics(looks, tb, effect, sd, futility_t=ft or None)
                lines.append(f"    simulated ({oc.studies:,} studies, seed 0) at E = {effect:g}: rejects "
                             f"{oc.rejected:.3f}, stops at the looks {', '.join(f'{x:.3f}' for x in oc.stopped_at)}, "
                             f"expected seeds an arm {oc.expected_seeds:.1f}")
            lines.append("    cost by look: " + "; ".join(f"look {k + 1} {cost(n)[0]}" for k, n in enumerate(looks)))
    return lines


def cost_text(study, seconds_for, n):
    """(the floor, with widening and one rerun per arm) of running `n` held-out seeds of every arm, as text:
    seconds_for(arm, horizon, runs) -> (seconds, how), study.py's estimate; the widening adds up to max_widen values
    at each edge on every tuning seed for each tuned arm, the rerun one run per arm."""
    floor = more = 0.0
    unit = set()
    for horizon in study.horizons:
        for arm in arms_at(study, horizon):
            stage = advance(replace(study, horizons=[replace(h, seeds=[]) for h in study.horizons]), arm, horizon)
            tuning = 0 if arm.value or arm.value_from or not horizon.tune else (
                len(stage.todo) if stage.chosen is None else 0)
            widen = 0 if arm.value or arm.value_from or not horizon.tune else (
                2 * study.max_widen - len(stage.widening)) * len(study.tuning_seeds)
            s, how = seconds_for(arm, horizon, n + tuning)
            floor += s
            unit.add(how)
            more += s + seconds_for(arm, horizon, widen + 1)[0]
    name = "GPU-hours" if unit == {"flops"} else "run-hours"
    return f"{floor / 3600:,.1f} {name}", f"{more / 3600:,.1f} {name}"


def tables_section(study):
    """TABLES.md's section for a sequential study: per evaluated look and test, the estimate, t, df, boundary,
    decision, repeated confidence interval and sign-flip p; '' for a study without looks."""
    if study.sequential is None:
        return ""
    s, plan = state(study), study.sequential
    header = ["test", "look", "seeds an arm", "estimate (points)", "SE", "t", "df", "p (nominal)", "boundary (±t)",
              "decision", "repeated CI", "sign-flip p", "diverged runs"]
    rows = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * 7 + ["---"] * 2 + ["---:"] * 2)
            + "|"]
    rows += [f"| {e.test} | {e.look} | {len(e.seeds)} | {e.mean:+.3f} | {e.se:.3f} | {e.t:+.2f} | {e.df} | {e.p:.2g} "
             f"| {e.t_bound:.2f} | {e.decision} | [{e.interval[0]:+.2f}, {e.interval[1]:+.2f}] | "
             f"{e.sign_flip_p:.3g} ({e.sign_flip}) | {e.diverged} |" for e in s.evaluated]
    where = (f"the study stopped at look {s.stopped_at + 1}" if s.stopped_at is not None else
             f"look {s.current + 1}'s runs do not all exist yet")
    contrasts = "; ".join(_contrast_text(t) for t in study.tests)
    return (f"## The declared tests, look by look\n\n{contrasts}. Looks at {', '.join(map(str, plan.looks))} seeds an "
            f"arm, {SPENDING_NAMES[plan.spending]} Lan-DeMets spending, two-sided; {where}. The interval is the "
            f"repeated confidence interval (estimate ± boundary × SE); the sign-flip p is reported beside the "
            f"declared t-test, not instead of it.\n\n" + "\n".join(rows) + "\n")
