"""
The paper's Figure 2 (arXiv:2603.13381, Appendix A): the relative improvement of each arm's validation
loss over the baseline's, (L_base - L) / L_base in percent (the paper's Table 1 definition), against the
training step, every arm labelled with its non-embedding parameter count; in the paper, the res_gelu
tuning grid (84.97M) beside the MLP-widened controls (89.6 to 95.6M). compare.py draws it with
--figure2=PNG; docs/official.md gives the runs.
"""

from dataclasses import dataclass

import numpy as np


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
                 fontsize="medium")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig
