"""
The figures of compare.py (the paper's Figure 1: loss and relative improvement over steps; its Figure 2: the
relative improvement of each arm labelled with its non-embedding parameters, docs/official.md) and analyze.py (the
diagnostics over steps and the attn_logit_max heatmaps), as matplotlib Figures (no pyplot: no display, no global
state; matplotlib is imported inside the functions, since only --plot needs it).

Colours: arms of one family (compare.py: the same query_mode, e.g. the baseline, its QK-norm variant and MLP4.75;
analyze.py: the same run_name at several rates) share one hue and differ in lightness and marker, and families
get different hues, so that arms meant to be compared side by side stay apart and related arms look related.
Legends sit outside the axes, off the data.
"""

from dataclasses import dataclass

import numpy as np

from nonlinear_queries.analysis.arms import layer_mean, pooled
from nonlinear_queries.analysis.stats import step_list
from nonlinear_queries.record.runs import format_value

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">", "h")


def styles(keys):
    """[(color, marker)] for items whose family is keys[i]: each family one hue of matplotlib's tab10 cycle
    (C0-C9, in order of first appearance; they repeat after 10 families), its members from a darker (mixed 40%
    with black) to a lighter (mixed 50% with white) shade of it, and each member its own marker."""
    from matplotlib.colors import to_rgb

    families = list(dict.fromkeys(keys))
    sizes = {k: keys.count(k) for k in families}
    seen = {k: 0 for k in families}
    out = []
    for key in keys:
        i, size = seen[key], sizes[key]
        seen[key] += 1
        base = np.array(to_rgb(f"C{families.index(key) % 10}"))
        mix = -0.4 + 0.9 * i / (size - 1) if size > 1 else 0.0
        color = base * (1 + mix) if mix < 0 else base + (1 - base) * mix
        out.append((tuple(color), MARKERS[i % len(MARKERS)]))
    return out


def curve(arm):
    """An arm's curve: (steps, losses) with losses of shape (runs, steps, 2) holding (train_loss, val_loss) at the
    eval steps after step 0 that all its pooled runs have (arms.pooled: an all-diverged arm keeps its runs, so
    its curve ends where they stopped)."""
    runs = pooled(arm)
    steps = sorted(set.intersection(*(set(r.evals) for r in runs)) - {0})
    losses = np.array([[r.evals[s] for s in steps] for r in runs], dtype=float).reshape(len(runs), len(steps), 2)
    return np.array(steps, dtype=np.int64), losses


