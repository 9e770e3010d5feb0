"""
Power planning of a declared paired contrast (a study file's [power]): the power of the two-sided paired t-test,
the seeds it needs, its minimum detectable effect, the spread from a pilot's finished runs, and the same for a
group-sequential procedure's looks.

The paired t-test on n seeds' contrasts of standard deviation sd has, under a true mean delta, a noncentral t
statistic with n - 1 degrees of freedom and noncentrality delta sqrt(n) / sd; its power is that distribution's mass
beyond +-t_{1-alpha/2, n-1} (scipy.stats.nct; Cohen 1988, "Statistical Power Analysis for the Behavioral Sciences",
ch. 2; G*Power's and R pwr's pwr.t.test(type = "paired") compute the same). For Cohen's medium effect,
pwr.t.test(d = 0.5, power = 0.8, type = "paired") prints n = 33.36713; tests/test_sequential.py holds
seeds_for_power to it.

At a look with a nominal two-sided level (sequential.nominal_levels), the same formulas at that level give the
effect that look alone detects with the given power: what it can decide. The looks of a group-sequential procedure
that reach a power (looks_for_power) come from its simulated operating characteristics (sequential), as no closed
form holds for the t statistics at the looks.
"""

import functools
import json
import math

import numpy as np
from scipy import optimize
from scipy import stats as sps

from nonlinear_queries.analysis import sequential, stats
from nonlinear_queries.errors import PilotError
from nonlinear_queries.record.runs import RunDir


def paired_power(effect, sd, n, alpha=0.05):
    """The power of the two-sided paired t-test at level alpha on n seeds whose contrast has mean `effect` and
    standard deviation `sd` (same units): the noncentral t's mass beyond +-t_{1-alpha/2, n-1}. n need not be an
    integer (as pwr.t.test solves it). Raises ValueError for n < 2 or sd <= 0."""
    if n < 2 or not sd > 0:
        raise ValueError(f"need n >= 2 and sd > 0; got n={n}, sd={sd}")
    df, nc = n - 1, effect * math.sqrt(n) / sd
    crit = sps.t.isf(alpha / 2, df)
    # the lower tail as sf(crit, df, -nc): scipy's nct.cdf gives nan far in the tail (stats.t_detectable_effect)
    return float(sps.nct.sf(crit, df, nc) + sps.nct.sf(crit, df, -nc))


def seeds_for_power(effect, sd, alpha=0.05, power=0.8, exact=False):
    """The seeds (pairs) the two-sided paired t-test needs to detect `effect` with `power` at level alpha when the
    contrast's standard deviation is `sd`: the smallest integer n, or with exact=True the real n at which the
    power is reached (pwr.t.test's n). Raises ValueError for effect 0 or sd <= 0."""
    if effect == 0 or not sd > 0:
        raise ValueError(f"need an effect other than 0 and sd > 0; got effect={effect}, sd={sd}")
    high = 4.0
    while paired_power(effect, sd, high, alpha) < power:
        high *= 2
    if exact:
        return float(optimize.brentq(lambda n: paired_power(effect, sd, n, alpha) - power, 2.0, high, xtol=1e-9))
    n = 2
    while paired_power(effect, sd, n, alpha) < power:
        n += 1
    return n


def detectable_effect(sd, n, alpha=0.05, power=0.8):
    """The minimum detectable effect (same units as sd) of the two-sided paired t-test on n seeds at level alpha:
    stats.paired_detectable_effect."""
    return stats.paired_detectable_effect(n, sd, alpha, power)


def look_detectable_effects(sd, looks, z_bounds, power=0.8):
    """Per look k (looks[k] seeds, boundary z_bounds[k]): the effect that look's t-test alone, at its nominal level
    2 (1 - Phi(c_k)), detects with `power`. Returns a list of floats."""
    return [detectable_effect(sd, n, float(2 * sps.norm.sf(z)), power) for n, z in zip(looks, z_bounds)]


@functools.lru_cache(maxsize=64)
def looks_for_power(effect, sd, level, spending, futility, n_looks, wanted, max_seeds):
    """(looks, simulated power): n_looks looks at max(3, ceil(k n / n_looks)) seeds an arm (k = 1 .. n_looks), n the
    fewest (from 3 n_looks up to max_seeds) at which the group-sequential paired t procedure's simulated power
    (sequential.operating_characteristics, seed 0) at `effect` (points, per-seed sd `sd`) reaches `wanted`, else
    max_seeds. The boundaries are sequential.look_boundaries' at two-sided `level` with `spending` and the |z|
    futility bounds `futility` (a tuple). Returns (a tuple of n_looks ints, a float)."""
    def schedule(n):
        return [max(3, math.ceil((k + 1) * n / n_looks)) for k in range(n_looks)]

    def reached(n):
        looks = schedule(n)
        _, t_bounds, futility_t = sequential.look_boundaries(looks, level, spending, list(futility))
        oc = sequential.operating_characteristics(looks, t_bounds, effect, sd, futility_t=futility_t or None)
        return oc.rejected

    low, high = 3 * n_looks, max_seeds
    if reached(high) < wanted:
        return tuple(schedule(high)), reached(high)
    while low < high:  # the power grows with n: the fewest n that reaches it
        mid = (low + high) // 2
        low, high = (low, mid) if reached(mid) >= wanted else (mid + 1, high)
    return tuple(schedule(low)), reached(low)


def run_seed(run_dir):
    """The seed of a finished run, from its config.json (train.py's newest header: its `config`'s seed)."""
    path = RunDir(run_dir).config
    try:
        with open(path) as f:
            return int(json.load(f)["config"]["seed"])
    except (OSError, ValueError, KeyError, TypeError):
        raise PilotError(f"{path} is missing or holds no config seed; name the run directories train.py wrote") \
            from None


def contrast_values(losses, baseline, contrast, diverged_val_loss):
    """Per seed common to every arm, sum over contrast arms of coeff * 100 (L_baseline - L_arm) / L_baseline,
    from `losses` {arm: {seed: val loss}} (inf for a diverged run, counted as `diverged_val_loss`). Returns
    (sorted seeds, array of shape (n,))."""
    arms = [baseline, *contrast]
    seeds = sorted(set.intersection(*(set(losses[a]) for a in arms)))
    value = lambda loss: diverged_val_loss if math.isinf(loss) else loss  # noqa: E731
    return seeds, np.array([sum(c * 100 * (value(losses[baseline][s]) - value(losses[a][s])) /
                                value(losses[baseline][s]) for a, c in contrast.items()) for s in seeds])
