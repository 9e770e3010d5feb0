"""
What changes as the model widens, from runs at several widths (compare.py's --width_transfer and --width_ladder,
whose tables and figures transfer_report and ladder_report print and save; results/width_transfer,
results/width_ladder; docs/width.md).

- transfer: per arm and parametrization, the mean val loss of every learning rate at every width, the best rate
  per width, how far it moves from the smallest width to the largest (in x2 steps), and what the base width's
  best rate costs at the largest width. Transfer holds for an arm when the best rate moves by at most one x2 step
  and the base width's rate costs at most 1% of val loss at the largest width (studies/width_transfer.toml).
- ladder: per width, each arm's relative improvement over the baseline arm at the same width, from the runs
  paired by seed (same init seed, same data order), with its 95% confidence interval, the paired t-test's p and
  the minimum detectable effect of that paired test (and, labelled, of Welch's test on the same runs), and the
  slope of the improvement against log2(width) with its 95% interval and its own minimum detectable effect: the
  gap grows or shrinks only where that interval excludes 0.

An arm is the runs' settings apart from the seeds, the width (n_embd, n_head), the parametrization and its base,
and the tuning key. A run at the μP base width (m = 1) is both an SP and a μP run (μP equals SP there bit for
bit, tests/test_width.py), so it joins both curves.
"""

import math
import sys
from dataclasses import dataclass, replace

import numpy as np

from nonlinear_queries.analysis import stats
from nonlinear_queries.analysis.arms import IGNORED_KEYS, make_arms
from nonlinear_queries.analysis.plots import pooled_estimates, rate_transfer, width_ladder
from nonlinear_queries.errors import RunsError
from nonlinear_queries.record.runs import format_value

SEED_KEYS = {"seed", "data_seed"}
WIDTH_KEYS = {"n_embd", "n_head", "parametrization", "mup_base_width", "mup_base_head_dim"}


def parametrizations(config):
    """The parametrizations a run's config trains under: {'mup'} or {'sp'}, both at the μP base width, where μP
    is SP (width multiplier 1 and the head size of the base, or a fixed head size)."""
    head_dim = config["n_embd"] // config["n_head"]
    at_base = (config["n_embd"] == config.get("mup_base_width", 128)
               and config.get("mup_base_head_dim", 0) in (0, head_dim))
    return {"sp", "mup"} if at_base else {config.get("parametrization", "sp")}


@dataclass
class TransferCurve:
    """One arm under one parametrization at one width: {rate: [val loss of each seed's run]} at the step, and how
    many of its runs (still training) have no eval there yet."""

    arm: str
    parametrization: str
    width: int
    losses: dict
    unfinished: int = 0

    def mean(self, rate):
        return float(np.mean(self.losses[rate]))

    @property
    def best(self):
        """The rate with the lowest mean val loss (ties: the lower rate)."""
        return min(self.losses, key=lambda r: (self.mean(r), r))


def transfer_curves(runs, step, rate_key="learning_rate"):
    """[TransferCurve] of the runs at `step`, ordered by arm (first appearance), parametrization (SP first) and
    width. A diverged run's rate counts as an infinite loss; a run without an eval at `step` is counted in its
    curve's `unfinished`."""
    # an arm is labelled as compare.py's other tables label it (arms.make_arms)
    arms = make_arms(runs, IGNORED_KEYS | SEED_KEYS | WIDTH_KEYS | {rate_key})
    curves = {}
    for arm, run in ((arm, run) for arm in arms for run in arm.runs):
        loss = math.inf if run.diverged is not None else run.evals.get(step, (None, None))[1]
        for p in parametrizations(run.config):
            key = (arm.label, p, run.config["n_embd"])
            curve = curves.setdefault(key, TransferCurve(*key, {}))
            if loss is None:
                curve.unfinished += 1
            else:
                curve.losses.setdefault(run.config[rate_key], []).append(loss)
    order = [arm.label for arm in arms]
    return sorted((c for c in curves.values() if c.losses),
                  key=lambda c: (order.index(c.arm), c.parametrization != "sp", c.width))


