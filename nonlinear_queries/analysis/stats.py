"""
The statistics of the comparisons of runs, and their one table printer.

- Welch's t-test for two groups of runs with unequal variances (Welch 1947, "The generalization of 'Student's'
  problem when several different population variances are involved", Biometrika 34), through
  scipy.stats.ttest_ind(equal_var=False);
- the paired t-test on runs matched by seed (scipy.stats.ttest_rel);
- Holm's step-down adjustment of m p-values (Holm 1979, "A simple sequentially rejective multiple test
  procedure", Scandinavian Journal of Statistics 6);
- the minimum detectable effect of Welch's test, of the paired t-test and of any t-tested estimate (a slope) at a
  given power, from the noncentral t distribution (scipy.stats.nct; the power of the t-test is the tail mass of the
  noncentral t beyond the critical value).

scipy's reference for the functions used: https://docs.scipy.org/doc/scipy/reference/stats.html (ttest_ind,
ttest_rel, t, nct) and https://docs.scipy.org/doc/scipy/reference/generated/scipy.optimize.brentq.html.
scipy.stats is imported inside the functions that need it: it is most of compare.py's start-up time.
"""

import csv
import sys
from dataclasses import dataclass

import numpy as np


@dataclass
class Paired:
    """The paired comparison of a row with the baseline: d = L - L_base over the matched pairs (nats per token),
    its mean (None without a pair), sample std and the paired t-test's p (None for n < 2, or for the baseline
    itself), and p_holm, p adjusted over the table's rows."""

    mean: float | None
    std: float | None
    n: int
    p: float | None
    p_holm: float | None = None


@dataclass
class Row:
    """One table row as numbers: `values` of the runs that count (shape (n,)), their mean and sample std (ddof=1;
    None without a value, std None for n < 2), n; the steps at which runs diverged, how many runs that did not
    diverge lack a value (`not_reached`) and how many runs the arm has. compare.py fills in the comparison with
    the baseline: rel (%), p (Welch), p_holm, paired, and tuning (the Row of the tuning runs, --select_on)."""

    values: np.ndarray
    mean: float | None
    std: float | None
    n: int
    diverged: list
    not_reached: int
    runs: int
    rel: float | None = None
    p: float | None = None
    p_holm: float | None = None
    paired: Paired | None = None
    tuning: "Row | None" = None

    @classmethod
    def of(cls, values, diverged=(), not_reached=0, runs=None):
        """The Row of `values` (a list of floats); runs defaults to the number of values."""
        values = np.array(values)
        n = len(values)
        return cls(values, float(values.mean()) if n else None, float(values.std(ddof=1)) if n >= 2 else None, n,
                   sorted(diverged), not_reached, n if runs is None else runs)


def rel_improvement(row, base):
    """(L_base - L) / L_base of the rows' means in percent (the paper's Table 1; positive = lower loss than the
    baseline); None where either has no value."""
    return 100 * (base.mean - row.mean) / base.mean if row.n and base.n else None


def welch_p(row, base):
    """Welch's two-sided p of two rows' values (Welch 1947; scipy.stats.ttest_ind with equal_var=False); None
    for the baseline itself or where either has fewer than 2 values."""
    if row is base or row.n < 2 or base.n < 2:
        return None
    from scipy import stats

    return float(stats.ttest_ind(row.values, base.values, equal_var=False).pvalue)


def paired_t(mine, theirs, same=False):
    """The paired comparison (a Paired) of two {key: loss} dicts over their common keys, in sorted order:
    d = mine - theirs, mean ± sample std, and the paired t-test's two-sided p (scipy.stats.ttest_rel), None for
    fewer than 2 pairs or when `same` (the baseline against itself)."""
    common = sorted(set(mine) & set(theirs))
    d = np.array([mine[k] - theirs[k] for k in common])
    n = len(d)
    if n < 2:
        return Paired(float(d.mean()) if n else None, None, n, None)
    from scipy import stats

    p = None if same else float(stats.ttest_rel([mine[k] for k in common], [theirs[k] for k in common]).pvalue)
    return Paired(float(d.mean()), float(d.std(ddof=1)), n, p)


