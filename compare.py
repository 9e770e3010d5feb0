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
later) counts as today's default, which reproduces what the older code did. Exit status:
0 ok; 1 bad input; 2 bad command line.
"""

import argparse
import csv
import json
import os
import sys
from dataclasses import dataclass, field, fields

import numpy as np

from nonlinear_queries.figures import Curve, figure2
from nonlinear_queries.runlog import read_metrics

# settings that say where, how or whether a run is stored, logged, compiled or diagnosed, not what it computes
IGNORED_KEYS = {
    "out_dir", "overwrite", "init_from", "resume_from", "eval_only", "keep_last_n", "save_checkpoint_steps",
    "log_interval", "wandb_log", "wandb_project", "wandb_group", "wandb_run_name", "data_dir", "compile",
    "backend", "peak_flops", "device", "eval_tasks", "eval_tasks_interval", "eval_tasks_limit",
    "eval_tasks_include_path", "parallelism", "activation_checkpointing", "diagnostics", "diagnostics_batches",
}
FOOTER = ("val loss: mean ± sample std (ddof=1) over the group's n runs; p: Welch's t-test vs the baseline "
          "(n >= 2 in both); rel. improvement = (L_base - L) / L_base of the means, positive = lower loss")
# the diagnostics --with_diag shows when it names none: the attention-logit growth and the attention's entropy
DEFAULT_DIAG = ("attn_logit_max", "attn_entropy")
HOLM_NOTE = "p (Holm): Holm-Bonferroni adjusted over the {m} rows compared with the baseline"
PAIRED_NOTE = ("paired Δ: L - L_base over the runs of the row and the baseline with equal {keys} (same init, same "
               "batches), mean ± sample std, (k) = number of pairs where it is not n; paired p: the paired t-test")


@dataclass
class Run:
    """One run directory: train.py's config header, its evals {step: (train_loss, val_loss)} (nats per token),
    the step at which it diverged (None if it did not), its downstream scores {step: {"task/metric": value}} and
    its diagnostics {step: {name: [value per layer]}} (the `diag` records, diagnostics.py; analyze.py reads them)."""

    out_dir: str
    header: dict
    evals: dict
    diverged: int | None
    downstream: dict
    diags: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.header["config"]


@dataclass
class Group:
    """Runs with equal settings apart from the --group_over keys, under a label unique in the table."""

    label: str
    runs: list

    @property
    def header(self):
        return self.runs[0].header


def die(message):
    """Print `error: message` to stderr and exit with status 1 (bad input)."""
    sys.exit(f"error: {message}")


def read_records(path):
    """The records of a metrics.jsonl as the run stands now. A `config` record at step s, written at a restart,
    drops the records of earlier sessions past step s (the resumed run logs those steps again). A line that is
    not a JSON record (cut short by a crash, or damaged) is skipped with a warning naming it (runlog.read_metrics)."""
    records = []
    for record in read_metrics(path):
        if record["type"] == "config":
            records = [r for r in records if r["step"] <= record["step"]]
        records.append(record)
    return records


def load_run(path):
    """Read a run directory into a Run: config.json, else the last `config` record of metrics.jsonl."""
    records = read_records(os.path.join(path, "metrics.jsonl"))
    headers = [r for r in records if r["type"] == "config"]
    if os.path.isfile(os.path.join(path, "config.json")):
        with open(os.path.join(path, "config.json")) as f:
            headers.append(json.load(f))
    if not headers:
        die(f"{path} has neither config.json nor a config record in metrics.jsonl; pass runs written by train.py")
    evals = {r["step"]: (r["train_loss"], r["val_loss"]) for r in records if r["type"] == "eval"}
    diverged = [r["step"] for r in records if r["type"] == "diverged"]
    downstream = {}
    for r in records:
        if r["type"] == "downstream":
            downstream.setdefault(r["step"], {}).update(
                {f"{r['task']}/{k}": v for k, v in r.items() if k not in ("type", "step", "task")})
    diags = {r["step"]: {k: v for k, v in r.items() if k not in ("type", "step")}
             for r in records if r["type"] == "diag"}
    return Run(path, headers[-1], evals, diverged[-1] if diverged else None, downstream, diags)


def fill_defaults(runs):
    """Give a setting that only some runs' configs have (one added to train.py after the others ran) today's
    default where it is missing: the defaults reproduce what the older code did."""
    keys = set().union(*(r.config for r in runs))
    if all(keys <= set(r.config) for r in runs):
        return
    # imported only here: train_config imports model, and so torch, which takes seconds
    from nonlinear_queries.train_config import TrainConfig

    defaults = {f.name: f.default for f in fields(TrainConfig)}
    for run in runs:
        for key in keys - set(run.config):
            if key in defaults:
                run.config[key] = defaults[key]


def find_run_dirs(paths):
    """Run directories named on the command line: a directory holding metrics.jsonl is a run; one that does not
    but whose subdirectories do (a sweep) stands for those, sorted. A run named twice counts once."""
    dirs = []
    for path in paths:
        if os.path.isfile(os.path.join(path, "metrics.jsonl")):
            dirs.append(path)
            continue
        subdirs = sorted(os.path.join(path, d) for d in os.listdir(path)) if os.path.isdir(path) else []
        runs = [d for d in subdirs if os.path.isfile(os.path.join(d, "metrics.jsonl"))]
        if not runs:
            die(f"{path} is not a run directory (one holding the metrics.jsonl and config.json that train.py "
                f"writes) nor a directory of such runs; pass the out_dir of a train.py run")
        dirs += runs
    unique = {}
    for d in dirs:
        unique.setdefault(os.path.realpath(d), d)
    return list(unique.values())


def read_runs(paths, group_over):
    """(runs, the set of keys to pool over): the runs under `paths` (find_run_dirs), their configs filled
    with train.py's defaults, and `group_over` (comma-separated config keys) checked against them; exits with
    a message naming a key that no run's config has."""
    runs = [load_run(d) for d in find_run_dirs(paths)]
    fill_defaults(runs)
    keys = set(group_over.split(","))
    unknown = keys - set().union(*(r.config for r in runs))
    if unknown:
        die(f"--group_over names {', '.join(sorted(unknown))}, which no run's config has; "
            f"pass config keys such as seed or data_seed")
    return runs, keys


