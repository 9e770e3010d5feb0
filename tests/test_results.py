"""Every generated table in results/*/README.md is what its command prints today on the committed runs.

Above each such table a README holds an HTML comment (invisible when rendered) naming the command that made it:

    <!-- table from: python compare.py results/ablations/{baseline,res_gelu} --paired --format=markdown -->

The test runs the command in this process (compare.py's or analyze.py's main) from the repo root and compares
the committed table with the printed one cell by cell; a command that prints two tables (compare.py
--width_ladder) has a marker for each, the second ending in `[table 2]`. A README may leave out columns that are
the same in every row (it says so in its prose): the committed header must then be the printed header with those
columns removed, in the same order, and each row the printed row with the same columns removed. `(headers renamed)`
marks a table whose column headers a person rewrote (analyze.py's "baseline learning_rate=0.003 (n=3)" as
"baseline lr 3e-3"): its header is left out of the comparison, every other line is compared in full.

Tables that put together numbers of several commands (each run's val loss, the relative improvement at several
steps) are marked `<!-- table built by tests/test_results.py: NAME -->`: BUILDERS[NAME] builds them from the
committed runs through the same library (nonlinear_queries.record.runs and .stats), and every cell is compared. A
table too costly to compute twice (results/coord_check's) is marked `<!-- table checked by tests/FILE.py: TEST -->`,
the test that computes it and compares it cell by cell.

Numbers that a README's prose states and no table holds are checked where it is cheap: PROSE[readme] builds,
from the runs, the words that state them, and the README (its line breaks ignored) must hold those words.
"""

import contextlib
import glob
import io
import json
import os
import re
import shlex
import sys

import numpy as np
import pytest

import analyze
import compare
from helpers import REPO
from nonlinear_queries.analysis import comparison
from nonlinear_queries.analysis.arms import Arm, diag_value, make_arms, paired_losses, read_runs
from nonlinear_queries.analysis.stats import paired_t, rel_improvement, welch_p
from nonlinear_queries.record.runs import format_value, load_run, read_metrics

BUILT = re.compile(r"<!-- table built by tests/test_results.py: (\w+) -->$")
MARKER = re.compile(r"<!-- table (\(headers renamed\) )?from: python (compare|analyze)\.py (.*?)"
                    r"(?: \[table (\d)\])? -->$")
# a table that a test elsewhere computes and compares, naming the test
CHECKED = re.compile(r"<!-- table checked by (tests/test_\w+\.py): (test_\w+) -->$")
PROGRAMS = {"compare": compare, "analyze": analyze}


def brace_expand(word):
    """bash's expansion of one {a,b,c} group in a word (the READMEs' commands use one at most per word)."""
    match = re.search(r"\{([^{}]*,[^{}]*)\}", word)
    if not match:
        return [word]
    return [word[: match.start()] + part + word[match.end() :] for part in match.group(1).split(",")]


def marked_tables(marker):
    """[(readme, line number, the marker's match, committed table lines)] for every line of a results README that
    `marker` matches, with the markdown table right below it."""
    found = []
    for readme in sorted(glob.glob(os.path.join(REPO, "results", "*", "README.md"))):
        lines = open(readme).read().splitlines()
        for i, line in enumerate(lines):
            match = marker.match(line)
            if match:
                table = []
                for row in lines[i + 1 :]:
                    if not row.startswith("|"):
                        break
                    table.append(row)
                found.append((os.path.relpath(readme, REPO), i + 1, match, table))
    return found


def generated_tables():
    """[(readme, line number, renamed, program, argv, committed table lines, which)] for every marker in the
    READMEs; which: the number of the printed table the marker names ('[table 2]' at its end: a command that prints
    two tables), 1 by default."""
    return [(readme, line, bool(match.group(1)), match.group(2),
             [w for word in shlex.split(match.group(3)) for w in brace_expand(word)], table, int(match.group(4) or 1))
            for readme, line, match, table in marked_tables(MARKER)]


TABLES = generated_tables()


def cells(line):
    """The cells of a markdown table line."""
    return [c.strip() for c in line.strip().strip("|").split("|")]


def printed_table(program, argv, which=1):
    """The lines of the `which`-th markdown table that `program`.py prints for argv, run from the repo root in this
    process."""
    out, cwd, saved = io.StringIO(), os.getcwd(), sys.argv
    try:
        os.chdir(REPO)
        sys.argv = [f"{program}.py", *argv]
        with contextlib.redirect_stdout(out):
            PROGRAMS[program].main()
    finally:
        os.chdir(cwd)
        sys.argv = saved
    tables, previous = [], ""
    for line in out.getvalue().splitlines():
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(line)
        previous = line
    return tables[which - 1] if len(tables) >= which else []


def signed(x):
    """x with two decimals and a typographic minus, as the READMEs write percentages in prose tables."""
    return f"{x:.2f}".replace("-", "−")


def final_losses(arm_dir, step=1000):
    """{(rate key, rate): {seed: val loss at step}} of the runs under arm_dir, by their config."""
    runs, _ = read_runs([os.path.join(REPO, arm_dir)], "seed")
    out = {}
    for run in runs:
        key = "muon_learning_rate" if run.config.get("optimizer") == "muon" else "learning_rate"
        out.setdefault(run.config[key], {})[run.config["seed"]] = run.evals[step][1]
    return out


def chosen_rate(losses):
    """The rate with the lowest val loss on the tuning seed 0, of final_losses' {rate: {seed: loss}}."""
    return min((lr for lr in losses if 0 in losses[lr]), key=lambda lr: losses[lr][0])


def tuning_table(results, arms, step):
    """Each arm's seed-0 val loss at `step` per rate, the lowest in bold."""
    losses = {arm: {lr: seeds[0] for lr, seeds in final_losses(f"{results}/{arm}", step).items() if 0 in seeds}
              for arm in arms}
    rates = sorted({lr for by_lr in losses.values() for lr in by_lr})
    rows = [["arm", *(f"{lr:g}" for lr in rates)]]
    for arm, by_lr in losses.items():
        best = min(by_lr, key=by_lr.get)
        rows.append([arm, *("" if lr not in by_lr else f"**{by_lr[lr]:.4f}**" if lr == best else f"{by_lr[lr]:.4f}"
                            for lr in rates)])
    return rows


def held_out_table(results, arms, step, seeds):
    """Every held-out run's val loss at `step`, at its arm's rate chosen on seed 0."""
    rows = [["arm", "lr", *(f"seed {s}" for s in seeds)]]
    for arm in arms:
        losses = final_losses(f"{results}/{arm}", step)
        lr = chosen_rate(losses)
        rows.append([arm, format_value(lr), *(f"{losses[lr][s]:.4f}" for s in seeds)])
    return rows


def held_out_groups(results, arms, step):
    """({arm: the Arm of its held-out runs at the rate chosen on seed 0 at `step`}, the keys a pair shares)."""
    runs, keys = read_runs([os.path.join(REPO, results, a) for a in arms], "seed,data_seed")
    groups = {}
    for arm in arms:
        mine = [r for r in runs if os.path.basename(os.path.dirname(os.path.normpath(r.out_dir))) == arm]
        lr = chosen_rate({r.config["learning_rate"]: {0: r.evals[step][1]} for r in mine if r.config["seed"] == 0})
        groups[arm] = Arm(arm, [r for r in mine if r.config["seed"] != 0 and r.config["learning_rate"] == lr])
    return groups, keys


def over_time(groups, base, steps):
    """Each group's rel. improvement over `base` and Welch's p at each of `steps`."""
    rows = [["step", *map(str, steps)]]
    for group in groups:
        pairs = [(comparison.summarize(group, s), comparison.summarize(base, s)) for s in steps]
        rows.append([f"{group.label} (%)", *(signed(rel_improvement(r, b)) for r, b in pairs)])
        rows.append([f"{group.label}, Welch p", *(f"{welch_p(r, b):.2g}" for r, b in pairs)])
    return rows


ARMS = ["baseline", "baseline_qk_norm", "identity", "residual", "res_linear", "res_gelu", "res_gelu_relu2",
        "res_gelu_no_norm", "res_gelu_no_half", "res_gelu_qk_norm", "mlp475"]
LONG_ARMS = ["baseline", "baseline_qk_norm", "res_gelu", "res_gelu_wd", "res_gelu_no_half", "baseline_temp2",
             "baseline_qk_norm_temp"]


def ablations_tuning():
    """results/ablations: each arm's seed-0 val loss at step 1000 per rate, the lowest in bold."""
    return tuning_table("results/ablations", ARMS, 1000)


def ablations_held_out():
    """results/ablations: every held-out run's val loss at step 1000, at its arm's rate chosen on seed 0."""
    return held_out_table("results/ablations", ARMS, 1000, range(1, 6))


def ablations_long_over_time():
    """results/ablations: res_gelu's and the QK-norm baseline's rel. improvement and Welch p at each step."""
    runs, group_over = read_runs([os.path.join(REPO, "results/ablations/long", a)
                                  for a in ("baseline", "baseline_qk_norm", "res_gelu")], "seed")
    base, qk_norm, res_gelu = make_arms(runs, group_over)
    return over_time([res_gelu, qk_norm], base, [400, 600, 800, 1000, 1400, 2000, 3000])


def long_horizon_tuning():
    """results/long_horizon: each arm's seed-0 val loss at step 3000 per rate, the lowest in bold."""
    return tuning_table("results/long_horizon", LONG_ARMS, 3000)


def long_horizon_held_out():
    """results/long_horizon: every held-out run's val loss at step 3000 (seed s: init and data order s)."""
    return held_out_table("results/long_horizon", LONG_ARMS, 3000, range(1, 6))


def long_horizon_over_time():
    """results/long_horizon: every arm's rel. improvement over the tuned baseline and Welch p during training."""
    groups, _ = held_out_groups("results/long_horizon", LONG_ARMS, 3000)
    base = groups.pop("baseline")
    return over_time(groups.values(), base, [600, 1000, 1400, 2000, 2600, 3000])


