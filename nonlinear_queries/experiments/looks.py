"""
A study's declared tests ([[test]]), run look by look ([sequential]) and planned by power ([power]): study.py's side
of nonlinear_queries/analysis/sequential.py and power.py.

Looks. Look k holds the first looks[k] held-out seeds of the horizon, in the order the study file writes them, for
every arm. study.py runs one look at a time (`at_look`: the study with its seeds cut to that look's). A look is
evaluated only once every run of every declared test's arms at its seeds has finished (`state`); until then no loss
of its runs is shown or recorded (`withhold` keeps them out of study.json). At an evaluated look each test's
statistic is the paired t of its per-seed contrast on the look's seeds (n - 1 degrees of freedom), against the
look's boundary: the Lan-DeMets z boundary carried to t by the same nominal p-value (sequential.look_boundaries,
sequential.look_test). A test rejects at the first look where |t| reaches its boundary; with a declared futility
bound it stops without rejecting at an earlier look where |t| falls below it (non-binding: the rejection bounds do
not count on it). The study stops at the look where every test has stopped, or at the last look. Beside each, the
exact sign-flip p of the same per-seed contrasts (sequential.sign_flip_p), reported and never a substitute for the
declared test, and the repeated confidence interval, estimate +- t_k x SE (Jennison & Turnbull 2000, ch. 9: it
covers the contrast at every look at once with probability about 1 - level, as the boundaries carried to t hold the
level).

A diverged run is never dropped: its val loss counts as the test's declared `diverged_val_loss` (power.contrast_values).

A pilot stage ([pilot] seeds): after tuning, every arm runs the pilot's seeds first (`at_look(study, PILOT)`); they
enter no test. Their per-seed contrasts give [power]'s spread, and with [sequential] n_looks the looks are set from
it before any held-out seed runs (`planned_looks`: K equally spaced looks up to the fewest seeds at which the
simulated procedure reaches the power asked at the effect, capped at the held-out seeds listed:
power.looks_for_power). A family ([family] order) is tested in a fixed sequence (gatekeeping): the first test is the
gate, run look by look as above; at the look where it rejects, the next test is tested against its own boundary at
that look (each at the full level, with its own spending: Glimm, Maurer & Bretz 2010, "Hierarchical testing of
multiple endpoints in group-sequential trials", Statistics in Medicine 29), and so on until one is not rejected; the
tests after it are not tested. The study stops at the look where the gate is decided. This controls the family-wise
error at the level. A family with `rule = "holm"` is a group-sequential Holm procedure instead
(sequential.holm_levels; Maurer & Bretz 2013): every open test is tested at every look against the boundaries of its
current level, level / (m - r) with r of the m tests rejected so far, so a rejection passes its level to the others
at that look (tested again there) and at every later look; the study stops once every test is rejected, or at the
last look.
"""

import json
import math
import os
from dataclasses import dataclass, replace

import numpy as np
from scipy import stats as sps

from nonlinear_queries.analysis import power, sequential
from nonlinear_queries.errors import PilotError, RunsError, StudyError
from nonlinear_queries.experiments.protocol import advance, arms_at, point_dir
from nonlinear_queries.record.runs import RunDir, find_run_dirs, finished, history, read_json, step_seconds

SPENDING_NAMES = {"obrien_fleming": "O'Brien-Fleming-type", "pocock": "Pocock-type"}
PILOT = -1  # LookState.current while the pilot stage's runs do not all exist


def holm_family(study):
    """Whether the study's family is a group-sequential Holm procedure ([family] rule = "holm")."""
    return bool(study.family) and study.family_rule == "holm"


def initial_level(study, test):
    """The level `test` is first tested at: the family's level over its m tests under Holm, else its own."""
    return sequential.holm_levels(test.level, len(study.tests))[0] if holm_family(study) else test.level


def primary(study):
    """The test whose power sets n_looks' looks: the family's first, else the first declared."""
    return next(t for t in study.tests if t.name == study.family[0]) if study.family else study.tests[0]