@dataclass
class Transfer:
    """Whether the best rate of one arm under one parametrization holds from the smallest to the largest width:
    the best rate per width, its move in x2 steps (log2 of the largest width's best over the smallest's; None for
    an arm not run at every width of the table), and the relative val loss (%) at the largest width of the base
    width's best rate over that width's best (None where the base rate was not run at the largest width); an arm
    with runs still training (`unfinished` of them) is not judged."""

    arm: str
    parametrization: str
    best: dict  # width -> best rate
    shift: float | None
    cost: float | None
    holds: bool
    unfinished: int = 0


def transfer_verdicts(curves, base_width, max_shift=1, max_cost=1.0):
    """[Transfer] per arm and parametrization of `curves` (transfer_curves), judged by the study's criterion: the
    best rate moves by at most `max_shift` x2 steps from the smallest width to the largest, and the best rate of
    `base_width` costs at most `max_cost` % of val loss at the largest width. An arm whose runs have not all
    reached the step is not judged: a rate not yet run cannot lose."""
    out, widths = [], sorted({c.width for c in curves})
    for arm, p in dict.fromkeys((c.arm, c.parametrization) for c in curves):
        mine = {c.width: c for c in curves if (c.arm, c.parametrization) == (arm, p)}
        best = {w: mine[w].best for w in sorted(mine)}
        unfinished = sum(c.unfinished for c in mine.values())
        if set(mine) != set(widths) or unfinished:  # an arm not yet run at every width, or still running
            out.append(Transfer(arm, p, best, None, None, False, unfinished))
            continue
        shift = math.log2(best[widths[-1]] / best[widths[0]])
        cost = None
        if base_width in mine and best[base_width] in mine[widths[-1]].losses:
            largest = mine[widths[-1]]
            cost = 100 * (largest.mean(best[base_width]) - largest.mean(largest.best)) / largest.mean(largest.best)
        holds = abs(shift) <= max_shift + 1e-9 and cost is not None and cost <= max_cost
        out.append(Transfer(arm, p, best, shift, cost, holds))
    return out


def transfer_tables(curves, base_width):
    """(the loss table, the verdict table), each (header, rows) for stats.print_table: per arm, parametrization
    and width the mean val loss at every rate (the best in bold, n seeds in the header), and per arm and
    parametrization the best rate at each width, its shift, the base rate's cost and whether transfer holds."""
    rates = sorted({r for c in curves for r in c.losses})
    seeds = sorted({len(v) for c in curves for v in c.losses.values()})
    header = ["arm", "param.", "width", *(f"{format_value(r)}" for r in rates), "best"]
    rows = []
    for c in curves:
        cells = [f"**{c.mean(r):.4f}**" if r == c.best else f"{c.mean(r):.4f}" if r in c.losses else ""
                 for r in rates]
        rows.append([c.arm, label_of(c.parametrization), str(c.width), *cells, format_value(c.best)])
    header[3] += " (1 seed)" if seeds == [1] else f" (mean of {'/'.join(map(str, seeds))} seeds)"
    verdicts = transfer_verdicts(curves, base_width)
    widths = sorted({c.width for c in curves})
    vheader = ["arm", "param.", *(f"best at {w}" for w in widths), f"shift {widths[0]}→{widths[-1]} (x2 steps)",
               f"cost at {widths[-1]} of {base_width}'s best (%)", "transfer holds"]
    vrows = [[v.arm, label_of(v.parametrization), *(format_value(v.best[w]) if w in v.best else "" for w in widths),
              f"{v.unfinished} run(s) unfinished" if v.unfinished else
              "not at every width" if v.shift is None else f"{v.shift:+.0f}",
              "-" if v.shift is None else "not run" if v.cost is None else f"{v.cost:.2f}",
              "not judged" if v.shift is None else "yes" if v.holds else "no"]
             for v in verdicts]
    return (header, rows), (vheader, vrows)


def label_of(parametrization):
    return {"sp": "SP", "mup": "μP"}[parametrization]


@dataclass
class Rung:
    """One arm against the baseline at one width: the val losses of the runs paired by seed (same init seed, same
    data order), the per-seed relative improvement g = 100 (L_base - L) / L_base (%, positive = lower loss than
    the baseline), its mean, 95% confidence interval (the paired t interval) and the paired t-test's p on g, the
    minimum detectable effect (80% power, two-sided 5%) of that paired test on g (`mde`, percentage points: the
    test the table reports) and of Welch's test on the two arms' losses (`mde_welch`, % of the baseline's mean:
    what an unpaired comparison of the same runs would detect), the pairs' keys ((seed, data_seed) each), and the
    model's non-embedding parameters and training FLOPs per run."""

    arm: str
    width: int
    losses: np.ndarray
    base_losses: np.ndarray
    gaps: np.ndarray
    ci: tuple
    p: float | None
    mde: float | None
    mde_welch: float | None
    params: int
    flops: float
    seeds: tuple = ()

    @property
    def gap(self):
        return float(self.gaps.mean())


@dataclass
class Slope:
    """The least-squares slope of an arm's per-seed relative improvement (%) against log2(width), in percentage
    points per doubling of the width, with its 95% confidence interval (t with n - 2 degrees of freedom, n the
    pairs at every width), what the interval supports, the slope's minimum detectable effect (points per
    doubling; the t-test of the slope at 80% power, two-sided 5%) and the narrowest and widest widths it spans
    (`widths`; mde times `span`, the doublings between them, is the smallest change over the whole ladder it
    detects)."""

    arm: str
    slope: float
    ci: tuple
    n: int
    mde: float = math.nan
    widths: tuple = ()

    @property
    def span(self):
        """The doublings from the narrowest width to the widest, log2(widest / narrowest)."""
        return math.log2(self.widths[1] / self.widths[0])

    @property
    def verdict(self):
        if self.ci[0] > 0:
            return "grows with width"
        if self.ci[1] < 0:
            return "shrinks with width"
        return "no trend detected"


def one_sample_p(values):
    """The two-sided p of the one-sample t-test of mean(values) = 0 (scipy.stats.ttest_1samp; for the per-seed
    gaps, the paired t-test on the relative scale); None for fewer than 2 values."""
    from scipy import stats as sps

    return float(sps.ttest_1samp(values, 0.0).pvalue) if len(values) > 1 else None


def t_interval(values):
    """(low, high) of the 95% t interval of the mean of `values`; (nan, nan) for fewer than 2."""
    from scipy import stats as sps

    if len(values) < 2:
        return (math.nan, math.nan)
    half = sps.t.ppf(0.975, len(values) - 1) * np.std(values, ddof=1) / math.sqrt(len(values))
    return (float(np.mean(values) - half), float(np.mean(values) + half))


def setting(runs, step):
    """The ladder's setting in words for its figure: the seeds its runs hold (held-out seeds 1-5 and fresh 6-10
    make different figures, so the title says which), the parametrization every run trains under ('μP' where each
    is μP, the base width's SP runs included), the learning rates and the horizons, and the step read."""
    every = set.intersection(*(parametrizations(r.config) for r in runs)) if runs else set()
    kind = "μP" if "mup" in every else "SP" if every == {"sp"} else "SP and μP"
    rates = "/".join(format_value(x) for x in sorted({r.config["learning_rate"] for r in runs}))
    horizons = "/".join(str(x) for x in sorted({r.config["max_iters"] for r in runs}))
    seeds = seed_ranges({r.config.get("seed") for r in runs})
    return f"seeds {seeds}, {kind}, learning rate {rates}, {horizons} steps, val loss at step {step}"


def seed_ranges(seeds):
    """Seeds as ranges of consecutive ones: {1, 2, 3, 5} -> '1-3, 5'."""
    out = []
    for s in sorted(seeds):
        if out and s == out[-1][-1] + 1:
            out[-1].append(s)
        else:
            out.append([s])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in out)


