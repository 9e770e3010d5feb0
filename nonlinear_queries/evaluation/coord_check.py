"""
The coordinate check of μP (Yang et al. 2022, Tensor Programs V; the `mup` package's
coord_check): train the same model at several widths for a few steps at a deliberately high rate and record the
mean |x| of every activation at every step. Under μP each one keeps its size as the width grows (a flat line in
log-log); under SP some grow with width once training has moved the weights, the sign that the best rate will
move too. `analyze.py --coord_check` prints the table and draws the figure (coordinates); tests/test_width.py
holds the slopes.

Activations (per block i): `embedding` (the first block's input), `attn_i` (attention's output, after c_proj),
`mlp_i` (the MLP's output), `query_i` (the query module's output, the q that the softmax scale then multiplies),
`query_f_i` (the learned branch f(x) of res_gelu and the other anchored-plus-f modules, where the module has
one), `gate_i` (the output gate's scores x W_θ, before the sigmoid, where attn_gate is on), and `logits` (after
μP's 1/m). The model runs without the fused input matmul (fused_qkv=False), the same
parameters and numbers up to rounding, so that every module's own forward runs and can be hooked.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch

from model import GPT
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.data.batches import get_batch
from nonlinear_queries.trainer.optimizers import build_optimizers, set_learning_rates


@dataclass
class CoordCheck:
    """The mean |x| of every activation: `values[name]` is a float array (len(widths), len(seeds), steps); step s
    is the forward pass after s updates."""

    widths: list
    seeds: list
    steps: int
    parametrization: str
    values: dict

    def slopes(self):
        """{name: array (steps,)}: the least-squares slope of log(mean over seeds of mean |x|) against log(width)
        at each step. 0 = the activation keeps its size as the width grows; 1 = it grows in proportion."""
        x = np.log(np.asarray(self.widths, dtype=float))
        return {name: np.polyfit(x, np.log(v.mean(axis=1)), 1)[0] for name, v in self.values.items()}


def record_activations(model, sink):
    """Forward hooks on `model` (a GPT) that add each activation's mean |x| to sink[name] (a list) at every forward
    pass; returns their handles. The logits are recorded by the caller, after μP's multiplier."""
    handles = [model.transformer.drop.register_forward_hook(lambda m, i, out: sink["embedding"].append(
        out.abs().mean().item()))]
    for i, block in enumerate(model.transformer.h):
        hooked = {f"attn_{i}": block.attn, f"mlp_{i}": block.mlp, f"query_{i}": block.attn.query}
        if hasattr(block.attn.query, "f"):  # the learned branch f(x) ends in the module's own LayerNorm
            hooked[f"query_f_{i}"] = block.attn.query.ln
        if block.attn.c_gate is not None:  # the scores: the sigmoid would hide their growth
            hooked[f"gate_{i}"] = block.attn.c_gate
        for name, module in hooked.items():
            handles.append(module.register_forward_hook(
                lambda m, i, out, name=name: sink.setdefault(name, []).append(out.abs().mean().item())))
    return handles


def coord_check(settings, widths, seeds, steps, learning_rate, data, head_dim=32):
    """Run the coordinate check.

    settings: TrainConfig settings of the model and optimizer (e.g. a config file's, parsed); each width w gets
    n_embd = w and n_head = w / head_dim (width grown by heads at a fixed head size, as μP's base width
    assumes), fused_qkv off, a constant `learning_rate` with no warmup, no decay, no clipping and no dropout.
    data: a uint16 token array (a memmap of train.bin); seed s draws the batches (the same at every width) and
    the init. Returns a CoordCheck. Raises ValueError for a width that head_dim does not divide."""
    values = {}
    for w_index, width in enumerate(widths):
        if width % head_dim:
            raise ValueError(f"width {width} is not a multiple of head_dim={head_dim}")
        cfg = TrainConfig(**{**settings, "n_embd": width, "n_head": width // head_dim, "fused_qkv": False,
                             "dropout": 0.0, "learning_rate": learning_rate, "decay_lr": False, "grad_clip": 0.0,
                             "compile": False, "device": "cpu"})
        for s_index, seed in enumerate(seeds):
            torch.manual_seed(seed)
            model = GPT(cfg.model_config())
            optimizers = build_optimizers(model, cfg, "cpu")
            set_learning_rates(optimizers, learning_rate, cfg)
            starts = np.random.default_rng(seed).integers(0, len(data) - cfg.block_size - 1,
                                                          (steps, cfg.batch_size))
            sink = {"embedding": [], "logits": []}
            handles = record_activations(model, sink)
            for step in range(steps):
                x, y = get_batch(data, starts[step], cfg.block_size, "cpu")
                logits, loss = model(x, y)
                sink["logits"].append(logits.abs().mean().item())
                loss.backward()
                for opt in optimizers:
                    opt.step()
                    opt.zero_grad(set_to_none=True)
            for handle in handles:
                handle.remove()
            for name, series in sink.items():
                values.setdefault(name, np.zeros((len(widths), len(seeds), steps)))[w_index, s_index] = series
    return CoordCheck(list(widths), list(seeds), steps, settings.get("parametrization", "sp"), values)


def slope_summary(check, from_step=2):
    """{name: (the largest slope over steps >= from_step, the smallest, the slope at the last step)}."""
    return {n: (float(s[from_step:].max()), float(s[from_step:].min()), float(s[-1]))
            for n, s in check.slopes().items()}


def slope_cell(slope):
    """A slope as the table prints it: signed, two decimals, and no '-0.00'."""
    return f"{slope + 0.0:+.2f}" if round(slope, 2) != 0 else "+0.00"


def widths_label(widths):
    """'64, 128, 256, 512 (log2 6-9)' for a figure's caption."""
    return ", ".join(map(str, widths)) + f" (log2 {math.log2(widths[0]):g}-{math.log2(widths[-1]):g})"


def coordinates(checks):
    """The coordinate check's figure (analyze.py --coord_check): one row per activation, one column per
    parametrization (CoordCheck), the mean over seeds of mean |x| against the width on log-log axes,
    one line per step from light (step 0) to dark (the last), each panel titled with the slope's range over
    steps >= 2. A flat fan of lines is what μP promises; lines that climb with the width are SP's blow-up."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    names = list(checks[0].values)
    fig = Figure(figsize=(4.5 * len(checks), 2.1 * len(names)), layout="constrained")
    axes = fig.subplots(len(names), len(checks), sharex=True, sharey="row", squeeze=False)
    shades = colormaps["viridis_r"](np.linspace(0.15, 1.0, checks[0].steps))
    for column, check in enumerate(checks):
        summary = slope_summary(check)
        label = {"sp": "SP", "mup": "μP"}[check.parametrization]
        for row, name in enumerate(names):
            ax = axes[row][column]
            means = check.values[name].mean(axis=1)
            for step in range(check.steps):
                ax.plot(check.widths, means[:, step], marker=".", color=shades[step],
                        label=f"step {step}" if row == 0 and step in (0, check.steps - 1) else None)
            high, low, _ = summary[name]
            ax.set_title(f"{label}: {name}, slope {slope_cell(low)} to {slope_cell(high)}", fontsize="small")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(check.widths)
            ax.get_xaxis().set_major_formatter("{x:.0f}")
        axes[-1][column].set_xlabel("width n_embd")
    for row in axes:
        row[0].set_ylabel("mean |x|")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return fig
