"""
Group-sequential tests of a declared paired contrast: alpha-spending boundaries, their carrying to t statistics,
one look's test against them, the exact sign-flip test beside it, the operating characteristics of the whole
procedure by simulation, and the same for a family of declared tests on shared seeds.

The boundaries (two-sided, symmetric, z scale). At looks with information fractions t_1 < ... < t_K = 1 (for a
paired contrast, the seeds so far over the seeds at the last look), the standardized statistics Z_k of a
cumulative mean have corr(Z_i, Z_j) = sqrt(t_i / t_j) for i <= j (Jennison & Turnbull 2000, "Group Sequential
Methods with Applications to Clinical Trials", section 3.1). Lan & DeMets (1983, "Discrete sequential boundaries for
clinical trials", Biometrika 70) choose c_k so that the chance of first crossing at look k under the null is
alpha(t_k) - alpha(t_{k-1}) for a spending function alpha(t):

- O'Brien-Fleming type: each side spends alpha_1(t) = 2 - 2 Phi(z_{1 - alpha_1 / 2} / sqrt(t)) of its one-sided
  alpha_1 = alpha / 2, so alpha(t) = 2 alpha_1(t) (DeMets & Lan 1994, "Interim analysis: the alpha spending
  function approach", Statistics in Medicine 13; R gsDesign's sfLDOF). Lan & DeMets' 1983 form, 2 - 2 Phi(z_{1 -
  alpha/2} / sqrt(t)) two-sided, spends less early (3.395 at the first of three looks, not 3.710);
- Pocock type: alpha(t) = alpha ln(1 + (e - 1) t).

The classical boundaries (O'Brien & Fleming 1979, Biometrics 35; Pocock 1977, Biometrika 64) have a fixed shape,
c_k = C / sqrt(t_k) or c_k = C, with C set so that the chance of any crossing is alpha. Three equally spaced looks
at two-sided 0.05 give 3.471, 2.454, 2.004 (classical O'Brien-Fleming, C = 2.004: Jennison & Turnbull's Table 2.3),
2.289 at every look (classical Pocock, their Table 2.1) and 3.710, 2.511, 1.993 (Lan-DeMets O'Brien-Fleming type);
tests/test_sequential.py holds this code to them. The probabilities P(|Z_j| < c_j, j <= k) are the multivariate
normal's rectangle probabilities, scipy.stats.multivariate_normal.cdf with lower_limit (Genz's algorithm, a
quasi-Monte Carlo integration: a fixed rng and abseps 1e-7 make it repeatable and accurate far past the three
decimals above); each c_k is solved for with scipy.optimize.brentq.

Few seeds make the statistic a t with n_k - 1 degrees of freedom at look k, not a z. Each look's z boundary is
carried to its t by the same nominal two-sided p-value: t_k = F_t^{-1}(Phi(c_k); n_k - 1) (t_boundaries), the
"nominal p" carrying that Jennison & Turnbull section 3.8 discuss for small samples. It is not exact, so the level of
the whole procedure is checked by simulation (operating_characteristics: the t statistics of simulated studies at
the planned looks, their rejection rate under the null and their power under an effect).

At look k the paired t of the per-seed contrasts is tested against t_k (look_test): it rejects where |t| >= t_k;
with a futility bound it stops without rejecting where |t| falls below it (non-binding: the rejection bounds do not
count on it). Beside it stands the repeated confidence interval, estimate +- t_k x SE (Jennison & Turnbull 2000,
ch. 9: it covers the contrast at every look at once with probability about 1 - level, as the boundaries carried to t
hold the level).

The sign-flip test (Fisher 1935, "The Design of Experiments", section 21; a randomisation test): under the null of
a paired contrast symmetric about 0, each seed's difference is as likely negated, so the p-value is the share of the
2^n sign patterns whose |mean| is at least the observed one: every pattern when 2^n is at most 2^20, else a seeded
Monte Carlo sample of patterns with p = (1 + hits) / (1 + draws) (Phipson & Smyth 2010, "Permutation p-values should
never be zero", Stat. Appl. Genet. Mol. Biol. 9).

scipy: https://docs.scipy.org/doc/scipy/reference/generated/scipy.stats.multivariate_normal.html, scipy.stats.t,
scipy.stats.norm, scipy.optimize.brentq. No torch here: study.py's dry run imports this.
"""

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize
from scipy import stats as sps

SPENDING = ("obrien_fleming", "pocock")