def run_flops(config, flops_per_token=None):
    """Training FLOPs of one run of `config` (a run's config dict, or a planned run's): model.GPT.flops_per_token
    times the tokens of its max_iters steps. flops_per_token: the run header's (train.py records it); None builds
    the model on the meta device to count it (a planned run, or one whose header predates the record)."""
    if flops_per_token is None:
        import torch

        from model import GPT, GPTConfig, model_config_keys
        with torch.device("meta"):
            flops_per_token = GPT(GPTConfig(**{k: config[k] for k in model_config_keys() if k in config}
                                            )).flops_per_token()
    tokens = config["batch_size"] * config["gradient_accumulation_steps"] * config["block_size"]
    return flops_per_token * tokens * config["max_iters"]


def ladder(runs, step, baseline=None):
    """([Rung], [Slope], the baseline's label) of `runs` at `step`: every arm but the baseline (by default the
    first run's arm; else the label `baseline`) against the baseline at each width where both have runs, paired
    by seed and data_seed; runs that diverged or lack the step are left out. Raises RunsError for an unknown
    baseline or an arm with no paired runs."""
    # an arm is labelled as compare.py's other tables label it (arms.make_arms)
    made = make_arms(runs, IGNORED_KEYS | SEED_KEYS | WIDTH_KEYS)
    by_arm = {}
    for arm, run in ((arm, run) for arm in made for run in arm.runs):
        if run.diverged is None and step in run.evals:
            seed = (run.config.get("seed"), run.config.get("data_seed"))
            by_arm.setdefault(arm.label, {}).setdefault(run.config["n_embd"], {})[seed] = run
    arms = [arm.label for arm in made]
    base = arms[0] if baseline is None else baseline
    if base not in by_arm:
        raise RunsError(f"no baseline arm {base!r} among the runs' arms: {', '.join(map(repr, arms))}")
    rungs, slopes = [], []
    for arm in (a for a in arms if a != base and a in by_arm):
        mine = []
        for width in sorted(by_arm[arm]):
            pairs = sorted(set(by_arm[arm][width]) & set(by_arm[base].get(width, {})))
            if not pairs:
                continue
            losses = np.array([by_arm[arm][width][s].evals[step][1] for s in pairs])
            base_losses = np.array([by_arm[base][width][s].evals[step][1] for s in pairs])
            gaps = 100 * (base_losses - losses) / base_losses
            p = one_sample_p(gaps)
            mde = stats.paired_detectable_effect(len(gaps), gaps.std(ddof=1)) if len(pairs) > 1 else None
            welch = (100 * stats.min_detectable_effect(len(losses), len(base_losses), losses.std(ddof=1),
                                                       base_losses.std(ddof=1)) / base_losses.mean()
                     if len(pairs) > 1 else None)
            run = by_arm[arm][width][pairs[0]]
            mine.append(Rung(arm, width, losses, base_losses, gaps, t_interval(gaps), p, mde, welch,
                             run.header.get("non_embedding_params"),
                             run_flops(run.config, run.header.get("flops_per_token")), tuple(pairs)))
        if not mine:
            raise RunsError(f"{arm}: no run pairs with the baseline {base} at any width (same seed and data_seed)")
        rungs += mine
        if len(mine) > 1:
            x = np.concatenate([np.full(len(r.gaps), math.log2(r.width)) for r in mine])
            y = np.concatenate([r.gaps for r in mine])
            slope, ci, se = slope_interval(x, y, stderr=True)
            mde = stats.t_detectable_effect(se, len(y) - 2) if len(y) > 2 and se > 0 else math.nan
            slopes.append(Slope(arm, slope, ci, len(y), mde, (mine[0].width, mine[-1].width)))
    return rungs, slopes, base


def slope_interval(x, y, stderr=False):
    """(slope, (low, high)) of the least-squares line of y on x with the 95% t interval of the slope
    (scipy.stats.linregress's standard error, n - 2 degrees of freedom); with stderr, (slope, (low, high), its
    standard error)."""
    from scipy import stats as sps

    fit = sps.linregress(x, y)
    half = sps.t.ppf(0.975, len(x) - 2) * fit.stderr if len(x) > 2 else math.nan
    out = float(fit.slope), (float(fit.slope - half), float(fit.slope + half))
    return (*out, float(fit.stderr)) if stderr else out


