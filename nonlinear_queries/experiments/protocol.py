"""
The held-out protocol of a study (study.py): its file (a TOML file; see study.py's docstring and
studies/*.toml) read into a Study, and for each arm at each horizon how far its finished runs take the
protocol (`advance`): the tuning grid, widened at an edge, the chosen value, the held-out seeds, and the
points still to run. Runs are named as sweep.py names them (sweeps.point_name) and read with runs.py.
"""

import json
import math
import os
import statistics
import tomllib
from dataclasses import dataclass, field, fields

from nonlinear_queries.config.configurator import did_you_mean, parse_config, train_config_class
from nonlinear_queries.errors import StudyError
from nonlinear_queries.experiments.sweeps import Launcher, point_name
from nonlinear_queries.record.runs import RunDir, finished, format_value, history

# the repo root, above the package and its room
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# assumed when no run of the study has finished yet: an H100's dense bf16 peak at a typical MFU
DEFAULT_PEAK_FLOPS, DEFAULT_MFU = 989e12, 0.40


@dataclass
class StudyArm:
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
    written to `figure` where one is named; `note`, where given, is printed under the title in TABLES.md (what
    the table is not, e.g. a pooled test that is not the declared family). `kind`: 'compare' (Table 1 over the
    arms), 'width_transfer' (each arm's val loss against the rate, per width, SP and μP) or 'width_ladder' (the
    gap to the baseline per width and its slope against log width), compare.py's --width_transfer /
    --width_ladder."""

    horizon: int  # max_iters of the horizon it compares
    title: str
    arms: list
    args: list
    figure: str
    kind: str = "compare"
    note: str = ""


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
class DeclaredTest:
    """A declared paired contrast ([[test]]): per held-out seed, sum over `contrast` {arm: coefficient} of
    coefficient x g_arm, g_arm = 100 (L_baseline - L_arm) / L_baseline (points, positive = the arm's val loss lower),
    tested two-sided at `level` by the paired (one-sample) t-test, the sign-flip test beside it. A diverged run's val
    loss counts as `diverged_val_loss` (e.g. ln of the vocabulary size, a model that learned nothing), never
    dropped."""

    name: str
    baseline: str
    contrast: dict
    level: float
    diverged_val_loss: float
    horizon: int  # max_iters of the horizon whose held-out runs it reads


@dataclass
class Sequential:
    """Group-sequential looks ([sequential]): `looks` held-out seeds per arm at each look (the first looks[k] of
    the horizon's seeds, in the order written), or `n_looks` equally spaced looks up to the seeds that [power] asks
    of the first test of the family (looks.planned_looks); Lan-DeMets `spending` ('obrien_fleming' or 'pocock'), an
    optional non-binding `futility` bound on |z| per look but the last (carried to t as the rejection bounds are),
    and the sign-flip test's Monte Carlo draws where 2^n is too many."""

    looks: list  # [] = set by power (n_looks)
    spending: str
    futility: list
    sign_flip_draws: int
    n_looks: int = 0
    held_out: list = field(default_factory=list)  # the tests' horizon's held-out seeds, in order (a cut study's too)


@dataclass
class PowerTarget:
    """One declared test's power planning: the `effect` to detect (points) and its spread, `sd` given or from
    `pilot`: {arm: [run or arm directories]} of finished runs of the same contrast, paired by each run's seed; in a
    study with a pilot stage ([pilot] seeds), from the pilot stage's runs once they all exist (`sd`, if given, is
    the spread assumed until then)."""

    effect: float
    sd: float  # 0 = from the pilot
    pilot: dict


@dataclass
class PowerPlan:
    """[power]: the power wanted and, per declared test's name, its PowerTarget."""

    power: float
    targets: dict


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
    tests: list = field(default_factory=list)  # DeclaredTest: the declared paired contrasts ([[test]])
    sequential: "Sequential | None" = None  # the looks and their spending ([sequential])
    power: "PowerPlan | None" = None  # the power planning ([power])
    pilot_seeds: list = field(default_factory=list)  # [pilot] seeds: run by every arm before the looks, tested never
    family: list = field(default_factory=list)  # [family] order: the declared tests' order
    family_rule: str = "fixed_sequence"  # [family] rule: 'fixed_sequence' (gatekeeping) or 'holm' (looks.py)
    # what the study's decisions rest on, as the file declares it (`declaration`): kept whole when the held-out
    # seeds are cut to a look's (looks.at_look), so study.json records the declaration, not the look's cut
    declared: dict = field(default_factory=dict)

    @property
    def tuning_seed(self):
        """The first tuning seed: the one a point is checked with, and compare.py's --select_on."""
        return self.tuning_seeds[0]


# a study file's top-level keys and tables
TOP_KEYS = ("name", "results_dir", "runs_dir", "tuning", "held_out", "horizon", "arm", "launcher", "table", "cost",
            "test", "sequential", "pilot", "power", "family")


def _keys(cls):
    """The keys of a study file's table that parses into the dataclass `cls`: its fields' names."""
    return [f.name for f in fields(cls)]


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


def _no_more(table, where, keys):
    """Raise StudyError for what is left in `table` once its `keys` are taken: the unknown keys, each with the
    nearest known one (configurator.did_you_mean, as train.py's config errors)."""
    if table:
        unknown = sorted(table)
        hints = [f"{k}: {did_you_mean(k, list(keys))}" for k in unknown] if len(unknown) > 1 else \
            [did_you_mean(unknown[0], list(keys))]
        raise StudyError(f"{where}: unknown key(s) {', '.join(unknown)}; {'; '.join(hints)}")


def load_study(path):
    """Parse and check the study file at `path`: its tables taken in the order they are checked (_read_toml,
    _tuning, _held_out, _arms, _horizons, _launcher, _tables, _cost, _declared_tests), checked together, then every
    arm's config (_check_arm_configs). Returns a Study. Raises StudyError naming the file and key (a missing or
    unknown key, a wrong type, an unknown config key, a config file that does not exist)."""
    raw = _read_toml(path)
    name = _take(raw, "name", str, path, os.path.splitext(os.path.basename(path))[0])
    results_dir = _take(raw, "results_dir", str, path, os.path.join("results", name))
    runs_dir = _take(raw, "runs_dir", str, path, results_dir)
    key, grid, max_widen, tuning_seeds = _tuning(raw, path)
    seeds, vary = _held_out(raw, path, tuning_seeds)
    raw_horizons = _take(raw, "horizon", list, path)
    arms = _arms(raw, path, key, grid, tuning_seeds)
    names = [a.name for a in arms]
    horizons = _horizons(raw_horizons, path, names, tuning_seeds, seeds)
    launcher = _launcher(raw, path)
    tables = _tables(raw, path, results_dir, horizons, names)
    peak, mfu, per_step = _cost(raw, path)
    tests, sequential, pilot_seeds, power, order, rule = _declared_tests(raw, path, horizons)
    _no_more(raw, path, TOP_KEYS)
    _check_declared(path, tests, sequential, power, pilot_seeds, order, tuning_seeds, horizons)
    _check_rule(path, rule, tests, sequential)
    study = Study(path, name, runs_dir, results_dir, arms, key, grid, max_widen, tuning_seeds, vary, horizons,
                  launcher, tables, peak, mfu, per_step, tests, sequential, power, pilot_seeds, order, rule)
    study.declared = declaration(study, seeds)
    _check_arm_configs(study)
    return study


def _read_toml(path):
    """The study file at `path` as a dict (tomllib). Raises StudyError for a file that does not exist or is not
    valid TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise StudyError(f"{path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise StudyError(f"{path} is not valid TOML: {e}") from None


def _tuning(raw, path):
    """The [tuning] table taken from `raw`: (key, grid as text, max_widen, the tuning seeds). Raises StudyError."""
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
    _no_more(tuning, where, ("key", "grid", "max_widen", "seed", "seeds"))
    return key, grid, max_widen, tuning_seeds


def _held_out(raw, path, tuning_seeds):
    """The [held_out] table taken from `raw`: (its seeds, vary_data_order). Raises StudyError, also for a seed that
    is a tuning seed too."""
    held_out = _take(raw, "held_out", dict, path)
    where = f"{path} [held_out]"
    seeds = _take(held_out, "seeds", list, where)
    vary = _take(held_out, "vary_data_order", bool, where, True)
    _no_more(held_out, where, ("seeds", "vary_data_order"))
    if set(tuning_seeds) & set(seeds):
        raise StudyError(f"{path}: the tuning seed {sorted(set(tuning_seeds) & set(seeds))[0]} is also a held-out "
                         f"seed; a value chosen on a seed must not be reported on it")
    return seeds, vary


def _arms(raw, path, key, grid, tuning_seeds):
    """The [[arm]] tables taken from `raw` as StudyArms, each checked (one of value and value_from, no tuning seed
    among its seeds, a numeric grid, a config file that exists), then together (distinct names, each value_from
    naming an arm that is tuned or has a fixed value). Raises StudyError."""
    arms = []
    for i, a in enumerate(_take(raw, "arm", list, path)):
        where = f"{path} [[arm]] {i + 1}"
        arm = StudyArm(_take(a, "name", str, where), _take(a, "config", str, where),
                       _take(a, "overrides", dict, where, {}), [str(v) for v in _take(a, "grid", list, where, [])],
                       _take(a, "value", str, where, ""), _take(a, "value_from", str, where, ""),
                       _take(a, "runs", str, where, ""), _take(a, "seeds", list, where, None) if "seeds" in a else None)
        _no_more(a, where, _keys(StudyArm))
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
    for i, arm in enumerate(arms):
        source = next((a for a in arms if a.name == arm.value_from), None) if arm.value_from else None
        if arm.value_from and (source is None or source.value_from):
            raise StudyError(f"{path} [[arm]] {i + 1}: value_from = {arm.value_from!r} must name an arm that is "
                             f"tuned or has a fixed value")
    return arms


def _horizons(raw_horizons, path, names, tuning_seeds, seeds):
    """The [[horizon]] tables `raw_horizons` as Horizons (their arms `names` and held-out `seeds` by default), each
    checked against the tuning seeds, the arms and the tuned horizons before it. Raises StudyError."""
    horizons = []
    for i, h in enumerate(raw_horizons):
        where = f"{path} [[horizon]] {i + 1}"
        horizon = Horizon(_take(h, "max_iters", int, where), _take(h, "subdir", str, where, ""),
                          _take(h, "arms", list, where, names), _take(h, "tune", bool, where, True),
                          _take(h, "chosen_from", int, where, 0), _take(h, "seeds", list, where, seeds))
        _no_more(h, where, _keys(Horizon))
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
    return horizons


def _launcher(raw, path):
    """The [launcher] table taken from `raw` ({} when absent): sweep.py's options and no other. Raises
    StudyError."""
    launcher = _take(raw, "launcher", dict, path, {})
    options = [f.name for f in fields(Launcher)]
    # the sweeps take them as keyword arguments (sweeps.Sweep): sweep.py's options and no other
    _no_more({k: v for k, v in launcher.items() if k not in options}, f"{path} [launcher] (sweep.py's options)",
             options)
    return launcher


def _tables(raw, path, results_dir, horizons, names):
    """The [[table]] tables taken from `raw` as Tables (by default one a horizon, with its figure under
    `results_dir`), each of a known kind at one of the `horizons` that runs every arm it names. Raises
    StudyError."""
    tables = []
    default_tables = [{"horizon": h.max_iters, "arms": h.arms,
                       "figure": os.path.join(results_dir, f"figure_{h.max_iters}.png")} for h in horizons]
    for i, tb in enumerate(_take(raw, "table", list, path, default_tables)):
        where = f"{path} [[table]] {i + 1}"
        table = Table(_take(tb, "horizon", int, where, horizons[0].max_iters), _take(tb, "title", str, where, ""),
                      _take(tb, "arms", list, where, names), [str(x) for x in _take(tb, "args", list, where, [])],
                      _take(tb, "figure", str, where, ""), _take(tb, "kind", str, where, "compare"),
                      _take(tb, "note", str, where, ""))
        _no_more(tb, where, _keys(Table))
        if table.kind not in ("compare", "width_transfer", "width_ladder"):
            raise StudyError(f"{where}: kind must be 'compare', 'width_transfer' or 'width_ladder', got {table.kind!r}")
        horizon = next((h for h in horizons if h.max_iters == table.horizon), None)
        if horizon is None or set(table.arms) - set(horizon.arms):
            raise StudyError(f"{where}: its horizon {table.horizon} is not one of the study's, or does not run every "
                             f"arm it names")
        tables.append(table)
    return tables


def _cost(raw, path):
    """The [cost] table taken from `raw`: (peak_flops, mfu, seconds_per_step), the defaults where absent. Raises
    StudyError."""
    cost = _take(raw, "cost", dict, path, {})
    peak = _take(cost, "peak_flops", float, f"{path} [cost]", DEFAULT_PEAK_FLOPS)
    mfu = _take(cost, "mfu", float, f"{path} [cost]", DEFAULT_MFU)
    per_step = _take(cost, "seconds_per_step", float, f"{path} [cost]", 0.0)
    _no_more(cost, f"{path} [cost]", ("peak_flops", "mfu", "seconds_per_step"))
    return peak, mfu, per_step


def _declared_tests(raw, path, horizons):
    """The declared tests and their plans taken from `raw`: ([[test]] as DeclaredTests, [sequential] as a Sequential
    or None, the [pilot] seeds, [power] as a PowerPlan or None, the [family] order and rule), each table checked on
    its own (_check_declared checks them together). Raises StudyError."""
    tests = [_declared_test(t, f"{path} [[test]] {i + 1}", horizons) for i, t in
             enumerate(_take(raw, "test", list, path, []))]
    sequential = _sequential(raw.pop("sequential"), f"{path} [sequential]", tests, horizons) \
        if "sequential" in raw else None
    pilot = _take(raw, "pilot", dict, path, {})
    pilot_seeds = _take(pilot, "seeds", list, f"{path} [pilot]", []) if pilot else []
    _no_more(pilot, f"{path} [pilot]", ("seeds",))
    power = _power(raw.pop("power"), f"{path} [power]", tests, bool(pilot_seeds)) if "power" in raw else None
    family = _take(raw, "family", dict, path, {})
    order = _take(family, "order", list, f"{path} [family]") if family else []
    rule = _take(family, "rule", str, f"{path} [family]", "fixed_sequence") if family else "fixed_sequence"
    _no_more(family, f"{path} [family]", ("order", "rule"))
    return tests, sequential, pilot_seeds, power, order, rule


def _check_arm_configs(study):
    """Every arm's config at each of its horizons, with the study's settings, checked to be one train.py accepts,
    and an arm's reused runs to hold every run the protocol asks for. Raises StudyError."""
    for arm in study.arms:
        for horizon in (h for h in study.horizons if arm.name in h.arms):
            try:
                arm_config(study, arm, horizon, {study.key: arm.value or (arm.grid or study.grid)[0],
                                                 "seed": study.tuning_seeds[0]})
            except Exception as e:
                raise StudyError(f"{study.path}: arm {arm.name}: {e}") from None
            if arm.runs:  # reused runs are read, never run: every one the protocol asks for must be there
                missing = advance(study, arm, horizon).todo
                if missing or not os.path.isdir(arm.runs):
                    raise StudyError(f"{study.path}: arm {arm.name} reuses the runs in {arm.runs}, which lack "
                                     f"{len(missing) or 'all'} the protocol asks for (e.g. "
                                     f"{point_dir(study, arm, horizon, missing[0]) if missing else arm.runs}); "
                                     f"finish them in their own study first")


def declaration(study, held_out):
    """What the study's decisions (each arm's chosen value, each look's test) rest on, as its file declares it, with
    `held_out` its [held_out] seeds: the runs' directory, the tuning, the held-out seeds, the horizons, the arms
    (config, overrides, grid, value, reused runs, seeds), the declared tests, the looks and their spending and
    futility, the pilot, the power planning and the family's order and rule, as plain JSON values, keyed by the file's
    tables ([[arm]] by name, [[horizon]] by max_iters, [[test]] by name), a copy through JSON (nothing the study
    shares). Left out, as the decisions do not rest on them: the name, the results directory (where study.json is),
    [launcher], [cost] and [[table]]."""
    seq, plan = study.sequential, study.power
    return json.loads(json.dumps({
        "runs_dir": study.runs_dir,
        "tuning": {"key": study.key, "grid": study.grid, "seeds": study.tuning_seeds, "max_widen": study.max_widen},
        "held_out": {"seeds": held_out, "vary_data_order": study.vary_data_order},
        "horizon": {str(h.max_iters): {"subdir": h.subdir, "arms": h.arms, "tune": h.tune,
                                       "chosen_from": h.chosen_from, "seeds": h.seeds} for h in study.horizons},
        "arm": {a.name: {"config": a.config, "overrides": a.overrides, "grid": a.grid, "value": a.value,
                         "value_from": a.value_from, "runs": a.runs, "seeds": a.seeds} for a in study.arms},
        "test": {t.name: {"baseline": t.baseline, "contrast": t.contrast, "level": t.level,
                          "diverged_val_loss": t.diverged_val_loss, "horizon": t.horizon} for t in study.tests},
        "sequential": seq and {"looks": seq.looks, "n_looks": seq.n_looks, "spending": seq.spending,
                               "futility": seq.futility, "sign_flip_draws": seq.sign_flip_draws},
        "pilot": {"seeds": study.pilot_seeds},
        "power": plan and {"power": plan.power, **{name: {"effect": t.effect, "sd": t.sd, "pilot": t.pilot}
                                                   for name, t in plan.targets.items()}},
        "family": {"order": study.family, "rule": study.family_rule},
    }))


def _declared_test(raw, where, horizons):
    """A [[test]] table checked (module docstring of DeclaredTest). Raises StudyError."""
    if not isinstance(raw, dict):
        raise StudyError(f"{where}: must be a table")
    test = DeclaredTest(_take(raw, "name", str, where), _take(raw, "baseline", str, where),
                        _take(raw, "contrast", dict, where), _take(raw, "level", float, where, 0.05),
                        _take(raw, "diverged_val_loss", float, where), _take(raw, "horizon", int, where,
                                                                               horizons[0].max_iters))
    _no_more(raw, where, _keys(DeclaredTest))
    horizon = next((h for h in horizons if h.max_iters == test.horizon), None)
    arms = [test.baseline, *test.contrast]
    if horizon is None or set(arms) - set(horizon.arms):
        raise StudyError(f"{where}: its horizon {test.horizon} must be one of the study's and run every arm it names "
                         f"({', '.join(arms)})")
    if not test.contrast or test.baseline in test.contrast or not all(
            isinstance(c, (int, float)) and not isinstance(c, bool) and c != 0 for c in test.contrast.values()):
        raise StudyError(f"{where}: 'contrast' must map arms other than the baseline to nonzero numbers, got "
                         f"{test.contrast!r}")
    if not 0 < test.level < 1 or not test.diverged_val_loss > 0:
        raise StudyError(f"{where}: 'level' must lie in (0, 1) and 'diverged_val_loss' be positive")
    return test


def _sequential(raw, where, tests, horizons):
    """The [sequential] table checked against the declared tests and the held-out seeds. Raises StudyError."""
    if not isinstance(raw, dict):
        raise StudyError(f"{where}: must be a table")
    plan = Sequential(_take(raw, "looks", list, where, []), _take(raw, "spending", str, where, "obrien_fleming"),
                      _take(raw, "futility", list, where, []), _take(raw, "sign_flip_draws", int, where, 100_000),
                      _take(raw, "n_looks", int, where, 0))
    _no_more(raw, where, [k for k in _keys(Sequential) if k != "held_out"])
    if not tests:
        raise StudyError(f"{where}: looks need a declared test to evaluate: add a [[test]]")
    if len({t.horizon for t in tests}) > 1:
        raise StudyError(f"{where}: the declared tests of a study with looks must read one horizon")
    plan.held_out = list(next(h for h in horizons if h.max_iters == tests[0].horizon).seeds)
    seeds = len(plan.held_out)
    looks = plan.looks or [3 * (k + 1) for k in range(plan.n_looks)]  # n_looks: checked as its smallest schedule
    if bool(plan.looks) == (plan.n_looks > 0):
        raise StudyError(f"{where}: give the looks as 'looks' (seeds an arm at each) or as 'n_looks' (set by [power]), "
                         f"one of the two")
    if not looks or not all(isinstance(n, int) and not isinstance(n, bool) for n in looks) or looks[0] < 3 or any(
            b <= a for a, b in zip(looks, looks[1:])) or looks[-1] > seeds:
        raise StudyError(f"{where}: 'looks' must be increasing seed counts from at least 3 up to the {seeds} held-out "
                         f"seeds, got {looks!r}")
    if plan.spending not in ("obrien_fleming", "pocock"):
        raise StudyError(f"{where}: 'spending' must be 'obrien_fleming' or 'pocock', got {plan.spending!r}")
    if plan.futility and (len(plan.futility) != len(looks) - 1 or not all(
            isinstance(f, (int, float)) and not isinstance(f, bool) and f >= 0 for f in plan.futility)):
        raise StudyError(f"{where}: 'futility' must give one |z| bound (>= 0) for each look but the last, got "
                         f"{plan.futility!r}")
    if plan.sign_flip_draws < 1000:
        raise StudyError(f"{where}: 'sign_flip_draws' must be at least 1000")
    return plan


def _power(raw, where, tests, pilot_stage=False):
    """The [power] table: `power`, and one table per declared test's name with `effect` and `sd` or `pilot` (with a
    pilot stage, `sd` alone or nothing: the stage's runs give the spread). Raises StudyError."""
    if not isinstance(raw, dict):
        raise StudyError(f"{where}: must be a table")
    wanted = _take(raw, "power", float, where, 0.8)
    by_name = {t.name: t for t in tests}
    targets = {}
    for name in list(raw):
        here = f"{where} [power.{name}]"
        if name not in by_name:
            raise StudyError(f"{where}: {name!r} is no declared test's name ({', '.join(by_name) or 'none declared'})")
        t = _take(raw, name, dict, where)
        target = PowerTarget(_take(t, "effect", float, here), _take(t, "sd", float, here, 0.0),
                             _take(t, "pilot", dict, here, {}))
        _no_more(t, here, _keys(PowerTarget))
        if target.sd < 0 or (target.sd > 0 and target.pilot) or (
                not pilot_stage and (target.sd > 0) == bool(target.pilot)):
            raise StudyError(f"{here}: give the spread as 'sd' (> 0) or as 'pilot' runs, one of the two"
                             + ("" if pilot_stage else " (or declare a [pilot] stage)"))
        arms = {by_name[name].baseline, *by_name[name].contrast}
        if target.pilot and (set(target.pilot) != arms or not all(
                isinstance(v, list) and v and all(isinstance(d, str) for d in v) for v in target.pilot.values())):
            raise StudyError(f"{here}: 'pilot' must give a list of run or arm directories for each of the test's arms "
                             f"({', '.join(sorted(arms))})")
        if target.effect == 0:
            raise StudyError(f"{here}: 'effect' must not be 0")
        targets[name] = target
    if not 0 < wanted < 1:
        raise StudyError(f"{where}: 'power' must lie in (0, 1)")
    return PowerPlan(wanted, targets)


def _check_declared(path, tests, sequential, power, pilot_seeds, order, tuning_seeds, horizons):
    """The declared tests' parts checked against each other: the pilot's seeds, the family's order, the test whose
    power sets the looks. Raises StudyError."""
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in pilot_seeds) or (pilot_seeds and (
            set(pilot_seeds) & ({*tuning_seeds} | {s for h in horizons for s in h.seeds}) or not tests)):
        raise StudyError(f"{path} [pilot]: 'seeds' must be integers that are neither tuning nor held-out seeds, in a "
                         f"study that declares a [[test]]")
    names = [t.name for t in tests]
    if len(set(names)) != len(names):
        raise StudyError(f"{path}: two [[test]] tables share a name")
    if order and sorted(order) != sorted(names):
        raise StudyError(f"{path} [family]: 'order' must list every declared test once ({', '.join(names)})")
    if sequential and sequential.n_looks:
        first = order[0] if order else names[0]
        target = power.targets.get(first) if power else None
        if target is None or not (target.sd or target.pilot or pilot_seeds):
            raise StudyError(f"{path} [sequential]: 'n_looks' sets the looks from [power.{first}]'s effect and spread: "
                             f"declare it, with 'sd', 'pilot' runs or a [pilot] stage")


def _check_rule(path, rule, tests, sequential):
    """The [family] rule checked: 'fixed_sequence', or 'holm' over looks without a futility bound, every test at one
    level (the family's). Raises StudyError."""
    if rule not in ("fixed_sequence", "holm"):
        raise StudyError(f"{path} [family]: 'rule' must be 'fixed_sequence' or 'holm', got {rule!r}")
    if rule == "holm" and (sequential is None or sequential.futility or len({t.level for t in tests}) > 1):
        raise StudyError(f"{path} [family]: rule 'holm' needs [sequential] looks without 'futility' and every "
                         f"[[test]] at one level (the family's)")


def train_args(study, arm, horizon):
    """The train.py arguments every run of `arm` at `horizon` shares: its config file, its overrides, and the
    horizon (max_iters, with lr_decay_iters following it)."""
    overrides = {**arm.overrides, "max_iters": horizon.max_iters, "lr_decay_iters": horizon.max_iters}
    return [os.path.join(REPO, arm.config), *(f"--{k}={v}" for k, v in overrides.items())]


def arm_config(study, arm, horizon, point):
    """The TrainConfig of one run (raises ConfigError for a setting train.py would refuse)."""
    args = [*train_args(study, arm, horizon), *(f"--{k}={v}" for k, v in point.items())]
    return parse_config(train_config_class(), args)[0]


def arm_dir(study, arm, horizon):
    """The directory of the arm's runs at `horizon`: RUNS_DIR/<subdir>/<arm>, or the reused runs' directory."""
    return arm.runs or os.path.join(study.runs_dir, horizon.subdir, arm.name)


def held_out_point(study, value, seed):
    """The point (an ordered dict of axis values, as sweep.py names its directory) of a held-out run."""
    point = {study.key: value, "seed": seed}
    if study.vary_data_order:
        point["data_seed"] = seed
    return point


def wandb_args(study, arm, horizon, points):
    """The train.py arguments, after train_args', that make wandb show each arm as one line with its spread over
    seeds: the arm as the runs' wandb group (STUDY/ARM, the horizon's subdir between), the stage of `points` (the
    points to run, all of one stage) as their job type, tuning, pilot or held-out, and the arm's directory under
    the study's (SUBDIR/ARM) as the wandb_name that a sweep of the arm puts before each run's directory
    (wandb_name), and the arm's name as the runs' wandb_run_name, the label compare.py's tables give the arm (one
    label an arm, not its config file's name with the settings that set it apart); each unless the arm's overrides
    set it."""
    settings = {"wandb_group": "/".join(filter(None, (study.name, horizon.subdir, arm.name))),
                "wandb_name": "/".join(filter(None, (horizon.subdir, arm.name))), "wandb_run_name": arm.name}
    if points:
        seed = points[0]["seed"]
        settings["wandb_job_type"] = ("tuning" if seed in study.tuning_seeds else
                                      "pilot" if seed in study.pilot_seeds else "held-out")
    return [f"--{k}={v}" for k, v in settings.items() if k not in arm.overrides]


def wandb_name(study, arm, horizon, point):
    """The wandb name of `point`'s run of `arm` at `horizon`, as a sweep of the arm (wandb_args) names it: its
    directory under the study's, SUBDIR/ARM/POINT (the arm's own wandb_name in place of SUBDIR/ARM where its
    overrides set one), unique in the study."""
    prefix = arm.overrides.get("wandb_name", "/".join(filter(None, (horizon.subdir, arm.name))))
    return "/".join(filter(None, (str(prefix), point_name(point))))


def point_dir(study, arm, horizon, point):
    """The run directory of `point` ({key: raw value}, in order) of `arm` at `horizon`, named as sweep.py names it."""
    return os.path.join(arm_dir(study, arm, horizon), point_name(point))


def final_val_loss(path, max_iters):
    """A run's val loss at max_iters; inf for a run that diverged; None while it is missing or unfinished
    (runs.RunDir.status)."""
    run_dir = RunDir(path)
    status = run_dir.status(max_iters)
    if not finished(status):
        return None
    return math.inf if status != "done" else history(run_dir.records())[0][max_iters][1]


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


def arms_at(study, horizon):
    """The Arms run at `horizon`, in the study's order."""
    return [a for a in study.arms if a.name in horizon.arms]


def points_had(study, stage):
    """How many of an arm's points at one horizon are finished, from its Stage (see `advance`): its tuning runs
    (every one once a value is chosen; else the grid's less those still to run) and its finished held-out seeds."""
    tuning = len(stage.values) * len(study.tuning_seeds) - (len(stage.todo) if stage.chosen is None else 0)
    return tuning + sum(loss is not None for loss in stage.held_out.values())
