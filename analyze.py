"""
What the query learns: the per-layer diagnostics of diagnostics.py over training, from runs' metrics.jsonl,
or for one model.

    python analyze.py out-mini/baseline out-mini/res_gelu                     # a table at the last common step
    python analyze.py out-diag/* --step=600 --format=markdown --plot=diag.png
    python analyze.py --checkpoint=out-mini/res_gelu/learning_rate=3e-3,seed=1   # one model, per layer
    python analyze.py --checkpoint=gpt2 --data_dir=data/openwebtext           # any source load_model loads
    python analyze.py --coord_check=config/mini/res_gelu.py --plot=coord.png   # μP's coordinate check

Runs: the `diag` records that train.py writes at every evaluation, read, grouped and pooled as compare.py
does it (run directories or directories of runs; runs that differ only in --group_over, default seed, form a
group; a run that diverged is left out of a group that has others, and a group whose runs all diverged keeps
them up to where they stopped). Each diagnostic is averaged over the layers, then over a group's runs.

- The table, at --step (default: the last diag step that every run that did not diverge has): one row per
  diagnostic, the val loss first, one column per group: mean ± sample std (ddof=1) over its runs. csv gives
  one line per group and diagnostic, in full precision.
- --plot: one panel per diagnostic over the steps (the group's mean, a band from its lowest to its highest
  run), then for each group a layers x steps heatmap of attn_logit_max (the mean over its runs), all on one
  color scale.

--checkpoint=SOURCE: the diagnostics of one model, anything pretrained.load_model loads (a run directory or
checkpoint of this repo, the official code's checkpoints, a Hugging Face GPT-2 directory, gpt2), one row
per layer. A run's checkpoint is measured on the first diagnostics_batches of its own val_eval batches (its
dataset or data_dir, data_seed, batch_size and block_size), so the numbers are those its metrics.jsonl holds
at that step; another source on the val.bin of --data_dir (default data/openwebtext) with train.py's
defaults. --batches and --batch_size override the number and size of the batches.

--coord_check=CONFIG: μP's coordinate check (nonlinear_queries/evaluation/coord_check.py, docs/width.md) of a config's
model, under SP and under μP: --widths (head size 32, width grown by heads), --coord_n_layer layers, --coord_steps
steps of --coord_batch tokens at the constant rate --coord_lr, --coord_seeds; the mean |x| of every activation
at every step on the config's training data (--data_dir). The table gives, per activation and parametrization,
the largest and smallest slope of log mean|x| against log width over steps >= 2 and the slope at the last step;
--plot draws mean |x| against width at every step.

Exit status: 0 ok; 1 bad input; 2 bad command line.
"""

import nonlinear_queries.interrupt  # noqa: F401  (first: Ctrl-C at any moment ends with one line)

import argparse
import os
import sys
from dataclasses import asdict

import numpy as np

from nonlinear_queries.analysis.arms import layer_mean, make_arms, pooled, read_runs
from nonlinear_queries.analysis.plots import diagnostics as plot_diagnostics
from nonlinear_queries.analysis.stats import Row, print_table, step_list
from nonlinear_queries.cli import run_main
from nonlinear_queries.errors import ConfigError, PretrainedError, RunsError, SetupError

REPO = os.path.dirname(os.path.abspath(__file__))
ACTIVATIONS = ("attn_logit_max", "attn_logit_mean_max", "attn_entropy", "query_norm", "key_norm", "query_cos",
               "query_f_ratio")  # diagnostics.ACTIVATIONS, here without importing torch


def diagnostic_names(records):
    """The diagnostics of some `diag` records ({name: [value per layer]}) in the order of the README: the
    activations, then the weight norms as they first appear; names whose values are all None are left out."""
    seen = dict.fromkeys(n for r in records for n in r if n not in ACTIVATIONS)
    defined = {n for r in records for n, v in r.items() if any(x is not None for x in v)}
    return [n for n in [*ACTIVATIONS, *seen] if n in defined]


def die(message):
    """Print `error: message` to stderr and exit with status 1 (bad input)."""
    sys.exit(f"error: {message}")


def default_step(runs):
    """The largest diag step that every run that did not diverge has; an error if there is none."""
    alive = [r for r in runs if r.diverged is None] or runs
    common = set.intersection(*(set(r.diags) for r in alive))
    if not common:
        die("no diag step is common to all runs that did not diverge; pass --step=N")
    return max(common)


def stats(values):
    """(mean, sample std or None, n) of the values that are not None; (None, None, 0) without any."""
    row = Row.of([v for v in values if v is not None])
    return row.mean, row.std, row.n


def table(arms, names, step):
    """{arm label: {row: (mean, std, n)}} at `step`: the val loss and each diagnostic's layer mean over the
    arm's pooled runs that have that step."""
    out = {}
    for arm in arms:
        runs = pooled(arm)
        cells = {"val_loss": stats([r.evals[step][1] for r in runs if step in r.evals])}
        for name in names:
            cells[name] = stats([layer_mean(r.diags[step].get(name, [])) for r in runs if step in r.diags])
        out[arm.label] = cells
    return out


def cell(mean, std, n):
    """'mean ± std' with 4 significant digits, the mean alone for one run, '-' without a value."""
    if mean is None:
        return "-"
    return f"{mean:.4g}" + (f" ± {std:.3g}" if std is not None else "")


def print_runs_table(arms, names, step, values, fmt, group_over):
    """The table of the runs at `step` (module docstring)."""
    if fmt == "csv":
        print_table(["run", "step", "diagnostic", "mean", "std", "n"],
                    [[a.label, step, name, *cells] for a in arms for name, cells in values[a.label].items()], fmt)
        return
    print(f"diagnostics at step {step}: the mean over layers, then mean ± sample std over the group's runs; "
          f"runs pooled over {', '.join(sorted(group_over))}\n")
    header = ["diagnostic"] + [f"{a.label} (n={values[a.label]['attn_logit_max'][2]})" for a in arms]
    rows = [[name] + [cell(*values[a.label][name]) for a in arms] for name in ["val_loss", *names]]
    print_table(header, rows, fmt, [True])
    notes = []
    for arm in arms:
        diverged = [r.diverged for r in arm.runs if r.diverged is not None]
        if diverged:
            kept = "kept up to where they stopped" if len(diverged) == len(arm.runs) else "left out"
            notes.append(f"{arm.label}: {len(diverged)} of {len(arm.runs)} diverged at "
                         f"{step_list(diverged)}, {kept}")
    if notes:
        print("\n" + "\n".join(notes))


def analyze_runs(args):
    """Read the runs named on the command line, print the table and, with --plot, write the figure."""
    try:
        runs, group_over = read_runs(args.runs, args.group_over)
    except RunsError as e:
        die(str(e))
    empty = [r.out_dir for r in runs if not r.diags]
    if empty:
        die(f"{', '.join(empty)}: no diag records in metrics.jsonl (trained with diagnostics=False, or before "
            f"train.py had them); leave those runs out, or measure a checkpoint with --checkpoint")
    arms = make_arms(runs, group_over)
    if args.step is None:
        step = default_step(runs)
    else:
        step = args.step
        diag_steps = sorted(set().union(*(r.diags for r in runs)))
        if step not in diag_steps:
            die(f"--step={step} is not a diag step of any run; diag steps: {', '.join(map(str, diag_steps))}")
    names = diagnostic_names([d for r in runs for d in r.diags.values()])
    print_runs_table(arms, names, step, table(arms, names, step), args.format, group_over)
    if args.plot:
        plot_diagnostics(arms, names).savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}", file=sys.stderr if args.format == "csv" else sys.stdout)