@dataclass
class Pooled:
    """One arm's gap pooled over the widths, by the model declared for the ladder's fresh seeds
    (studies/width_ladder_fresh.toml, results/width_ladder/README.md): the per-seed relative improvement g_ws of
    width w and seed s is mu + d_w + e_ws, width a factor (each width its own mean) and every width weighted
    equally, so mu's estimate is the mean of the per-width mean gaps; its standard error is
    s_p sqrt(sum_w 1 / n_w) / W, with s_p^2 the pooled within-width variance on N - W degrees of freedom (N pairs,
    W widths); the two-sided t-test of mu = 0, its 95% interval and minimum detectable effect (80% power), and
    p_holm, Holm's adjustment over the arms of one table."""

    arm: str
    estimate: float
    ci: tuple
    p: float
    mde: float
    n: int
    widths: tuple
    df: int
    p_holm: float | None = None


def pooled_test(arm, gaps_by_width):
    """The Pooled test of `arm` from {width: per-seed gaps (%)}; None where it has no error degrees of freedom
    (N - W < 1) or no spread."""
    from scipy import stats as sps

    per_width = [np.asarray(g, dtype=float) for _, g in sorted(gaps_by_width.items())]
    n, w = sum(len(g) for g in per_width), len(per_width)
    if n - w < 1:
        return None
    se = pooled_sd(gaps_by_width) * math.sqrt(sum(1 / len(g) for g in per_width)) / w
    if not se > 0:
        return None
    estimate = float(np.mean([g.mean() for g in per_width]))
    half = sps.t.ppf(0.975, n - w) * se
    p = float(2 * sps.t.sf(abs(estimate) / se, n - w))
    return Pooled(arm, estimate, (estimate - half, estimate + half), p, stats.t_detectable_effect(se, n - w), n,
                  tuple(sorted(gaps_by_width)), n - w)


def pooled_sd(gaps_by_width):
    """The pooled within-width standard deviation of {width: per-seed gaps}, the s_p of pooled_test (N - W
    degrees of freedom)."""
    per_width = [np.asarray(g, dtype=float) for g in gaps_by_width.values()]
    n, w = sum(len(g) for g in per_width), len(per_width)
    return math.sqrt(sum(float(((g - g.mean()) ** 2).sum()) for g in per_width) / (n - w))


def planned_mde(sd, seeds, widths, alpha=0.05):
    """The minimum detectable effect (80% power) of pooled_test on `seeds` pairs at each of `widths` widths, were
    the within-width standard deviation `sd`: what a planned study of that n detects at the spread seen so far."""
    n = seeds * widths
    return stats.t_detectable_effect(sd * math.sqrt(widths / seeds) / widths, n - widths, alpha)


def seeds_for_mde(sd, target, widths, alpha=0.05):
    """The fewest seeds per width at which planned_mde(sd, seeds, widths, alpha) is at most `target`."""
    seeds = 2
    while planned_mde(sd, seeds, widths, alpha) > target:
        seeds += 1
    return seeds


def leave_one_out(rungs):
    """[(width, seed pair, [Pooled])]: pooled_tests of `rungs` (width.ladder's) run again with one seed pair left
    out at one width, once for each seed of each width (the pair left out of every arm at that width): how much
    one seed moves each arm's pooled test and its Holm p."""
    out = []
    for width in sorted({r.width for r in rungs}):
        for seed in sorted({s for r in rungs if r.width == width for s in r.seeds}):
            kept = [r if r.width != width else replace(r, gaps=r.gaps[[s != seed for s in r.seeds]],
                                                        seeds=tuple(s for s in r.seeds if s != seed))
                    for r in rungs]
            out.append((width, seed, pooled_tests(kept)))
    return out


def pooled_shift(before, after):
    """Pooled: the pooled gap of `after` minus that of `before`, each {width: per-seed gaps} of one arm on two sets
    of seeds, by the declared model with each (seed set, width) its own mean, every width weighted equally within
    a set, t on the variance pooled within all the cells (pairs - cells degrees of freedom): whether an arm's
    pooled gap moved from one set of seeds to the other. Its `mde` is this test's at 80% power."""
    from scipy import stats as sps

    cells = [np.asarray(g, dtype=float) for part in (before, after) for _, g in sorted(part.items())]
    n, k = sum(len(g) for g in cells), len(cells)
    residual = sum(float(((g - g.mean()) ** 2).sum()) for g in cells) / (n - k)
    se = math.sqrt(residual) * math.sqrt(sum(1 / len(g) / len(part) ** 2 for part in (before, after)
                                             for g in part.values()))
    estimate = (float(np.mean([np.mean(g) for g in after.values()]))
                - float(np.mean([np.mean(g) for g in before.values()])))
    half = sps.t.ppf(0.975, n - k) * se
    return Pooled("shift", estimate, (estimate - half, estimate + half), float(2 * sps.t.sf(abs(estimate) / se, n - k)),
                  stats.t_detectable_effect(se, n - k), n, tuple(sorted(set(before) | set(after))), n - k)


def effect_difference(rungs, plus, minus, control):
    """{width: per-seed D = g(plus) - g(minus) - g(control)} over the seeds that all three arms (labels of
    `rungs`, width.ladder's, every gap against the same baseline) share at that width: with plus = res_gelu_no_half,
    minus = res_gelu and control = baseline_temp2, what dropping res_gelu's 1/2 gains minus what doubling the
    baseline's softmax scale gains, in % of the baseline's val loss on that seed (the declared temperature
    comparison of results/width_ladder/README.md; pooled_test tests it)."""
    by = {(r.arm, r.width): dict(zip(r.seeds, r.gaps)) for r in rungs}
    out = {}
    for width in sorted({r.width for r in rungs}):
        if all((a, width) in by for a in (plus, minus, control)):
            seeds = sorted(set(by[plus, width]) & set(by[minus, width]) & set(by[control, width]))
            if seeds:
                out[width] = np.array([by[plus, width][k] - by[minus, width][k] - by[control, width][k]
                                       for k in seeds])
    return out


def pooled_tests(rungs):
    """[Pooled] of each arm of `rungs` (width.ladder's), over every width it has, Holm-adjusted over the arms."""
    out = []
    for arm in dict.fromkeys(r.arm for r in rungs):
        test = pooled_test(arm, {r.width: r.gaps for r in rungs if r.arm == arm})
        if test is not None:
            out.append(test)
    for test, adjusted in zip(out, stats.holm([t.p for t in out])):
        test.p_holm = adjusted
    return out


POOLED_CAPTION = ("pooled: each arm's per-seed rel. improvement with width as a factor, every width weighted "
                  "equally (the mean of the per-width means), t on the pooled within-width variance (pairs - widths "
                  "degrees of freedom); Holm over the arms of this table; MDE at 80% power. The model declared "
                  "before the ladder's fresh seeds 6-10 (results/width_ladder/README.md): on runs seen before that "
                  "declaration (seeds 1-5) it is exploratory")


def pooled_table(tests):
    """(header, rows) of the pooled tests for stats.print_table."""
    header = ["arm", "widths", "pairs", "pooled rel. improvement (%)", "95% CI (%)", "p", "p (Holm)", "MDE (%)"]
    rows = [[t.arm, ", ".join(map(str, t.widths)), str(t.n), f"{t.estimate:+.2f}", f"[{t.ci[0]:+.2f}, {t.ci[1]:+.2f}]",
             stats.p_cell(t.p), stats.p_cell(t.p_holm), f"{t.mde:.2f}"] for t in tests]
    return header, rows


DIFFERENCE_CAPTION = ("D = g({plus}) - g({minus}) - g({control}) per seed that the three share at a width, each g "
                      "the paired rel. improvement over {baseline} (%): what the first change gains "
                      "minus what the control's gains. Per width: mean D, its 95% t interval, the one-sample "
                      "t-test's p and MDE at 80% power; last row (two widths or more): the pooled model above over "
                      "the widths, a family of its own (uncorrected)")