def make_groups(runs, group_over):
    """Group runs whose configs are equal apart from IGNORED_KEYS and group_over, in order of first appearance.
    Each group's label is its run_name, plus key=value for every setting in which it differs from another group
    of the same run_name."""
    skip = IGNORED_KEYS | group_over
    members = {}
    for run in runs:
        key = json.dumps({k: v for k, v in run.config.items() if k not in skip}, sort_keys=True)
        members.setdefault(key, []).append(run)
    names = ["/".join(dict.fromkeys(run.header["run_name"] for run in group)) for group in members.values()]
    groups = []
    for name, group in zip(names, members.values()):
        configs = [other[0].config for n, other in zip(names, members.values()) if n == name]
        keys = [k for k in dict.fromkeys(k for c in configs for k in c)
                if k not in skip and len({json.dumps(c.get(k, "(unset)")) for c in configs}) > 1]
        groups.append(Group(" ".join([name] + [f"{k}={group[0].config.get(k, '(unset)')}" for k in keys]), group))
    return groups


def find_baseline(groups, name):
    """The group named by --baseline (a label or one of the run directories); the first group if name is None."""
    if name is None:
        return groups[0]
    for group in groups:
        if name == group.label or any(os.path.realpath(name) == os.path.realpath(r.out_dir) for r in group.runs):
            return group
    die(f"--baseline={name} is neither a group label nor a run directory given; "
        f"labels: {', '.join(repr(g.label) for g in groups)}")


def default_step(runs):
    """The largest eval step that every run that did not diverge has reached; an error if there is none."""
    alive = [r for r in runs if r.diverged is None]
    if not alive:
        die("every run diverged, so no eval step is common to the runs that did not; pass --step=N")
    common = set.intersection(*(set(r.evals) for r in alive))
    if not common:
        die("no eval step is common to all runs that did not diverge; pass --step=N, or leave out the runs that "
            "have not reached an eval yet")
    return max(common)


def val_loss(run, step):
    """A run's val loss at `step` (nats per token), None if it has no eval there."""
    return run.evals[step][1] if step in run.evals else None