def spread(study, test):
    """(sd of `test`'s per-seed contrast, how it was had) from its [power] target: given; from the pilot's named
    runs; from the pilot stage's runs once they all exist; else the `sd` assumed until then. (None, why) where
    there is none yet."""
    target = study.power.targets.get(test.name) if study.power else None
    if target is None and not study.pilot_seeds:
        return None, "no [power] target"
    if target is not None and target.pilot:
        seeds, d, diverged = pilot_contrast(study, test, target)
        return float(np.std(d, ddof=1)), (f"from the pilot's {len(seeds)} paired seeds ({_seed_ranges(seeds)}; "
                                          f"{diverged} diverged run(s) among them)")
    if study.pilot_seeds:
        losses = _losses(study, test, study.pilot_seeds)
        if losses is not None:
            seeds, d = power.contrast_values(losses, test.baseline, test.contrast, test.diverged_val_loss)
            return float(np.std(d, ddof=1)), f"from the pilot stage's {len(seeds)} seeds ({_seed_ranges(seeds)})"
        if target is not None and target.sd:
            return target.sd, "assumed until the pilot stage's runs all exist"
        return None, "set by the pilot stage's runs, not all done"
    return target.sd, "given"


def planned_looks(study):
    """(the looks, how they were set): [sequential] looks as declared; with n_looks, from the first test's power
    (power.looks_for_power at its spread: the pilot stage's once its runs exist); (None, why) where no spread is had."""
    plan = study.sequential
    if plan.looks:
        return list(plan.looks), "declared"
    test = primary(study)
    sd, how = spread(study, test)
    if sd is None:
        return None, how
    target = study.power.targets[test.name]
    looks, reached = power.looks_for_power(target.effect, sd, test.level, plan.spending, tuple(plan.futility),
                                           plan.n_looks, study.power.power, len(plan.held_out))
    return list(looks), (f"set by [power]: {test.name}'s simulated power {reached:.3f} at {target.effect:g} points, "
                         f"sd {sd:.3f} {how}")


def boundaries(study, test, level=None):
    """(z boundaries, t boundaries, t futility bounds or []) of `test` at the study's looks: Lan-DeMets at the
    fractions looks[k] / looks[-1] at `level` (default the test's own), carried to t on looks[k] - 1 degrees of
    freedom (sequential.look_boundaries)."""
    return sequential.look_boundaries(planned_looks(study)[0], test.level if level is None else level,
                                      study.sequential.spending, study.sequential.futility)


def _horizon(study, test):
    return next(h for h in study.horizons if h.max_iters == test.horizon)


def _cut(study, n):
    """The study with every horizon's held-out seeds the pilot's then the first n (and an arm's own cut to n)."""
    seeds = [*study.pilot_seeds, *study.sequential.held_out[:n]]
    return replace(study, horizons=[replace(h, seeds=seeds) for h in study.horizons],
                   arms=[replace(a, seeds=a.seeds[:n]) if a.seeds is not None else a for a in study.arms])


def at_look(study, k):
    """The study with every horizon's (and arm's own) held-out seeds cut to the first looks[k], after the pilot's
    seeds where it has a pilot stage: what study.py plans and runs while look k is current; k = PILOT: the pilot's
    seeds alone."""
    return _cut(study, 0 if k == PILOT else planned_looks(study)[0][k])


def _losses(study, test, seeds):
    """{arm: {seed: val loss}} of the test's arms on `seeds`, or None while one run is missing or unfinished (its
    status read, not its loss)."""
    horizon = _horizon(study, test)
    cut = replace(study, horizons=[replace(h, seeds=list(seeds)) for h in study.horizons])
    arms = [a for a in arms_at(cut, _horizon(cut, test)) if a.name in {test.baseline, *test.contrast}]
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
        losses[arm.name] = {s: stage.held_out[s] for s in seeds}
    return losses


def _look_losses(study, test, k, looks):
    """_losses of look k's held-out seeds; None where the held-out seeds are fewer than the look asks."""
    seeds = study.sequential.held_out[:looks[k]]
    return _losses(study, test, seeds) if len(seeds) == looks[k] else None


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
    level: float | None = None  # the level it was tested at, under a Holm family (None: the test's own)


def evaluate_look(study, test, k, losses, level=None):
    """The Evaluation of `test` at look k from `losses` ({arm: {seed: val loss}}, every run of the look finished),
    against the boundaries at `level` (a Holm family's current level; default the test's own): sequential.look_test
    of its per-seed contrasts. A test after the gate of a fixed-sequence family ([family] order) is tested once, at
    the look where the tests before it rejected: 'reject' or 'not rejected'."""
    seeds, d = power.contrast_values(losses, test.baseline, test.contrast, test.diverged_val_loss)
    z, tb, ft = boundaries(study, test, level)
    last = k == len(z) - 1
    gated = bool(study.family) and test.name != study.family[0] and not holm_family(study)
    futility = ft[k] if ft and not last and not gated else None
    r = sequential.look_test(d, tb[k], futility, last or gated, study.sequential.sign_flip_draws)
    diverged = sum(math.isinf(losses[a][s]) for a in losses for s in seeds)
    return Evaluation(test.name, k + 1, seeds, r.mean, r.se, r.t, r.df, r.p, z[k], tb[k], futility, r.decision,
                      r.interval, r.sign_flip_p, r.sign_flip, diverged, level)


@dataclass
class LookState:
    """Where a sequential study stands: `evaluated` (Evaluations of the looks whose runs all exist, in order),
    `current` (the 0-based look to run now, PILOT while the pilot stage's runs do not all exist, None once the
    study has stopped) and `stopped_at` (the 0-based look at which it stopped, None while it goes on)."""

    evaluated: list
    current: int | None
    stopped_at: int | None


def state(study):
    """The LookState of a sequential study: the pilot stage first, where there is one; then each look in turn is
    evaluated once its runs all exist. Without a family a test stops at its first rejection or futility, and the
    study at the look where every test has stopped or at the last look; with a family, at the look where its gate
    (the first test) is decided, the later tests tested in order at that look while each before rejected."""
    if study.pilot_seeds and any(_losses(study, t, study.pilot_seeds) is None for t in study.tests):
        return LookState([], PILOT, None)
    looks = planned_looks(study)[0]
    order = [next(t for t in study.tests if t.name == n) for n in study.family] or list(study.tests)
    if holm_family(study):
        return _holm_state(study, order, looks)
    evaluated, open_tests = [], order[:1] if study.family else order
    for k in range(len(looks)):
        results = []
        for test in open_tests:
            losses = _look_losses(study, test, k, looks)
            if losses is None:
                return LookState(evaluated, k, None)
            results.append(evaluate_look(study, test, k, losses))
        if study.family and results[0].decision == "reject":
            for test in order[1:]:  # gatekeeping: each at its own boundary, while the ones before it rejected
                results.append(evaluate_look(study, test, k, _look_losses(study, test, k, looks)))
                if results[-1].decision != "reject":
                    break
        evaluated += results
        open_tests = [t for t, e in zip(open_tests, results) if e.decision == "continue"]
        if not open_tests or k == len(looks) - 1:
            return LookState(evaluated, None, k)
    raise AssertionError("unreachable: the last look stops the study")


def _holm_state(study, order, looks):
    """state() of a Holm family: at each look every open test is evaluated at level / (m - r), r the tests rejected
    so far; each rejection re-evaluates the open ones at the raised level, at the same look. A rejected test's
    Evaluation is the one at the level it was rejected at."""
    levels = sequential.holm_levels(order[0].level, len(order))
    evaluated, rejected = [], []
    for k in range(len(looks)):
        open_tests = [t for t in order if t.name not in rejected]
        losses = {t.name: _look_losses(study, t, k, looks) for t in open_tests}
        if any(v is None for v in losses.values()):
            return LookState(evaluated, k, None)
        final = {}
        while True:
            level = levels[min(len(rejected), len(order) - 1)]
            results = {t.name: evaluate_look(study, t, k, losses[t.name], level) for t in open_tests
                       if t.name not in rejected}
            final.update(results)
            new = [name for name, e in results.items() if e.decision == "reject"]
            if not new:
                break
            rejected += new
        evaluated += [final[t.name] for t in open_tests]
        if len(rejected) == len(order) or k == len(looks) - 1:
            return LookState(evaluated, None, k)
    raise AssertionError("unreachable: the last look stops the study")


def withhold(study, stages):
    """The stages ({max_iters: {arm: Stage}}) with the held-out losses of seeds past the last evaluated look left
    out, for study.json: no loss of a look whose runs do not all exist is written."""
    if study.sequential is None:
        return stages
    s = state(study)
    shown = set() if s.current == PILOT else {*study.pilot_seeds, *(seed for e in s.evaluated for seed in e.seeds)}
    return {h: {a: replace(stage, held_out={seed: v for seed, v in stage.held_out.items() if seed in shown})
                for a, stage in arms.items()} for h, arms in stages.items()}