def analyze_checkpoint(args):
    """Compute and print the diagnostics of the model at args.checkpoint, per layer."""
    # imported here: torch takes seconds, and the runs' table needs none of it
    from nonlinear_queries.config.train_config import TrainConfig
    from nonlinear_queries.data.batches import open_tokens, row_offsets
    from nonlinear_queries.evaluation.diagnostics import diagnose
    from nonlinear_queries.runtime.processes import setup
    from nonlinear_queries.weights.pretrained import load_model

    try:
        runtime = setup(args.device, args.dtype, join_process_group=False)
        model = load_model(args.checkpoint)
    except (SetupError, PretrainedError) as e:
        die(str(e))
    model.to(runtime.device)
    loaded, defaults = model.loaded_from, TrainConfig()
    run = loaded.run_config or {}
    data_dir = args.data_dir or run.get("data_dir") or os.path.join(REPO, "data", run.get("dataset", "openwebtext"))
    batch_size = args.batch_size or run.get("batch_size", defaults.batch_size)
    batches = args.batches or run.get("diagnostics_batches", defaults.diagnostics_batches)
    data_seed, block_size = run.get("data_seed", defaults.data_seed), model.config.block_size
    try:
        val = open_tokens(os.path.join(data_dir, "val.bin"), "the data set's prepare.py, or pass --data_dir")
    except FileNotFoundError as e:
        die(str(e))
    if len(val) <= block_size:
        die(f"{val.filename} holds {len(val)} tokens, fewer than block_size + 1 = {block_size + 1}")
    if int(val.max()) >= model.config.vocab_size:
        die(f"{val.filename} holds token ids up to {int(val.max())}, past the model's vocab_size "
            f"{model.config.vocab_size}: it is another tokenizer's data; pass the model's own with --data_dir")
    # the rows of the run's val_eval index file (batches.py), computed rather than read: nothing is written
    index = np.stack([row_offsets(data_seed, "val_eval", r, batch_size, len(val) - block_size)
                      for r in range(batches)])
    diag = diagnose(model, val, index, block_size, runtime.device, runtime.autocast)
    names = [n for n in diag if any(v is not None for v in diag[n])]
    step = f", step {loaded.step}" if loaded.step is not None else ""
    caption = (f"{loaded.path} ({loaded.kind}{step}), query_mode={model.config.query_mode}: diagnostics on "
               f"{batches} x {batch_size} sequences of {block_size} tokens of {val.filename} (val_eval, "
               f"data_seed {data_seed}), {runtime.device}, {runtime.dtype}")
    if args.format == "csv":
        print_table(["layer", *names], [[i, *(diag[n][i] for n in names)] for i in range(model.config.n_layer)], "csv")
        return
    print(caption + "\n")
    rows = [[str(i), *("-" if diag[n][i] is None else f"{diag[n][i]:.4g}" for n in names)]
            for i in range(model.config.n_layer)]
    print_table(["layer", *names], rows, args.format, [True])