def downstream_score(metric):
    """value(run, step) of a downstream score "task/metric", None where the run has none."""
    return lambda run, step: run.downstream.get(step, {}).get(metric)


def layer_mean(values):
    """The mean over the layers of one diagnostic ([value per layer]); None where it is undefined (None) at every
    layer, as query_f_ratio is for a query without an f."""
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def diag_value(name):
    """value(run, step) of a diagnostic (a `diag` record, diagnostics.py): its mean over the layers, None where
    the run has none."""
    return lambda run, step: layer_mean(run.diags.get(step, {}).get(name) or [])


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

    return ([Group(g.label, [r for r in g.runs if tuning(r)]) for g in groups],
            [Group(g.label, [r for r in g.runs if not tuning(r)]) for g in groups])


def holm(ps):
    """Holm-Bonferroni adjusted p-values (Holm 1979, "A simple sequentially rejective multiple test procedure") of
    the m p-values in `ps` that are not None, in the same order: the i-th smallest becomes
    max over j <= i of min(1, (m - j + 1) p_(j)). None stays None."""
    order = sorted((i for i, p in enumerate(ps) if p is not None), key=lambda i: ps[i])
    adjusted, running = [None] * len(ps), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(order) - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def paired(group, base, step, keys):
    """The paired comparison of a group with the baseline group at `step`: the runs of each that did not diverge
    and have a val loss there, matched on their values of `keys` (the --group_over keys, e.g. the seed).
    Returns {"mean", "std", "n", "p"} of d = L - L_base over the pairs (nats per token; std with ddof=1 and p of
    the paired t-test need n >= 2, else None; mean None without a pair). Exits if two runs of one group have the
    same values of `keys`, since a pair would then be ambiguous."""
    def by_key(g):
        losses = {}
        for run in g.runs:
            if run.diverged is None and step in run.evals:
                key = tuple(json.dumps(run.config.get(k)) for k in sorted(keys))
                if key in losses:
                    die(f"{g.label}: two runs with {', '.join(sorted(keys))} = {', '.join(key)}; --paired needs "
                        f"one run per value (a run given twice under two paths?)")
                losses[key] = run.evals[step][1]
        return losses

    mine, theirs = by_key(group), by_key(base)
    common = sorted(set(mine) & set(theirs))
    d = np.array([mine[k] - theirs[k] for k in common])
    n = len(d)
    if n < 2:
        return {"mean": float(d.mean()) if n else None, "std": None, "n": n, "p": None}
    # imported here: scipy.stats is most of the start-up time
    from scipy import stats

    p = None if group is base else float(stats.ttest_rel([mine[k] for k in common], [theirs[k] for k in common]).pvalue)
    return {"mean": float(d.mean()), "std": float(d.std(ddof=1)), "n": n, "p": p}


def summarize(group, step, value=val_loss):
    """One table row as numbers: value(run, step) (by default the val loss, nats per token) over the group's runs
    that did not diverge and have one at `step`, their mean and sample std (None without a value), and which runs
    are left out."""
    alive = [r for r in group.runs if r.diverged is None]
    values = np.array([v for v in (value(r, step) for r in alive) if v is not None])
    n = len(values)
    return {"values": values, "mean": float(values.mean()) if n else None,
            "std": float(values.std(ddof=1)) if n >= 2 else None, "n": n,
            "diverged": sorted(r.diverged for r in group.runs if r.diverged is not None),
            "not_reached": len(alive) - n, "runs": len(group.runs)}


def versus(row, base):
    """(rel. improvement in % of row's mean over the baseline row's, Welch's two-sided p of their losses);
    None where it is undefined: no value, fewer than 2 runs in either, or the baseline itself for p."""
    rel = 100 * (base["mean"] - row["mean"]) / base["mean"] if row["n"] and base["n"] else None
    if row is base or row["n"] < 2 or base["n"] < 2:
        return rel, None
    # imported here: scipy.stats is most of the start-up time, and only p needs it
    from scipy import stats

    return rel, float(stats.ttest_ind(row["values"], base["values"], equal_var=False).pvalue)


def step_list(steps):
    """'step 812' or 'steps 812, 900'."""
    return ("step " if len(steps) == 1 else "steps ") + ", ".join(map(str, steps))


