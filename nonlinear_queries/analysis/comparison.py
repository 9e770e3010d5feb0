"""
compare.py's report as a library: runs read (runs.py), grouped into arms (arms.py), each arm's row at one eval
step (the paper's Table 1: mean ± std, relative improvement, Welch's and paired tests, Holm; an arm at its best
setting, chosen on tuning runs and reported on the others), downstream scores and diagnostics beside it, its
figures, and the width-transfer and width-ladder reports (width.py): `compare_parser`'s options in, `report`
printing and saving them.
"""

import argparse
import os
import sys

from nonlinear_queries.analysis import arms as ca  # the comparison arms
from nonlinear_queries.analysis import stats, width
from nonlinear_queries.analysis.plots import Curve, curve, figure2, loss_curves
from nonlinear_queries.analysis.table1 import notes, table
from nonlinear_queries.errors import RunsError

# the diagnostics --with_diag shows when it names none: the attention-logit growth and the attention's entropy
DEFAULT_DIAG = ("attn_logit_max", "attn_entropy")


def summarize(arm, step, value=ca.val_loss):
    """The Row of value(run, step) (by default the val loss, nats per token) over the arm's runs that did not
    diverge and have one at `step`, and which runs are left out."""
    alive = [r for r in arm.runs if r.diverged is None]
    values = [v for v in (value(r, step) for r in alive) if v is not None]
    diverged = [r.diverged for r in arm.runs if r.diverged is not None]
    return stats.Row.of(values, diverged, len(alive) - len(values), len(arm.runs))


