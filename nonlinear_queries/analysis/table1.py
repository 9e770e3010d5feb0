"""
compare.py's Table 1 as it prints it: the columns of each arm's row (its settings, the val loss at the step, the
downstream scores and diagnostics asked for, the rel. improvement and p against the baseline, and the optional
selection, Holm and paired columns), each cell's text, and the footer that says what the columns mean. csv keeps
full precision; text and markdown get the human-readable cells (stats.print_table prints either).
"""

from nonlinear_queries.analysis import stats

FOOTER = ("val loss: mean ± sample std (ddof=1) over the group's n runs; p: Welch's t-test vs the baseline "
          "(n >= 2 in both); rel. improvement = (L_base - L) / L_base of the means, positive = lower loss")
HOLM_NOTE = "p (Holm): Holm-Bonferroni adjusted over the {m} rows compared with the baseline"
PAIRED_NOTE = ("paired Δ: L - L_base over the runs of the row and the baseline with equal {keys} (same init, same "
               "batches), mean ± sample std, (k) = number of pairs where it is not n; paired p: the paired t-test")


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


def table(arms, rows, step, fmt, metrics, metric_rows, opts):
    """(header, lines, left) of the table: csv with full precision, else the human-readable cells. metrics: the
    names of the --metric and --with_diag columns; metric_rows[i]: arm i's Rows of them, in that order. opts:
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
        for arm, row, scores in zip(arms, rows, metric_rows):
            cfg, pair = arm.header["config"], row.paired
            lines.append([arm.label, cfg["query_mode"], arm.header["non_embedding_params"], cfg["learning_rate"],
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
    for arm, row, scores in zip(arms, rows, metric_rows):
        cfg, pair, tuned = arm.header["config"], row.paired, row.tuning
        cells = [arm.label, cfg["query_mode"], f"{arm.header['non_embedding_params']:,}",
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