def coord_check(args):
    """Run μP's coordinate check on args.coord_check's model, print the slopes and, with --plot, draw the figure."""
    # imported here: torch takes seconds, and the runs' table needs none of it
    from nonlinear_queries.config.configurator import parse_config
    from nonlinear_queries.config.train_config import TrainConfig
    from nonlinear_queries.data.batches import open_tokens
    from nonlinear_queries.evaluation import coord_check as cc

    try:
        batch_size, block_size = (int(n) for n in args.coord_batch.split("x"))
        cfg = parse_config(TrainConfig, [args.coord_check, f"--n_layer={args.coord_n_layer}",
                                         f"--batch_size={batch_size}", f"--block_size={block_size}"])[0]
        widths, seeds = [int(w) for w in args.widths.split(",")], [int(s) for s in args.coord_seeds.split(",")]
    except (ConfigError, ValueError) as e:
        die(f"--coord_check: {e}")
    data_dir = args.data_dir or cfg.data_dir or os.path.join(REPO, "data", cfg.dataset)
    try:
        data = open_tokens(os.path.join(data_dir, "train.bin"), f"python data/{cfg.dataset}/prepare.py")
    except FileNotFoundError as e:
        die(str(e))
    try:
        checks = [cc.coord_check({**asdict(cfg), "parametrization": p}, widths, seeds, args.coord_steps, args.coord_lr,
                                 data) for p in ("sp", "mup")]
    except ValueError as e:
        die(f"--coord_check: {e}")
    header = ["activation", *(f"{label} {what}" for label in ("SP", "μP")
                              for what in ("max slope", "min slope", "last slope"))]
    rows = [[name, *(cc.slope_cell(v) for c in checks for v in cc.slope_summary(c)[name])] for name in checks[0].values]
    if args.format != "csv":
        print(f"{args.coord_check} at {cc.widths_label(widths)}, {args.coord_n_layer} layers, {args.coord_steps} steps "
              f"of {args.coord_batch} tokens at learning rate {args.coord_lr:g}, seeds {args.coord_seeds}: slope of "
              f"log mean|x| against log width, the largest and smallest over steps >= 2 and at the last step (0: "
              f"the size holds as the width grows; 1: it grows with the width)\n")
    print_table(header, rows, args.format, [True])
    if args.plot:
        cc.coordinates(checks).savefig(args.plot, dpi=120)
        print(f"wrote {args.plot}", file=sys.stderr if args.format == "csv" else sys.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="*", metavar="RUN", help="run directories, or directories of runs")
    parser.add_argument("--checkpoint", metavar="SOURCE",
                        help="compute the diagnostics of one model instead: anything pretrained.load_model loads")
    parser.add_argument("--format", choices=["text", "markdown", "csv"], default="text")
    runs = parser.add_argument_group("runs")
    runs.add_argument("--group_over", default="seed",
                      help="comma-separated config keys whose runs are pooled into one column (default: seed)")
    runs.add_argument("--step", type=int, help="diag step of the table (default: the last one every run that "
                                               "did not diverge has)")
    runs.add_argument("--plot", metavar="PNG", help="also draw the diagnostics over steps and the heatmaps here")
    one = parser.add_argument_group("--checkpoint")
    one.add_argument("--data_dir", help="directory of the val.bin to measure on (default: the run's data, else "
                                        "data/openwebtext)")
    one.add_argument("--batches", type=int, default=0, help="val_eval batches (default: the run's "
                                                            "diagnostics_batches, else 1)")
    one.add_argument("--batch_size", type=int, default=0, help="sequences per batch (default: the run's, else 12)")
    one.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, ...")
    one.add_argument("--dtype", default="auto", help="auto (bfloat16 on CUDA, float32 on CPU), float32, ...")
    coord = parser.add_argument_group("--coord_check")
    coord.add_argument("--coord_check", metavar="CONFIG", help="run μP's coordinate check on this config's model")
    coord.add_argument("--widths", default="64,128,256,512", help="widths n_embd (multiples of 32)")
    coord.add_argument("--coord_seeds", default="0,1,2", help="seeds (init and batches)")
    coord.add_argument("--coord_steps", type=int, default=10, help="training steps recorded")
    coord.add_argument("--coord_lr", type=float, default=1e-2, help="the constant learning rate, deliberately high")
    coord.add_argument("--coord_n_layer", type=int, default=2, help="layers")
    coord.add_argument("--coord_batch", default="4x64", help="sequences x tokens of a step's batch")
    args = parser.parse_args()
    if sum(map(bool, (args.runs, args.checkpoint, args.coord_check))) != 1:
        parser.error("pass run directories, --checkpoint=SOURCE or --coord_check=CONFIG")
    if args.coord_check:
        return coord_check(args)
    if args.batches < 0 or args.batch_size < 0:
        parser.error("--batches and --batch_size must be >= 1 (0: the run's own)")
    if args.checkpoint:
        analyze_checkpoint(args)
    else:
        analyze_runs(args)


if __name__ == "__main__":
    sys.exit(run_main(main))