def loss_cell(row):
    """The val loss column's text: mean ± std, or why there is no value, and which runs are left out."""
    diverged, missing, total = row["diverged"], row["not_reached"], row["runs"]
    if len(diverged) == total:
        return f"diverged at {step_list(diverged)}"
    if row["n"] == 0:
        value = "not reached"
    else:
        value = f"{row['mean']:.4f}" + (f" ± {row['std']:.4f}" if row["n"] >= 2 else "")
    notes = [f"{len(diverged)} of {total} diverged at {step_list(diverged)}"] if diverged else []
    notes += [f"{missing} of {total} not reached"] if missing and row["n"] else []
    return value + (f" ({'; '.join(notes)})" if notes else "")


def metric_cell(row):
    """A downstream score's column text: mean ± std over the runs that have it, and how many do not."""
    if row["n"] == 0:
        return "not evaluated"
    value = f"{row['mean']:.4f}" + (f" ± {row['std']:.4f}" if row["n"] >= 2 else "")
    return value + (f" ({row['not_reached']} of {row['runs']} not evaluated)" if row["not_reached"] else "")


def pm_cell(stats_, digits=4):
    """'mean ± std' of a summary (mean alone without a std), '-' without a mean."""
    if stats_["mean"] is None:
        return "-"
    return f"{stats_['mean']:.{digits}f}" + (f" ± {stats_['std']:.{digits}f}" if stats_["std"] is not None else "")


def p_cell(p):
    """A p-value's text: two significant digits, '-' where there is none."""
    return "-" if p is None else f"{p:.2g}"


def text_cells(group, row, metric_rows, opts):
    """The human-readable cells of one row of the text and markdown tables; metric_rows: the row's summaries of
    the --metric and --with_diag columns; opts: which optional columns (print_table)."""
    cfg = group.header["config"]
    cells = [group.label, cfg["query_mode"], f"{group.header['non_embedding_params']:,}", f"{cfg['learning_rate']:g}",
             f"{cfg['min_lr']:g}", f"{cfg['weight_decay']:g}"]
    if opts.get("select"):
        tuned = row["tuning"]
        cells.append(pm_cell(tuned) + (f" ({tuned['n']})" if tuned["n"] != 1 else ""))
    cells += [loss_cell(row), *(metric_cell(m) for m in metric_rows), str(row["n"]),
              "-" if row["rel"] is None else f"{row['rel']:.2f}", p_cell(row["p"])]
    if opts.get("holm"):
        cells.append(p_cell(row["p_holm"]))
    if opts.get("paired"):
        pair = row["paired"]
        cells.append(pm_cell(pair) + (f" ({pair['n']})" if pair["mean"] is not None and pair["n"] != row["n"] else ""))
        cells.append(p_cell(pair["p"]))
        if opts.get("holm"):
            cells.append(p_cell(pair["p_holm"]))
    return cells