def long_horizon_temperature():
    """results/long_horizon: per held-out seed, what dropping the 1/2 does to res_gelu (Δ½ = no_half - res_gelu)
    beside what doubling the softmax scale does to the baseline (ΔT = temp2 - baseline), and their difference;
    the last row: mean ± std and the paired t-test's p of each difference (of Δ½ - ΔT: the two effects differ)."""
    groups, keys = held_out_groups("results/long_horizon", LONG_ARMS, 3000)
    loss = {arm: paired_losses(groups[arm], 3000, keys) for arm in
            ("res_gelu", "res_gelu_no_half", "baseline", "baseline_temp2")}
    half = {k: loss["res_gelu_no_half"][k] - loss["res_gelu"][k] for k in loss["res_gelu"]}
    temp = {k: loss["baseline_temp2"][k] - loss["baseline"][k] for k in loss["baseline"]}
    rows = [["seed", "res_gelu", "res_gelu_no_half", "Δ½", "baseline", "baseline_temp2", "ΔT", "Δ½ − ΔT"]]
    for k in sorted(half, key=lambda k: int(k[0])):  # keys: (data_seed, seed) as JSON
        rows.append([k[0], *(f"{x:.4f}" for x in (loss["res_gelu"][k], loss["res_gelu_no_half"][k], half[k],
                                                   loss["baseline"][k], loss["baseline_temp2"][k], temp[k],
                                                   half[k] - temp[k]))])
    tests = [paired_t(loss["res_gelu_no_half"], loss["res_gelu"]), paired_t(loss["baseline_temp2"], loss["baseline"]),
             paired_t(half, temp)]
    cell = [f"{t.mean:.4f} ± {t.std:.4f}, p = {t.p:.2g}".replace("-", "−") for t in tests]
    rows.append(["mean ± std, paired p", "", "", cell[0], "", "", cell[1], cell[2]])
    return rows


def restarts(results, arms):
    """results/RESULTS: every run of `arms` that was stopped and resumed (its metrics.jsonl holds a `config` record
    past step 0): the step each session started at, the commit each ran at, and the steps that two sessions
    logged."""
    rows = [["arm", "run", "sessions start at step", "commit of each session", "steps logged by two sessions"]]
    for arm in arms:
        for path in sorted(glob.glob(os.path.join(REPO, "results", results, arm, "*", "metrics.jsonl"))):
            records = read_metrics(path)
            starts = [r for r in records if r["type"] == "config"]
            if len(starts) > 1:
                logged = [(r["type"], r["step"]) for r in records if r["type"] != "config"]
                twice = sorted({step for kind, step in set(logged) if logged.count((kind, step)) > 1})
                rows.append([arm, os.path.basename(os.path.dirname(path)), ", ".join(str(r["step"]) for r in starts),
                             ", ".join(r["git_commit"][:7] for r in starts), ", ".join(map(str, twice)) or "none"])
    return rows


def long_horizon_restarts():
    return restarts("long_horizon", LONG_ARMS)


# the arms of results/width_transfer: two parametrizations a width, width 128 shared
TRANSFER_ARMS = ["baseline_w128", "baseline_w64_mup", "baseline_w256_mup", "baseline_w64_sp", "baseline_w256_sp",
                 "res_gelu_w128", "res_gelu_w64_mup", "res_gelu_w256_mup", "res_gelu_w64_sp", "res_gelu_w256_sp"]


def width_transfer_restarts():
    return restarts("width_transfer", TRANSFER_ARMS)


def width_ladder_restarts():
    """results/width_ladder: every run of the ladder and of its temperature control (held-out seeds 1-5 at every
    width, width 128's being results/long_horizon's) and of the fresh seeds 6-10 that was stopped and resumed, as
    restarts() gives them."""
    rows = [["arm", "run", "sessions start at step", "commit of each session", "steps logged by two sessions"]]
    for directory in LADDER_RUNS + TEMP2_RUNS + FRESH_RUNS:
        for path in sorted(glob.glob(os.path.join(REPO, directory, "*", "metrics.jsonl"))):
            run = os.path.basename(os.path.dirname(path))
            seed = dict(kv.split("=") for kv in run.split(",")).get("seed")
            if "data_seed" not in run or int(seed) not in range(1, 11):
                continue
            records = read_metrics(path)
            starts = [r for r in records if r["type"] == "config"]
            if len(starts) > 1:
                logged = [(r["type"], r["step"]) for r in records if r["type"] != "config"]
                twice = sorted({step for kind, step in set(logged) if logged.count((kind, step)) > 1})
                rows.append([directory.removeprefix("results/"), run, ", ".join(str(r["step"]) for r in starts),
                             ", ".join(r["git_commit"][:7] for r in starts), ", ".join(map(str, twice)) or "none"])
    return rows


def width_transfer_margins():
    """results/width_transfer at step 1000: per arm, parametrization and width, the best rate, its two seeds' val
    losses and their spread (|difference| over their mean, %), the runner-up rate and how far its mean lies above
    the best's (%): a best rate is resolved by 2 seeds only where that margin exceeds the seeds' spread."""
    from nonlinear_queries.analysis import width

    runs, _ = read_runs([os.path.join(REPO, "results/width_transfer", a) for a in TRANSFER_ARMS], "seed")
    rows = [["arm", "param.", "width", "best rate", "its seeds' val loss", "seeds' spread (%)", "runner-up",
             "runner-up above the best (%)"]]
    for c in width.transfer_curves(runs, 1000):
        best, (second, *_) = c.best, sorted((r for r in c.losses if r != c.best), key=c.mean)
        losses = c.losses[best]
        rows.append([c.arm, width.label_of(c.parametrization), str(c.width), format_value(best),
                     ", ".join(f"{v:.4f}" for v in losses), f"{100 * abs(losses[0] - losses[1]) / c.mean(best):.1f}",
                     format_value(second), f"{100 * (c.mean(second) - c.mean(best)) / c.mean(best):.1f}"])
    return rows


def by_seed(group, value, step):
    """{seed: value(run, step)} of a group's runs (value: e.g. diag_value(name))."""
    return {run.config["seed"]: value(run, step) for run in group.runs}


def long_horizon_logits():
    """results/long_horizon: per held-out seed at step 3000, res_gelu's and res_gelu_no_half's largest logit
    (attn_logit_max) and its ratio no_half / res_gelu, and the mean norm of q and of k per head (query_norm,
    key_norm, taken before the softmax scale, which holds res_gelu's 1/2), each the mean over the 4 layers; then
    mean ± std, and Welch's p / the paired p of no_half against res_gelu (of the ratio: the paired p of no_half
    against twice res_gelu, the logits res_gelu's weights would give without the 1/2)."""
    groups, _ = held_out_groups("results/long_horizon", ["res_gelu", "res_gelu_no_half"], 3000)
    res, half = groups["res_gelu"], groups["res_gelu_no_half"]
    names, digits = ("attn_logit_max", "query_norm", "key_norm"), {"attn_logit_max": 1, "query_norm": 2,
                                                                      "key_norm": 2}
    per_seed = {name: (by_seed(res, diag_value(name), 3000), by_seed(half, diag_value(name), 3000)) for name in names}
    logit_res, logit_half = per_seed["attn_logit_max"]
    ratio = {s: logit_half[s] / logit_res[s] for s in logit_res}
    rows = [["seed", "logit res_gelu", "logit no_half", "no_half / res_gelu", "‖q‖ res_gelu", "‖q‖ no_half",
             "‖k‖ res_gelu", "‖k‖ no_half"]]
    for seed in sorted(ratio):
        cells = [f"{per_seed[n][i][seed]:.{digits[n]}f}" for n in names for i in (0, 1)]
        rows.append([str(seed), *cells[:2], f"{ratio[seed]:.2f}", *cells[2:]])
    rows_of = {name: tuple(comparison.summarize(g, 3000, diag_value(name)) for g in (res, half)) for name in names}
    spread = [f"{row.mean:.{digits[n]}f} ± {row.std:.{digits[n]}f}" for n in names for row in rows_of[n]]
    ratios = list(ratio.values())
    rows.append(["mean ± std", *spread[:2], f"{np.mean(ratios):.2f} ± {np.std(ratios, ddof=1):.2f}",
                 *spread[2:]])
    tests = [f"{welch_p(rows_of[n][1], rows_of[n][0]):.2g} / {paired_t(*reversed(per_seed[n])).p:.2g}" for n in names]
    twice = paired_t(logit_half, {s: 2 * v for s, v in logit_res.items()}).p
    rows.append(["p: Welch / paired", "", tests[0], f"against 2 × res_gelu, paired: {twice:.2g}", "", tests[1], "",
                 tests[2]])
    return rows


def grid(results, arms, header):
    """A whole grid's val loss at step 1000: per arm and rate the seeds' losses joined by ' / '."""
    losses = {arm: final_losses(f"{results}/{arm}") for arm in arms}
    rates = sorted({lr for by_lr in losses.values() for lr in by_lr})
    rows = [["arm", *(header(lr) for lr in rates)]]
    for arm, by_lr in losses.items():
        rows.append([arm, *(" / ".join(f"{by_lr[lr][s]:.4f}" for s in sorted(by_lr[lr])) for lr in rates)])
    return rows


def mini_grid():
    """results/mini: every run's val loss at step 1000."""
    return grid("results/mini", ["baseline", "mlp475", "res_gelu"], lambda lr: f"lr {format_value(lr)}")


def mini_modern_grid():
    """results/mini_modern: every run's val loss at step 1000."""
    return grid("results/mini_modern", ["modern_baseline", "modern_mlp475", "modern_res_gelu"],
                lambda lr: f"Muon lr {lr:g}")