def loss_curves(arms, baseline):
    """Figure 1 of the paper: top, the loss vs step of every arm (val solid, train dashed; the mean over its
    runs, a band from the lowest to the highest run when n > 1); bottom, the relative improvement over the
    baseline arm's mean, 100 (L_base - L) / L_base (%), at the steps both have: the arm's mean, and for the
    val loss a band of ± one sample std of its runs' improvements. Step 0 is left out: the untrained loss, about
    ln(vocab_size), would squash the y-range. Runs that diverged are left out of an arm that has others; an arm
    whose runs all diverged is drawn on top only, up to where they stopped; the legend says which."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 8), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    base_steps, base_losses = curve(baseline)
    for arm, (color, marker) in zip(arms, styles([a.header["config"]["query_mode"] for a in arms])):
        steps, losses = curve(arm)
        diverged = [r.diverged for r in arm.runs if r.diverged is not None]
        note = f" ({len(diverged)} of {len(arm.runs)} diverged, left out)" if diverged else ""
        if len(diverged) == len(arm.runs):
            note = f" (diverged at {step_list(diverged)})"
        _, mine, theirs = np.intersect1d(steps, base_steps, return_indices=True)
        base_mean = base_losses.mean(axis=0)[theirs]
        for j, style in ((1, "-"), (0, "--")):
            top.plot(steps, losses[:, :, j].mean(axis=0), style, marker=marker, markersize=3, color=color,
                     label=None if j == 0 else arm.label + note)
            if len(losses) > 1:
                top.fill_between(steps, losses[:, :, j].min(axis=0), losses[:, :, j].max(axis=0), color=color,
                                 alpha=0.15, linewidth=0)
            # a diverged arm's early losses would set the scale of the improvements that matter
            if len(diverged) < len(arm.runs):
                rel = 100 * (base_mean[:, j] - losses[:, mine, j]) / base_mean[:, j]
                bottom.plot(steps[mine], rel.mean(axis=0), style, marker=marker, markersize=3, color=color)
                # the val loss's band only: with the train loss's too, a figure of many arms turns to mud
                if len(rel) > 1 and j == 1:
                    spread = rel.std(axis=0, ddof=1)
                    bottom.fill_between(steps[mine], rel.mean(axis=0) - spread, rel.mean(axis=0) + spread,
                                        color=color, alpha=0.1, linewidth=0)
    bottom.axhline(0, color="gray", linewidth=0.8)
    top.set_ylabel("loss (nats per token)")
    top.legend(title="val loss solid, train loss dashed", loc="upper left", bbox_to_anchor=(1.01, 1),
               fontsize="small")
    bottom.set_xlabel("step")
    bottom.set_ylabel("rel. improvement (%)")
    # the baseline's label can be as wide as the axes (a study's arms differ in several settings): it gets a line
    # of its own, wrapped at its spaces where it is wider still (wrap: at draw time, to the figure's width)
    bottom.set_title(f"(L_base - L) / L_base; band: val, ± std over runs\n"
                     f"baseline: {baseline.label}", fontsize="medium", wrap=True)
    return fig


def diagnostic_curve(arm, name):
    """(steps, values (runs, steps)) of a diagnostic's layer mean over an arm's pooled runs, at the diag steps
    they all have; values None where the diagnostic is undefined for the arm."""
    runs = pooled(arm)
    steps = sorted(set.intersection(*(set(r.diags) for r in runs)))
    values = [[layer_mean(r.diags[s].get(name, [])) for s in steps] for r in runs]
    if all(v is None for row in values for v in row):
        return steps, None
    return steps, np.array(values, dtype=float)


def diagnostics(arms, names):
    """analyze.py's figure: one panel per diagnostic over the steps, each arm a line (its mean over runs, a band
    from its lowest to its highest run; each arm, its run_name, one colour family), the legend above the panels;
    then per arm a layers x steps heatmap of attn_logit_max, the mean over its runs, all on one color scale."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    cols = 3
    panel_rows, map_rows = -(-len(names) // cols), -(-len(arms) // cols)
    fig = Figure(figsize=(4.2 * cols, 3.0 * (panel_rows + map_rows) + 0.6), layout="constrained")
    grid = fig.add_gridspec(panel_rows + map_rows, cols)
    looks = styles(["/".join(dict.fromkeys(r.header["run_name"] for r in a.runs)) for a in arms])
    handles = {}
    for k, name in enumerate(names):
        ax = fig.add_subplot(grid[k // cols, k % cols])
        for arm, (color, marker) in zip(arms, looks):
            steps, values = diagnostic_curve(arm, name)
            if values is None:
                continue
            (line,) = ax.plot(steps, values.mean(axis=0), marker=marker, markersize=3, color=color,
                              label=arm.label)
            handles.setdefault(arm.label, line)
            if len(values) > 1:
                ax.fill_between(steps, values.min(axis=0), values.max(axis=0), color=color, alpha=0.15, linewidth=0)
        ax.set_title(f"{name}, mean over layers", fontsize="medium")
        ax.set_xlabel("step")
    fig.legend(list(handles.values()), list(handles), loc="outside upper center", ncols=min(len(handles), 3),
               fontsize="small")
    maps = []
    for arm in arms:
        runs = pooled(arm)
        steps = sorted(set.intersection(*(set(r.diags) for r in runs)))
        maps.append((steps, np.array([[r.diags[s]["attn_logit_max"] for s in steps] for r in runs],
                                     dtype=float).mean(axis=0)))
    low, high = min(m.min() for _, m in maps), max(m.max() for _, m in maps)
    for i, (arm, (steps, heat)) in enumerate(zip(arms, maps)):
        ax = fig.add_subplot(grid[panel_rows + i // cols, i % cols])
        image = ax.imshow(heat.T, origin="lower", aspect="auto", cmap="viridis", vmin=low, vmax=high,
                          extent=(-0.5, len(steps) - 0.5, -0.5, heat.shape[1] - 0.5))
        ticks = np.unique(np.linspace(0, len(steps) - 1, min(len(steps), 6)).round().astype(int))
        ax.set_xticks(ticks, [str(steps[t]) for t in ticks])
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel("layer")
        ax.set_title(f"{arm.label}: attn_logit_max", fontsize="medium")
        fig.colorbar(image, ax=ax)
    return fig


@dataclass
class Curve:
    """One arm: its label, its non-embedding parameters (GPT.get_num_params()), its eval steps (S,) int
    and its validation loss at those steps (S,) float, nats per token (the mean over its runs)."""

    label: str
    non_embedding_params: int
    steps: np.ndarray
    val_loss: np.ndarray


def relative_improvement(curve, baseline):
    """(steps, improvement): the eval steps that `curve` and `baseline` both have, (K,) int, and
    100 (L_base - L) / L_base at each, (K,) float, percent; positive = lower loss than the baseline."""
    steps, mine, theirs = np.intersect1d(curve.steps, baseline.steps, return_indices=True)
    base = np.asarray(baseline.val_loss, dtype=float)[theirs]
    return steps, 100 * (base - np.asarray(curve.val_loss, dtype=float)[mine]) / base


def params_label(curve):
    """'label (84.97M)': the arm's label with its non-embedding parameters in millions, 4 significant digits."""
    return f"{curve.label} ({curve.non_embedding_params / 1e6:.4g}M)"


def figure2(curves, baseline):
    """Figure 2 as a matplotlib Figure: one line per curve but the baseline's (the curve labelled
    `baseline`, drawn as the zero line), its relative improvement over the baseline (relative_improvement)
    against the step, labelled by params_label. Arms with at least 1% more non-embedding parameters than the
    baseline (the MLP-widened controls: 5.6% and more) are dashed, the others solid (res_gelu's norm weights
    add 0.02%). Raises ValueError if no curve has the label `baseline`."""
    # imported here: only a figure needs matplotlib; Figure without pyplot needs no display and no global state
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    base = next((c for c in curves if c.label == baseline), None)
    if base is None:
        raise ValueError(f"no curve is labelled {baseline!r}; labels: {', '.join(c.label for c in curves)}")
    arms = [c for c in curves if c is not base]
    # one legend line per arm beside the axes, so the height grows with the number of arms
    fig = Figure(figsize=(14, max(6.0, 0.24 * (len(arms) + 1))), layout="constrained")
    ax = fig.subplots()
    ax.axhline(0, color="gray", linewidth=0.8, label=f"baseline: {params_label(base)}")
    for i, arm in enumerate(arms):
        # matplotlib's default cycle repeats after 10 colors; the grid and its controls are 34 arms
        color = f"C{i}" if len(arms) <= 10 else colormaps["turbo"](i / (len(arms) - 1))
        steps, improvement = relative_improvement(arm, base)
        style = "--" if arm.non_embedding_params >= 1.01 * base.non_embedding_params else "-"
        ax.plot(steps, improvement, style, marker="o", markersize=2, color=color, label=params_label(arm))
    ax.set_xlabel("step")
    ax.set_ylabel("rel. improvement over the baseline (%)")
    ax.set_title("(L_base - L) / L_base of the val loss; dashed: >= 1% more non-embedding parameters",
                 fontsize="medium", wrap=True)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def rate_transfer(curves, verdicts, step=None, base_width=None):
    """results/width_transfer's figure: one row per arm, SP left and μP right, the mean val loss of each rate
    against log2 of the rate, one curve per width (lighter = narrower), a bar from the lowest to the highest seed
    at each rate (the seeds' spread), each width's best rate starred, and each panel titled with how far the best
    rate moves and whether the study's criterion (width.transfer_verdicts) is met, said as the weak test it is (it
    allows a one-step move, so SP and μP can both meet it). The figure's title gives the step and the seeds; the
    base width's curve (μP is SP there) is marked as the same runs in both panels. curves: [width.TransferCurve]."""
    from matplotlib.figure import Figure


    arms = list(dict.fromkeys(c.arm for c in curves))
    widths = sorted({c.width for c in curves})
    fig = Figure(figsize=(10, 3.6 * len(arms) + 0.7), layout="constrained")
    axes = fig.subplots(len(arms), 2, sharey="row", squeeze=False)
    colors = styles(["width"] * len(widths))
    holds = {(v.arm, v.parametrization): v for v in verdicts}
    seeds = sorted({len(v) for c in curves for v in c.losses.values()})
    for row, arm in zip(axes, arms):
        for ax, p in zip(row, ("sp", "mup")):
            for c in (c for c in curves if (c.arm, c.parametrization) == (arm, p)):
                color, marker = colors[widths.index(c.width)]
                rates = sorted(c.losses)
                means = np.array([c.mean(r) for r in rates])
                low = means - np.array([min(c.losses[r]) for r in rates])
                high = np.array([max(c.losses[r]) for r in rates]) - means
                shared = "*" if c.width == base_width else ""
                ax.errorbar(np.log2(rates), means, yerr=[low, high], marker=marker, color=color, capsize=3,
                            label=f"width {c.width}{shared}")
                ax.plot(np.log2(c.best), c.mean(c.best), "*", markersize=14, color=color, markeredgecolor="black")
            v = holds.get((arm, p))
            verdict = "" if v is None or v.shift is None else (
                f"\nbest rate moves {v.shift:+.0f} x2 steps from {widths[0]} to {widths[-1]}\nthe study's lenient "
                f"criterion (≤ 1 step) {'is met' if v.holds else 'is not met'}")
            ax.set_title(f"{arm}, {'SP' if p == 'sp' else 'μP'}{verdict}", fontsize="medium")
            rates = sorted({r for c in curves for r in c.losses})
            ax.set_xticks(np.log2(rates), [format_value(r) for r in rates], fontsize="small")
            ax.set_xlabel("learning rate (log2 scale)")
            ax.grid(alpha=0.3)
        row[0].set_ylabel("val loss (nats per token)")
    shared = (f"; *: width {base_width}'s curve is the same runs in both panels (μP is SP there)"
              if any(c.width == base_width for c in curves) else "")
    fig.legend(*axes[0][1].get_legend_handles_labels(), loc="outside lower center", ncols=len(widths),
               fontsize="small", title_fontsize="small", title=f"star: each width's best rate (lowest mean){shared}")
    at = f" at step {step} (the run's horizon)" if step is not None else ""
    fig.suptitle(f"val loss{at}: the mean of {'/'.join(map(str, seeds))} seeds per rate, the bar from the lowest "
                 f"seed to the highest", fontsize="medium")
    return fig


def width_ladder(rungs, slopes, baseline, claims=(), setting=""):
    """results/width_ladder's figure: each arm's relative improvement over the baseline (%) against the width
    (log2 axis) with its 95% confidence interval and each seed's value as a small open dot beside it, the arms
    dodged left and right of each width so no interval or dot hides another; the number of pairs under each width;
    the fitted slope as a dashed line, its value in percentage points per doubling in the legend, and no line
    joining the means (at two widths the fit passes through both means, and such a line would hide it); `setting` (the
    parametrization, rate and horizon) in the title. `claims` [(width, percent, label)] made elsewhere are not
    drawn as points: a note under the axes says what they are and that they are not data of this ladder."""
    from matplotlib.figure import Figure

    arms = list(dict.fromkeys(r.arm for r in rungs))
    fig = Figure(figsize=(9, 6.2 if claims else 5.6), layout="constrained")
    ax = fig.subplots()
    fits = {s.arm: s for s in slopes}
    widths = sorted({r.width for r in rungs})
    # each arm's points a fixed fraction of a doubling left or right of its width (log2 axis)
    offsets = {arm: 0.09 * (i - (len(arms) - 1) / 2) for i, arm in enumerate(arms)}
    for arm, (color, marker) in zip(arms, styles(arms)):
        mine = [r for r in rungs if r.arm == arm]
        x = np.array([r.width for r in mine], dtype=float) * 2 ** offsets[arm]
        ax.errorbar(x, [r.gap for r in mine], yerr=np.array([[r.gap - r.ci[0], r.ci[1] - r.gap] for r in mine]).T,
                    marker=marker, markersize=7, color=color, capsize=4, linestyle="none", zorder=3,
                    label=f"{arm}: mean and 95% CI")
        for xi, r in zip(x, mine):
            ax.plot(np.full(len(r.gaps), xi * 2 ** (0.035 if offsets[arm] >= 0 else -0.035)), r.gaps, "o",
                    markersize=4, markerfacecolor="none", markeredgecolor=color, alpha=0.7, zorder=2)
        if arm in fits:
            s = fits[arm]
            mean_x, mean_y = np.mean(np.log2([r.width for r in mine])), np.mean([g for r in mine for g in r.gaps])
            line = mean_y + s.slope * (np.log2([r.width for r in mine]) - mean_x)
            ax.plot(x, line, "--", color=color, linewidth=1, zorder=1,
                    label=f"{arm}: slope {s.slope:+.2f} points per doubling [{s.ci[0]:+.2f}, {s.ci[1]:+.2f}]")
    ax.plot([], [], "o", markersize=4, markerfacecolor="none", markeredgecolor="gray", label="one seed's pair")
    ax.axhline(0, color="gray", linewidth=0.8)
    ax.set_xscale("log", base=2)
    pairs = {w: sorted({len(r.gaps) for r in rungs if r.width == w}) for w in widths}
    ax.set_xticks(widths, [f"{w}\nn = {'/'.join(map(str, pairs[w]))}" for w in widths])
    ax.set_xlim(widths[0] / 2 ** 0.3, widths[-1] * 2 ** 0.3)
    ax.set_xlabel("width n_embd (log2 scale); n: seed pairs at that width")
    ax.set_ylabel(f"rel. improvement over {baseline} (%)")
    ax.set_title(f"(L_base - L) / L_base per width{': ' + setting if setting else ''}", fontsize="medium")
    ax.grid(alpha=0.3)
    notes = "; ".join(f"{label}: {percent:+.2f}% at width {width}" for width, percent, label in claims)
    fig.legend(loc="outside lower center", ncols=2, fontsize="small", title_fontsize="small",
               title=f"not drawn (another setting, not a point of this ladder or of its fit):\n{notes}"
               if claims else None)
    return fig


def pooled_estimates(tests, difference=None, baseline="the baseline", setting=""):
    """The declared pooled test as a figure: each arm's pooled gap to the baseline (width.pooled_tests' Pooled,
    one row per arm) with its 95% confidence interval (uncorrected: Holm changes p, not the interval) and its
    pairs, and beside it, where given, the pooled D of the temperature comparison (`difference`, a Pooled) with
    its interval: the estimates the declaration tests, not a line through the per-width means, which the
    declared model (width a factor) does not assume. `setting` (seeds, rate, horizon) goes in the title."""
    from matplotlib.figure import Figure

    panels = [(tests, f"pooled rel. improvement over\n{baseline} (%), 95% CI")]
    if difference is not None:
        panels.append(([difference], "D (points), 95% CI"))
    fig = Figure(figsize=(10, 2.2 + 0.7 * len(tests)), layout="constrained")
    axes = fig.subplots(1, len(panels), squeeze=False, width_ratios=[3, 2][: len(panels)])[0]
    for ax, (rows, xlabel) in zip(axes, panels):
        for i, (t, (color, marker)) in enumerate(zip(rows, styles([t.arm for t in rows]))):
            y = len(rows) - 1 - i
            ax.errorbar([t.estimate], [y], xerr=[[t.estimate - t.ci[0]], [t.ci[1] - t.estimate]], marker=marker,
                        color=color, capsize=4, markersize=7)
            ax.annotate(f"{t.estimate:+.2f} [{t.ci[0]:+.2f}, {t.ci[1]:+.2f}], {t.n} pairs", (t.estimate, y),
                        textcoords="offset points", xytext=(0, 8), ha="center", fontsize="small")
        ax.set_yticks(range(len(rows)), [t.arm for t in reversed(rows)], fontsize="small")
        ax.set_ylim(-0.7, len(rows) - 0.3)
        ax.axvline(0, color="gray", linewidth=0.8)
        ax.set_xlabel(xlabel)
        ax.margins(x=0.3)  # room for each estimate's label above it
        ax.grid(alpha=0.3, axis="x")
    widths = ", ".join(map(str, tests[0].widths)) if tests else ""
    fig.suptitle(f"pooled over widths {widths} (width a factor, each width weighted equally)"
                 f"{chr(10) + setting if setting else ''}", fontsize="medium")
    return fig