def spent(fraction, alpha, spending):
    """The two-sided alpha spent by information fraction `fraction` (0 < fraction <= 1) under the Lan-DeMets
    `spending` function, 'obrien_fleming' (2 (2 - 2 Phi(z_{1-alpha/4} / sqrt(t))): each side's one-sided alpha/2
    spent O'Brien-Fleming's way) or 'pocock' (alpha ln(1 + (e-1) t)).
    Raises ValueError for another name."""
    if spending == "obrien_fleming":
        return float(4 * sps.norm.sf(sps.norm.isf(alpha / 4) / math.sqrt(fraction)))
    if spending == "pocock":
        return float(alpha * math.log(1 + (math.e - 1) * fraction))
    raise ValueError(f"spending must be one of {', '.join(SPENDING)}, got {spending!r}")


def _covariance(fractions):
    """corr(Z_i, Z_j) = sqrt(t_i / t_j), i <= j: the statistics of a cumulative mean at the looks."""
    t = np.asarray(fractions, dtype=float)
    return np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))


def _inside(bounds, fractions):
    """P(|Z_j| < c_j for every look j): a multivariate normal rectangle (scipy, Genz's algorithm, seeded)."""
    c = np.asarray(bounds, dtype=float)
    if len(c) == 1:
        return float(1 - 2 * sps.norm.sf(c[0]))
    return float(sps.multivariate_normal.cdf(c, mean=np.zeros(len(c)), cov=_covariance(fractions), lower_limit=-c,
                                             maxpts=20_000 * len(c), abseps=1e-7, releps=0, rng=0))


def spending_bounds(fractions, alpha=0.05, spending="obrien_fleming"):
    """The two-sided Lan-DeMets boundaries (z scale) at information fractions `fractions` (increasing, the last
    1): c_k such that the null chance of first crossing at look k is spent(t_k) - spent(t_{k-1}). Returns a list of
    K floats. Raises ValueError for fractions that do not increase to 1 or an unknown spending function."""
    _check_fractions(fractions)
    bounds = []
    for k, t in enumerate(fractions):
        target = spent(t, alpha, spending) - (spent(fractions[k - 1], alpha, spending) if k else 0.0)
        if k == 0:
            bounds.append(float(sps.norm.isf(target / 2)))
            continue
        before = _inside(bounds, fractions[:k])

        def excess(c, k=k):
            # the chance of staying inside up to k-1 and crossing at k, less its share of alpha
            return before - _inside([*bounds, c], fractions[:k + 1]) - target

        bounds.append(float(optimize.brentq(excess, 0.5, 12.0, xtol=1e-7)))
    return bounds


def classical_bounds(fractions, alpha=0.05, shape="obrien_fleming"):
    """The classical boundaries of O'Brien & Fleming (c_k = C / sqrt(t_k)) or Pocock (c_k = C), two-sided, C set so
    that the null chance of any crossing is alpha. Returns a list of K floats (z scale)."""
    _check_fractions(fractions)
    scale = [1 / math.sqrt(t) if shape == "obrien_fleming" else 1.0 for t in fractions]
    if shape not in SPENDING:
        raise ValueError(f"shape must be one of {', '.join(SPENDING)}, got {shape!r}")
    c = optimize.brentq(lambda c: 1 - _inside([c * s for s in scale], fractions) - alpha, 0.5, 12.0, xtol=1e-7)
    return [float(c * s) for s in scale]


def _check_fractions(fractions):
    if not fractions or any(b <= a for a, b in zip(fractions, fractions[1:])) or fractions[0] <= 0 \
            or not math.isclose(fractions[-1], 1.0):
        raise ValueError(f"the information fractions must increase from above 0 to 1, got {list(fractions)}")


def t_boundaries(z_bounds, dfs):
    """Each look's z boundary carried to its t statistic with `dfs` degrees of freedom by the same nominal
    two-sided p-value: t_k = t.isf(norm.sf(c_k), df_k) (module docstring)."""
    return [float(sps.t.isf(sps.norm.sf(z), df)) for z, df in zip(z_bounds, dfs)]


@functools.lru_cache(maxsize=64)
def _look_z_bounds(looks, level, spending):
    """spending_bounds at the fractions looks[k] / looks[-1] of `looks` (a tuple), kept: a study's dry run and
    study.json ask for the same boundaries many times."""
    return tuple(spending_bounds([n / looks[-1] for n in looks], level, spending))