def parse_select(spec, group_over):
    """{key: value} of --select_on='key=value[,key=value...]', values as Python literals (seed=0 is the int 0).
    Raises RunsError for a malformed spec or a key outside --group_over: the tuning runs must be runs of the
    same arms as the reported ones, differing only in the pooled keys."""
    # imported here: only --select_on needs it
    import ast

    select = {}
    for item in spec.split(","):
        key, sep, raw = item.partition("=")
        if not sep or not key or not raw:
            raise RunsError(f"--select_on={spec}: write key=value, e.g. --select_on=seed=0")
        if key not in group_over:
            raise RunsError(f"--select_on={spec}: {key} is not pooled over (--group_over="
                            f"{','.join(sorted(group_over))}); the tuning runs must differ from the reported ones only "
                            f"in pooled keys, e.g. the seed")
        try:
            select[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            select[key] = raw
    return select


def split_arms(arms, select):
    """(tuning, held_out): each arm twice, under its label, with only its runs whose config matches every
    key=value of `select`, and with only the others."""
    def tuning(run):
        return all(run.config.get(k) == v for k, v in select.items())

    return ([ca.Arm(a.label, [r for r in a.runs if tuning(r)]) for a in arms],
            [ca.Arm(a.label, [r for r in a.runs if not tuning(r)]) for a in arms])


def tuning_groups(arms, group_over, best_over):
    """Each arm's tuning group: its settings apart from IGNORED_KEYS, the pooled keys `group_over` and the tuned
    keys `best_over` (sets of config keys), as arms.arm_key writes them, so that arms of one group differ only in
    the tuned keys (say, learning_rate). A list in the order of `arms`."""
    skip = ca.IGNORED_KEYS | group_over | best_over
    return [ca.arm_key(arm.config, skip) for arm in arms]


def best_of(arms, rows, groups):
    """Of the arms of each tuning group (`groups`, each arm's: tuning_groups), the one with the lowest mean val
    loss; arms without a value lose. Returns [(arm, row, group)] in order of first appearance."""
    tuned = {}
    for arm, row, group in zip(arms, rows, groups):
        tuned.setdefault(group, []).append((arm, row, group))
    return [min(members, key=lambda m: (m[1].mean is None, m[1].mean or 0.0)) for members in tuned.values()]


def checked_names(option, asked, known, what, how):
    """The comma-separated names of `asked` (an --option's value) as a list, each checked to be among `known`
    (the names the runs have); raises RunsError naming the first that is not, with the ones there are, or with
    `how` to get any."""
    names, known = [n for n in asked.split(",") if n], sorted(set(known))
    for name in names:
        if name not in known:
            raise RunsError(f"{option}={name}: no run has that {what}; they have "
                            + (", ".join(known) if known else f"none ({how})"))
    return names


def compare_parser(description=None):
    """compare.py's command line (its options are report()'s), with `description` for --help."""
    p = argparse.ArgumentParser(prog="compare.py", description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
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
    p.add_argument("--effect_difference", nargs=3, metavar=("PLUS", "MINUS", "CONTROL"),
                   help="with --width_ladder: per seed and width D = g(PLUS) - g(MINUS) - g(CONTROL), the three "
                        "arms' gaps to the baseline (labels as the ladder prints them), and its test per width "
                        "and pooled, e.g. res_gelu_no_half res_gelu 'baseline attn_scale=0.35355339059327373'")
    p.add_argument("--pooled_plot", action="store_true",
                   help="with --width_ladder --plot: draw each arm's pooled gap over the widths (the declared model "
                        "of results/width_ladder) and, with --effect_difference, D, with their 95%% intervals, "
                        "instead of the per-width figure and its slope")
    p.add_argument("--metric", default="", metavar="TASK/METRIC",
                   help="comma-separated downstream scores (train.py's eval_tasks), e.g. hellaswag/acc_norm: a "
                        "column each, at the same step, mean ± std over each row's runs")
    return p


def parse_args(argv, description=None):
    """compare.py's arguments `argv` (a list of strings; None: sys.argv[1:]) parsed and their combinations
    checked: report()'s `args`. A bad command line is argparse's: usage and the error on stderr, then
    SystemExit(2)."""
    cli = compare_parser(description)
    args = cli.parse_args(argv)
    if args.select_on and not args.best_over:
        cli.error("--select_on chooses each arm's --best_over setting on the tuning runs; give --best_over too, "
                  "e.g. --best_over=learning_rate")
    if args.pooled_plot and not (args.width_ladder and args.plot):
        cli.error("--pooled_plot draws the width ladder's pooled tests; give --width_ladder and --plot too")
    if args.effect_difference and not args.width_ladder:
        cli.error("--effect_difference compares three arms' gaps on the width ladder; give --width_ladder too")
    return args


def select_held_out(arms, baseline, step, args, group_over):
    """--select_on: (arms, rows, baseline) of each arm at its --best_over setting chosen on the tuning runs
    (KEY=VALUE), reported over the other runs; each row's `tuning` holds the tuning runs' Row. Raises RunsError
    where an arm cannot be chosen on the tuning runs or has no other runs to report."""
    tuning, held_out = split_arms(arms, parse_select(args.select_on, group_over))
    # an arm's tuning runs and its other runs share its group: its runs differ only in pooled keys
    groups = tuning_groups(arms, group_over, set(args.best_over.split(",")))
    tuned = [(t, summarize(t, step), group) for t, group in zip(tuning, groups) if t.runs]
    if not tuned:
        raise RunsError(f"--select_on={args.select_on}: no run has {args.select_on}, so there is nothing to "
                        f"choose on")
    keys = {group for _, _, group in tuned}
    orphans = [h.label for h, group in zip(held_out, groups) if h.runs and group not in keys]
    if orphans:
        raise RunsError(f"--select_on={args.select_on}: no run of the arm of {', '.join(orphans)} has "
                        f"{args.select_on}, so its {args.best_over} cannot be chosen; run its grid with "
                        f"{args.select_on}")
    # each arm's best setting on its tuning runs, the baseline's arm included; reported on the other runs
    kept = best_of(*zip(*tuned))
    untuned = [t.label for t, row, _ in kept if row.mean is None]
    if untuned:
        raise RunsError(f"--select_on={args.select_on}: no tuning run of {', '.join(untuned)} has a val loss at "
                        f"step {step}")
    reported = {h.label: h for h in held_out}
    missing = [t.label for t, _, _ in kept if not reported[t.label].runs]
    if missing:
        raise RunsError(f"--select_on={args.select_on}: {', '.join(missing)}, chosen on the tuning runs, has no "
                        f"other runs to report; run its held-out seeds at that setting")
    base_group = next(group for arm, group in zip(arms, groups) if arm is baseline)
    baseline = next(reported[t.label] for t, _, group in kept if group == base_group)
    arms = [reported[t.label] for t, _, _ in kept]
    rows = [summarize(a, step) for a in arms]
    for row, (_, tuning_row, _) in zip(rows, kept):
        row.tuning = tuning_row
    return arms, rows, baseline


def check_writable(option, path):
    """Raise RunsError naming `option` where the figure could not be saved at `path` (a directory, or in none)."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise RunsError(f"{option}={path} is a directory; name the image file to write, e.g. "
                        f"{option}={os.path.join(path, 'figure.png')}")
    if not os.path.isdir(directory):
        raise RunsError(f"{option}={path}: there is no directory {directory}; create it (mkdir -p {directory}) or "
                        f"name a file in a directory that exists")


def report(args):
    """Print the table of the runs in args.out_dirs (`args`: parse_args()'s) on stdout, its notes on stderr, and write
    its figures (--plot, --figure2), each checked to be writable before the runs are read. Raises RunsError for a
    figure that cannot be written or runs that cannot be compared as asked."""
    for option, path in (("--plot", args.plot), ("--figure2", args.figure2)):
        if path:
            check_writable(option, path)
    runs, group_over = ca.read_runs(args.out_dirs, args.group_over)
    ca.check_keys(runs, "--best_over", [k for k in args.best_over.split(",") if k])
    if args.seeds:
        runs = [r for r in runs if str(r.config.get("seed")) in args.seeds.split(",")]
        if not runs:
            raise RunsError(f"--seeds={args.seeds}: no run has one of these seeds")
    if args.width_transfer or args.width_ladder:
        return width_report(runs, args)
    metrics = checked_names("--metric", args.metric, [s for r in runs for d in r.downstream.values() for s in d],
                            "downstream score", "train with eval_tasks to get them")
    diags = checked_names("--with_diag", args.with_diag, [n for r in runs for d in r.diags.values() for n in d],
                          "diagnostic", "train with diagnostics=True to get them")
    arms = ca.make_arms(runs, group_over)
    for note in filter(None, map(ca.numerics_note, arms)):
        print(note, file=sys.stderr)
    baseline = ca.find_baseline(arms, args.baseline)
    if args.step is None:
        step = step_to_report(runs)
        caption = f"val loss at step {step}, the last eval step that every run that did not diverge has reached"
    else:
        step, caption = args.step, f"val loss at step {args.step}"
        eval_steps = sorted(set().union(*(r.evals for r in runs)))
        if step not in eval_steps:
            raise RunsError(f"--step={step} is not an eval step of any run; eval steps: "
                            f"{', '.join(map(str, eval_steps))}")
    opts = {"holm": args.holm, "paired": args.paired, "keys": group_over}
    if args.select_on:
        arms, rows, baseline = select_held_out(arms, baseline, step, args, group_over)
        opts["select"] = args.select_on
        caption += (f"; each row the {args.best_over} with the lowest mean val loss over its arm's runs with "
                    f"{args.select_on} (the selection column), reported over the other runs only")
    else:
        rows = [summarize(a, step) for a in arms]
        if args.best_over:
            # tuned against tuned: each arm keeps its best setting, the baseline's arm included
            groups = tuning_groups(arms, group_over, set(args.best_over.split(",")))
            kept = best_of(arms, rows, groups)
            base_group = next(group for arm, group in zip(arms, groups) if arm is baseline)
            baseline = next(a for a, _, group in kept if group == base_group)
            arms, rows = [a for a, _, _ in kept], [r for _, r, _ in kept]
            caption += f"; each row the best {args.best_over} of its arm (lowest mean val loss at this step)"
    base_row = rows[arms.index(baseline)]
    for arm, row in zip(arms, rows):
        row.rel, row.p = stats.rel_improvement(row, base_row), stats.welch_p(row, base_row)
        if args.paired:
            row.paired = stats.paired_t(ca.paired_losses(arm, step, group_over),
                                        ca.paired_losses(baseline, step, group_over), same=arm is baseline)
    for row, p in zip(rows, stats.holm([r.p for r in rows])):
        row.p_holm = p
    if args.paired:
        for row, p in zip(rows, stats.holm([r.paired.p for r in rows])):
            row.paired.p_holm = p
    caption += f"; baseline: {baseline.label}; runs pooled over {', '.join(sorted(group_over))}"
    values = [ca.downstream_score(m) for m in metrics] + [ca.diag_value(d) for d in diags]
    metric_rows = [[summarize(a, step, v) for v in values] for a in arms]
    names = metrics + [f"diag/{d}" for d in diags]
    header, lines, left = table(arms, rows, step, args.format, names, metric_rows, opts)
    if args.format != "csv":
        print(caption + "\n")
    stats.print_table(header, lines, args.format, left)
    if args.format != "csv":
        print("\n" + notes(rows, names, opts))
    if args.plot:
        loss_curves(arms, baseline).savefig(args.plot, dpi=150)
        # the csv on stdout stays machine-readable
        print(f"wrote {args.plot}", file=sys.stderr if args.format == "csv" else sys.stdout)
    if args.figure2:  # the arms with a run that did not diverge, each its mean val loss
        alive = [(a, *curve(a)) for a in arms if any(r.diverged is None for r in a.runs)]
        if all(a is not baseline for a, _, _ in alive):
            raise RunsError(f"--figure2: every run of the baseline {baseline.label} diverged; choose another with "
                            f"--baseline")
        curves = [Curve(a.label, a.header["non_embedding_params"], s, v[:, :, 1].mean(axis=0)) for a, s, v in alive]
        figure2(curves, baseline.label).savefig(args.figure2, dpi=150)
        print(f"wrote {args.figure2}", file=sys.stderr if args.format == "csv" else sys.stdout)


def step_to_report(runs):
    """ca.default_step, saying on stderr when a run still training holds it back (ca.unfinished_note)."""
    step = ca.default_step(runs)
    note = ca.unfinished_note(runs, step)
    if note:
        print(note, file=sys.stderr)
    return step


def width_report(runs, args):
    """--width_transfer or --width_ladder: its tables at --step (default: the last step every run has), and with
    --plot its figure (nonlinear_queries/analysis/width.py)."""
    step = args.step if args.step is not None else step_to_report(runs)
    if args.width_transfer:
        width.transfer_report(runs, step, args.format, args.plot)
    else:
        width.ladder_report(runs, step, args.format, args.baseline, args.claim, args.plot, args.effect_difference,
                            args.pooled_plot)