def diagnostics_steps():
    """results/diagnostics: per rate and step the val losses, res_gelu's gap to the baseline with Welch's and the
    paired p, and the largest logit and the entropy (means over the layers, then the seeds)."""
    runs, group_over = read_runs([os.path.join(REPO, "results/diagnostics", a)
                                  for a in ("baseline", "res_gelu", "baseline_qk_norm")], "seed")
    rows = [["lr", "step", "val loss baseline", "val loss res_gelu", "res_gelu vs baseline (%)", "p (Welch / paired)",
             "val loss qk_norm", "max logit baseline", "max logit res_gelu", "max logit qk_norm", "entropy baseline",
             "entropy res_gelu", "entropy qk_norm"]]
    for lr in (3e-3, 6e-3):
        base, res, qk = make_arms([r for r in runs if r.config["learning_rate"] == lr], group_over)
        for step in (200, 400, 600, 800, 1000):
            loss = [comparison.summarize(g, step) for g in (base, res, qk)]
            logit = [comparison.summarize(g, step, diag_value("attn_logit_max")).mean for g in (base, res, qk)]
            entropy = [comparison.summarize(g, step, diag_value("attn_entropy")).mean for g in (base, res, qk)]
            pair = paired_t(paired_losses(res, step, group_over), paired_losses(base, step, group_over))
            rows.append([format_value(lr), str(step), f"{loss[0].mean:.4f}", f"{loss[1].mean:.4f}",
                         f"{rel_improvement(loss[1], loss[0]):.2f}", f"{welch_p(loss[1], loss[0]):.2g} / {pair.p:.2g}",
                         f"{loss[2].mean:.4f}", *(f"{x:.1f}" for x in logit), *(f"{x:.2f}" for x in entropy)])
    return rows


BUILDERS = {f.__name__: f for f in (ablations_tuning, ablations_held_out, ablations_long_over_time, mini_grid,
                                    mini_modern_grid, diagnostics_steps, long_horizon_tuning, long_horizon_held_out,
                                    long_horizon_over_time, long_horizon_temperature, long_horizon_restarts,
                                    long_horizon_logits, width_transfer_restarts, width_transfer_margins,
                                    width_ladder_restarts)}


def built_tables():
    """[(readme, line number, builder name, committed table lines)] for every `table built by` marker."""
    return [(readme, line, match.group(1), table) for readme, line, match, table in marked_tables(BUILT)]


BUILT_TABLES = built_tables()