def look_boundaries(looks, level=0.05, spending="obrien_fleming", futility=()):
    """The boundaries of a group-sequential paired t procedure at `looks` (the seeds an arm at each look,
    increasing): (z boundaries, t boundaries, t futility bounds or []), each a list. The z boundaries are
    spending_bounds' at the information fractions looks[k] / looks[-1] at two-sided `level`; the t boundaries and
    the futility bounds (`futility`: |z| bounds, one per look but the last) are carried to t on looks[k] - 1 degrees
    of freedom (t_boundaries)."""
    z = list(_look_z_bounds(tuple(looks), level, spending))
    dfs = [n - 1 for n in looks]
    return z, t_boundaries(z, dfs), t_boundaries(futility, dfs)


def nominal_levels(z_bounds):
    """The nominal two-sided p-value of each look's boundary, 2 (1 - Phi(c_k)): a look rejects when its t-test's
    p is at most this."""
    return [float(2 * sps.norm.sf(z)) for z in z_bounds]


def sign_flip_p(differences, exact_up_to=20, draws=100_000, seed=0):
    """The two-sided sign-flip (randomisation) p-value of the mean of paired `differences` (shape (n,)): the share
    of sign patterns whose |sum| is at least the observed |sum| (a relative tolerance of 1e-9 counts ties). Every
    one of the 2^n patterns when n <= exact_up_to; else `draws` patterns drawn with numpy's default_rng(seed),
    p = (1 + hits) / (1 + draws). Returns (p, how: 'exact, 2^n patterns' or 'Monte Carlo, D patterns, seed S').
    Raises ValueError for fewer than 1 difference."""
    d = np.asarray(differences, dtype=float)
    n = len(d)
    if n < 1:
        raise ValueError("the sign-flip test needs at least one paired difference")
    observed = abs(d.sum()) * (1 - 1e-9)
    if n <= exact_up_to:
        hits, chunk = 0, 1 << min(n, 16)
        bits = np.arange(n)
        for start in range(0, 1 << n, chunk):
            patterns = ((np.arange(start, start + chunk)[:, None] >> bits) & 1) * 2 - 1
            hits += int((np.abs(patterns @ d) >= observed).sum())
        return hits / (1 << n), f"exact, 2^{n} patterns"
    rng = np.random.default_rng(seed)
    hits = 0
    for size in [10_000] * (draws // 10_000) + ([draws % 10_000] if draws % 10_000 else []):
        patterns = rng.integers(0, 2, size=(size, n)) * 2 - 1
        hits += int((np.abs(patterns @ d) >= observed).sum())
    return (1 + hits) / (1 + draws), f"Monte Carlo, {draws} patterns, seed {seed}"


@functools.lru_cache(maxsize=256)
def _sign_flip_kept(differences, draws):
    """sign_flip_p of a look's per-seed contrasts (a tuple) with `draws` patterns, kept: a study's study.json is
    rewritten every round, with every evaluated look's p."""
    return sign_flip_p(np.array(differences), draws=draws)


@dataclass
class LookTest:
    """The paired t-test of one look's per-seed contrasts against its boundary: n seeds, the contrast's mean (its
    units: points) and SE, t on df = n - 1, its two-sided nominal p, the decision ('reject', 'futility', 'continue',
    or 'not rejected' where no later look tests it), the repeated confidence interval (mean +- t boundary x SE), and
    the sign-flip p beside it with how it was computed (sign_flip_p)."""

    n: int
    mean: float
    se: float
    t: float
    df: int
    p: float
    decision: str
    interval: tuple
    sign_flip_p: float
    sign_flip: str


def look_test(differences, t_bound, futility_t=None, final=False, sign_flip_draws=100_000):
    """The LookTest of a look's per-seed contrasts `differences` (shape (n,), n >= 2; points) against the look's
    boundary on |t| `t_bound`: the paired (one-sample) t, mean / (sd / sqrt(n)) with the sample sd (ddof 1), +-inf
    for a nonzero mean with sd 0. It rejects where |t| >= t_bound; else with a futility bound `futility_t` on |t| it
    stops for futility where |t| < futility_t (module docstring); else 'not rejected' where the look is `final` (the
    last, or the one look a test is tested at), 'continue' otherwise. The sign-flip p draws `sign_flip_draws`
    patterns past 2^20 (sign_flip_p, seed 0)."""
    d = np.asarray(differences, dtype=float)
    n = len(d)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    se = sd / math.sqrt(n)
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else 0.0
    decision = ("reject" if abs(t) >= t_bound else "futility" if futility_t is not None and abs(t) < futility_t
                else "not rejected" if final else "continue")
    p_flip, how = _sign_flip_kept(tuple(d), sign_flip_draws)
    return LookTest(n, mean, se, t, n - 1, float(2 * sps.t.sf(abs(t), n - 1)), decision,
                    (mean - t_bound * se, mean + t_bound * se), p_flip, how)


@dataclass
class Characteristics:
    """The operating characteristics of a group-sequential paired t procedure, from simulated studies: the share
    that rejected (at any look), the share that stopped at each look (efficacy or futility), the share that stopped
    for futility, and the expected seeds per arm at stopping."""

    rejected: float
    stopped_at: list
    futile: float
    expected_seeds: float
    studies: int


def operating_characteristics(looks, t_bounds, effect, sd, studies=20_000, seed=0, futility_t=None):
    """Simulate `studies` studies whose per-seed contrast is normal(effect, sd) (points), each analysed with the
    paired (one-sample) t statistic of its first looks[k] seeds at look k: rejected at the first look with
    |t| >= t_bounds[k]; with `futility_t` (one bound per look but the last, on |t|; non-binding, so the rejection
    bounds ignore it), stopped without rejecting at the first earlier look with |t| < futility_t[k]. Seeded
    (numpy default_rng(seed)). Returns a Characteristics."""
    rng = np.random.default_rng(seed)
    x = rng.normal(effect, sd, size=(studies, looks[-1]))
    s1, s2 = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    active = np.ones(studies, dtype=bool)
    rejected = np.zeros(studies, dtype=bool)
    futile = np.zeros(studies, dtype=bool)
    stopped_at, seeds = [], np.full(studies, looks[-1], dtype=float)
    for k, n in enumerate(looks):
        mean = s1[:, n - 1] / n
        var = (s2[:, n - 1] - n * mean * mean) / (n - 1)
        t = np.abs(mean) / np.sqrt(np.maximum(var, 1e-300) / n)
        reject = active & (t >= t_bounds[k])
        stop_futile = active & ~reject & (t < futility_t[k]) if futility_t and k < len(looks) - 1 else \
            np.zeros(studies, dtype=bool)
        stop = reject | stop_futile if k < len(looks) - 1 else active
        rejected |= reject
        futile |= stop_futile
        seeds[stop] = n
        stopped_at.append(float(stop.mean()))
        active &= ~stop
    return Characteristics(float(rejected.mean()), stopped_at, float(futile.mean()), float(seeds.mean()), studies)


FAMILY_RULES = ("fixed_sequence", "holm")


def holm_levels(level, m):
    """The level each open test of a group-sequential Holm family of m tests is tested at, by how many of the m
    have been rejected (r = 0 .. m - 1): level / (m - r). The graphical form with equal weights, a rejected test's
    level split equally among the open ones (Bretz, Maurer, Brannath & Posch 2009, "A graphical approach to
    sequentially rejective multiple test procedures", Statistics in Medicine 28; in group-sequential trials:
    Maurer & Bretz 2013, "Multiple testing in group sequential trials using graphical approaches", Statistics in
    Biopharmaceutical Research 5). Returns a list of m floats."""
    return [level / (m - r) for r in range(m)]


@dataclass
class FamilyCharacteristics:
    """The operating characteristics of a family of group-sequential paired t tests on shared seeds, from simulated
    studies: per test the share of studies that rejected it, the share that rejected at least one test whose
    effect is 0 (the family-wise error where some effects are 0), and the expected seeds per arm at stopping."""

    rejected: list
    false_rejection: float
    expected_seeds: float
    studies: int


def family_characteristics(looks, t_bounds, means, cov, rule, futility_t=None, studies=20_000, seed=0):
    """Simulate `studies` studies of m declared tests on shared seeds: each seed's m contrasts (points) drawn from
    normal(means, cov) (numpy default_rng(seed)), each test's statistic at look k the paired (one-sample) t of its
    first looks[k] seeds. `rule`:

    - 'fixed_sequence' (gatekeeping, Glimm, Maurer & Bretz 2010): test 0 runs look by look against t_bounds[0]
      (its boundaries at the full level), with the non-binding `futility_t` on it; at the look where it rejects,
      test 1 is tested once against the same look's boundary, then test 2 while each before it rejected; the study
      stops at the look where test 0 is decided.
    - 'holm' (holm_levels, group-sequential): every open test is tested at every look against the boundaries of its
      current level, t_bounds[r] with r the tests rejected so far (t_bounds[r]: the boundaries at level / (m - r));
      a rejection at a look raises the others' level at that look (tested again there) and at the later looks;
      the study stops once every test is rejected, or at the last look. No futility bound.

    `t_bounds`: per level (one list for 'fixed_sequence', m for 'holm'), a boundary on |t| per look.
    Returns a FamilyCharacteristics. Raises ValueError for another rule, or a futility bound under 'holm'."""
    if rule not in FAMILY_RULES:
        raise ValueError(f"the family's rule must be one of {', '.join(FAMILY_RULES)}, got {rule!r}")
    if rule == "holm" and futility_t:
        raise ValueError("a group-sequential Holm family has no futility bound here")
    means = np.asarray(means, dtype=float)
    m, n_max = len(means), looks[-1]
    rng = np.random.default_rng(seed)
    x = rng.multivariate_normal(means, np.asarray(cov, dtype=float), size=(studies, n_max))  # (S, N, m)
    s1, s2 = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    bounds = np.asarray(t_bounds, dtype=float)  # (levels, K)
    active = np.ones(studies, dtype=bool)
    rejected = np.zeros((studies, m), dtype=bool)
    seeds = np.full(studies, n_max, dtype=float)
    for k, n in enumerate(looks):
        mean = s1[:, n - 1] / n
        var = (s2[:, n - 1] - n * mean * mean) / (n - 1)
        t = np.abs(mean) / np.sqrt(np.maximum(var, 1e-300) / n)  # (S, m)
        if rule == "holm":
            for _ in range(m):  # each new rejection raises the others' level, tested again at this look
                r = np.minimum(rejected.sum(axis=1), m - 1)
                rejected |= active[:, None] & (t >= bounds[r, k][:, None])
            stop = active & rejected.all(axis=1) if k < len(looks) - 1 else active
        else:
            chain = active & (t[:, 0] >= bounds[0, k])
            for j in range(m):
                chain = chain & (t[:, j] >= bounds[0, k]) if j else chain
                rejected[:, j] |= chain
            futile = active & ~rejected[:, 0] & (t[:, 0] < futility_t[k]) if futility_t and k < len(looks) - 1 \
                else np.zeros(studies, dtype=bool)
            stop = active & (rejected[:, 0] | futile) if k < len(looks) - 1 else active
        seeds[stop] = n
        active &= ~stop
    null = means == 0
    false = rejected[:, null].any(axis=1) if null.any() else np.zeros(studies, dtype=bool)
    return FamilyCharacteristics([float(v) for v in rejected.mean(axis=0)], float(false.mean()), float(seeds.mean()),
                                 studies)


def contrast_covariance(contrasts, sds):
    """The covariance (points^2) of m declared tests' per-seed contrasts with the spreads `sds` (shape (m,),
    points), `contrasts` a list of m (baseline arm, {arm: coefficient}): each contrast taken as its arms'
    independent, equally spread noises (the baseline +sum of the coefficients, each contrast arm -its coefficient),
    so corr(i, j) = a_i . a_j / (|a_i| |a_j|) for those arm vectors, the arms in sorted order (two tests sharing an
    arm with the same sign correlate positively). Returns an (m, m) numpy array."""
    arms = sorted({a for baseline, contrast in contrasts for a in (baseline, *contrast)})
    a = np.zeros((len(contrasts), len(arms)))
    for i, (baseline, contrast) in enumerate(contrasts):
        a[i, arms.index(baseline)] += sum(contrast.values())
        for arm, c in contrast.items():
            a[i, arms.index(arm)] -= c
    corr = (a @ a.T) / np.outer(np.linalg.norm(a, axis=1), np.linalg.norm(a, axis=1))
    return corr * np.outer(sds, sds)


def simulate_family(looks, means, cov, level, spending, rule, futility=(), studies=20_000, seed=0):
    """family_characteristics of a family of m tests under `rule` at `looks` (seeds an arm), per-test true `means`
    (points, shape (m,)) and covariance `cov` ((m, m), points^2; contrast_covariance), the boundaries
    look_boundaries' with `spending` at `level` ('holm': one set per holm_levels level), the |z| futility bounds
    `futility` carried to t (none: [])."""
    levels = holm_levels(level, len(means)) if rule == "holm" else [level]
    bounds = [look_boundaries(looks, x, spending)[1] for x in levels]
    futility_t = t_boundaries(futility, [n - 1 for n in looks]) or None
    return family_characteristics(looks, bounds, means, cov, rule, futility_t, studies, seed)
