"""
Compare runs written by train.py: the paper's Table 1, and with --plot its Figure 1.

    python compare.py out-baseline out-res-gelu                    # baseline = the first run's group
    python compare.py sweeps/seeds --baseline=baseline             # a sweep directory: one run per subdirectory
    python compare.py out-* --step=59000 --format=markdown         # the paper's step, a table for RESULTS.md
    python compare.py sweeps/lr --group_over=seed,data_seed --format=csv > lr.csv
    python compare.py out-baseline out-res-gelu --plot=figure1.png
    python compare.py out-mini/* --best_over=learning_rate         # each arm at its own best learning rate
    python compare.py out-baseline out-res-gelu --metric=hellaswag/acc_norm   # a downstream score beside val loss
    python compare.py results/ablations/{baseline,res_gelu} --best_over=learning_rate --select_on=seed=0 --holm --paired
    python compare.py results/width_transfer/* --width_transfer --plot=transfer.png   # the best rate per width
    python compare.py results/width_ladder/* --width_ladder --seeds=1,2,3,4,5         # the gap per width, its slope

Runs whose settings are equal except for --group_over (default: seed) and for settings that
cannot change the numbers (paths, logging, compile, ...) form a group, one row of the table:
the mean ± sample std of the validation loss over the group's n runs at one eval step, by
default the last step that every run that did not diverge has reached. rel. improvement is
(L_base - L) / L_base of the group means in percent (the paper's Table 1; positive = lower loss than the
baseline); p is Welch's t-test against the baseline group when both have n >= 2. A run that
diverged is left out of its group's mean and n, and its row says so. --metric=TASK/METRIC
(train.py's eval_tasks: the `downstream` records) adds a column with that score at the same
step, mean ± sample std over the group's runs like the loss.

A run's history is its metrics.jsonl as it stands now: a `config` record at step s (a
restart) replaces what an earlier session logged after step s, and of records logged twice
the later one counts. A setting missing from an older run's config (one added to train.py
later) counts as today's default, which reproduces what the older code did. --seeds keeps only the runs
with those seeds (e.g. the held-out ones).

Across widths (nonlinear_queries/width.py, docs/width.md): --width_transfer tables each arm's mean val loss
at every learning rate per width and parametrization, where the best rate sits and whether it transfers;
--width_ladder each arm's relative improvement over the baseline at each width (runs paired by seed, 95% CI)
and its slope against log2(width); with --plot, their figures instead of Figure 1. Exit status: 0 ok; 1 bad
input; 2 bad command line.
"""

import nonlinear_queries.interrupt  # noqa: F401  (first: Ctrl-C at any moment ends with one line)

import argparse
import json
import os
import sys

from nonlinear_queries import runs as rd
from nonlinear_queries import stats
from nonlinear_queries.cli import run_main
from nonlinear_queries.plots import Curve, curve, figure2, loss_curves

FOOTER = ("val loss: mean ± sample std (ddof=1) over the group's n runs; p: Welch's t-test vs the baseline "
          "(n >= 2 in both); rel. improvement = (L_base - L) / L_base of the means, positive = lower loss")
# the diagnostics --with_diag shows when it names none: the attention-logit growth and the attention's entropy
DEFAULT_DIAG = ("attn_logit_max", "attn_entropy")
HOLM_NOTE = "p (Holm): Holm-Bonferroni adjusted over the {m} rows compared with the baseline"
PAIRED_NOTE = ("paired Δ: L - L_base over the runs of the row and the baseline with equal {keys} (same init, same "
               "batches), mean ± sample std, (k) = number of pairs where it is not n; paired p: the paired t-test")


def die(message):
    """Print `error: message` to stderr and exit with status 1 (bad input)."""
    sys.exit(f"error: {message}")


def summarize(group, step, value=rd.val_loss):
    """The Row of value(run, step) (by default the val loss, nats per token) over the group's runs that did not
    diverge and have one at `step`, and which runs are left out."""
    alive = [r for r in group.runs if r.diverged is None]
    values = [v for v in (value(r, step) for r in alive) if v is not None]
    diverged = [r.diverged for r in group.runs if r.diverged is not None]
    return stats.Row.of(values, diverged, len(alive) - len(values), len(group.runs))