def record(study):
    """study.json's 'sequential' entry: the looks, spending and, per evaluated look and test, its statistic, df,
    boundary and decision; {} for a study without looks."""
    if study.sequential is None:
        return {}
    s = state(study)
    plan = study.sequential
    looks, how = planned_looks(study)
    return {"sequential": {
        "looks": looks, "looks_set": how, "pilot_seeds": study.pilot_seeds, "family_order": study.family,
        "spending": plan.spending, "futility_z": plan.futility,
        "boundaries": {t.name: {"z": boundaries(study, t)[0], "t": boundaries(study, t)[1], "level": t.level}
                       for t in study.tests} if looks else {},
        **({"family_rule": "holm", "boundaries_by_level": {
            f"{level:.6g}": {"z": boundaries(study, study.tests[0], level)[0],
                             "t": boundaries(study, study.tests[0], level)[1]}
            for level in sequential.holm_levels(study.tests[0].level, len(study.tests))}}
           if holm_family(study) and looks else {}),
        "current_look": None if s.current is None else "pilot" if s.current == PILOT else s.current + 1,
        "stopped_at_look": None if s.stopped_at is None else s.stopped_at + 1,
        "evaluated": [{"test": e.test, "look": e.look, "seeds": e.seeds, "estimate": e.mean, "se": e.se, "t": e.t,
                       "df": e.df, "p": e.p, "z_boundary": e.z_bound, "t_boundary": e.t_bound,
                       "futility_t": e.futility_t, "decision": e.decision, "repeated_ci": list(e.interval),
                       "sign_flip_p": e.sign_flip_p, "sign_flip": e.sign_flip, "diverged_runs": e.diverged,
                       **({"level": e.level} if e.level is not None else {})}
                      for e in s.evaluated]}}


def _contrast_text(test):
    terms = " ".join(f"{'+' if c > 0 else '-'} {abs(c):g} g({a})" for a, c in test.contrast.items())
    return f"{test.name} = {terms.removeprefix('+ ')}, each g against {test.baseline}"


def _runs_done(study, test, seeds):
    """How many of the test's arms' runs at `seeds` have finished (their status read, not their losses)."""
    horizon = _horizon(study, test)
    return sum(finished(RunDir(point_dir(study, a, horizon, p)).status(test.horizon))
               for a in arms_at(study, horizon) if a.name in {test.baseline, *test.contrast}
               for p in _points(study, a, test, seeds))