def print_table(groups, rows, step, caption, fmt, metrics=(), metric_rows=(), opts=None):
    """Print the table to stdout as aligned text, a markdown pipe table, or csv with full precision. metrics: the
    names of the --metric and --with_diag columns; metric_rows[i]: group i's summaries of them, in that order.
    opts: the optional columns: "select" (the --select_on text: the tuning runs' val loss, row["tuning"]),
    "holm" (row["p_holm"]), "paired" (row["paired"]), "keys" (the pooled keys, for the footer)."""
    metric_rows = metric_rows or [[] for _ in groups]
    opts = opts or {}
    holm_on, paired_on = opts.get("holm"), opts.get("paired")
    if fmt == "csv":
        out = csv.writer(sys.stdout, lineterminator="\n")
        optional = (["tuning_val_loss_mean", "tuning_val_loss_std", "tuning_n"] if opts.get("select") else []) + (
            ["p_holm"] if holm_on else []) + (
            ["paired_diff_mean", "paired_diff_std", "paired_n", "paired_p"] + (["paired_p_holm"] if holm_on else [])
            if paired_on else [])
        out.writerow(["run", "query_mode", "non_embedding_params", "learning_rate", "min_lr", "weight_decay", "step",
                      "val_loss_mean", "val_loss_std", "n", "rel_improvement_pct", "p", "diverged", "not_reached"]
                     + optional + [f"{m}_{k}" for m in metrics for k in ("mean", "std", "n")])
        for group, row, scores in zip(groups, rows, metric_rows):
            cfg = group.header["config"]
            extra = ([row["tuning"][k] for k in ("mean", "std", "n")] if opts.get("select") else []) + (
                [row["p_holm"]] if holm_on else []) + (
                [row["paired"][k] for k in ("mean", "std", "n", "p")] + ([row["paired"]["p_holm"]] if holm_on else [])
                if paired_on else [])
            out.writerow([group.label, cfg["query_mode"], group.header["non_embedding_params"], cfg["learning_rate"],
                          cfg["min_lr"], cfg["weight_decay"], step] + [row[k] for k in ("mean", "std", "n", "rel", "p")]
                         + [" ".join(map(str, row["diverged"])), row["not_reached"]] + extra
                         + [m[k] for m in scores for k in ("mean", "std", "n")])
        return
    # text columns and the val loss and scores (which may carry a note) align left, numbers right
    columns = ["run", "query", "non-emb params", "max lr", "min lr", "weight decay"]
    left = [True, True, False, False, False, False]
    if opts.get("select"):
        columns.append(f"val loss @ {step}, {opts['select']} (selection)")
        left.append(True)
    columns += [f"val loss @ {step}", *(f"{m} @ {step}" for m in metrics), "n", "rel. improvement (%)", "p"]
    left += [True, *(True for _ in metrics), False, False, False]
    if holm_on:
        columns.append("p (Holm)")
        left.append(False)
    if paired_on:
        columns += ["paired Δ", "paired p"] + (["paired p (Holm)"] if holm_on else [])
        left += [True, False] + ([False] if holm_on else [])
    cells = [text_cells(g, r, m, opts) for g, r, m in zip(groups, rows, metric_rows)]
    print(caption + "\n")
    if fmt == "markdown":
        for line in [columns, ["---" if lft else "---:" for lft in left], *cells]:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(c) for c in column) for column in zip(columns, *cells)]
        for line in [columns, ["-" * w for w in widths], *cells]:
            print("  ".join(c.ljust(w) if lft else c.rjust(w) for c, w, lft in zip(line, widths, left)).rstrip())
    notes = [FOOTER]
    if any(not m.startswith("diag/") for m in metrics):
        notes.append("downstream scores (train.py's eval_tasks): mean ± sample std over the runs that have them at "
                     "this step")
    if any(m.startswith("diag/") for m in metrics):
        notes.append("diag/NAME: the diagnostic's mean over the layers (diagnostics.py), then mean ± sample std over "
                     "the runs")
    if holm_on:
        notes.append(HOLM_NOTE.format(m=sum(r["p"] is not None for r in rows)))
    if paired_on:
        notes.append(PAIRED_NOTE.format(keys=", ".join(sorted(opts["keys"]))))
    print("\n" + "; ".join(notes))


def curve(group):
    """A group's curve: (steps, losses) with losses of shape (runs, steps, 2) holding (train_loss, val_loss) at the
    eval steps after step 0 that all its runs that did not diverge have; an all-diverged group uses all its runs,
    so its curve ends where they stopped."""
    runs = [r for r in group.runs if r.diverged is None] or group.runs
    steps = sorted(set.intersection(*(set(r.evals) for r in runs)) - {0})
    losses = np.array([[r.evals[s] for s in steps] for r in runs], dtype=float).reshape(len(runs), len(steps), 2)
    return np.array(steps, dtype=np.int64), losses


def line_color(i, n):
    """The color of group i of n in a figure: matplotlib's default cycle (C0-C9) for up to 10 groups, which
    repeats after 10, so tab20's 20 colors for more."""
    if n <= 10:
        return f"C{i}"
    # imported here: only a figure needs matplotlib
    from matplotlib import colormaps

    return colormaps["tab20"](i % 20)