def parse_select(spec, group_over):
    """{key: value} of --select_on='key=value[,key=value...]', values as Python literals (seed=0 is the int 0).
    Exits with a message for a malformed spec or a key outside --group_over: the tuning runs must be runs of the
    same groups as the reported ones, differing only in the pooled keys."""
    # imported here: only --select_on needs it
    import ast

    select = {}
    for item in spec.split(","):
        key, sep, raw = item.partition("=")
        if not sep or not key or not raw:
            die(f"--select_on={spec}: write key=value, e.g. --select_on=seed=0")
        if key not in group_over:
            die(f"--select_on={spec}: {key} is not pooled over (--group_over={','.join(sorted(group_over))}); the "
                f"tuning runs must differ from the reported ones only in pooled keys, e.g. the seed")
        try:
            select[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            select[key] = raw
    return select


def split_groups(groups, select):
    """(tuning, held_out): each group twice, under its label, with only its runs whose config matches every
    key=value of `select`, and with only the others."""
    def tuning(run):
        return all(run.config.get(k) == v for k, v in select.items())

    return ([rd.Group(g.label, [r for r in g.runs if tuning(r)]) for g in groups],
            [rd.Group(g.label, [r for r in g.runs if not tuning(r)]) for g in groups])


def family(group, skip):
    """The settings of a group apart from the keys in `skip`, as a comparable string."""
    return json.dumps({k: v for k, v in group.runs[0].config.items() if k not in skip}, sort_keys=True)


def best_of(groups, rows, skip):
    """Of the groups whose settings differ only in keys in `skip` (say, learning_rate), the one with the lowest
    mean val loss; groups without a value lose. Returns [(group, row)] in order of first appearance."""
    families = {}
    for group, row in zip(groups, rows):
        families.setdefault(family(group, skip), []).append((group, row))
    return [min(members, key=lambda m: (m[1].mean is None, m[1].mean or 0.0)) for members in families.values()]


def checked_names(option, asked, known, what, how):
    """The comma-separated names of `asked` (an --option's value) as a list, each checked to be among `known`
    (the names the runs have); exits naming the first that is not, with the ones there are, or with `how` to
    get any."""
    names, known = [n for n in asked.split(",") if n], sorted(set(known))
    for name in names:
        if name not in known:
            die(f"{option}={name}: no run has that {what}; they have "
                + (", ".join(known) if known else f"none ({how})"))
    return names


def loss_cell(row):
    """The val loss column's text: mean ± std, or why there is no value, and which runs are left out."""
    if len(row.diverged) == row.runs:
        return f"diverged at {stats.step_list(row.diverged)}"
    value = "not reached" if row.n == 0 else stats.pm_cell(row.mean, row.std)
    notes = [f"{len(row.diverged)} of {row.runs} diverged at {stats.step_list(row.diverged)}"] if row.diverged else []
    notes += [f"{row.not_reached} of {row.runs} not reached"] if row.not_reached and row.n else []
    return value + (f" ({'; '.join(notes)})" if notes else "")


def metric_cell(row):
    """A downstream score's column text: mean ± std over the runs that have it, and how many do not."""
    if row.n == 0:
        return "not evaluated"
    missing = f" ({row.not_reached} of {row.runs} not evaluated)" if row.not_reached else ""
    return stats.pm_cell(row.mean, row.std) + missing


def table(groups, rows, step, fmt, metrics, metric_rows, opts):
    """(header, lines, left) of the table: csv with full precision, else the human-readable cells. metrics: the
    names of the --metric and --with_diag columns; metric_rows[i]: group i's Rows of them, in that order. opts:
    the optional columns: "select" (the --select_on text: row.tuning), "holm" (row.p_holm), "paired"."""
    select, holm_on, paired_on = opts.get("select"), opts.get("holm"), opts.get("paired")
    if fmt == "csv":
        header = (["run", "query_mode", "non_embedding_params", "learning_rate", "min_lr", "weight_decay", "step",
                   "val_loss_mean", "val_loss_std", "n", "rel_improvement_pct", "p", "diverged", "not_reached"]
                  + (["tuning_val_loss_mean", "tuning_val_loss_std", "tuning_n"] if select else [])
                  + (["p_holm"] if holm_on else [])
                  + (["paired_diff_mean", "paired_diff_std", "paired_n", "paired_p"] if paired_on else [])
                  + (["paired_p_holm"] if paired_on and holm_on else [])
                  + [f"{m}_{k}" for m in metrics for k in ("mean", "std", "n")])
        lines = []
        for group, row, scores in zip(groups, rows, metric_rows):
            cfg, pair = group.header["config"], row.paired
            lines.append([group.label, cfg["query_mode"], group.header["non_embedding_params"], cfg["learning_rate"],
                          cfg["min_lr"], cfg["weight_decay"], step, row.mean, row.std, row.n, row.rel, row.p,
                          " ".join(map(str, row.diverged)), row.not_reached]
                         + ([row.tuning.mean, row.tuning.std, row.tuning.n] if select else [])
                         + ([row.p_holm] if holm_on else [])
                         + ([pair.mean, pair.std, pair.n, pair.p] if paired_on else [])
                         + ([pair.p_holm] if paired_on and holm_on else [])
                         + [x for m in scores for x in (m.mean, m.std, m.n)])
        return header, lines, []
    # text columns and the val loss and scores (which may carry a note) align left, numbers right
    columns = [("run", True), ("query", True), ("non-emb params", False), ("max lr", False), ("min lr", False),
               ("weight decay", False)]
    columns += [(f"val loss @ {step}, {select} (selection)", True)] if select else []
    columns += [(f"val loss @ {step}", True), *((f"{m} @ {step}", True) for m in metrics), ("n", False),
                ("rel. improvement (%)", False), ("p", False)]
    columns += [("p (Holm)", False)] if holm_on else []
    columns += [("paired Δ", True), ("paired p", False)] if paired_on else []
    columns += [("paired p (Holm)", False)] if paired_on and holm_on else []
    lines = []
    for group, row, scores in zip(groups, rows, metric_rows):
        cfg, pair, tuned = group.header["config"], row.paired, row.tuning
        cells = [group.label, cfg["query_mode"], f"{group.header['non_embedding_params']:,}",
                 f"{cfg['learning_rate']:g}", f"{cfg['min_lr']:g}", f"{cfg['weight_decay']:g}"]
        cells += [stats.pm_cell(tuned.mean, tuned.std) + (f" ({tuned.n})" if tuned.n != 1 else "")] if select else []
        cells += [loss_cell(row), *(metric_cell(m) for m in scores), str(row.n),
                  "-" if row.rel is None else f"{row.rel:.2f}", stats.p_cell(row.p)]
        cells += [stats.p_cell(row.p_holm)] if holm_on else []
        if paired_on:
            shown = pair.mean is not None and pair.n != row.n
            cells += [stats.pm_cell(pair.mean, pair.std) + (f" ({pair.n})" if shown else ""), stats.p_cell(pair.p)]
            cells += [stats.p_cell(pair.p_holm)] if holm_on else []
        lines.append(cells)
    return [c for c, _ in columns], lines, [lft for _, lft in columns]


def notes(rows, metrics, opts):
    """The footer of the text and markdown tables: what the columns mean."""
    out = [FOOTER]
    if any(not m.startswith("diag/") for m in metrics):
        out.append("downstream scores (train.py's eval_tasks): mean ± sample std over the runs that have them at "
                   "this step")
    if any(m.startswith("diag/") for m in metrics):
        out.append("diag/NAME: the diagnostic's mean over the layers (diagnostics.py), then mean ± sample std over "
                   "the runs")
    if opts.get("holm"):
        out.append(HOLM_NOTE.format(m=sum(r.p is not None for r in rows)))
    if opts.get("paired"):
        out.append(PAIRED_NOTE.format(keys=", ".join(sorted(opts["keys"]))))
    return "; ".join(out)


def parser():
    """compare.py's command line."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_dirs", nargs="+", metavar="OUT_DIR", help="run directories, or directories of runs")
    p.add_argument("--group_over", default="seed",
                   help="comma-separated config keys whose runs are pooled into one row (default: seed)")
    p.add_argument("--baseline", help="group label or run directory of the baseline (default: the first run)")
    p.add_argument("--step", type=int,
                   help="eval step to tabulate (default: the last one that every run that did not diverge has)")
    p.add_argument("--best_over", default="",
                   help="comma-separated config keys, e.g. learning_rate: of the groups that differ only in them, "
                        "show the one with the lowest mean val loss (a tuned-vs-tuned comparison)")
    p.add_argument("--select_on", default="", metavar="KEY=VALUE",
                   help="with --best_over: choose each arm's setting on the runs with KEY=VALUE (e.g. seed=0, the "
                        "tuning seed) only, and report only the other runs")
    p.add_argument("--holm", action="store_true",
                   help="add Holm-Bonferroni adjusted p-values over all rows compared with the baseline")
    p.add_argument("--paired", action="store_true",
                   help="add the paired comparison with the baseline: runs with equal --group_over values (same "
                        "seed: same init and batches), mean ± std of L - L_base and the paired t-test's p")
    p.add_argument("--with_diag", nargs="?", const=",".join(DEFAULT_DIAG), default="", metavar="NAMES",
                   help="add the diagnostics (diagnostics.py) at the step as columns, each a mean over the "
                        f"layers, then over the runs (default names: {', '.join(DEFAULT_DIAG)})")
    p.add_argument("--format", choices=["text", "markdown", "csv"], default="text")
    p.add_argument("--plot", metavar="PNG", help="also draw Figure 1 (loss and rel. improvement vs step) here")
    p.add_argument("--figure2", metavar="PNG", help="also draw Figure 2 here: each group's rel. improvement over "
                   "the baseline vs step, labelled with its non-embedding parameters (docs/official.md)")
    p.add_argument("--seeds", default="", metavar="S,S,...",
                   help="only the runs whose seed is one of these (e.g. the held-out seeds of a study)")
    width = p.add_mutually_exclusive_group()
    width.add_argument("--width_transfer", action="store_true",
                       help="per arm, parametrization and width: the val loss of every learning rate, the best "
                            "rate, and whether the base width's best rate transfers (docs/width.md)")
    width.add_argument("--width_ladder", action="store_true",
                       help="each arm's relative improvement over the baseline at each width, paired by seed, with "
                            "its 95%% CI, and its slope against log2(width) (docs/width.md)")
    p.add_argument("--claim", action="append", default=[], metavar="WIDTH:PERCENT:LABEL",
                   help="with --width_ladder --plot: a value claimed elsewhere (e.g. the paper's), noted under "
                        "the figure as a claim, not drawn as data")
    p.add_argument("--metric", default="", metavar="TASK/METRIC",
                   help="comma-separated downstream scores (train.py's eval_tasks), e.g. hellaswag/acc_norm: a "
                        "column each, at the same step, mean ± std over each row's runs")
    return p


def select_held_out(groups, baseline, step, args, group_over):
    """--select_on: (groups, rows, baseline) of each arm at its --best_over setting chosen on the tuning runs
    (KEY=VALUE), reported over the other runs; each row's `tuning` holds the tuning runs' Row."""
    tuning, held_out = split_groups(groups, parse_select(args.select_on, group_over))
    skip = rd.IGNORED_KEYS | group_over | set(args.best_over.split(","))
    tuned = [(t, summarize(t, step)) for t in tuning if t.runs]
    if not tuned:
        die(f"--select_on={args.select_on}: no run has {args.select_on}, so there is nothing to choose on")
    families = {family(t, skip) for t, _ in tuned}
    orphans = [h.label for h in held_out if h.runs and family(h, skip) not in families]
    if orphans:
        die(f"--select_on={args.select_on}: no run of the arm of {', '.join(orphans)} has {args.select_on}, so "
            f"its {args.best_over} cannot be chosen; run its grid with {args.select_on}")
    # each arm's best setting on its tuning runs, the baseline's arm included; reported on the other runs
    kept = best_of([t for t, _ in tuned], [r for _, r in tuned], skip)
    untuned = [t.label for t, row in kept if row.mean is None]
    if untuned:
        die(f"--select_on={args.select_on}: no tuning run of {', '.join(untuned)} has a val loss at step {step}")
    reported = {h.label: h for h in held_out}
    missing = [t.label for t, _ in kept if not reported[t.label].runs]
    if missing:
        die(f"--select_on={args.select_on}: {', '.join(missing)}, chosen on the tuning runs, has no other runs "
            f"to report; run its held-out seeds at that setting")
    base_family = family(baseline, skip)
    baseline = next(reported[t.label] for t, _ in kept if family(t, skip) == base_family)
    groups = [reported[t.label] for t, _ in kept]
    rows = [summarize(g, step) for g in groups]
    for row, (_, tuning_row) in zip(rows, kept):
        row.tuning = tuning_row
    return groups, rows, baseline


def main(argv=None):
    """Read the runs named on the command line, print the table and, with --plot, write the figure."""
    cli = parser()
    args = cli.parse_args(argv)
    if args.select_on and not args.best_over:
        cli.error("--select_on chooses each arm's --best_over setting on the tuning runs; give --best_over too, "
                  "e.g. --best_over=learning_rate")
    for option, path in (("--plot", args.plot), ("--figure2", args.figure2)):
        if path:
            check_writable(option, path)
    try:
        report(args)
    except rd.RunsError as e:
        die(str(e))


def check_writable(option, path):
    """Exit naming `option` where the figure could not be saved at `path`, before the runs are read, not after."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        die(f"{option}={path} is a directory; name the image file to write, e.g. "
            f"{option}={os.path.join(path, 'figure.png')}")
    if not os.path.isdir(directory):
        die(f"{option}={path}: there is no directory {directory}; create it (mkdir -p {directory}) or name a file in "
            f"a directory that exists")