def describe_looks(study):
    """The lines --dry_run prints for a sequential study: the pilot stage where there is one, the family's order,
    per test its boundaries, per look its seeds, whether its runs all exist (counted by status: no loss is read
    until they do) and, for evaluated looks, the decision."""
    s = state(study)
    plan = study.sequential
    looks, how = planned_looks(study)
    lines = [f"\nlooks ({SPENDING_NAMES[plan.spending]} Lan-DeMets spending, two-sided; each look's z boundary carried "
             f"to its t by the same nominal p; the first n of the held-out seeds in the study file's order):"]
    if study.pilot_seeds:
        n_arms = len(study.arms)
        done = max(_runs_done(study, t, study.pilot_seeds) for t in study.tests)
        lines.append(f"  pilot stage: seeds {', '.join(map(str, study.pilot_seeds))} of every arm after its tuning, "
                     f"in no test; its spread sets [power] ({n_arms * len(study.pilot_seeds)} runs; {done} of the "
                     f"largest test's exist)" + ("  <- current" if s.current == PILOT else ""))
    if plan.n_looks:
        lines.append(f"  {plan.n_looks} looks, " + (f"at {', '.join(map(str, looks))} seeds an arm, {how}" if looks
                                                    else f"not set yet: {how}"))
    if holm_family(study):
        levels = sequential.holm_levels(primary(study).level, len(study.tests))
        lines.append(f"  one family, group-sequential Holm at level {primary(study).level:g} over "
                     f"{', '.join(study.family)}: every open test at every look at level / (m - r), r of the "
                     f"{len(study.tests)} rejected so far ({', '.join(f'{x:.4g}' for x in levels)}); a rejection "
                     f"passes its level to the others at that look and the later ones")
    elif study.family:
        lines.append(f"  one family, a fixed sequence (gatekeeping) at level {primary(study).level:g}: "
                     f"{' -> '.join(study.family)}; the gate {study.family[0]} runs look by look, each later test is "
                     f"tested at the look where the gate rejects, while every test before it rejected")
    if not looks:
        return lines
    for test in ([next(t for t in study.tests if t.name == n) for n in study.family] or study.tests):
        z, tb, ft = boundaries(study, test, initial_level(study, test))
        lines.append(f"  {_contrast_text(test)}, level {initial_level(study, test):.4g}" + (
            f" (raised to {', '.join(f'{x:.4g}' for x in sequential.holm_levels(test.level, len(study.tests))[1:])}"
            f" as others are rejected)" if holm_family(study) else "") + ":")
        for k, n in enumerate(looks):
            seeds = plan.held_out[:n]
            done = _runs_done(study, test, seeds)
            total = n * (1 + len(test.contrast))
            result = next((e for e in s.evaluated if e.test == test.name and e.look == k + 1), None)
            where = ("  <- current" if s.current == k else "")
            futility = f", stop for futility if |t| < {ft[k]:.2f}" if ft and k < len(looks) - 1 and \
                plan.futility[k] > 0 and not (study.family and test.name != study.family[0]) else ""
            outcome = (f"; t = {result.t:+.2f}, {result.decision}" if result else
                       f"; {done}/{total} runs exist" + ("" if s.current != k else
                                                         " (no loss of this look is read until all exist)")
                       if s.stopped_at is None or k < s.stopped_at else "; not run (stopped earlier)")
            raised = "".join(f"; at {x:.4g}: |t| >= {boundaries(study, test, x)[1][k]:.2f}" for x in
                             sequential.holm_levels(test.level, len(study.tests))[1:]) if holm_family(study) else ""
            lines.append(f"    look {k + 1}: {n} seeds an arm ({_seed_ranges(seeds)}), reject if |z| >= {z[k]:.3f}: "
                         f"|t| >= {tb[k]:.2f} on {n - 1} df (nominal p <= {2 * sps.norm.sf(z[k]):.2g}){raised}"
                         f"{futility}{outcome}{where}")
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
            except PilotError as e:
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
    expected seeds; for a test without a spread, each look's MDE in units of its per-seed sd; and the cost of each
    n from `cost(n)` -> (text of the floor, text with widening and one rerun per arm), the pilot's seeds added."""
    plan = study.power
    looks = planned_looks(study)[0] if study.sequential else None
    pilot = len(study.pilot_seeds)
    with_pilot = f" (with the pilot stage's {pilot} seeds)" if pilot else ""
    lines = [f"\npower (two-sided, {plan.power:.0%} power; the paired t-test on each test's per-seed contrast; cost "
             f"of n seeds an arm{with_pilot}, tuning included):"]
    for test in study.tests:
        target = plan.targets.get(test.name)
        sd, basis = spread(study, test)
        if sd is None:
            if looks:
                z = boundaries(study, test, initial_level(study, test))[0]
                lines.append(f"  {test.name}: no spread yet ({basis}); each look alone detects, in units of its "
                             f"per-seed sd: " + ", ".join(
                                 f"look {k + 1} ({n} seeds) {m:.2f} sd" for k, (n, m) in
                                 enumerate(zip(looks, power.look_detectable_effects(1.0, looks, z, plan.power)))))
            continue
        if target is None:  # a spread from the pilot stage, and no effect declared: the MDE at each look alone
            if looks:
                z = boundaries(study, test, initial_level(study, test))[0]
                lines.append(f"  {test.name}: sd {sd:.3f} points {basis}; each look alone detects (MDE at its nominal "
                             f"level): " + ", ".join(f"look {k + 1} ({n} seeds) {m:.2f} points" for k, (n, m) in
                                                     enumerate(zip(looks, power.look_detectable_effects(
                                                         sd, looks, z, plan.power)))))
            continue
        planned = looks[-1] if looks else len(_horizon(study, test).seeds)
        needed = power.seeds_for_power(target.effect, sd, initial_level(study, test), plan.power)
        mde = power.detectable_effect(sd, planned, initial_level(study, test), plan.power)
        lines += [f"  {test.name}: sd {sd:.3f} points {basis}; effect to detect {target.effect:g} points at level "
                  f"{initial_level(study, test):.4g}",
                  f"    a fixed-n test needs {needed} seeds an arm; cost {cost(needed + pilot)[0]}, with widening and "
                  f"one rerun per arm {cost(needed + pilot)[1]}",
                  f"    at the planned {planned} seeds an arm its MDE is {mde:.2f} points; cost "
                  f"{cost(planned + pilot)[0]}, with widening and one rerun per arm {cost(planned + pilot)[1]}"]
        if looks:
            z, tb, ft = boundaries(study, test, initial_level(study, test))
            gated = bool(study.family) and test.name != study.family[0] and not holm_family(study)
            mdes = power.look_detectable_effects(sd, looks, z, plan.power)
            lines.append("    each look alone detects (MDE at its nominal level): " + ", ".join(
                f"look {k + 1} ({n} seeds) {m:.2f} points" for k, (n, m) in enumerate(zip(looks, mdes))))
            lines.append(f"    were the look's spread sd {sd:.3f}, it rejects where |estimate| >= " + ", ".join(
                f"{b * sd / math.sqrt(n):.2f}" for b, n in zip(tb, looks)) + " points" + ("".join(
                    f"; look {k + 1} stops for futility where |estimate| < {f * sd / math.sqrt(looks[k]):.2f}"
                    for k, (f, z_f) in enumerate(zip(ft, study.sequential.futility)) if z_f > 0 and not gated)))
            if not gated:  # a later test of a family is tested once, where the gate rejects: no procedure of its own
                for effect in (0.0, target.effect):
                    oc = sequential.operating_characteristics(looks, tb, effect, sd, futility_t=ft or None)
                    alone = f"alone at level {initial_level(study, test):.4g}, " if holm_family(study) else ""
                    lines.append(f"    simulated ({alone}{oc.studies:,} studies, seed 0) at E = {effect:g}: rejects "
                                 f"{oc.rejected:.3f}, stops at the looks {', '.join(f'{x:.3f}' for x in oc.stopped_at)}"
                                 f", expected seeds an arm {oc.expected_seeds:.1f}")
            lines.append("    cost by look: " + "; ".join(f"look {k + 1} {cost(n + pilot)[0]}"
                                                          for k, n in enumerate(looks)))
    if holm_family(study) and looks:
        lines += describe_family(study)
    return lines