def plot(groups, baseline):
    """Figure 1 of the paper, returned as a matplotlib Figure: top, the loss vs step of every group (val solid,
    train dashed; the mean over its runs, a band from the lowest to the highest run when n > 1); bottom, the
    relative improvement over the baseline group's mean (%) at the steps both have. Step 0 is left out: the
    untrained loss, about ln(vocab_size), would squash the y-range. Runs that diverged are left out of a group
    that has others; a group whose runs all diverged is drawn on top only, up to where they stopped; the
    legend says which."""
    # imported here: only --plot needs matplotlib; Figure without pyplot needs no display and no global state
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 8), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    base_steps, base_losses = curve(baseline)
    for i, group in enumerate(groups):
        steps, losses = curve(group)
        color = line_color(i, len(groups))
        diverged = [r.diverged for r in group.runs if r.diverged is not None]
        note = f" ({len(diverged)} of {len(group.runs)} diverged, left out)" if diverged else ""
        if len(diverged) == len(group.runs):
            note = f" (diverged at {step_list(diverged)})"
        _, mine, theirs = np.intersect1d(steps, base_steps, return_indices=True)
        base_mean = base_losses.mean(axis=0)[theirs]
        for j, style in ((1, "-"), (0, "--")):
            top.plot(steps, losses[:, :, j].mean(axis=0), style, marker="o", markersize=2, color=color,
                     label=None if j == 0 else group.label + note)
            if len(losses) > 1:
                top.fill_between(steps, losses[:, :, j].min(axis=0), losses[:, :, j].max(axis=0), color=color,
                                 alpha=0.15, linewidth=0)
            # a diverged group's early losses would set the scale of the improvements that matter
            if len(diverged) < len(group.runs):
                rel = 100 * (base_mean[:, j] - losses[:, mine, j].mean(axis=0)) / base_mean[:, j]
                bottom.plot(steps[mine], rel, style, marker="o", markersize=2, color=color)
    bottom.axhline(0, color="gray", linewidth=0.8)
    top.set_ylabel("loss (nats per token)")
    top.legend(title="val loss solid, train loss dashed")
    bottom.set_xlabel("step")
    bottom.set_ylabel("rel. improvement (%)")
    bottom.set_title(f"(L_base - L) / L_base, baseline: {baseline.label}", fontsize="medium")
    return fig


def family(group, skip):
    """The settings of a group apart from the keys in `skip`, as a comparable string."""
    return json.dumps({k: v for k, v in group.runs[0].config.items() if k not in skip}, sort_keys=True)


def best_of(groups, rows, skip):
    """Of the groups whose settings differ only in keys in `skip` (say, learning_rate), the one with the lowest
    mean val loss; groups without a value lose. Returns [(group, row)] in order of first appearance."""
    families = {}
    for group, row in zip(groups, rows):
        families.setdefault(family(group, skip), []).append((group, row))
    return [min(members, key=lambda m: (m[1]["mean"] is None, m[1]["mean"] or 0.0)) for members in families.values()]


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


def main():
    """Read the runs named on the command line, print the table and, with --plot, write the figure."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dirs", nargs="+", metavar="OUT_DIR", help="run directories, or directories of runs")
    parser.add_argument("--group_over", default="seed",
                        help="comma-separated config keys whose runs are pooled into one row (default: seed)")
    parser.add_argument("--baseline", help="group label or run directory of the baseline (default: the first run)")
    parser.add_argument("--step", type=int,
                        help="eval step to tabulate (default: the last one that every run that did not diverge has)")
    parser.add_argument("--best_over", default="",
                        help="comma-separated config keys, e.g. learning_rate: of the groups that differ only in them, "
                             "show the one with the lowest mean val loss (a tuned-vs-tuned comparison)")
    parser.add_argument("--select_on", default="", metavar="KEY=VALUE",
                        help="with --best_over: choose each arm's setting on the runs with KEY=VALUE (e.g. seed=0, the "
                             "tuning seed) only, and report only the other runs")
    parser.add_argument("--holm", action="store_true",
                        help="add Holm-Bonferroni adjusted p-values over all rows compared with the baseline")
    parser.add_argument("--paired", action="store_true",
                        help="add the paired comparison with the baseline: runs with equal --group_over values (same "
                             "seed: same init and batches), mean ± std of L - L_base and the paired t-test's p")
    parser.add_argument("--with_diag", nargs="?", const=",".join(DEFAULT_DIAG), default="", metavar="NAMES",
                        help="add the diagnostics (diagnostics.py) at the step as columns, each a mean over the "
                             f"layers, then over the runs (default names: {', '.join(DEFAULT_DIAG)})")
    parser.add_argument("--format", choices=["text", "markdown", "csv"], default="text")
    parser.add_argument("--plot", metavar="PNG", help="also draw Figure 1 (loss and rel. improvement vs step) here")
    parser.add_argument("--figure2", metavar="PNG", help="also draw Figure 2 here: each group's rel. improvement over "
                        "the baseline vs step, labelled with its non-embedding parameters (docs/official.md)")
    parser.add_argument("--metric", default="", metavar="TASK/METRIC",
                        help="comma-separated downstream scores (train.py's eval_tasks), e.g. hellaswag/acc_norm: a "
                             "column each, at the same step, mean ± std over each row's runs")
    args = parser.parse_args()
    if args.select_on and not args.best_over:
        parser.error("--select_on chooses each arm's --best_over setting on the tuning runs; give --best_over too, "
                     "e.g. --best_over=learning_rate")

    runs, group_over = read_runs(args.out_dirs, args.group_over)
    metrics = checked_names("--metric", args.metric, [s for r in runs for d in r.downstream.values() for s in d],
                            "downstream score", "train with eval_tasks to get them")
    diags = checked_names("--with_diag", args.with_diag, [n for r in runs for d in r.diags.values() for n in d],
                          "diagnostic", "train with diagnostics=True to get them")
    groups = make_groups(runs, group_over)
    baseline = find_baseline(groups, args.baseline)
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
        select = parse_select(args.select_on, group_over)
        tuning, held_out = split_groups(groups, select)
        skip = IGNORED_KEYS | group_over | set(args.best_over.split(","))
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
        untuned = [t.label for t, row in kept if row["mean"] is None]
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
            row["tuning"] = tuning_row
        opts["select"] = args.select_on
        caption += (f"; each row the {args.best_over} with the lowest mean val loss over its arm's runs with "
                    f"{args.select_on} (the selection column), reported over the other runs only")
    else:
        rows = [summarize(g, step) for g in groups]
        if args.best_over:
            # tuned against tuned: each family of groups keeps its best, the baseline's family included
            skip = IGNORED_KEYS | group_over | set(args.best_over.split(","))
            kept = best_of(groups, rows, skip)
            baseline = next(g for g, _ in kept if family(g, skip) == family(baseline, skip))
            groups, rows = [g for g, _ in kept], [r for _, r in kept]
            caption += f"; each row the best {args.best_over} of its arm (lowest mean val loss at this step)"
    base_row = rows[groups.index(baseline)]
    for group, row in zip(groups, rows):
        row["rel"], row["p"] = versus(row, base_row)
        if args.paired:
            row["paired"] = paired(group, baseline, step, group_over)
    for row, p in zip(rows, holm([r["p"] for r in rows])):
        row["p_holm"] = p
    if args.paired:
        for row, p in zip(rows, holm([r["paired"]["p"] for r in rows])):
            row["paired"]["p_holm"] = p
    caption += f"; baseline: {baseline.label}; runs pooled over {', '.join(sorted(group_over))}"
    values = [downstream_score(m) for m in metrics] + [diag_value(d) for d in diags]
    metric_rows = [[summarize(g, step, v) for v in values] for g in groups]
    print_table(groups, rows, step, caption, args.format, metrics + [f"diag/{d}" for d in diags], metric_rows, opts)
    if args.plot:
        plot(groups, baseline).savefig(args.plot, dpi=150)
        # the csv on stdout stays machine-readable
        print(f"wrote {args.plot}", file=sys.stderr if args.format == "csv" else sys.stdout)
    if args.figure2:  # the groups with a run that did not diverge, each its mean val loss
        arms = [(g, *curve(g)) for g in groups if any(r.diverged is None for r in g.runs)]
        if all(g is not baseline for g, _, _ in arms):
            die(f"--figure2: every run of the baseline {baseline.label} diverged; choose another with --baseline")
        curves = [Curve(g.label, g.header["non_embedding_params"], s, v[:, :, 1].mean(axis=0)) for g, s, v in arms]
        figure2(curves, baseline.label).savefig(args.figure2, dpi=150)
        print(f"wrote {args.figure2}", file=sys.stderr if args.format == "csv" else sys.stdout)


if __name__ == "__main__":
    main()