def report(args):
    """The table (and figure) of main(); raises RunsError for runs that cannot be compared as asked."""
    runs, group_over = rd.read_runs(args.out_dirs, args.group_over)
    rd.check_keys(runs, "--best_over", [k for k in args.best_over.split(",") if k])
    if args.seeds:
        runs = [r for r in runs if str(r.config.get("seed")) in args.seeds.split(",")]
        if not runs:
            die(f"--seeds={args.seeds}: no run has one of these seeds")
    if args.width_transfer or args.width_ladder:
        return width_report(runs, args)
    metrics = checked_names("--metric", args.metric, [s for r in runs for d in r.downstream.values() for s in d],
                            "downstream score", "train with eval_tasks to get them")
    diags = checked_names("--with_diag", args.with_diag, [n for r in runs for d in r.diags.values() for n in d],
                          "diagnostic", "train with diagnostics=True to get them")
    groups = rd.make_groups(runs, group_over)
    for note in filter(None, map(rd.numerics_note, groups)):
        print(note, file=sys.stderr)
    baseline = rd.find_baseline(groups, args.baseline)
    if args.step is None:
        step = default_step(runs)
        caption = f"val loss at step {step}, the last eval step that every run that did not diverge has reached"
    else:
        step, caption = args.step, f"val loss at step {args.step}"
        eval_steps = sorted(set().union(*(r.evals for r in runs)))
        if step not in eval_steps:
            die(f"--step={step} is not an eval step of any run; eval steps: {', '.join(map(str, eval_steps))}")
    opts = {"holm": args.holm, "paired": args.paired, "keys": group_over}
    if args.select_on:
        groups, rows, baseline = select_held_out(groups, baseline, step, args, group_over)
        opts["select"] = args.select_on
        caption += (f"; each row the {args.best_over} with the lowest mean val loss over its arm's runs with "
                    f"{args.select_on} (the selection column), reported over the other runs only")
    else:
        rows = [summarize(g, step) for g in groups]
        if args.best_over:
            # tuned against tuned: each family of groups keeps its best, the baseline's family included
            skip = rd.IGNORED_KEYS | group_over | set(args.best_over.split(","))
            kept = best_of(groups, rows, skip)
            baseline = next(g for g, _ in kept if family(g, skip) == family(baseline, skip))
            groups, rows = [g for g, _ in kept], [r for _, r in kept]
            caption += f"; each row the best {args.best_over} of its arm (lowest mean val loss at this step)"
    base_row = rows[groups.index(baseline)]
    for group, row in zip(groups, rows):
        row.rel, row.p = stats.rel_improvement(row, base_row), stats.welch_p(row, base_row)
        if args.paired:
            row.paired = stats.paired_t(rd.paired_losses(group, step, group_over),
                                  rd.paired_losses(baseline, step, group_over), same=group is baseline)
    for row, p in zip(rows, stats.holm([r.p for r in rows])):
        row.p_holm = p
    if args.paired:
        for row, p in zip(rows, stats.holm([r.paired.p for r in rows])):
            row.paired.p_holm = p
    caption += f"; baseline: {baseline.label}; runs pooled over {', '.join(sorted(group_over))}"
    values = [rd.downstream_score(m) for m in metrics] + [rd.diag_value(d) for d in diags]
    metric_rows = [[summarize(g, step, v) for v in values] for g in groups]
    names = metrics + [f"diag/{d}" for d in diags]
    header, lines, left = table(groups, rows, step, args.format, names, metric_rows, opts)
    if args.format != "csv":
        print(caption + "\n")
    stats.print_table(header, lines, args.format, left)
    if args.format != "csv":
        print("\n" + notes(rows, names, opts))
    if args.plot:
        loss_curves(groups, baseline).savefig(args.plot, dpi=150)
        # the csv on stdout stays machine-readable
        print(f"wrote {args.plot}", file=sys.stderr if args.format == "csv" else sys.stdout)
    if args.figure2:  # the groups with a run that did not diverge, each its mean val loss
        arms = [(g, *curve(g)) for g in groups if any(r.diverged is None for r in g.runs)]
        if all(g is not baseline for g, _, _ in arms):
            die(f"--figure2: every run of the baseline {baseline.label} diverged; choose another with --baseline")
        curves = [Curve(g.label, g.header["non_embedding_params"], s, v[:, :, 1].mean(axis=0)) for g, s, v in arms]
        figure2(curves, baseline.label).savefig(args.figure2, dpi=150)
        print(f"wrote {args.figure2}", file=sys.stderr if args.format == "csv" else sys.stdout)