def describe_family(study):
    """The dry run's lines for a Holm family: its simulated power per test at the [power] effects and its
    family-wise error with every effect 0 (sequential.simulate_family), at the tests' spreads, the tests' contrasts
    correlated through their shared arms (sequential.contrast_covariance)."""
    looks = planned_looks(study)[0]
    tests = [next(t for t in study.tests if t.name == n) for n in study.family]
    sds = [spread(study, t)[0] for t in tests]
    if any(sd is None for sd in sds) or any(t.name not in study.power.targets for t in tests):
        return ["  the family: every test needs a [power] effect and spread for its simulation"]
    effects = [study.power.targets[t.name].effect for t in tests]
    cov = sequential.contrast_covariance([(t.baseline, t.contrast) for t in tests], sds)
    plan = (tests[0].level, study.sequential.spending, study.family_rule, study.sequential.futility)
    at = sequential.simulate_family(looks, effects, cov, *plan)
    null = sequential.simulate_family(looks, [0.0] * len(tests), cov, *plan)
    return [f"  the family, simulated ({at.studies:,} studies, seed 0; the tests' contrasts correlated through their "
            f"shared arms): at the effects {', '.join(f'{t.name} {e:g}' for t, e in zip(tests, effects))} it rejects "
            + ", ".join(f"{t.name} {p:.3f}" for t, p in zip(tests, at.rejected))
            + f", expected seeds an arm {at.expected_seeds:.1f}; with every effect 0 it rejects any test in "
            f"{null.false_rejection:.3f} of them"]


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
             "the pilot stage's runs do not all exist yet" if s.current == PILOT else
             f"look {s.current + 1}'s runs do not all exist yet")
    if holm_family(study):
        where += (f"; one family, group-sequential Holm over {', '.join(study.family)}: each open test at level "
                  f"{primary(study).level:g} / (m - r) at every look, r the tests rejected so far (the boundary "
                  f"column is the one at the level it was tested at)")
    elif study.family:
        where += (f"; one family in a fixed sequence, {' -> '.join(study.family)}: a test after the first is tested "
                  f"at the look where the first rejects, while every test before it rejected")
    contrasts = "; ".join(_contrast_text(t) for t in study.tests)
    looks = planned_looks(study)[0]
    by_look = zip(machines_text(study, s.evaluated), per_seed_text(study, s.evaluated))  # a line each a look
    machines = "".join(f"\n{line}\n" for pair in by_look for line in pair)
    return (f"## The declared tests, look by look\n\n{contrasts}. Looks at {', '.join(map(str, looks))} seeds an "
            f"arm, {SPENDING_NAMES[plan.spending]} Lan-DeMets spending, two-sided; {where}. The interval is the "
            f"repeated confidence interval (estimate ± boundary × SE); the sign-flip p is reported beside the "
            f"declared t-test, not instead of it.\n\n" + "\n".join(rows) + "\n" + machines
            + "".join(f"\n{text}" for text in exploratory_text(study, s.evaluated)))


def _machine(numerics):
    """A run's machine in words, from its header's `numerics` (runtime.numerics): the GPU, or ATen's CPU capability
    and the CPU model, with torch's thread count; 'not recorded' for a run from before headers held it."""
    if not numerics:
        return "not recorded"
    return (numerics.get("gpu") or f"{numerics.get('cpu_capability')}, {numerics.get('cpu_model')}") + \
        f", torch_threads {numerics.get('torch_threads')}"


def _test_runs(study, e):
    """[(arm name, seed, run path)] of the runs Evaluation `e` rests on: each of its test's arms at its seeds."""
    test = next(t for t in study.tests if t.name == e.test)
    horizon = _horizon(study, test)
    return [(arm.name, point["seed"], point_dir(study, arm, horizon, point)) for arm in arms_at(study, horizon)
            if arm.name in {test.baseline, *test.contrast} for point in _points(study, arm, test, e.seeds)]


def machines_text(study, evaluated):
    """One line per evaluated look: the machines its runs trained on (each run's header `numerics`, counted), and
    for each test at that look the seeds whose runs of the test's arms share every numerics fact. A pair split
    across machines still pairs the init and data order; its contrast also holds the machines' floating-point
    differences, which the per-seed spread carries. Reads the runs' config.json, never their losses."""
    lines = []
    for look in sorted({e.look for e in evaluated}):
        runs, shared, split = {}, [], False
        for e in (e for e in evaluated if e.look == look):
            per_seed = {}
            for _, seed, path in _test_runs(study, e):
                runs[path] = read_json(os.path.join(path, "config.json")).get("numerics") or {}
                per_seed.setdefault(seed, set()).add(json.dumps(runs[path], sort_keys=True))
            shared.append(f"{e.test} {sum(len(v) == 1 for v in per_seed.values())} of {len(per_seed)}")
            split |= any(len(v) > 1 for v in per_seed.values())
        kinds = {}
        for numerics in runs.values():
            kinds[_machine(numerics)] = kinds.get(_machine(numerics), 0) + 1
        lines.append(f"Machines at look {look} (each run's header, `numerics`): its {len(runs)} runs trained on "
                     + "; ".join(f"{k} ({n})" for k, n in sorted(kinds.items())) + ". Seeds whose runs of a test's "
                     f"arms share every numerics fact: {', '.join(shared)}" + (
                         "; a seed split across machines is still paired by init and data order, and its contrast "
                         "also carries the machines' floating-point differences." if split else "."))
    return lines


def per_seed_text(study, evaluated):
    """One paragraph per evaluated look: for each test, its per-seed contrasts (points, power.contrast_values: a
    diverged run at the test's diverged_val_loss) as the count of seeds above 0, the lowest and highest with their
    seeds and the sample SD (ddof 1; SE x sqrt(n)), and each of its arms' mean val loss at max_iters as the test
    counts it; then the run-hours the look's runs trained for, their logged step laps summed (runs.step_seconds:
    evaluation, diagnostics and startup left out), each run counted once. Reads losses: only of evaluated looks,
    whose runs all exist."""
    lines = []
    for look in sorted({e.look for e in evaluated}):
        at, parts, paths = [e for e in evaluated if e.look == look], [], set()
        for e in at:
            test = next(t for t in study.tests if t.name == e.test)
            losses = _losses(study, test, e.seeds)  # the values the test was evaluated on
            paths.update(path for _, _, path in _test_runs(study, e))
            seeds, d = power.contrast_values(losses, test.baseline, test.contrast, test.diverged_val_loss)
            low, high = int(np.argmin(d)), int(np.argmax(d))
            value = lambda loss: test.diverged_val_loss if math.isinf(loss) else loss  # noqa: E731
            means = ", ".join(f"{arm} {np.mean([value(v) for v in by_seed.values()]):.4f}"
                              for arm, by_seed in losses.items())
            parts.append(f"{e.test} above 0 on {int((d > 0).sum())} of {len(d)} seeds, from {d[low]:+.2f} (seed "
                         f"{seeds[low]}) to {d[high]:+.2f} (seed {seeds[high]}), SD {d.std(ddof=1):.2f}; mean val "
                         f"loss at step {test.horizon}: {means}")
        hours = sum(step_seconds(RunDir(path).records(warn=False)) for path in paths) / 3600
        lines.append(f"Per seed at look {look} (points of the reference arm's val loss): " + "; ".join(parts)
                     + f". The look's {len(paths)} runs trained for {hours:.2f} run-hours, their logged step laps "
                     f"summed (evaluation, diagnostics and startup left out).")
    return lines


def _val_losses(path):
    """({eval step: val loss} before the run at `path` diverged, the step it diverged at or None): history of its
    records, read with the restart rule as RunDir.status reads it."""
    evals, diverged, _, _ = history(RunDir(path).records(warn=False))
    return {step: val for step, (_, val) in evals.items() if diverged is None or step < diverged}, diverged