def difference_table(rungs, plus, minus, control):
    """(header, rows) of the temperature comparison (effect_difference's D of the labels `plus`, `minus`,
    `control`): per width and pooled over the widths (pooled_test). Raises RunsError where a label is not an arm
    of `rungs` or no width has a seed all three share."""
    arms = set(r.arm for r in rungs)
    missing = [label for label in (plus, minus, control) if label not in arms]
    if missing:
        raise RunsError(f"--effect_difference: no arm {missing[0]!r} against the baseline; the arms are "
                        f"{', '.join(map(repr, dict.fromkeys(r.arm for r in rungs)))}")
    d = effect_difference(rungs, plus, minus, control)
    if not d:
        raise RunsError(f"--effect_difference: {plus}, {minus} and {control} share no seed at any width")
    header = ["width", "seeds", "D (points)", "95% CI", "p", "MDE (points)"]
    rows = []
    for w, values in d.items():
        one = len(values) < 2
        ci = None if one else t_interval(values)
        mde = None if one else stats.paired_detectable_effect(len(values), values.std(ddof=1))
        rows.append([str(w), str(len(values)), f"{values.mean():+.2f}",
                     "-" if one else f"[{ci[0]:+.2f}, {ci[1]:+.2f}]", stats.p_cell(None if one else
                                                                       one_sample_p(values)),
                     "-" if mde is None else f"{mde:.2f}"])
    test = pooled_test("D", d) if len(d) > 1 else None
    if test is not None:
        rows.append([", ".join(map(str, test.widths)) + " (pooled)", str(test.n), f"{test.estimate:+.2f}",
                     f"[{test.ci[0]:+.2f}, {test.ci[1]:+.2f}]", stats.p_cell(test.p), f"{test.mde:.2f}"])
    return header, rows


def ladder_tables(rungs, slopes, baseline):
    """(the per-width table, the slope table), each (header, rows) for stats.print_table; a width with one pair
    has no interval, p or MDE ('-'). The MDE columns: the paired test's (the p the table gives) and Welch's on
    the same runs (an unpaired comparison), both at 80% power; the slope's MDE per doubling and over the widths
    it spans."""
    header = ["arm", "width", "non-emb. params", "training PFLOPs", "n", "val loss", f"{baseline} val loss",
              "rel. improvement (%)", "95% CI (%)", "paired p", "MDE, paired (%)", "MDE, Welch (%)"]
    rows = [[r.arm, str(r.width), f"{r.params:,}", f"{r.flops / 1e15:.3f}", str(len(r.gaps)),
             stats.pm_cell(float(r.losses.mean()), float(r.losses.std(ddof=1)) if len(r.losses) > 1 else None),
             stats.pm_cell(float(r.base_losses.mean()),
                           float(r.base_losses.std(ddof=1)) if len(r.base_losses) > 1 else None),
             f"{r.gap:+.2f}", "-" if len(r.gaps) < 2 else f"[{r.ci[0]:+.2f}, {r.ci[1]:+.2f}]", stats.p_cell(r.p),
             "-" if r.mde is None else f"{r.mde:.2f}", "-" if r.mde_welch is None else f"{r.mde_welch:.2f}"]
            for r in rungs]
    sheader = ["arm", "slope (points per doubling of width)", "95% CI", "pairs", "what the interval supports",
               "MDE (points per doubling)", "MDE over the widths (points)"]
    srows = [[s.arm, f"{s.slope:+.2f}", f"[{s.ci[0]:+.2f}, {s.ci[1]:+.2f}]", str(s.n), s.verdict,
              "-" if math.isnan(s.mde) else f"{s.mde:.2f}",
              "-" if math.isnan(s.mde) else f"{s.mde * s.span:.2f} ({s.widths[0]}→{s.widths[1]})"] for s in slopes]
    return (header, rows), (sheader, srows)


def transfer_report(runs, step, fmt, plot=None):
    """compare.py --width_transfer: print the loss and verdict tables of `runs` at `step` in `fmt` (text, markdown
    or csv), and with `plot` (a path) save their figure there."""
    base_width = runs[0].config.get("mup_base_width", 128)
    curves = transfer_curves(runs, step)
    (header, rows), (vheader, vrows) = transfer_tables(curves, base_width)
    verdicts = transfer_verdicts(curves, base_width)
    caption = (f"val loss at step {step}, the mean over each rate's seeds; bold: the best rate of the row. A run "
               f"at the μP base width {base_width} (m = 1) counts as SP and as μP, which are equal there")
    vcaption = (f"transfer holds: the best rate moves by at most one x2 step from the smallest width to the "
                f"largest, and width {base_width}'s best rate costs at most 1% of val loss at the largest")
    print_tables([(header, rows, caption), (vheader, vrows, vcaption)], fmt)
    if plot:
        save(rate_transfer(curves, verdicts, step, base_width), plot, fmt)


def ladder_report(runs, step, fmt, baseline=None, claims=(), plot=None, difference=None, pooled_plot=False):
    """compare.py --width_ladder: print the per-width, slope and pooled tables of `runs` at `step` against the
    arm labelled `baseline` (ladder's default: the first run's) in `fmt`, with `difference` (the labels plus,
    minus, control) the table of their effect difference D (difference_table), and with `plot` (a path) save
    the figure there, noting `claims` (--claim's WIDTH:PERCENT:LABEL specs) under it; with `pooled_plot` the figure
    is the pooled tests' instead (plots.pooled_estimates: each arm's pooled gap and D with their intervals, the
    declared model's estimates, not the per-width slope). Raises RunsError for an
    unknown baseline or label, an arm without pairs or a malformed claim."""
    rungs, slopes, baseline = ladder(runs, step, baseline)
    (header, rows), (vheader, vrows) = ladder_tables(rungs, slopes, baseline)
    caption = (f"val loss at step {step}; rel. improvement = 100 (L_base - L) / L_base over the runs paired by "
               f"seed and data_seed with the baseline {baseline} at the same width (positive = lower loss), its "
               f"95% t interval and the paired t-test's p; MDE: the smallest gap detected with 80% power at "
               f"these n and stds by the paired test (the p given) and, for comparison, by Welch's test on the "
               f"same runs (in % of the baseline's loss); training PFLOPs: 6N + attention per token times the "
               f"run's tokens")
    vcaption = ("slope: least squares of each pair's rel. improvement on log2(width), in percentage points per "
                "doubling; the gap grows or shrinks only where its 95% interval excludes 0; MDE: the smallest "
                "slope its t-test detects with 80% power, and that slope times the doublings the widths span")
    claimed = [claim(spec) for spec in claims]
    # the pooled test declared for the ladder's fresh seeds (results/width_ladder/README.md)
    print_tables([(header, rows, caption), (vheader, vrows, vcaption),
                  (*pooled_table(pooled_tests(rungs)), POOLED_CAPTION),
                  *([(*difference_table(rungs, *difference),
                      DIFFERENCE_CAPTION.format(plus=difference[0], minus=difference[1], control=difference[2],
                                                baseline=baseline))] if difference else [])], fmt)
    if plot and pooled_plot:
        d = pooled_test("D", effect_difference(rungs, *difference)) if difference else None
        save(pooled_estimates(pooled_tests(rungs), d, baseline, setting(runs, step)), plot, fmt)
    elif plot:
        save(width_ladder(rungs, slopes, baseline, claimed, setting(runs, step)), plot, fmt)


def claim(spec):
    """(width, percent, label) of a --claim=WIDTH:PERCENT:LABEL; raises RunsError for a malformed one."""
    w, percent, label = (spec.split(":", 2) + ["", ""])[:3]
    try:
        return int(w), float(percent), label
    except ValueError:
        raise RunsError(f"--claim={spec}: write WIDTH:PERCENT:LABEL, e.g. --claim=768:1.40:the paper") from None


def print_tables(tables, fmt):
    """Print each (header, rows, caption) of `tables` with stats.print_table, the caption above a text or
    markdown table (csv stays machine-readable: tables only)."""
    for head, lines, text in tables:
        if fmt != "csv":
            print(text + "\n")
        stats.print_table(head, lines, fmt, [True])
        if fmt != "csv":
            print()


def save(figure, path, fmt):
    """Save `figure` at `path` and say so, on stderr under csv so that stdout stays machine-readable."""
    figure.savefig(path, dpi=150)
    print(f"wrote {path}", file=sys.stderr if fmt == "csv" else sys.stdout)