WORDS = ["no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def long_horizon_prose():
    """[(what, the words that say it)]: numbers of results/long_horizon/README.md's prose that no table holds,
    built from the runs."""
    results = os.path.join(REPO, "results/long_horizon")
    # the tuning run of QK-norm at scale 0.5 beyond the grid's edge: its largest logit at step 3000, layer mean
    widened = load_run(os.path.join(results, "baseline_qk_norm_temp", "learning_rate=1.2e-2,seed=0"))
    # res_gelu without the 1/2 against the baseline at every evaluation from step 1000
    groups, _ = held_out_groups("results/long_horizon", ["baseline", "res_gelu_no_half"], 3000)
    steps = [s for s in sorted(groups["baseline"].runs[0].evals) if s >= 1000]
    half, base = groups["res_gelu_no_half"], groups["baseline"]
    pairs = [(comparison.summarize(half, s), comparison.summarize(base, s)) for s in steps]
    lead, p = [rel_improvement(r, b) for r, b in pairs], [welch_p(r, b) for r, b in pairs]
    # the validation sequences (their fingerprint in the header): one set per data_seed, whatever the arm
    sets = {}
    for path in glob.glob(os.path.join(results, "*", "*", "config.json")):
        with open(path) as f:
            header = json.load(f)
        sets.setdefault(header["config"]["data_seed"], set()).add(json.dumps(header["data"]["val_eval index"]))
    distinct = len(set().union(*sets.values()))
    # a phrase no README holds where the runs contradict the claim, so that the test fails naming it
    evaluated = (f"{WORDS[distinct]} sets" if all(len(v) == 1 for v in sets.values())
                 else "(the arms of one seed were evaluated on different sequences)")
    # the difference of the two effects of the temperature table: the seeds on which it is positive
    temperature = long_horizon_temperature()
    against = [(row[0], row[-1]) for row in temperature[1:-1] if float(row[-1]) > 0]
    other_way = (f"on seed {against[0][0]} it goes the other way (Δ½ − ΔT = +{against[0][1]})" if len(against) == 1
                 else f"(Δ½ − ΔT is positive on {len(against)} seeds)")
    restarts = len(long_horizon_restarts()) - 1
    return [
        ("the widened run's largest logit", f"its tuning run at 1.2e-2 (seed 0) ended at "
                                           f"{diag_value('attn_logit_max')(widened, 3000):.1f}"),
        ("no_half's lead from step 1000", f"{min(lead):.2f}–{max(lead):.2f}% at each of the {len(steps)} evaluations "
                                          f"from step 1000 to 3000 (Welch p {min(p):.2g}–{max(p):.2g}"),
        ("the validation sets", evaluated),
        ("the seed on which the effects' difference is positive", other_way),
        ("the resumed runs", f"{WORDS[restarts].capitalize()} runs were stopped and resumed"),
    ]


def readme_prose():
    """[(what, the words that say it)]: README.md's headline numbers: results/long_horizon's, from the committed
    table of its 7 arms (which test_committed_table_equals_what_its_command_prints holds to the runs), the
    width ladder's gaps and slope, and its declared pooled test on the fresh seeds."""
    table = next(committed for readme, _, _, _, argv, committed, _ in TABLES
                 if readme == "results/long_horizon/README.md"
                 and sum(a.startswith("results/long_horizon/") for a in argv) == 7)
    header, rows = cells(table[0]), [cells(row) for row in table[2:]]
    column = header.index("p (Holm)")
    smallest, label = min((float(row[column]), row[0]) for row in rows if row[column] != "-")
    whose = "the weight-decay arm's" if "weight_decay=0.03125" in label else f"{label}'s"
    rung, slope = ladder()
    gaps = [f"{rung['res_gelu', w].gap:+.2f}%".replace("-", "−") for w in (64, 128, 256, 384)]
    s = slope["res_gelu"]
    declared = declared_tests(FRESH_RUNS, range(6, 11))[0]
    return [("the smallest Holm p against the baseline", f"the smallest Holm p is {whose}, {smallest:g}"),
            ("the width ladder's res_gelu gaps", f"({gaps[0]}, {gaps[1]}, {gaps[2]} and {gaps[3]})"),
            ("the width ladder's res_gelu slope", f"({with_sign(s.slope)} points per doubling, {with_sign(s.ci[0])} to "
             f"{with_sign(s.ci[1])})")] + [
            (f"the declared test, {arm}", f"({with_sign(t.estimate)}%, Holm p = {t.p_holm:.2g}")
            for arm, t in declared.items()] + [
            ("the declared test's MDE for res_gelu", "minimum detectable effect "
             f"{declared['res_gelu'].mde:.2f}%) ([results/width_ladder]")]


def width_transfer_prose():
    """results/width_transfer/README.md's numbers on the rate above the optimum and on μP against SP, from the
    runs at step 1000."""
    from nonlinear_queries.analysis import width

    runs, _ = read_runs([os.path.join(REPO, "results/width_transfer", a) for a in TRANSFER_ARMS], "seed")
    every = {(c.arm, c.parametrization, c.width): c for c in width.transfer_curves(runs, 1000)}
    curves = {(p, w): c for (arm, p, w), c in every.items() if arm == "baseline"}
    sp, mup = curves["sp", 256], curves["mup", 256]
    res_sp, res_mup = every["res_gelu", "sp", 256], every["res_gelu", "mup", 256]
    res_above = 100 * (res_sp.mean(6e-3) - res_sp.mean(res_sp.best)) / res_sp.mean(res_sp.best)
    res_wide = 100 * (res_mup.mean(res_mup.best) - res_sp.mean(res_sp.best)) / res_sp.mean(res_sp.best)
    above = {p: 100 * (c.mean(6e-3) - c.mean(c.best)) / c.mean(c.best) for p, c in (("sp", sp), ("mup", mup))}
    wide = 100 * (mup.mean(mup.best) - sp.mean(sp.best)) / sp.mean(sp.best)
    narrow = 100 * (curves["sp", 64].mean(curves["sp", 64].best) - curves["mup", 64].mean(curves["mup", 64].best)) \
        / curves["sp", 64].mean(curves["sp", 64].best)
    # the margin of SP's optimum at 128 over its runner-up against its two seeds' spread (%, unrounded to 2 places)
    c128 = curves["sp", 128]
    second = sorted((r for r in c128.losses if r != c128.best), key=c128.mean)[0]
    margin = 100 * (c128.mean(second) - c128.mean(c128.best)) / c128.mean(c128.best)
    spread = 100 * abs(np.subtract(*c128.losses[c128.best])) / c128.mean(c128.best)
    # each seed's own best rate of res_gelu at width 64, under SP and under μP
    per_seed = {}
    for run in runs:
        if run.header["run_name"] == "res_gelu" and run.config["n_embd"] == 64:
            key = (run.config.get("parametrization", "sp"), run.config["seed"])
            per_seed.setdefault(key, {})[run.config["learning_rate"]] = run.evals[1000][1]
    own = {k: format_value(min(v, key=v.get)) for k, v in per_seed.items()}
    return [("SP's margin at 128", f"the margin equals the spread ({margin:.2f}% against {spread:.2f}%)"
             if f"{margin:.2f}" == f"{spread:.2f}" else f"(the margin {margin:.2f}% and the spread {spread:.2f}%)"),
            ("res_gelu's seeds at 64 under μP", f"the two seeds pick different rates there (seed 0 {own['mup', 0]}, "
             f"seed 6 {own['mup', 6]})"),
            ("res_gelu's seeds at 64 under SP", f"seeds pick different rates (seed 0 {own['sp', 0]}, seed 6 "
             f"{own['sp', 6]})"),
            ("SP's cost one step above its optimum at 256", f"costs SP {above['sp']:.1f}% of val loss (2.3931"),
            ("μP's", f"and μP {above['mup']:.1f}% (2.2339 against {mup.mean(mup.best):.4f})"),
            ("μP's best against SP's at 256", f"{mup.mean(mup.best):.4f}, is {wide:.1f}% above SP's best"),
            ("and at 64", f"at width 64 it is {narrow:.1f}% below"),
            ("res_gelu under SP one step above its optimum at 256",
             f"costs res_gelu under SP {res_above:.1f}% of val loss ({res_sp.mean(6e-3):.4f} against "
             f"{res_sp.mean(res_sp.best):.4f})"),
            ("res_gelu under μP against SP at 256", f"{res_mup.mean(res_mup.best):.4f}, is {res_wide:.1f}% above SP's")]


# results/width_ladder: widths 64, 256 and 384, and the width-128 runs of results/long_horizon that the study reuses
LADDER_RUNS = ["results/width_ladder/baseline_w64", "results/width_ladder/res_gelu_w64",
               "results/width_ladder/res_gelu_no_half_w64", "results/long_horizon/baseline",
               "results/long_horizon/res_gelu", "results/long_horizon/res_gelu_no_half",
               "results/width_ladder/baseline_w256", "results/width_ladder/res_gelu_w256",
               "results/width_ladder/res_gelu_no_half_w256", "results/width_ladder/baseline_w384",
               "results/width_ladder/res_gelu_w384", "results/width_ladder/res_gelu_no_half_w384"]
# the ladder's temperature control, baseline_temp2, at every width (width 128's: results/long_horizon's)
TEMP2_RUNS = ["results/width_ladder/baseline_temp2_w64", "results/long_horizon/baseline_temp2",
              "results/width_ladder/baseline_temp2_w256", "results/width_ladder/baseline_temp2_w384"]
# the declared pooled test's fresh held-out seeds 6-10 (studies/width_ladder_fresh.toml)
FRESH_RUNS = [f"results/width_ladder/fresh/{a}_w{w}" for w in (128, 256)
              for a in ("baseline", "res_gelu", "res_gelu_no_half", "baseline_temp2")]


def with_sign(x):
    """A number as the prose writes it: two decimals, its sign, a minus sign rather than a hyphen."""
    return f"{x:+.2f}".replace("-", "−")


def ladder():
    """results/width_ladder's runs at step 3000 on held-out seeds 1-5: ({(arm, width): rung}, {arm: slope})."""
    from nonlinear_queries.analysis import width

    runs, _ = read_runs([os.path.join(REPO, d) for d in LADDER_RUNS], "seed")
    rungs, slopes, _ = width.ladder([r for r in runs if r.config["seed"] in range(1, 6)], 3000)
    return {(r.arm.split()[0], r.width): r for r in rungs}, {s.arm.split()[0]: s for s in slopes}


def pct(x):
    """A percentage as the prose writes it: two decimals and a % sign."""
    return f"{x:.2f}%"


def corr(x):
    """A correlation as the prose writes it: signed, two decimals, a minus sign rather than a hyphen."""
    return f"{x:+.2f}".replace("-", "−")


def and_list(items):
    """'a, b, c and d'."""
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else items[0]


RATE_ARMS = ("baseline", "res_gelu", "res_gelu_no_half")


def rates_at_384():
    """{arm: {learning rate: seed 0's val loss at step 3000}} of studies/width_ladder_rates.toml's width-384 runs
    that reached step 3000 (an arm with none is left out)."""
    out = {}
    for arm in RATE_ARMS:
        for path in glob.glob(os.path.join(REPO, "results/width_ladder/rates", f"{arm}_w384", "*", "")):
            run = load_run(path)
            if 3000 in run.evals:
                out.setdefault(arm, {})[run.config["learning_rate"]] = run.evals[3000][1]
    return out


def tuned(losses):
    """Whether an arm's {rate: loss} is its whole tuning: the grid 1.5e-3, 3e-3, 6e-3 run and its best rate inside
    the rates run (an edge winner's next ×2 rate run too), the rule of studies/width_ladder_rates.toml."""
    return {1.5e-3, 3e-3, 6e-3} <= set(losses) and min(losses, key=losses.get) not in (min(losses), max(losses))


def width_384_rates_prose():
    """[(what, words)]: how many of width 384's tuning runs are done, which arms are tuned, and for each tuned arm
    its best rate and what a ×2 step off it costs, against the same steps at widths 64 and 128 (seed 0)."""
    at384 = rates_at_384()
    done = sum(len(losses) for losses in at384.values())
    whole = [arm for arm, losses in at384.items() if tuned(losses)]
    if len(whole) == len(RATE_ARMS):
        counts = and_list([f"{who(arm)}'s {len(losses)}" for arm, losses in at384.items()])
        out = [("width 384's rate runs", f"All {done} of width 384's runs are done and reported below: {counts}"),
               ("width 384's rate runs, in the opening", f"widths 64 and 384 are done, all "
                f"{done + sum(len(rate_losses(arm, 64)) for arm in RATE_ARMS)} runs ({best_at_384(at384)} at 384")]
    else:
        parts = [f"{who(arm)}'s {len(losses)} (reported below)" if tuned(losses) else
                 f"{len(losses)} of {who(arm)}'s (not yet reported)" for arm, losses in at384.items()]
        out = [("width 384's rate runs", f"{done} of width 384's 9 runs are done: {and_list(parts)}"),
               ("width 384's rate runs, in the opening", f"width 64 is done, and {done} of width 384's 9 runs"
                + (f" ({best_at_384(at384)} there" if best_at_384(at384) else ""))]
    ms = [float(np.median([r["ms_per_step"] for r in read_metrics(path) if "ms_per_step" in r])) for path in
          glob.glob(os.path.join(REPO, "results/width_ladder/rates/*_w384/*/metrics.jsonl"))]
    out.append(("width 384's rate runs' time", f"Width 384's rate runs took a median {min(ms) / 1000:.2f} to "
                f"{max(ms) / 1000:.2f} s a step"))
    at_3e3 = all(min(at384[arm], key=at384[arm].get) == 3e-3 for arm in whole)
    if len(whole) == len(RATE_ARMS):
        at64 = {arm: rate_losses(arm, 64) for arm in RATE_ARMS}
        both = at_3e3 and all(min(losses, key=losses.get) == 3e-3 for losses in at64.values())
        out += [("384's tuning in the declared test's limits",
                 "3e-3 is each arm's best rate at 384 on the tuning seed, one run per rate" if at_3e3
                 else "(an arm's best rate at 384 is not 3e-3)"),
                ("384's tuning in the Limits", "was tested on the tuning seed at widths 64 and 384 (it is, for "
                 f"{and_list([who(arm) for arm in RATE_ARMS])} at both" if both
                 else "(an arm's best rate at 64 or 384 is not 3e-3)")]
    elif whole:
        names = and_list([who(arm) for arm in whole])
        out += [("384's tuning in the declared test's limits",
                 f"best rate at 384 is tested for {names} alone so far (it is, on the tuning seed"
                 if at_3e3 else "(an arm's best rate at 384 is not 3e-3)"),
                ("384's tuning in the Limits", f"and at 384 for {names} alone (it is), not yet for "
                 f"{and_list([a for a in RATE_ARMS if a not in whole])} at 384" if at_3e3
                 else "(an arm's best rate at 384 is not 3e-3)")]
    for arm, losses in at384.items():
        if not tuned(losses):
            continue
        best = min(losses, key=losses.get)
        cost = {64: step_off(rate_losses(arm, 64)), 128: step_off(rate_losses(arm, 128)), 384: step_off(losses)}
        steps = lambda w: f"{pct(cost[w][0])} and {pct(cost[w][1])}"  # noqa: E731
        out.append((f"{arm}'s best rate at 384",
                    f"At width 384 {who(arm)}'s best rate on the tuning seed is {rate(best)}"
                    + (", inside the grid, as at 64 and 128: the rule adds no held-out runs for it" if best == 3e-3
                       else "")))
        out.append((f"{arm}'s cost of a step off at 384", f"On this seed 1.5e-3 and 6e-3 cost it {steps(384)} of val "
                    f"loss at 384, against {steps(64)} at 64 and {steps(128)} at 128"))
    if len(whole) == len(RATE_ARMS):  # the smallest cost of a ×2 step over every arm, width and side
        costs = {(arm, w, lr): c for arm in RATE_ARMS for w, losses in
                 ((64, rate_losses(arm, 64)), (128, rate_losses(arm, 128)), (384, at384[arm]))
                 for lr, c in zip((1.5e-3, 6e-3), step_off(losses))}
        arm, w, lr = min(costs, key=costs.get)
        out.append(("the narrowest margin", f"{who(arm)}'s {pct(costs[arm, w, lr])} to {rate(lr)} at {w} is the "
                    "narrowest margin of any arm at any of the three widths on this seed"))
    return out


def best_at_384(at384):
    """Each tuned arm's best rate at 384, arms grouped by rate: "the baseline's and res_gelu's best is 3e-3" ('' if
    no arm is tuned yet)."""
    by_rate = {}
    for arm, losses in at384.items():
        if tuned(losses):
            by_rate.setdefault(rate(min(losses, key=losses.get)), []).append(f"{who(arm)}'s")
    return and_list([f"{and_list(names)} best is {lr}" for lr, names in by_rate.items()]) if by_rate else ""


def step_off(losses):
    """[what 1.5e-3 costs, what 6e-3 costs] in % of val loss against 3e-3, of {rate: loss} on one seed."""
    return [100 * (losses[lr] - losses[3e-3]) / losses[3e-3] for lr in (1.5e-3, 6e-3)]


def rate(lr):
    """A learning rate as the prose writes it: 3e-3, 1.5e-3."""
    return np.format_float_scientific(lr, trim="-", exp_digits=1)


def who(arm):
    """An arm as the prose names it: 'the baseline', 'res_gelu'."""
    return "the baseline" if arm == "baseline" else arm


def rate_losses(arm, width):
    """{rate: seed 0's val loss at step 3000} of an arm's tuning runs at width 64 (results/width_ladder/rates) or
    128 (results/long_horizon's)."""
    where = f"results/width_ladder/rates/{arm}_w64" if width == 64 else f"results/long_horizon/{arm}"
    return {lr: seeds[0] for lr, seeds in final_losses(where, 3000).items() if 0 in seeds}


def width_ladder_prose():
    """results/width_ladder/README.md's numbers, from the runs at step 3000 (held-out seeds 1-5): each arm's gap
    to the baseline per width with its interval, p and minimum detectable effects (the paired test's, and Welch's
    beside it), the within-seed correlations, width 384's runs during training, the slopes with their own MDE,
    the signs of the gaps, the FLOPs ratios, the planned power of the declared test, how many runs each new width
    has, and that each ran in one session."""
    from nonlinear_queries.analysis import stats, width

    rung, slope = ladder()
    widths = (64, 128, 256, 384)
    arms = ("res_gelu", "res_gelu_no_half")

    def gap(r, word):  # the gap as the prose says it: "2.24% behind (95% CI ...)" or "1.77% ahead (...)"
        return f"{abs(r.gap):.2f}% {word if r.gap < 0 else 'ahead'} ({with_sign(r.ci[0])} to {with_sign(r.ci[1])}"

    def both(w, which="mde"):  # "5.82% for res_gelu and 6.05% for res_gelu_no_half"
        return " and ".join(f"{pct(getattr(rung[a, w], which))} for {a}" for a in arms)

    def rho(a, w):
        r = rung[a, w]
        return float(np.corrcoef(r.losses, r.base_losses)[0, 1])

    sessions = {w: [sum(r["type"] == "config" for r in read_metrics(path)) for a in arms + ("baseline",) for path in
                    glob.glob(os.path.join(REPO, f"results/width_ladder/{a}_w{w}/*/metrics.jsonl"))]
                for w in (64, 256, 384)}
    g, n = rung["res_gelu", 64], rung["res_gelu_no_half", 64]
    g2, n2 = rung["res_gelu", 128], rung["res_gelu_no_half", 128]
    g4, n4 = rung["res_gelu", 256], rung["res_gelu_no_half", 256]
    g6, n6 = rung["res_gelu", 384], rung["res_gelu_no_half", 384]
    # width 384 during training: res_gelu's gap to the baseline per seed at each evaluation
    during = {}
    for seed in (1, 2, 3):
        point = f"learning_rate=3e-3,seed={seed},data_seed={seed}"
        base = load_run(os.path.join(REPO, "results/width_ladder/baseline_w384", point)).evals
        mine = load_run(os.path.join(REPO, "results/width_ladder/res_gelu_w384", point)).evals
        during[seed] = {step: 100 * (base[step][1] - mine[step][1]) / base[step][1] for step in sorted(base)}
    ahead = [step for step in during[2] if 0 < step and during[2][step] > 0]
    behind_from = min(step for step in during[2] if all(during[2][t] < 0 for t in during[2] if t >= step))
    seed2 = (f"res_gelu's seed 2 ({g6.losses[1]:.4f}, against the baseline's {g6.base_losses[1]:.4f}: "
             f"{-g6.gaps[1]:.2f}% behind) was ahead of its pair at steps {and_list([str(t) for t in ahead[-2:]])} ("
             f"{' and '.join(with_sign(during[2][t]) + '%' for t in ahead[-2:])}) and behind from step "
             f"{behind_from} on; seeds 1 and 3 were further behind mid-run ({with_sign(during[1][1000])}% and "
             f"{with_sign(during[3][1000])}% at step 1000) and ended {-g6.gaps[0]:.2f}% and {-g6.gaps[2]:.2f}% behind")
    # the slopes' power and the signs of the gaps
    s_g, s_n = slope["res_gelu"], slope["res_gelu_no_half"]
    power = (f"The slope's test detects, with 80% power, a slope of {s_g.mde:.2f} (res_gelu) and {s_n.mde:.2f} "
             f"(res_gelu_no_half) points per doubling, {s_g.mde * s_g.span:.2f} and {s_n.mde * s_n.span:.2f} points "
             f"over 64 → 384")
    largest = max(abs(rung[a, w].gap) for a in arms for w in widths)
    power_vs_gaps = ("larger than either arm's gap at any width" if min(s_g.mde, s_n.mde) * s_g.span > largest
                     else "(not larger than every gap)")
    signs = ("Each arm's gap has the same sign at all four widths (res_gelu behind the baseline, res_gelu_no_half "
             "ahead)" if all(rung["res_gelu", w].gap < 0 < rung["res_gelu_no_half", w].gap for w in widths)
             else "(the gaps change sign across the widths)")
    flops = {w: rung["res_gelu", w].flops for w in widths}
    flop_words = (f"multiplies a run's training FLOPs by {flops[128] / flops[64]:.2f} from 64 to 128 and by "
                  f"{flops[256] / flops[128]:.2f} from 128 to 256 (" +
                  ", ".join(f"{flops[w] / 1e15:.4f}" for w in (64, 128)) + f" and {flops[256] / 1e15:.4f} PFLOPs; "
                  f"{flops[384] / 1e15:.4f} at 384, {flops[384] / flops[256]:.2f} times 256's for 1.5 times the width")
    # the declared test's power on 10 fresh pairs at widths 128 and 256, at the spread of seeds 1-5 there
    planned = []
    for a in arms:
        groups = [rung[a, w].gaps for w in (128, 256)]
        spread = np.sqrt(sum(float(((x - x.mean()) ** 2).sum()) for x in groups) / 8)
        se = spread * np.sqrt(1 / 5 + 1 / 5) / 2
        planned.append((a, spread, stats.t_detectable_effect(se, 8), stats.t_detectable_effect(se, 8, alpha=0.025)))
    plan = (f"at the spread of seeds 1–5 at widths 128 and 256 (a pooled within-width standard deviation of "
            f"{planned[0][1]:.2f} points for res_gelu and {planned[1][1]:.2f} for res_gelu_no_half), the declared "
            f"test on 10 fresh pairs detects with 80% power a pooled gap of {pct(planned[0][2])} and "
            f"{pct(planned[1][2])} at level 0.05, {pct(planned[0][3])} and {pct(planned[1][3])} at Holm's first "
            f"level, 0.025")
    # one x2 step off 3e-3 on results/long_horizon's tuning seed, for the three arms the ladder runs
    off = [cost for a in RATE_ARMS for cost in step_off(rate_losses(a, 128))]
    # section "Each arm's own rate at the ladder's ends": width 64's tuning runs on seed 0 (studies/width_ladder_rates)
    rates = "results/width_ladder/rates"
    at64 = {a: rate_losses(a, 64) for a in RATE_ARMS}
    step_cost = {a: step_off(losses) for a, losses in at64.items()}
    costs = lambda a: f"{pct(step_cost[a][0])} and {pct(step_cost[a][1])}"  # noqa: E731
    at128 = {a: rate_losses(a, 128) for a in RATE_ARMS}
    less_at_64 = all(mine < there for a in at64 for mine, there in zip(step_cost[a], step_off(at128[a])))
    rate_runs = glob.glob(os.path.join(REPO, rates, "*_w64", "*", "metrics.jsonl"))
    rate_headers = [read_metrics(path) for path in glob.glob(os.path.join(REPO, rates, "*", "*", "metrics.jsonl"))]
    ms_384 = [float(np.median([r["ms_per_step"] for r in read_metrics(path) if "ms_per_step" in r]))
              for a in arms + ("baseline",)
              for path in glob.glob(os.path.join(REPO, f"results/width_ladder/{a}_w384/*/metrics.jsonl"))]
    # one x2 step off the best rate on the tuning seed (every arm, widths 64, 128 and 384) against the gaps
    at384 = rates_at_384()
    every_cost = [c for a in RATE_ARMS for losses in (at64[a], at128[a], at384[a]) for c in step_off(losses)]
    every_gap = [abs(rung[a, w].gap) for a in arms for w in widths]
    down64, up128 = step_cost["res_gelu"][0], step_off(at128["res_gelu"])[1]
    steps_vs_gaps = (f"On the tuning seed one ×2 step off the best rate costs {pct(min(every_cost))} to "
                     f"{pct(max(every_cost))} of val loss (the baseline, res_gelu and res_gelu_no_half at widths 64, "
                     f"128 and 384, one run per rate), comparable to the gaps above ({pct(min(every_gap))} to "
                     f"{pct(max(every_gap))}) and not larger than each of them: res_gelu's step down at 64 costs "
                     f"{pct(down64)} against its {pct(-g.gap)} gap there, its step up at 128 {pct(up128)} against "
                     f"its {pct(-g2.gap)}" if down64 < -g.gap and up128 < -g2.gap else "(every step costs more)")
    # section "The temperature control at every width": baseline_temp2's gap, and D per width and pooled
    def done(d):  # the run directories of `d` with an eval at step 3000
        return [path for path in glob.glob(os.path.join(REPO, d, "*", "")) if 3000 in load_run(path).evals]

    # width 384's temperature control is analysed once its three seeds are all run (the others are complete)
    temp2_dirs = [d for d in TEMP2_RUNS if os.path.isdir(os.path.join(REPO, d))]
    analysed = [d for d in temp2_dirs if not d.endswith("_w384") or len(done(d)) == 3]
    runs, _ = read_runs([os.path.join(REPO, d) for d in LADDER_RUNS + analysed], "seed")
    trungs = width.ladder([r for r in runs if r.config["seed"] in range(1, 6)], 3000)[0]
    temp2 = "baseline attn_scale=0.35355339059327373"
    tr = {(r.arm.split()[0] if r.arm != temp2 else "temp2", r.width): r for r in trungs}
    d = width.effect_difference(trungs, "res_gelu_no_half", "res_gelu", temp2)
    d_test = width.pooled_test("D", d)

    def t2(w, source=""):
        r = tr["temp2", w]
        return f"{with_sign(r.gap)}% at {w} ({source}{with_sign(r.ci[0])} to {with_sign(r.ci[1])}"

    def d_at(w):
        ci = width.t_interval(d[w])
        return (f"{with_sign(d[w].mean())} {'points at' if w == 64 else 'at'} {w} ({'95% CI ' if w == 64 else ''}"
                f"{with_sign(ci[0])} to {with_sign(ci[1])}, p = {width.one_sample_p(d[w]):.2g}")

    def parts(w):  # D's two parts: no_half's gap minus temp2's, and res_gelu's deficit (means over shared seeds)
        return f"{tr['res_gelu_no_half', w].gap - tr['temp2', w].gap:.2f} and {-tr['res_gelu', w].gap:.2f}"

    temp2_done = [path for d in temp2_dirs if d.startswith("results/width_ladder/") for path in done(d)]
    fresh_done = [path for d in FRESH_RUNS for path in done(d)]
    ms_256 = [float(np.median([r["ms_per_step"] for r in read_metrics(path) if "ms_per_step" in r]))
              for path in glob.glob(os.path.join(REPO, "results/width_ladder/baseline_temp2_w256/*/metrics.jsonl"))]
    ms_t384 = [float(np.median([r["ms_per_step"] for r in read_metrics(os.path.join(path, "metrics.jsonl"))
                                if "ms_per_step" in r]))
               for path in done("results/width_ladder/baseline_temp2_w384")]
    seed3 = [ms for path, ms in zip(done("results/width_ladder/baseline_temp2_w384"), ms_t384) if "seed=3," in path]
    ms_t384_seed3 = seed3[0] if seed3 else None
    # the widths analysed: 64, 128 and 256, and 384 once its three seeds are run; 128's are long_horizon's runs
    t_widths = sorted(d)
    n_widths = {3: "three", 4: "four"}[len(t_widths)]
    holm = dict(zip(t_widths, stats.holm([width.one_sample_p(d[w]) for w in t_widths])))
    temperature = [
        ("temp2's own gaps", and_list([f"{t2(w)}, n = {len(tr['temp2', w].gaps)})" for w in t_widths if w != 128])
         + f", against {t2(128, source='results/long_horizon' + chr(39) + 's runs, ')})"),
        ("D per width", and_list([f"{d_at(w)}" + (")" if w == 128 else f", n = {len(d[w])})") for w in t_widths])),
        ("D's sign", f"D is positive at each of the {n_widths} widths" if all(d[w].mean() > 0 for w in t_widths)
         else "(D is not positive at every width)"),
        ("D after Holm", f"Holm's correction over the {n_widths} widths gives " + and_list(
            [f"{q:.2g} at {w}" for w, q in holm.items()])),
        ("D's width under 0.05 after Holm", "after correction it is established at " + " and ".join(
            str(w) for w, q in holm.items() if q < 0.05) + " alone" if any(q < 0.05 for q in holm.values())
         else "after correction no single width establishes it"),
        ("D's parts", f"At 64 these are {parts(64)} points, " + ", ".join(f"at {w} {parts(w)}" for w in t_widths[1:])),
        ("D's larger part", "at every width the larger of the two is res_gelu's deficit" if all(
            -tr["res_gelu", w].gap > tr["res_gelu_no_half", w].gap - tr["temp2", w].gap for w in t_widths)
         else "(res_gelu's deficit is not the larger part at every width)"),
        ("D pooled", f"D is {with_sign(d_test.estimate)} points ({with_sign(d_test.ci[0])} to "
         f"{with_sign(d_test.ci[1])}, p = {d_test.p:.2g}, {d_test.n} seed triples)"),
        ("temp2's runs done", f"{len(temp2_done)} of its 13 new runs are done" if len(temp2_done) < 13
         else "all 13 of its new runs are done"),
        ("fresh runs done", f"{len(fresh_done)} of its 40 runs are done" if len(fresh_done) < 40
         else "all 40 of its runs are done"),
        ("a width-256 run's time", f"a width-256 run took about {np.median(ms_256) * 3000 / 60000:.0f} minutes here"),
        ("a width-384 temp2 run's time", f"a width-384 run about {np.median(ms_t384) * 3000 / 60000:.0f})"),
        ("width 384's seed 3's time", f"its seed 3, on a later machine of the same kind, took about "
         f"{ms_t384_seed3 * 3000 / 60000:.0f}" if ms_t384_seed3 else "(width 384's seed 3 is not run)"),
    ]
    return temperature + declared_test_prose() + temperature_declaration_prose() + [
            ("width 64's best rates", "At width 64 every arm's best rate on the tuning seed is 3e-3"
             if all(min(losses, key=losses.get) == 3e-3 and len(losses) == 3 for losses in at64.values())
             else "(an arm's best rate at 64 is not 3e-3)"),
            ("width 64's cost of a step off", f"1.5e-3 and 6e-3 cost the baseline {costs('baseline')} of val loss at "
             f"64, res_gelu {costs('res_gelu')}, res_gelu_no_half {costs('res_gelu_no_half')}"),
            ("64 against 128", "one ×2 step off 3e-3 costs less at 64 than at 128, in all six cases" if less_at_64
             else "(not in all six cases)"),
            ("res_gelu's narrowest margin", f"res_gelu's narrowest margin here ({pct(min(step_cost['res_gelu']))})"),
            *width_384_rates_prose(),
            ("the rates' runs", f"Width 64 is done ({len(rate_runs)} runs)"
             if all({r.get("git_commit", "")[:7] for r in h if r["type"] == "config"} == {"675661b"} and
                    sum(r["type"] == "config" for r in h) == 1 for h in rate_headers) else "(a rate run differs)"),
            ("width 384's time", f"a median {np.median(ms_384) / 1000:.2f} s a step with two side by side on 2 cores, "
             f"about {np.median(ms_384) * 3000 / 60000:.0f} minutes a run, so about "
             f"{9 * np.median(ms_384) * 3000 / 1000 / 3600 / 2:.1f} hours of wall time for the 9"),
            ("width 64, res_gelu", f"{-g.gap:.2f}% above the baseline's (95% CI {with_sign(g.ci[0])} to "
             f"{with_sign(g.ci[1])}, paired p = {g.p:.2g})"),
            ("width 64, res_gelu_no_half", f"{n.gap:.2f}% below ({with_sign(n.ci[0])} to {with_sign(n.ci[1])}, "
             f"p = {n.p:.2g})"),
            ("width 128, res_gelu", f"res_gelu {gap(g2, 'behind')}, p = {g2.p:.2g})"),
            ("width 128, no_half", f"res_gelu_no_half {gap(n2, 'behind')}, p = {n2.p:.2g})"),
            ("width 256, res_gelu", f"res_gelu {gap(g4, 'behind')}, p = {g4.p:.2g}, n = {len(g4.gaps)})"),
            ("width 256, no_half", f"res_gelu_no_half {gap(n4, 'behind')}, p = {n4.p:.2g}, n = {len(n4.gaps)})"),
            ("width 384, res_gelu", f"res_gelu {gap(g6, 'behind')}, p = {g6.p:.2g}, n = {len(g6.gaps)})"),
            ("width 384, no_half", f"res_gelu_no_half {gap(n6, 'behind')}, p = {n6.p:.2g}, n = {len(n6.gaps)})"),
            ("width 64's MDEs", f"at this n the paired test's minimum detectable effect is {both(64)} (Welch's on "
             f"the same runs: {pct(g.mde_welch)} and {pct(n.mde_welch)})"),
            ("width 128's MDEs", f"the paired test's minimum detectable effects are {both(128)}"),
            ("width 256's MDEs", f"the paired test's minimum detectable effect at width 256 is {both(256)} "
             f"(Welch's: {pct(g4.mde_welch)} and {pct(n4.mde_welch)})"),
            ("width 384's MDEs", f"with three seeds the paired test's minimum detectable effect is {both(384)}"),
            ("the correlations", f"the correlation over seeds of res_gelu's val loss with the baseline's is "
             f"{and_list([corr(rho('res_gelu', w)) for w in widths])}, and of res_gelu_no_half's "
             f"{and_list([corr(rho('res_gelu_no_half', w)) for w in widths])}"),
            ("what pairing costs at 256", f"res_gelu's paired MDE is {pct(g4.mde)} against Welch's "
             f"{pct(g4.mde_welch)}" if rho("res_gelu", 256) < 0 and g4.mde > g4.mde_welch
             else "(pairing gains at 256)"),
            ("and gains at 384", f"res_gelu_no_half's is {pct(n6.mde)} against {pct(n6.mde_welch)}"
             if rho("res_gelu_no_half", 384) > 0 and n6.mde < n6.mde_welch else "(pairing costs at 384)"),
            ("width 384 during training", seed2),
            ("width 384's pairs in the slopes", f"over the four widths ({s_g.n} and {s_n.n} pairs"),
            ("the slopes' power", f"{power}: {power_vs_gaps}"),
            ("the signs", signs),
            ("the FLOPs", flop_words),
            ("width 256's baseline", f"{g4.base_losses.mean():.4f} at 256"),
            ("res_gelu's slope", f"res_gelu's slope is {with_sign(s_g.slope)} percentage points per "
             f"doubling of width ({with_sign(s_g.ci[0])} to {with_sign(s_g.ci[1])})"),
            ("no_half's slope", f"res_gelu_no_half's {with_sign(s_n.slope)} "
             f"({with_sign(s_n.ci[0])} to {with_sign(s_n.ci[1])})"),
            ("the limits at 384", f"where the paired test's minimum detectable effect is {both(384)}, against "
             f"{both(256)} at 256"),
            ("the declared test's planned power", plan),
            ("no_half's exploratory pooled gap against the planned MDE",
             "res_gelu_no_half's pooled gap on seeds 1–5 (the exploratory table below) is smaller than its planned MDE"
             if next(t for t in width.pooled_tests(list(rung.values())) if t.arm.split()[0] == "res_gelu_no_half"
                     ).estimate < planned[1][2] else "(no_half's pooled gap reaches the planned MDE)"),
            ("one step off the rate", f"one ×2 step off 3e-3 cost between {min(off):.1f}% and {max(off):.1f}%"),
            ("a step off against the gaps", steps_vs_gaps),
            ("a step off against the gaps, in the Limits", f"comparable to the gaps above and not larger than each "
             f"(res_gelu's step up there, {pct(step_off(at128['res_gelu'])[1])}, against its {pct(-g2.gap)} gap)"
             if step_off(at128["res_gelu"])[1] < -g2.gap else "(every step costs more than the gap at 128)"),
            ("runs of widths 64, 256 and 384, one session each",
             f"Width 64's {len(sessions[64])} runs, width 256's {len(sessions[256])} and width 384's "
             f"{len(sessions[384])} are complete" if all(set(s) == {1} for s in sessions.values())
             else "a run of width 64, 256 or 384 was resumed")]


def declared_tests(dirs, seeds):
    """The ladder's declared pooled tests on the runs under `dirs` at step 3000 with a seed in `seeds`: ({arm:
    Pooled}, Holm over res_gelu and res_gelu_no_half against the baseline; the Pooled test of D, the temperature
    comparison, None where `dirs` hold no baseline_temp2; {(arm, width): Rung}, baseline_temp2's arm "temp2")."""
    from nonlinear_queries.analysis import width

    runs, _ = read_runs([os.path.join(REPO, d) for d in dirs], "seed")
    rungs = width.ladder([r for r in runs if r.config["seed"] in seeds], 3000)[0]
    arms = ("res_gelu", "res_gelu_no_half")
    tests = {t.arm: t for t in width.pooled_tests([r for r in rungs if r.arm in arms])}
    temp2 = "baseline attn_scale=0.35355339059327373"
    d = (width.pooled_test("D", width.effect_difference(rungs, "res_gelu_no_half", "res_gelu", temp2))
         if any(r.arm == temp2 for r in rungs) else None)
    return tests, d, {("temp2" if r.arm == temp2 else r.arm, r.width): r for r in rungs}


def declared_test_prose():
    """results/width_ladder/README.md's report of the declared pooled test: on the fresh seeds 6-10 alone (all 40
    runs), seeds 1-5's estimate at the same widths beside it and the test of the shift between them, the MDEs under
    Holm, how much the lead leans on single seeds, and the same model over every seed (1-10 at 128 and 256, 1-5 at
    64, 1-3 at 384), labelled exploratory."""
    from nonlinear_queries.analysis import width

    assert sum(len(glob.glob(os.path.join(REPO, d, "*", "metrics.jsonl"))) for d in FRESH_RUNS) == 40
    no_temp2 = [d for d in FRESH_RUNS if "temp2" not in d]
    on_fresh, d_fresh, rung = declared_tests(FRESH_RUNS, range(6, 11))
    middle = [d for d in LADDER_RUNS if d.startswith("results/long_horizon/") or d.endswith("_w256")]
    on_15, _, _ = declared_tests(middle, range(1, 6))
    on_all, _, _ = declared_tests(LADDER_RUNS + no_temp2, range(1, 11))
    _, d_all, _ = declared_tests(LADDER_RUNS + TEMP2_RUNS + FRESH_RUNS, range(1, 11))

    def words(t, unit="%", holm=True):
        return (f"{with_sign(t.estimate)}{unit} ({with_sign(t.ci[0])} to {with_sign(t.ci[1])}, p = {t.p:.2g}"
                + (f", Holm p = {t.p_holm:.2g}" if holm else "") + f", {t.n} "
                + ("pairs" if holm else "seed triples") + f"; minimum detectable effect {t.mde:.2f}{unit})")

    def verdict(arm, t):
        return (f"**{arm}'s {'lead' if t.estimate > 0 else 'deficit'} "
                + ("is detected" if t.p_holm < 0.05 else "is not detected at this n"))

    def parts(w):  # D's two parts on the fresh seeds: no_half's gap minus temp2's, and res_gelu's deficit
        return f"{rung['res_gelu_no_half', w].gap - rung['temp2', w].gap:.2f} and {-rung['res_gelu', w].gap:.2f}"

    def t2(w):
        r = rung["temp2", w]
        return f"{with_sign(r.gap)}% at {w}, {with_sign(r.ci[0])} to {with_sign(r.ci[1])}"

    g, g15 = on_fresh["res_gelu"], on_15["res_gelu"]
    # the MDEs under the declared Holm: its first level 0.025 at the observed spread of the fresh pairs
    holm_mde = {a: width.planned_mde(width.pooled_sd({w: rung[a, w].gaps for w in (128, 256)}), 5, 2, alpha=0.025)
                for a in on_fresh}
    # res_gelu's fresh estimate against seeds 1-5's at the same widths, the seed set a factor
    _, _, rung15 = declared_tests(middle, range(1, 6))
    shift = width.pooled_shift({w: rung15["res_gelu", w].gaps for w in (128, 256)},
                               {w: rung["res_gelu", w].gaps for w in (128, 256)})
    # res_gelu_no_half's Holm p with one fresh pair left out, for each of the 10
    loo = [(w, seed[0], next(t.p_holm for t in tests if t.arm == "res_gelu_no_half"))
           for w, seed, tests in width.leave_one_out([rung[a, w] for a in on_fresh for w in (128, 256)])]
    above = [(w, s, p) for w, s, p in loo if p >= 0.05]
    below = [p for *_, p in loo if p < 0.05]
    above_seeds = sorted({s for _, s, _ in above})
    fragile = (f"its Holm p rises above 0.05 for {len(above)} of the {len(loo)} pairs (seeds "
               f"{and_list([str(x) for x in above_seeds])} at each width), to {min(p for *_, p in above):.3f}–"
               f"{max(p for *_, p in above):.3f}; for the other {len(below)} it stays between {min(below):.3f} and "
               f"{max(below):.3f}" if above and all(sorted(s for w2, s, _ in above if w2 == w) == above_seeds
                                                    for w in (128, 256)) else "(no_half's leave-one-out changed)")
    return [(f"declared, {arm}", f"{arm}'s pooled gap is {words(t)}") for arm, t in on_fresh.items()] + [
        (f"declared verdict, {arm}", verdict(arm, t)) for arm, t in on_fresh.items()] + [
        ("res_gelu's interval", f"its 95% interval leaves out a deficit larger than {-g.ci[0]:.2f}% and a lead "
         f"larger than {g.ci[1]:.2f}%" if g.ci[0] < 0 < g.ci[1] else "(res_gelu's interval excludes 0)"),
        ("res_gelu on seeds 1-5", f"estimate was {with_sign(g15.estimate)}%, {g15.estimate / g.estimate:.1f} times "
         "the fresh one"),
        ("the MDE under Holm", f"A true pooled gap of {g.mde:.2f}% either way would be detected with 80% power at "
         f"this spread without correction; under the declared Holm correction, which tests res_gelu at level 0.025 "
         f"or 0.05 by its rank, the gap detected with 80% power is up to {holm_mde['res_gelu']:.2f}% "
         f"({holm_mde['res_gelu_no_half']:.2f}% for res_gelu_no_half, {on_fresh['res_gelu_no_half'].mde:.2f}% "
         "uncorrected)"),
        ("res_gelu's shift from seeds 1-5", f"puts the fresh estimate {with_sign(shift.estimate)} points above seeds "
         f"1–5's ({with_sign(shift.ci[0])} to {with_sign(shift.ci[1])}, p = {shift.p:.2g}, {shift.df} degrees of "
         "freedom): a shift not detected at level 0.05" if shift.p >= 0.05 else "(the shift is detected)"),
        ("no_half's leave-one-out", fragile),
        ("declared, D", f"D is {words(d_fresh, ' points', holm=False)}"),
        ("declared verdict, D", "**D is detected, and positive" if d_fresh.p < 0.05 and d_fresh.estimate > 0
         else "(D is not detected)"),
        ("D's parts on the fresh seeds", f"are {parts(128)} points at 128 and {parts(256)} at 256"),
        ("temp2's gap on the fresh seeds", f"({t2(128)}, and {t2(256)})" if all(
            rung["temp2", w].ci[0] < 0 < rung["temp2", w].ci[1] for w in (128, 256)) else "(temp2's gap detected)")] + [
        (f"all seeds, {arm}", f"{arm}'s pooled gap is {words(t)}") for arm, t in on_all.items()] + [
        ("all seeds, D", f"D is {words(d_all, ' points', holm=False)}")]


# the declared contrast E's arms on the seeds already run: baseline_temp2 (first: the baseline) and res_gelu_no_half
# at widths 128 (results/long_horizon's and fresh seeds 6-10) and 256
E_RUNS = ["results/long_horizon/baseline_temp2", "results/long_horizon/res_gelu_no_half",
          "results/width_ladder/baseline_temp2_w256", "results/width_ladder/res_gelu_no_half_w256",
          *(f"results/width_ladder/fresh/{a}_w{w}" for w in (128, 256) for a in ("baseline_temp2", "res_gelu_no_half"))]
# and on its declared seeds 11-20 (studies/width_ladder_temperature.toml)
E_DECLARED_RUNS = [f"results/width_ladder/temperature/{a}_w{w}" for w in (128, 256)
                   for a in ("baseline_temp2", "res_gelu_no_half")]


def temperature_declaration_prose():
    """results/width_ladder/README.md's declaration of E (res_gelu_no_half against baseline_temp2 on seeds 11-20)
    and its result: all 40 runs committed, each unbroken; the power planned from E's spread on the seeds run before
    (seeds 1-10, and 1-5 alone), the seeds a width that detect 0.4 points, E on those seeds (exploratory), and the
    declared test (temperature_result_prose)."""
    from nonlinear_queries.analysis import width

    runs, _ = read_runs([os.path.join(REPO, d) for d in E_RUNS + E_DECLARED_RUNS], "seed")

    def e_rungs(seeds):
        return width.ladder([r for r in runs if r.config["seed"] in seeds], 3000)[0]

    def words(t):
        return (f"{with_sign(t.estimate)} points ({with_sign(t.ci[0])} to {with_sign(t.ci[1])}, p = {t.p:.2g}, "
                f"{t.n} pairs)")

    made = sorted(glob.glob(os.path.join(REPO, "results/width_ladder/temperature/*/*/metrics.jsonl")))
    assert len(made) == 40, "the temperature study's 40 runs are all committed"
    # each run ran from step 0 in one process: one config record, nothing resumed
    for path in made:
        records = [json.loads(line) for line in open(path)]
        assert [r["config"]["resume_from"] for r in records if r["type"] == "config"] == [""], path
    sd = width.pooled_sd({r.width: r.gaps for r in e_rungs(range(1, 11))})
    sd15 = width.pooled_sd({r.width: r.gaps for r in e_rungs(range(1, 6))})
    mde, mde15 = width.planned_mde(sd, 10, 2), width.planned_mde(sd15, 10, 2)
    runs_done = [
        ("E's runs, in its section", "**All 40 of its runs are done, and its test is reported below.**"),
        ("E's runs, in the opening", "declared before its seeds 11–20: all 40 of its runs are done, and its section "
         "reports the declared test")]
    return runs_done + temperature_result_prose(e_rungs, words) + [
        ("E's spread", f"E's pooled within-width standard deviation on seeds 1–10 at widths 128 and 256 (20 pairs, "
         f"the exploratory table below) is {sd:.2f} points"),
        ("the planned MDE", f"At that spread 10 seeds at each of the two widths detect with 80% power E = {mde:.2f} "
         f"points (a one-sided test would detect {width.planned_mde(sd, 10, 2, alpha=0.1):.2f}), so a 0.4-point "
         f"contrast is detectable; {width.seeds_for_mde(sd, 0.4, 2)} seeds a width is the fewest that would detect "
         "it" if mde <= 0.4 else "(10 seeds do not detect 0.4 points at the spread of seeds 1-10)"),
        ("the planned MDE at seeds 1-5's spread", f"On seeds 1–5 alone the spread is larger, {sd15:.2f} points: "
         f"there 10 seeds detect {mde15:.2f} points, not 0.4, and {width.seeds_for_mde(sd15, 0.4, 2)} seeds a width "
         "would be needed" if sd15 > sd and mde15 > 0.4 else "(seeds 1-5's spread changed)"),
        ("E on seeds 1-10", f"on seeds 1–10 E is {words(width.pooled_tests(e_rungs(range(1, 11)))[0])}"),
        ("E on seeds 6-10",
         f"On the fresh seeds 6–10 alone it is {words(width.pooled_tests(e_rungs(range(6, 11)))[0])}")]


def temperature_result_prose(e_rungs, words):
    """The declared test of E on seeds 11-20 (all 40 runs), its verdict by the declaration's outcomes, its spread
    against the one the declaration planned with, E per width on those seeds, and the same model over seeds 1-20
    (exploratory)."""
    from nonlinear_queries.analysis import width

    rungs = e_rungs(range(11, 21))
    assert sorted((r.width, len(r.gaps)) for r in rungs) == [(128, 10), (256, 10)]
    t = width.pooled_tests(rungs)[0]
    pooled = width.pooled_tests(e_rungs(range(1, 21)))[0]
    if t.p < 0.05:
        verdict = f"**E is detected, and {'positive' if t.estimate > 0 else 'negative'}**"
    else:
        verdict = "**E is not detected at this n**"
    sd, planned_sd = (width.pooled_sd({r.width: r.gaps for r in e_rungs(seeds)}) for seeds in (range(11, 21),
                                                                                             range(1, 11)))
    bounds = (f"from a loss of {-t.ci[0]:.2f} to a gain of {t.ci[1]:.2f}" if t.ci[0] < 0 < t.ci[1]
              else "(E's interval excludes 0)")
    per_width = " and ".join(f"{with_sign(r.gap)} at {r.width} ({with_sign(r.ci[0])} to {with_sign(r.ci[1])}, "
                             f"p = {r.p:.2g})" for r in sorted(rungs, key=lambda r: r.width))
    return [
        ("the declared test of E", f"on seeds 11–20 E is {words(t)}; minimum detectable effect {t.mde:.2f} points"),
        ("its verdict", verdict),
        ("what E's interval bounds", bounds),
        ("E's spread against the plan's", f"E's pooled within-width standard deviation on seeds 11–20 was {sd:.2f} "
         f"points, against {planned_sd:.2f} on seeds 1–10, so the effect detectable with 80% power is {t.mde:.2f} "
         f"points, against the {width.planned_mde(planned_sd, 10, 2):.2f} the declaration planned for"
         if t.mde > 0.4 else "(the test met its plan)"),
        ("E per width on seeds 11-20", f"per width it is {per_width}"),
        ("E over seeds 1-20, exploratory", f"over seeds 1–20 E is {words(pooled)}")]


def width_doc_prose():
    """docs/width.md's account of the declared pooled test (fresh seeds 6-10; every seed beside it, exploratory),
    baseline_temp2's pooled gap on the fresh seeds, and of studies/width_ladder_rates.toml at width 384: the runs
    done, each tuned arm's best rate."""
    from nonlinear_queries.analysis import width

    fresh, d, rung = declared_tests(FRESH_RUNS, range(6, 11))
    every, _, _ = declared_tests(LADDER_RUNS + [r for r in FRESH_RUNS if "temp2" not in r], range(1, 11))
    g, n = fresh["res_gelu"], fresh["res_gelu_no_half"]
    # baseline_temp2's own pooled gap on the fresh seeds (the pooled table of the D table's three arms)
    t2 = width.pooled_test("temp2", {w: rung["temp2", w].gaps for w in (128, 256)})
    declared = [
        ("the declared test, res_gelu_no_half", f"({with_sign(n.estimate)}%, {with_sign(n.ci[0])} to "
         f"{with_sign(n.ci[1])}, Holm p = {n.p_holm:.2g})"),
        ("the declared test, res_gelu", f"({with_sign(g.estimate)}%, {with_sign(g.ci[0])} to {with_sign(g.ci[1])}, "
         f"Holm p = {g.p_holm:.2g}; minimum detectable effect {g.mde:.2f}%)"),
        ("the declared test, D", f"{with_sign(d.estimate)} points ({with_sign(d.ci[0])} to {with_sign(d.ci[1])}, "
         f"p = {d.p:.2g}; minimum detectable effect {d.mde:.2f})"),
        ("temp2's pooled gap", f"its gap is {with_sign(t2.estimate)}% ({with_sign(t2.ci[0])} to "
         f"{with_sign(t2.ci[1])}, p = {t2.p:.2g}, uncorrected and outside the declared family), "
         f"{t2.estimate / n.estimate:.2f} of res_gelu_no_half's {with_sign(n.estimate)}% there"),
        ("every seed, exploratory", f"res_gelu is {with_sign(every['res_gelu'].estimate)}% (p = "
         f"{every['res_gelu'].p:.2g}) and res_gelu_no_half {with_sign(every['res_gelu_no_half'].estimate)}% (p = "
         f"{every['res_gelu_no_half'].p:.2g}), exploratory")]
    e = dict(temperature_declaration_prose())  # the declared test of E, as results/width_ladder/README.md gives it
    declared += [("the declared test of E", f"{e['its verdict'].strip('*')} on seeds 11–20: "
                  + e["the declared test of E"].split(" E is ", 1)[1]),
                 ("E's spread against the plan's", e["E's spread against the plan's"])]
    at384 = rates_at_384()
    done = sum(len(losses) for losses in at384.values())
    best = best_at_384(at384)
    if all(tuned(losses) for losses in at384.values()):
        costs = [c for losses in at384.values() for c in step_off(losses)]
        return declared + [("width 384's rate runs", f"Widths 64 and 384 are done ({done} runs at 384)"),
                           ("width 384's tuned arms", f"At width 384 {best}, inside the grid, on the tuning seed; "
                            f"one ×2 step off it costs {min(costs):.1f}% to {max(costs):.1f}% there")]
    return declared + [("width 384's rate runs", f"{done} of 384's 9 runs are done"),
            ("width 384's tuned arms", f"Width 384 is not yet tuned ({done} of its 9 runs done"
             + (f"; {best} there)" if best else ")"))]


PROSE = {"results/long_horizon/README.md": long_horizon_prose, "README.md": readme_prose,
         "results/width_transfer/README.md": width_transfer_prose, "results/width_ladder/README.md": width_ladder_prose,
         "docs/width.md": width_doc_prose}


@pytest.mark.parametrize("readme", sorted(PROSE))
def test_numbers_in_the_prose_are_the_runs(readme):
    text = " ".join(open(os.path.join(REPO, readme)).read().split())  # the prose's line breaks are not its words
    for what, words in PROSE[readme]():
        assert words in text, f"{readme}: {what}: the runs say {words!r}"


# tables that hold no measurement: the studies' descriptions of their arms
NOT_GENERATED = {(readme, "| arm | what changes against the baseline | question |")
                 for readme in ("results/ablations/README.md", "results/long_horizon/README.md")}


def checked_elsewhere(marker):
    """Whether `marker` names a test that exists in the test file it names (CHECKED)."""
    match = CHECKED.match(marker)
    return bool(match) and f"def {match.group(2)}(" in open(os.path.join(REPO, match.group(1))).read()


def test_every_table_of_numbers_is_generated():
    for readme in sorted(glob.glob(os.path.join(REPO, "results", "*", "README.md"))):
        lines = ["", *open(readme).read().splitlines()]
        for before, line in zip(lines, lines[1:]):
            if line.startswith("|") and not before.startswith("|"):
                name = os.path.relpath(readme, REPO)
                assert (MARKER.match(before) or BUILT.match(before) or (name, line) in NOT_GENERATED
                        or checked_elsewhere(before)), (
                    f"{name}: the table {line[:60]!r} has no marker naming the command that makes it")


def test_every_results_readme_has_generated_tables():
    readmes = {readme for readme, *_ in TABLES}
    names = ("ablations", "diagnostics", "long_horizon", "mini", "mini_modern", "width_ladder", "width_transfer")
    assert readmes == {f"results/{name}/README.md" for name in names}
    assert sum(readme == "results/ablations/README.md" for readme, *_ in TABLES) == 4
    assert sorted(name for *_, name, _ in BUILT_TABLES) == sorted(BUILDERS)


@pytest.mark.parametrize("readme, line, renamed, program, argv, committed, which", TABLES,
                         ids=[f"{readme}:{line}" for readme, line, *_ in TABLES])
def test_committed_table_equals_what_its_command_prints(readme, line, renamed, program, argv, committed, which):
    assert len(committed) >= 3, f"{readme}:{line}: no table below the marker"
    printed = printed_table(program, argv, which)
    assert len(printed) == len(committed), f"{readme}:{line}: {len(printed)} printed lines, {len(committed)} committed"
    header = cells(printed[0])
    if renamed:
        keep = list(range(len(header)))
        assert len(cells(committed[0])) == len(header)
    else:
        shown = cells(committed[0])
        keep = [i for i, h in enumerate(header) if h in shown]
        assert [header[i] for i in keep] == shown, f"{readme}:{line}: columns not in the printed order"
    for number, (mine, theirs) in enumerate(zip(printed, committed)):
        if renamed and number == 0:
            continue
        row = cells(mine)
        assert [row[i] for i in keep] == cells(theirs), f"{readme}:{line + 1 + number}"


@pytest.mark.parametrize("readme, line, name, committed", BUILT_TABLES,
                         ids=[f"{readme}:{line}" for readme, line, *_ in BUILT_TABLES])
def test_committed_table_equals_the_one_built_from_the_runs(readme, line, name, committed):
    built = BUILDERS[name]()
    assert [cells(row) for row in committed[:1] + committed[2:]] == built, f"{readme}:{line}"