def default_step(runs):
    """rd.default_step, saying on stderr when a run still training holds it back (rd.unfinished_note)."""
    step = rd.default_step(runs)
    note = rd.unfinished_note(runs, step)
    if note:
        print(note, file=sys.stderr)
    return step


def width_report(runs, args):
    """--width_transfer or --width_ladder: its tables at --step (default: the last step every run has), and with
    --plot its figure (nonlinear_queries/width.py)."""
    # imported here: only the width tables need them (the ladder builds each model on the meta device)
    from nonlinear_queries import width
    from nonlinear_queries.plots import rate_transfer, width_ladder

    step = args.step if args.step is not None else default_step(runs)
    if args.width_transfer:
        base_width = runs[0].config.get("mup_base_width", 128)
        curves = width.transfer_curves(runs, step)
        (header, rows), (vheader, vrows) = width.transfer_tables(curves, base_width)
        verdicts = width.transfer_verdicts(curves, base_width)
        caption = (f"val loss at step {step}, the mean over each rate's seeds; bold: the best rate of the row. A run "
                   f"at the μP base width {base_width} (m = 1) counts as SP and as μP, which are equal there")
        vcaption = (f"transfer holds: the best rate moves by at most one x2 step from the smallest width to the "
                    f"largest, and width {base_width}'s best rate costs at most 1% of val loss at the largest")
        figure = (lambda: rate_transfer(curves, verdicts, step, base_width))  # noqa: E731
    else:
        try:
            rungs, slopes, baseline = width.ladder(runs, step, args.baseline)
        except ValueError as e:
            die(str(e))
        (header, rows), (vheader, vrows) = width.ladder_tables(rungs, slopes, baseline)
        caption = (f"val loss at step {step}; rel. improvement = 100 (L_base - L) / L_base over the runs paired by "
                   f"seed and data_seed with the baseline {baseline} at the same width (positive = lower loss), its "
                   f"95% t interval and the paired t-test's p; MDE: the smallest gap detected with 80% power at "
                   f"these n and stds by the paired test (the p given) and, for comparison, by Welch's test on the "
                   f"same runs (in % of the baseline's loss); training PFLOPs: 6N + attention per token times the "
                   f"run's tokens")
        vcaption = ("slope: least squares of each pair's rel. improvement on log2(width), in percentage points per "
                    "doubling; the gap grows or shrinks only where its 95% interval excludes 0; MDE: the smallest "
                    "slope its t-test detects with 80% power, and that slope times the doublings the widths span")
        claims = []
        for spec in args.claim:
            w, percent, label = (spec.split(":", 2) + ["", ""])[:3]
            try:
                claims.append((int(w), float(percent), label))
            except ValueError:
                die(f"--claim={spec}: write WIDTH:PERCENT:LABEL, e.g. --claim=768:1.40:the paper")
        figure = (lambda: width_ladder(rungs, slopes, baseline, claims, width.setting(runs, step)))  # noqa: E731
    tables = [(header, rows, caption), (vheader, vrows, vcaption)]
    if args.width_ladder:  # the pooled test declared for the ladder's fresh seeds (results/width_ladder/README.md)
        tables.append((*width.pooled_table(width.pooled_tests(rungs)), width.POOLED_CAPTION))
    for head, lines, text in tables:
        if args.format != "csv":
            print(text + "\n")
        stats.print_table(head, lines, args.format, [True])
        if args.format != "csv":
            print()
    if args.plot:
        figure().savefig(args.plot, dpi=150)
        print(f"wrote {args.plot}", file=sys.stderr if args.format == "csv" else sys.stdout)


if __name__ == "__main__":
    sys.exit(run_main(main))