def holm(ps):
    """Holm-Bonferroni adjusted p-values (Holm 1979) of the m p-values in `ps` that are not None, in the same
    order: the i-th smallest becomes max over j <= i of min(1, (m - j + 1) p_(j)). None stays None."""
    order = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: ps[i])
    adjusted, running = [None] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def min_detectable_effect(n1, n2, std1, std2=None, alpha=0.05, power=0.8):
    """The smallest true difference of two means (in the units of the stds, e.g. nats per token) that Welch's
    two-sided t-test (the p of compare.py) detects at level alpha with the given power, with n1 and n2 runs of
    standard deviations std1 and std2 (default: std1). Under a difference delta the statistic follows a
    noncentral t with the Welch-Satterthwaite degrees of freedom and noncentrality delta / SE,
    SE = sqrt(std1^2 / n1 + std2^2 / n2) (scipy.stats.nct); delta is solved for with scipy.optimize.brentq.
    With equal stds and n1 = n2 this is exact for Student's two-sample t-test (Cohen's d = 2.02 at n = 5, as in
    G*Power); for Welch's test it is the usual approximation (the degrees of freedom taken at the true stds), which
    at n = 5 overstates the power a little (a simulation gives 0.78-0.79 for 0.8). Raises ValueError for n1 or
    n2 < 2 or a std <= 0."""
    std2 = std1 if std2 is None else std2
    if n1 < 2 or n2 < 2 or not (std1 > 0 and std2 > 0):
        raise ValueError(f"need n1, n2 >= 2 and stds > 0; got n1={n1}, n2={n2}, std1={std1}, std2={std2}")
    v1, v2 = std1**2 / n1, std2**2 / n2
    df = (v1 + v2) ** 2 / (v1**2 / (n1 - 1) + v2**2 / (n2 - 1))
    return t_detectable_effect(np.sqrt(v1 + v2), df, alpha, power)


def paired_detectable_effect(n, std, alpha=0.05, power=0.8):
    """The smallest true mean of paired differences (in the units of `std`, the sample std of the n differences:
    nats per token, or the per-seed relative gaps in %) that the two-sided paired t-test (the one-sample t-test on
    the differences, scipy.stats.ttest_rel / ttest_1samp) detects at level alpha with the given power: a
    noncentral t with n - 1 degrees of freedom and noncentrality delta / (std / sqrt(n)), as for Welch's above
    (exact for the t-test, the std taken as the true one). Raises ValueError for n < 2 or std <= 0."""
    if n < 2 or not std > 0:
        raise ValueError(f"need n >= 2 and std > 0; got n={n}, std={std}")
    return t_detectable_effect(std / np.sqrt(n), n - 1, alpha, power)


def t_detectable_effect(se, df, alpha=0.05, power=0.8):
    """The smallest true value of an estimate with standard error `se` whose two-sided t-test with `df` degrees of
    freedom (t = estimate / se) reaches `power` at level alpha: the noncentrality at which the noncentral t's mass
    beyond +-crit is `power` (scipy.stats.nct), times se; solved with scipy.optimize.brentq. The common core of
    the detectable effects above, and of a regression slope's (se: the slope's standard error, df = n - 2)."""
    from scipy import optimize, stats

    crit = stats.t.ppf(1 - alpha / 2, df)

    def shortfall(nc):
        # the lower tail P(T < -crit) written as sf(crit, df, -nc): scipy's nct.cdf gives nan far in the tail
        return stats.nct.sf(crit, df, nc) + stats.nct.sf(crit, df, -nc) - power

    # the power grows with the noncentrality: double it until the power is reached
    high = 1.0
    while shortfall(high) < 0:
        high *= 2
    return float(optimize.brentq(shortfall, 0.0, high) * se)


def step_list(steps):
    """'step 812' or 'steps 812, 900'."""
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(map(str, steps))


def pm_cell(mean, std, digits=4):
    """'mean ± std' with `digits` decimals (the mean alone without a std), '-' without a mean."""
    if mean is None:
        return "-"
    return f"{mean:.{digits}f}" + (f" ± {std:.{digits}f}" if std is not None else "")


def p_cell(p):
    """A p-value's text: two significant digits, '-' where there is none."""
    return "-" if p is None else f"{p:.2g}"


def print_table(header, rows, fmt, left=(), file=None):
    """Print a table to `file` (default stdout): fmt "csv" (the cells as given, full precision), "markdown" (a
    pipe table) or "text" (columns aligned, two spaces apart). left[i]: column i aligns left (True) or right; a
    column past the end of `left` aligns right. Cells of markdown and text are strings."""
    file = file or sys.stdout
    if fmt == "csv":
        csv.writer(file, lineterminator="\n").writerows([header, *rows])
        return
    left = list(left) + [False] * (len(header) - len(left))
    if fmt == "markdown":
        for line in [header, ["---" if lft else "---:" for lft in left], *rows]:
            print("| " + " | ".join(line) + " |", file=file)
        return
    widths = [max(len(c) for c in column) for column in zip(header, *rows)]
    for line in [header, ["-" * w for w in widths], *rows]:
        print("  ".join(c.ljust(w) if lft else c.rjust(w) for c, w, lft in zip(line, widths, left)).rstrip(),
              file=file)