def contrasts_by_step(study, test, seeds):
    """{eval step: per-seed contrasts (points, shape (n,), seeds in sorted order)} of `test` on `seeds`, at every
    evaluation step logged by all of its arms' runs there that had not diverged by then; a diverged run counts at the
    test's diverged_val_loss from its diverged step on, as at max_iters (power.contrast_values at each step, so the
    step max_iters gives the test's own values). Reads losses: only for a look whose runs all exist (`state`
    evaluated it)."""
    horizon = _horizon(study, test)
    runs = {}
    for arm in arms_at(study, horizon):
        if arm.name in {test.baseline, *test.contrast}:
            for point in _points(study, arm, test, seeds):
                runs.setdefault(arm.name, {})[point["seed"]] = _val_losses(point_dir(study, arm, horizon, point))
    logged = [set(evals) for by_seed in runs.values() for evals, diverged in by_seed.values() if diverged is None]
    steps = sorted(set.intersection(*logged) if logged else {test.horizon})
    at = lambda run, step: run[0].get(step) if run[1] is None or step < run[1] else math.inf  # noqa: E731
    table = {step: {a: {s: at(run, step) for s, run in by_seed.items()} for a, by_seed in runs.items()}
             for step in steps}
    return {step: power.contrast_values(losses, test.baseline, test.contrast, test.diverged_val_loss)[1]
            for step, losses in table.items()
            if all(v is not None for by_seed in losses.values() for v in by_seed.values())}


def interval95(values):
    """(mean, low, high) of `values` (shape (n,), n >= 2): the mean with its two-sided 95% t-interval on n - 1
    degrees of freedom, mean +- t(0.975, n - 1) x sd / sqrt(n) (sd with ddof 1); not adjusted for looks or tests."""
    d = np.asarray(values, dtype=float)
    half = float(sps.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return float(d.mean()), float(d.mean()) - half, float(d.mean()) + half


def interactions(study):
    """The (first, second) pairs of declared tests, in the family's order (else the file's), whose arms are
    disjoint: the difference of their per-seed contrasts (second - first) compares two contrasts on four arms, an
    interaction where the arms form a 2 x 2 (width256_gate: E_gated - E_tuned, the query x the gate)."""
    order = [next(t for t in study.tests if t.name == n) for n in study.family] or list(study.tests)
    arms = {t.name: {t.baseline, *t.contrast} for t in order}
    return [(a, b) for i, a in enumerate(order) for b in order[i + 1:] if not arms[a.name] & arms[b.name]]


def exploratory_text(study, evaluated):
    """TABLES.md's exploratory lines at each evaluated look, never tests: each evaluated test's contrast at every
    evaluation step with its 95% interval (contrasts_by_step, interval95), and the difference of every two tests on
    disjoint arms (`interactions`) at max_iters with its 95% interval. Nothing here enters a decision."""
    texts = []
    for look in sorted({e.look for e in evaluated}):
        at = [e for e in evaluated if e.look == look]
        tests = [next(t for t in study.tests if t.name == e.test) for e in at]
        seeds = at[0].seeds
        steps = {t.name: contrasts_by_step(study, t, seeds) for t in tests}
        cell = lambda d: "{:+.2f} [{:+.2f}, {:+.2f}]".format(*interval95(d))  # noqa: E731
        rows = ["| step | " + " | ".join(t.name for t in tests) + " |", "|---:|" + "---:|" * len(tests)]
        rows += [f"| {step} | " + " | ".join(cell(steps[t.name][step]) for t in tests) + " |"
                 for step in sorted(set.intersection(*(set(v) for v in steps.values())))]
        text = (f"### Exploratory at look {look}, not tests\n\nEach test's contrast (points) at every evaluation step "
                f"on the look's {_seed_ranges(seeds)}: the mean with its 95% t-interval, not adjusted for the steps, "
                f"the tests or the looks; the last row is the tests' estimates.\n\n" + "\n".join(rows) + "\n")
        for first, second in ((a, b) for a, b in interactions(study) if a in tests and b in tests):
            last = max(set(steps[first.name]) & set(steps[second.name]))
            mean, low, high = interval95(steps[second.name][last] - steps[first.name][last])
            text += (f"\n{second.name} - {first.name} (two tests on disjoint arms: an interaction where the four "
                     f"form a 2 × 2), per seed at step {last}: {mean:+.2f} points, 95% t-interval "
                     f"[{low:+.2f}, {high:+.2f}] on {len(seeds)} seeds, not a test.\n")
        texts.append(text)
    return texts
