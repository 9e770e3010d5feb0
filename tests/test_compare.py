"""Tests of compare.py on run directories fabricated as train.py writes them: the statistics
(mean ± sample std, rel. improvement, Welch's p) against hand-computed numbers, step choice,
divergence, resumed runs, grouping and labels, the three formats, the plot, and bad input."""

import csv
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict

import numpy as np
import pytest
from matplotlib.colors import to_rgba
from scipy import stats

import compare
from helpers import REPO, run_script
from nonlinear_queries.analysis import comparison
from nonlinear_queries.analysis.arms import make_arms
from nonlinear_queries.analysis.plots import Curve, figure2, loss_curves
from nonlinear_queries.analysis.stats import holm, min_detectable_effect
from nonlinear_queries.config.configurator import parse_config
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.record.runs import load_run

# what train.py's header holds under "config" for Table 1's baseline: the real TrainConfig,
# resolved from the real config file
BASE = asdict(parse_config(TrainConfig, [os.path.join(REPO, "config", "baseline.py")])[0])
RES_GELU = {"query_mode": "res_gelu", "learning_rate": 3e-3, "min_lr": 3e-5, "weight_decay": 2**-5}
# non-embedding parameters at GPT-2 small (docs/design.md)
PARAMS = {"linear": 84_953_856, "res_gelu": 84_972_288, "identity": 77_875_968}


def header(run_name, without=(), **overrides):
    """train.py's config header (config.json, and the first `config` record of metrics.jsonl); `without`:
    settings to leave out, as in the header of a run made before train.py had them."""
    config = {k: v for k, v in {**BASE, **overrides}.items() if k not in without}
    return {"type": "config", "step": 0, "run_name": run_name, "config_files": [f"config/{run_name}.py"],
            "argv": ["train.py", f"config/{run_name}.py"], "git_commit": "0" * 40, "git_dirty": False,
            "torch": "2.8.0", "device": "cuda", "world_size": 1, "dtype": "bfloat16", "tokens_per_iter": 491520,
            "non_embedding_params": PARAMS[config["query_mode"]], "config": config}


def evals(losses):
    """train and eval records for {step: val_loss}; the eval's train_loss is val_loss - 0.1."""
    records = []
    for step, val in losses.items():
        records.append({"type": "train", "step": step, "loss": val + 0.3, "lr": 6e-4, "grad_norm": 0.4,
                        "ms_per_step": 900.0, "tokens_per_s": 546133.0})
        records.append({"type": "eval", "step": step, "train_loss": val - 0.1, "val_loss": val})
    return records


def diverged(step):
    """train.py's record of a run that stopped at `step` on a non-finite loss."""
    return {"type": "diverged", "step": step, "reason": "the loss is nan", "loss": float("nan"),
            "grad_norm": float("nan"), "lr": 6e-4, "last_checkpoint_step": step - step % 1000}


def make_run(out_dir, run_name, losses, diverged_at=None, without=(), **overrides):
    """Write out_dir as train.py would for a run logging val losses {step: loss}, ending in divergence at step
    `diverged_at` if given; overrides change the config. Returns out_dir as a str."""
    os.makedirs(out_dir)
    head = header(run_name, without, out_dir=str(out_dir), **overrides)
    write_records(out_dir, [head, *evals(losses), *([diverged(diverged_at)] if diverged_at else [])])
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(head, f, indent=2)
    return str(out_dir)


def write_records(out_dir, records):
    """Write records as out_dir/metrics.jsonl, one JSON object a line."""
    with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def run_compare(*args, check=True):
    """Run compare.py as a user would; check=True fails the test on a non-zero exit."""
    return run_script("compare.py", *map(str, args), check=check)


# compare.py's column headers, by the short names the tests use
COLUMNS = {"run": "run", "query": "query", "non-emb params": "params", "max lr": "max_lr", "min lr": "min_lr",
           "weight decay": "wd", "val loss": "val", "n": "n", "rel. improvement (%)": "rel", "p": "p"}


def rows(stdout):
    """{label: {column: cell}} of compare.py's text table, columns found by their headers (cells are
    separated by two or more spaces; "val loss @ STEP" is column "val")."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("run "))
    headers = [COLUMNS[re.sub(r" @ \d+$", "", h)] for h in re.split(r"\s{2,}", lines[start].strip())]
    table = {}
    for line in lines[start + 2 :]:
        if not line.strip():
            break
        cells = dict(zip(headers, re.split(r"\s{2,}", line.strip())))
        table[cells["run"]] = cells
    return table


def cells(row, *columns):
    """The cells of `row` (a dict of rows()) in the named columns, as a list."""
    return [row[c] for c in columns]


def csv_rows(stdout):
    """{label: row} of compare.py's csv output, parsed by the csv module."""
    return {row["run"]: row for row in csv.DictReader(io.StringIO(stdout))}


def welch_p(a, b):
    """Two-sided p of Welch's t-test from its definition: t with the Welch-Satterthwaite degrees of freedom."""
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    t = (np.mean(a) - np.mean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return 2 * stats.t.sf(abs(t), df)


@pytest.fixture
def seeds(tmp_path):
    """Three seeds each of the baseline (val 3.0, 3.2, 3.1 at step 2000) and res_gelu (2.9, 3.0, 3.1)."""
    dirs = []
    for name, finals, overrides in (("baseline", [3.0, 3.2, 3.1], {}), ("res_gelu", [2.9, 3.0, 3.1], RES_GELU)):
        for seed, final in enumerate(finals):
            dirs.append(make_run(tmp_path / f"{name}-{seed}", name, {0: 10.9, 1000: final + 0.5, 2000: final},
                                 seed=seed, **overrides))
    return dirs


def test_mean_std_rel_improvement_and_welch_p_match_hand_computed(seeds):
    out = run_compare(*seeds).stdout
    table = rows(out)
    assert list(table) == ["baseline", "res_gelu"]
    base, res = table["baseline"], table["res_gelu"]
    assert base == {"run": "baseline", "query": "linear", "params": "84,953,856", "max_lr": "0.0006",
                    "min_lr": "6e-05", "wd": "0.1", "val": "3.1000 ± 0.1000", "n": "3", "rel": "0.00", "p": "-"}
    assert cells(res, "query", "params", "max_lr", "min_lr", "wd", "val") == [
        "res_gelu", "84,972,288", "0.003", "3e-05", "0.03125", "3.0000 ± 0.1000"]
    # (3.1 - 3.0) / 3.1; both stds 0.1 with n = 3: t = -0.1 / sqrt(2 * 0.01 / 3), Welch df = 4
    p = 2 * stats.t.sf(0.1 / math.sqrt(2 * 0.01 / 3), 4)
    assert cells(res, "n", "rel", "p") == ["3", "3.23", f"{p:.2g}"]
    assert "val loss at step 2000" in out and "val loss @ 2000" in out
    assert "Welch's t-test" in out and "(L_base - L) / L_base" in out

    row = csv_rows(run_compare(*seeds, "--format=csv").stdout)["res_gelu"]
    assert float(row["rel_improvement_pct"]) == pytest.approx(100 * 0.1 / 3.1, abs=1e-9)
    assert float(row["p"]) == pytest.approx(p, abs=1e-9)
    assert float(row["p"]) == pytest.approx(welch_p([2.9, 3.0, 3.1], [3.0, 3.2, 3.1]), abs=1e-9)
    assert float(row["val_loss_mean"]) == pytest.approx(3.0, abs=1e-12)
    assert float(row["val_loss_std"]) == pytest.approx(0.1, abs=1e-12)
    assert (row["n"], row["step"], row["diverged"], row["not_reached"]) == ("3", "2000", "", "0")


def test_baseline_option_and_single_runs(seeds, tmp_path):
    single = make_run(tmp_path / "identity", "identity", {1000: 3.5, 2000: 3.41}, query_mode="identity")
    table = rows(run_compare(*seeds, single, "--baseline=res_gelu").stdout)
    assert cells(table["res_gelu"], "n", "rel", "p") == ["3", "0.00", "-"]
    assert table["baseline"]["rel"] == f"{100 * (3.0 - 3.1) / 3.0:.2f}" == "-3.33"
    # a group of one: its value without a std, n = 1, and no p
    assert cells(table["identity"], "val", "n", "rel", "p") == ["3.4100", "1", f"{100 * (3.0 - 3.41) / 3.0:.2f}", "-"]
    # the baseline named by one of its run directories
    assert rows(run_compare(single, *seeds, f"--baseline={seeds[4]}").stdout)["res_gelu"]["rel"] == "0.00"


def test_default_step_is_the_last_all_runs_reached_and_step_selects_another(tmp_path):
    base = [make_run(tmp_path / f"b{s}", "baseline", {1000: 3.6 + s / 10, 2000: 3.2 + s / 10, 3000: 3.0 + s / 10},
                     seed=s) for s in range(2)]
    short = make_run(tmp_path / "short", "res_gelu", {1000: 3.55, 2000: 3.25}, **RES_GELU)
    out = run_compare(*base, short).stdout
    assert "val loss at step 2000" in out
    assert rows(out)["baseline"]["val"] == "3.2500 ± 0.0707"
    assert cells(rows(out)["res_gelu"], "val", "n", "rel") == ["3.2500", "1", "0.00"]

    table = rows(run_compare(*base, short, "--step=3000").stdout)
    assert table["baseline"]["val"] == "3.0500 ± 0.0707"
    assert cells(table["res_gelu"], "val", "n", "rel", "p") == ["not reached", "0", "-", "-"]
    row = csv_rows(run_compare(*base, short, "--step=3000", "--format=csv").stdout)["res_gelu"]
    assert (row["val_loss_mean"], row["n"], row["not_reached"]) == ("", "0", "1")

    table = rows(run_compare(*base, short, "--step=1000").stdout)
    assert cells(table["res_gelu"], "val", "n", "rel") == ["3.5500", "1", f"{100 * (3.65 - 3.55) / 3.65:.2f}"]

    proc = run_compare(*base, short, "--step=1500", check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "error: --step=1500 is not an eval step of any run; eval steps: 1000, 2000, 3000"

    # one of two seeds not there yet: the row pools the one that is, and says so
    make_run(tmp_path / "b2", "baseline", {1000: 3.9}, seed=2)
    assert cells(rows(run_compare(*base, tmp_path / "b2", "--step=2000").stdout)["baseline"], "val", "n") == [
        "3.2500 ± 0.0707 (1 of 3 not reached)", "2"]


def test_diverged_runs_are_left_out_and_shown(tmp_path):
    base = [make_run(tmp_path / f"b{s}", "baseline", {1000: 3.5, 2000: final}, seed=s)
            for s, final in enumerate([3.0, 3.2])]
    partial = [make_run(tmp_path / "r0", "res_gelu", {1000: 3.4}, diverged_at=1812, seed=0, **RES_GELU)]
    partial += [make_run(tmp_path / f"r{s}", "res_gelu", {1000: 3.4, 2000: final}, seed=s, **RES_GELU)
                for s, final in ((1, 3.0), (2, 3.1))]
    # the paper's baseline at weight decay 0.05 diverges before 20k steps
    wd = [make_run(tmp_path / f"w{s}", "baseline", {1000: 3.9}, diverged_at=step, seed=s, weight_decay=0.05)
          for s, step in ((0, 1234), (1, 1300))]
    out = run_compare(*base, *partial, *wd).stdout
    assert "val loss at step 2000" in out  # the diverged runs' last evals (1000) do not hold the step back
    table = rows(out)
    assert cells(table["res_gelu"], "val", "n", "rel", "p") == [
        "3.0500 ± 0.0707 (1 of 3 diverged at step 1812)", "2", f"{100 * 0.05 / 3.1:.2f}",
        f"{welch_p([3.0, 3.1], [3.0, 3.2]):.2g}"]
    assert cells(table["baseline weight_decay=0.05"], "val", "n", "rel", "p") == [
        "diverged at steps 1234, 1300", "0", "-", "-"]
    assert cells(table["baseline weight_decay=0.1"], "val", "n") == ["3.1000 ± 0.1414", "2"]

    by_label = csv_rows(run_compare(*base, *partial, *wd, "--format=csv").stdout)
    assert (by_label["res_gelu"]["diverged"], by_label["res_gelu"]["n"]) == ("1812", "2")
    # unequal spreads tell Welch's p (df = 1.47) from Student's (df = 2, p = 0.69849)
    assert float(by_label["res_gelu"]["p"]) == pytest.approx(welch_p([3.0, 3.1], [3.0, 3.2]), abs=1e-9)
    assert welch_p([3.0, 3.1], [3.0, 3.2]) == pytest.approx(0.71172, abs=1e-5)
    assert by_label["baseline weight_decay=0.05"]["diverged"] == "1234 1300"
    assert "diverged at step 1812" in run_compare(*base, *partial, "--format=markdown").stdout

    proc = run_compare(*wd, check=False)
    assert proc.returncode == 1 and "every run diverged" in proc.stderr and "--step=N" in proc.stderr
    assert rows(run_compare(*wd, "--step=1000").stdout)["baseline"]["val"] == "diverged at steps 1234, 1300"


def test_resumed_run_counts_the_later_records(tmp_path):
    run = tmp_path / "resumed"
    make_run(run, "baseline", {})
    head = json.loads((run / "config.json").read_text())
    # first session: evals to 3000 and a divergence at 3345; then resumed from the step-1000 checkpoint, it
    # logs step 2000 again (3.2 replaces 3.4) and has not reached 3000 yet; a kill cut its last line short
    first = [head, *evals({0: 10.9, 1000: 3.5, 2000: 3.4}), {"type": "eval", "step": 3000, "train_loss": 2.9,
                                                              "val_loss": 3.0}, diverged(3345)]
    write_records(run, [*first, {**head, "step": 1000}, *evals({2000: 3.2})])
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"type": "train", "step": 2010, "lo')
    other = make_run(tmp_path / "other", "baseline", {1000: 3.6, 2000: 3.3, 3000: 3.1}, seed=7)
    # and in the other run a line in the middle is damaged (the first bytes of its train record at step 1000
    # lost): the rest of that run still counts
    metrics = os.path.join(other, "metrics.jsonl")
    with open(metrics) as f:
        lines = f.readlines()
    assert json.loads(lines[1])["type"] == "train"
    lines[1] = lines[1][20:]
    with open(metrics, "w") as f:
        f.writelines(lines)
    proc = run_compare(run, other)
    assert "val loss at step 2000" in proc.stdout
    assert cells(rows(proc.stdout)["baseline"], "val", "n") == ["3.2500 ± 0.0707", "2"]
    # one warning for each damaged line, naming it
    torn_line = len((run / "metrics.jsonl").read_text().splitlines())
    assert proc.stderr.count("warning: skipping line") == 2, proc.stderr
    assert f"warning: skipping line {torn_line} of {run / 'metrics.jsonl'}, which is not a JSON record" in proc.stderr
    assert f"warning: skipping line 2 of {metrics}, which is not a JSON record" in proc.stderr

    # duplicates within one session (no restart record between them): the later one counts too
    write_records(run, [head, *evals({1000: 3.5, 2000: 3.4}), *evals({2000: 3.0})])
    assert rows(run_compare(run).stdout)["baseline"]["val"] == "3.0000"


def test_sweep_directory_and_labels_that_tell_learning_rates_apart(tmp_path):
    sweep = tmp_path / "lr-sweep"
    for lr, finals in ((1e-3, [3.1, 3.3]), (3e-3, [3.0, 3.0])):
        for seed, final in enumerate(finals):
            make_run(sweep / f"lr{lr:g}-s{seed}", "res_gelu", {1000: 3.6, 2000: final}, seed=seed,
                     **{**RES_GELU, "learning_rate": lr})
    baseline = make_run(tmp_path / "baseline", "baseline", {1000: 3.6, 2000: 3.2})
    table = rows(run_compare(baseline, sweep).stdout)
    assert list(table) == ["baseline", "res_gelu learning_rate=0.001", "res_gelu learning_rate=0.003"]
    assert cells(table["res_gelu learning_rate=0.001"], "val", "n", "rel") == ["3.2000 ± 0.1414", "2", "0.00"]
    assert cells(table["res_gelu learning_rate=0.003"], "val", "n", "rel") == [
        "3.0000 ± 0.0000", "2", f"{100 * 0.2 / 3.2:.2f}"]

    table = rows(run_compare(sweep, baseline, "--baseline=res_gelu learning_rate=0.003").stdout)
    assert table["res_gelu learning_rate=0.001"]["rel"] == f"{100 * -0.2 / 3.0:.2f}"
    # a run named twice (itself and through its sweep) counts once
    table = rows(run_compare(sweep, f"{sweep}/../lr-sweep/lr0.001-s0").stdout)
    assert table["res_gelu learning_rate=0.001"]["n"] == "2"


def test_group_over_pools_runs_that_differ_in_several_keys(tmp_path):
    # out_dir, wandb_run_name and compile differ too, but cannot change the numbers
    runs = [make_run(tmp_path / f"s{seed}", "res_gelu", {1000: 3.5, 2000: final}, seed=seed, data_seed=seed + 10,
                     wandb_run_name=f"s{seed}", compile=seed == 1, without=("z_loss",), **RES_GELU)
            for seed, final in ((1, 3.0), (2, 3.2))]
    table = rows(run_compare(*runs).stdout)
    assert list(table) == ["res_gelu data_seed=11", "res_gelu data_seed=12"]
    assert [row["n"] for row in table.values()] == ["1", "1"]
    out = run_compare(*runs, "--group_over=seed,data_seed").stdout
    assert rows(out) == {"res_gelu": {"run": "res_gelu", "query": "res_gelu", "params": "84,972,288",
                                      "max_lr": "0.003", "min_lr": "3e-05", "wd": "0.03125",
                                      "val": "3.1000 ± 0.1414", "n": "2", "rel": "0.00", "p": "-"}}
    assert "runs pooled over data_seed, seed" in out

    # a setting that older runs lack (train.py gains keys) counts as today's default: a newer run at the
    # default pools with them, one at another value does not
    runs.append(make_run(tmp_path / "z0", "res_gelu", {1000: 3.5, 2000: 3.4}, z_loss=0.0, **RES_GELU))
    runs.append(make_run(tmp_path / "z", "res_gelu", {1000: 3.5, 2000: 2.9}, z_loss=1e-4, **RES_GELU))
    table = rows(run_compare(*runs, "--group_over=seed,data_seed").stdout)
    assert {label: cells(row, "val", "n") for label, row in table.items()} == {
        "res_gelu z_loss=0.0": ["3.2000 ± 0.2000", "3"], "res_gelu z_loss=0.0001": ["2.9000", "1"]}

    proc = run_compare(*runs, "--group_over=sede", check=False)
    assert proc.returncode == 1 and "sede" in proc.stderr


def test_markdown_and_csv(seeds):
    lines = run_compare(*seeds, "--format=markdown").stdout.splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert table[0] == ("| run | query | non-emb params | max lr | min lr | weight decay | val loss @ 2000 | n "
                        "| rel. improvement (%) | p |")
    assert table[1] == "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"
    assert table[2] == "| baseline | linear | 84,953,856 | 0.0006 | 6e-05 | 0.1 | 3.1000 ± 0.1000 | 3 | 0.00 | - |"
    assert len(table) == 4 and all(line.count("|") == 11 for line in table)
    assert any("Welch's t-test" in line for line in lines)

    records = list(csv.reader(io.StringIO(run_compare(*seeds, "--format=csv").stdout)))
    assert records[0] == ["run", "query_mode", "non_embedding_params", "learning_rate", "min_lr", "weight_decay",
                        "step", "val_loss_mean", "val_loss_std", "n", "rel_improvement_pct", "p", "diverged",
                        "not_reached"]
    assert len(records) == 3
    base = dict(zip(records[0], records[1]))
    assert base["non_embedding_params"] == "84953856" and float(base["learning_rate"]) == 6e-4
    assert float(base["val_loss_mean"]) == pytest.approx(3.1, abs=1e-12)
    assert (float(base["rel_improvement_pct"]), base["p"]) == (0.0, "")


def test_plot_draws_both_panels(seeds, tmp_path):
    png = tmp_path / "figure1.png"
    proc = run_compare(*seeds, f"--plot={png}")
    assert f"wrote {png}" in proc.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000

    wd = make_run(tmp_path / "wd", "baseline", {0: 10.9, 1000: 4.4}, diverged_at=1500, weight_decay=0.05)
    runs = [load_run(d) for d in [*seeds, wd]]
    groups = make_arms(runs, {"seed"})
    top, bottom = loss_curves(groups, groups[1]).axes
    # per group a val (solid) and a train (dashed) line; below, not for the diverged group, and the zero line
    assert [line.get_linestyle() for line in top.lines] == ["-", "--"] * 3
    assert len(bottom.lines) == 5 and bottom.lines[-1].get_ydata() == [0, 0]
    # step 0 is left out; the top shows group means, the bottom (L_base - L) / L_base in %, baseline res_gelu
    assert list(top.lines[0].get_xdata()) == [1000, 2000]
    np.testing.assert_allclose(top.lines[0].get_ydata(), [3.6, 3.1])
    np.testing.assert_allclose(top.lines[1].get_ydata(), [3.5, 3.0])
    np.testing.assert_allclose(top.lines[4].get_ydata(), [4.4])
    np.testing.assert_allclose(bottom.lines[0].get_ydata(), [100 * (3.5 - 3.6) / 3.5, 100 * (3.0 - 3.1) / 3.0])
    np.testing.assert_allclose(bottom.lines[1].get_ydata(), [100 * (3.4 - 3.5) / 3.4, 100 * (2.9 - 3.0) / 2.9])
    np.testing.assert_allclose(bottom.lines[2].get_ydata(), [0, 0], atol=1e-12)
    assert [t.get_text() for t in top.get_legend().get_texts()] == [
        "baseline weight_decay=0.1", "res_gelu", "baseline weight_decay=0.05 (diverged at step 1500)"]
    assert len(top.collections) == 4  # min..max bands of the 3 seeds, val and train, per group of several


def test_bad_input_is_a_clear_error(seeds, tmp_path):
    proc = run_compare(*seeds, "--baseline=res-gelu", check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == ("error: --baseline=res-gelu is neither a group label nor a run directory given; "
                                   "labels: 'baseline', 'res_gelu'")
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    for path in (empty, tmp_path / "missing"):
        proc = run_compare(seeds[0], path, check=False)
        assert proc.returncode == 1 and proc.stdout == ""
        assert proc.stderr.startswith(f"error: {path} is not a run directory") and "metrics.jsonl" in proc.stderr


def test_a_glob_over_a_study_skips_its_files_and_counts_nested_runs(tmp_path, capsys):
    # what `compare.py results/width_ladder/*` gets from the shell: files, arms (sweeps), and a folder of arms
    study = tmp_path / "study"
    for seed, final in enumerate([3.0, 3.2]):
        make_run(study / "baseline" / f"seed={seed}", "baseline", {1000: 3.6, 2000: final}, seed=seed)
        make_run(study / "later" / "res_gelu" / f"seed={seed}", "res_gelu", {1000: 3.6, 2000: final - 0.2},
                 seed=seed, **RES_GELU)
    (study / "later" / "res_gelu" / "seed=0" / "wandb").mkdir()  # a run's own subdirectories are not searched
    for name in ("README.md", "TABLES.md", "figure.png"):
        (study / name).write_text("not a run")
    compare.main(sorted(str(p) for p in study.iterdir()))
    out, err = capsys.readouterr()
    assert err == (f"note: skipped 3 file(s), not run directories: {study / 'README.md'}, {study / 'TABLES.md'}, "
                   f"{study / 'figure.png'}\n")
    table = rows(out)
    assert list(table) == ["baseline", "res_gelu"] and table["res_gelu"]["n"] == "2"
    assert table["res_gelu"]["val"] == "2.9000 ± 0.1414"
    # a directory that holds no run, however deep, is the one error; so are files alone
    (study / "empty" / "sub").mkdir(parents=True)
    message = compare_error(capsys, study / "baseline", study / "empty")
    assert message.startswith(f"error: {study / 'empty'} is not a run directory") and "\n" not in message
    message = compare_error(capsys, study / "README.md")
    assert message == f"error: no run directory among {study / 'README.md'}; pass the out_dir of a train.py run"


@pytest.mark.parametrize("option", ["--plot", "--figure2"])
def test_figure_path_that_cannot_be_written_is_refused_before_the_table(seeds, tmp_path, capsys, monkeypatch, option):
    # refused before any run is read: the figure is the last thing drawn, after minutes of reading a big sweep
    monkeypatch.setattr(comparison.ca, "read_runs", None)
    missing = tmp_path / "no" / "such" / "dir"
    message = compare_error(capsys, *seeds, f"{option}={missing / 'f.png'}")
    assert message.strip() == (f"error: {option}={missing / 'f.png'}: there is no directory {missing}; create it "
                               f"(mkdir -p {missing}) or name a file in a directory that exists")
    message = compare_error(capsys, *seeds, f"{option}={tmp_path}")
    assert message.strip() == (f"error: {option}={tmp_path} is a directory; name the image file to write, e.g. "
                               f"{option}={tmp_path / 'figure.png'}")


def test_best_over_compares_each_arm_at_its_best_learning_rate(tmp_path):
    # baseline: lr 6e-4 -> 3.1 (mean of 3.0, 3.2), lr 1e-3 -> 3.0; res_gelu: lr 3e-3 -> 2.9, lr 6e-3 -> 3.4
    grid = {("baseline", 6e-4): [3.0, 3.2], ("baseline", 1e-3): [2.95, 3.05],
            ("res_gelu", 3e-3): [2.85, 2.95], ("res_gelu", 6e-3): [3.3, 3.5]}
    dirs = [make_run(tmp_path / f"{name}-{lr}-{seed}", name, {1000: final + 0.5, 2000: final}, seed=seed,
                     **{**(RES_GELU if name == "res_gelu" else {}), "learning_rate": lr})
            for (name, lr), finals in grid.items() for seed, final in enumerate(finals)]
    full = rows(run_compare(*dirs).stdout)
    assert len(full) == 4 and full["baseline learning_rate=0.0006"]["rel"] == "0.00"  # the first run's row
    out = run_compare(*dirs, "--best_over=learning_rate", "--format=csv").stdout
    best = csv_rows(out)
    assert list(best) == ["baseline learning_rate=0.001", "res_gelu learning_rate=0.003"]
    assert float(best["baseline learning_rate=0.001"]["rel_improvement_pct"]) == 0.0  # the baseline's best row
    assert float(best["res_gelu learning_rate=0.003"]["rel_improvement_pct"]) == pytest.approx(100 * 0.1 / 3.0,
                                                                                            abs=1e-9)
    assert float(best["res_gelu learning_rate=0.003"]["p"]) == pytest.approx(welch_p([2.85, 2.95], [2.95, 3.05]),
                                                                           abs=1e-9)


def compare_error(capsys, *args):
    """compare.main(args) in this process, which must exit 1 printing nothing on stdout; returns its stderr."""
    with pytest.raises(SystemExit) as exit_:
        compare.main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert exit_.value.code not in (0, None) and out == ""
    # sys.exit(message) prints the message and exits 1
    return str(exit_.value.code) + err


def test_best_over_refuses_a_key_the_runs_do_not_have(seeds, capsys):
    # a typo must not print the untuned table under a header that calls each row the best learning rate
    # the closest few of the runs' keys, not all 80 of them (one line of 1,190 characters)
    message = compare_error(capsys, *seeds, "--best_over=learnin_rate")
    assert message.strip() == ("error: --best_over names learnin_rate (did you mean learning_rate or "
                               "muon_learning_rate?), which no run's config has; name keys of the runs' configs, "
                               "train.py's settings (python train.py --help lists them)")
    # --group_over goes through the same check, each unknown key with its closest
    message = compare_error(capsys, *seeds, "--group_over=seed,sede,data_sed,zzz", "--best_over=learning_rate")
    assert message.startswith("error: --group_over names data_sed (did you mean data_seed or dataset or data_dir?), "
                              "sede (did you mean seed?), zzz, which no run's config has;"), message


def test_metric_column_pools_downstream_scores_over_seeds(seeds):
    # train.py's eval_tasks records at step 2000: baseline acc_norm 0.30, 0.32, 0.34; res_gelu 0.35, 0.39 and one
    # run without the task
    scores = {0: 0.30, 1: 0.32, 2: 0.34, 3: 0.35, 4: 0.39}
    for i, out_dir in enumerate(seeds):
        if i in scores:
            with open(os.path.join(out_dir, "metrics.jsonl"), "a") as f:
                f.write(json.dumps({"type": "downstream", "step": 2000, "task": "hellaswag", "acc": 0.25,
                                    "acc_norm": scores[i], "examples": 100}) + "\n")
    out = run_compare(*seeds, "--metric=hellaswag/acc_norm").stdout
    assert "hellaswag/acc_norm @ 2000" in out
    assert "0.3200 ± 0.0200" in out and "0.3700 ± 0.0283 (1 of 3 not evaluated)" in out
    table = csv_rows(run_compare(*seeds, "--metric=hellaswag/acc_norm", "--format=csv").stdout)
    assert [(float(r["hellaswag/acc_norm_mean"]), float(r["hellaswag/acc_norm_std"]), int(r["hellaswag/acc_norm_n"]))
            for r in table.values()] == [(pytest.approx(0.32), pytest.approx(0.02), 3),
                                         (pytest.approx(0.37), pytest.approx(math.sqrt(0.0008)), 2)]
    assert table["baseline"]["val_loss_mean"] == "3.1"  # the loss columns as without --metric
    bad = run_compare(*seeds, "--metric=hellaswag/accuracy", check=False)
    assert bad.returncode == 1 and "hellaswag/acc, hellaswag/acc_norm, hellaswag/examples" in bad.stderr


# ---------------------------------------------------------------------------------------
# held-out selection, Holm's adjustment, the paired comparison and the diagnostics columns (the ablation study)

# val loss at step 2000 by (arm, learning rate): seed 0 (the tuning seed), then seeds 1, 2, 3. On seed 0 the
# baseline is best at 1e-3 and res_gelu at 3e-3; on the held-out seeds both are better at the other rate, so a
# choice made on all the runs, or on the reported ones, would pick differently
HELD_OUT = {("baseline", 1e-3): [3.00, 3.20, 3.30, 3.25], ("baseline", 3e-3): [3.10, 3.10, 3.15, 3.05],
            ("res_gelu", 1e-3): [3.05, 3.00, 3.02, 3.04], ("res_gelu", 3e-3): [2.90, 3.10, 3.22, 3.14]}


def held_out_runs(tmp_path, grid=HELD_OUT, diag=None):
    """Run directories of `grid` (seeds 0-3 each); diag(arm, lr, seed) -> {name: [value per layer]} adds a diag
    record at step 2000."""
    dirs = []
    for (name, lr), finals in grid.items():
        for seed, final in enumerate(finals):
            out = make_run(tmp_path / f"{name}-{lr:g}-{seed}", name, {1000: final + 0.5, 2000: final}, seed=seed,
                           **{**(RES_GELU if name == "res_gelu" else {}), "learning_rate": lr})
            if diag:
                with open(os.path.join(out, "metrics.jsonl"), "a") as f:
                    f.write(json.dumps({"type": "diag", "step": 2000, **diag(name, lr, seed)}) + "\n")
            dirs.append(out)
    return dirs


def t_sf_p(d):
    """Two-sided p of a one-sample t-test of the differences d against 0, from its definition."""
    t = np.mean(d) / (np.std(d, ddof=1) / math.sqrt(len(d)))
    return 2 * stats.t.sf(abs(t), len(d) - 1)


def test_select_on_chooses_on_the_tuning_seed_and_reports_only_the_others(tmp_path):
    dirs = held_out_runs(tmp_path)
    out = run_compare(*dirs, "--best_over=learning_rate", "--select_on=seed=0", "--paired", "--format=csv").stdout
    table = csv_rows(out)
    assert list(table) == ["baseline learning_rate=0.001", "res_gelu learning_rate=0.003"]
    base, res = table["baseline learning_rate=0.001"], table["res_gelu learning_rate=0.003"]
    # the selection column: the tuning run alone; the reported columns: seeds 1-3 only
    assert (float(base["tuning_val_loss_mean"]), base["tuning_n"]) == (3.00, "1")
    assert (float(res["tuning_val_loss_mean"]), res["tuning_n"]) == (2.90, "1")
    assert (base["n"], res["n"]) == ("3", "3")
    assert float(base["val_loss_mean"]) == pytest.approx(3.25, abs=1e-12)
    assert float(base["val_loss_std"]) == pytest.approx(0.05, abs=1e-12)
    assert float(res["val_loss_mean"]) == pytest.approx((3.10 + 3.22 + 3.14) / 3, abs=1e-12)
    assert float(res["rel_improvement_pct"]) == pytest.approx(100 * (3.25 - 3.1533333333) / 3.25, abs=1e-6)
    assert float(res["p"]) == pytest.approx(welch_p([3.10, 3.22, 3.14], [3.20, 3.30, 3.25]), abs=1e-9)
    # paired by seed: d = 3.10 - 3.20, 3.22 - 3.30, 3.14 - 3.25
    d = [-0.10, -0.08, -0.11]
    assert float(res["paired_diff_mean"]) == pytest.approx(-0.29 / 3, abs=1e-12)
    assert float(res["paired_diff_std"]) == pytest.approx(math.sqrt(((-0.10 + 0.29 / 3) ** 2 + (-0.08 + 0.29 / 3) ** 2
                                                                     + (-0.11 + 0.29 / 3) ** 2) / 2), abs=1e-12)
    assert res["paired_n"] == "3" and float(res["paired_p"]) == pytest.approx(t_sf_p(d), abs=1e-9)
    assert (float(base["paired_diff_mean"]), base["paired_p"]) == (0.0, "")

    # text: the selection column beside the held-out val loss, and the caption says how the rows were chosen
    text = run_compare(*dirs, "--best_over=learning_rate", "--select_on=seed=0", "--paired").stdout
    assert "3.0000" in text.splitlines()[4] and "3.2500 ± 0.0500" in text.splitlines()[4]
    assert "lowest mean val loss over its arm's runs with seed=0" in text and "reported over the other runs" in text
    # without --select_on the same runs choose the other rates (the tuning seed counted)
    assert list(csv_rows(run_compare(*dirs, "--best_over=learning_rate", "--format=csv").stdout)) == [
        "baseline learning_rate=0.003", "res_gelu learning_rate=0.001"]


def test_holm_adjusts_over_the_rows_compared_with_the_baseline(tmp_path):
    assert holm([0.01, 0.04, None, 0.03]) == pytest.approx([0.03, 0.06, None, 0.06])
    assert holm([0.5, 0.2]) == [0.5, 0.4]
    assert holm([0.9, 0.8, None]) == [1.0, 1.0, None]  # 2 x 0.8 capped at 1, then the running maximum
    # three arms against the baseline, three seeds each
    finals = {"baseline": [3.0, 3.2, 3.1], "res_gelu": [2.9, 3.0, 3.1], "identity": [3.3, 3.4, 3.35]}
    extra = {"res_gelu": RES_GELU, "identity": {"query_mode": "identity"}}
    dirs = [make_run(tmp_path / f"{name}-{seed}", name, {2000: v}, seed=seed, **extra.get(name, {}))
            for name, values in finals.items() for seed, v in enumerate(values)]
    dirs += [make_run(tmp_path / f"wd-{seed}", "baseline", {2000: v}, seed=seed, weight_decay=0.05)
             for seed, v in enumerate([3.05, 3.15, 3.12])]
    table = csv_rows(run_compare(*dirs, "--holm", "--paired", "--format=csv").stdout)
    arms = [label for label in table if label != "baseline weight_decay=0.1"]
    p = {label: welch_p(finals[label] if label in finals else [3.05, 3.15, 3.12], finals["baseline"])
         for label in ["res_gelu", "identity", "baseline weight_decay=0.05"]}
    assert sorted(arms) == sorted(p)
    order = sorted(p, key=p.get)  # hand computation: m = 3, multipliers 3, 2, 1, then the running maximum
    expected = {order[0]: min(1, 3 * p[order[0]])}
    expected[order[1]] = max(expected[order[0]], min(1, 2 * p[order[1]]))
    expected[order[2]] = max(expected[order[1]], min(1, p[order[2]]))
    for label in arms:
        assert float(table[label]["p"]) == pytest.approx(p[label], abs=1e-9)
        assert float(table[label]["p_holm"]) == pytest.approx(expected[label], abs=1e-9)
    assert table["baseline weight_decay=0.1"]["p_holm"] == ""
    # the paired p-values get their own adjustment
    d = {label: np.array(finals[label]) - np.array(finals["baseline"]) for label in ("res_gelu", "identity")}
    d["baseline weight_decay=0.05"] = np.array([3.05, 3.15, 3.12]) - np.array(finals["baseline"])
    pp = {label: t_sf_p(v) for label, v in d.items()}
    order = sorted(pp, key=pp.get)
    adjusted = dict(zip(order, np.maximum.accumulate([min(1, (3 - i) * pp[k]) for i, k in enumerate(order)])))
    for label in arms:
        assert float(table[label]["paired_p"]) == pytest.approx(pp[label], abs=1e-9)
        assert float(table[label]["paired_p_holm"]) == pytest.approx(adjusted[label], abs=1e-9)
    text = run_compare(*dirs, "--holm", "--paired", "--format=markdown").stdout
    assert "| p (Holm) | paired Δ | paired p | paired p (Holm) |" in text
    assert "Holm-Bonferroni adjusted over the 3 rows compared with the baseline" in text


def test_min_detectable_effect_has_80_percent_power():
    # Cohen's d at 80% power, alpha 0.05 two-sided, n per group (G*Power's two-sample t-test: 2.024 at 5, 0.909 at 20)
    assert min_detectable_effect(5, 5, 1.0) == pytest.approx(2.0244, abs=1e-4)
    assert min_detectable_effect(20, 20, 0.5) == pytest.approx(0.5 * 0.9091, abs=1e-4)
    # and by simulation: the t-test at that difference rejects in 80% of 40000 draws
    delta, rng = min_detectable_effect(5, 5, 0.02), np.random.default_rng(0)
    a, b = rng.normal(0, 0.02, (40_000, 5)), rng.normal(delta, 0.02, (40_000, 5))
    assert (stats.ttest_ind(a, b, axis=1).pvalue < 0.05).mean() == pytest.approx(0.8, abs=0.01)
    # unequal spreads (Welch): results/ablations' 4.3% for an arm as steady as res_gelu against the baseline
    assert 100 * min_detectable_effect(5, 5, 0.0562, 0.0205) / 2.1983 == pytest.approx(4.27, abs=0.01)
    with pytest.raises(ValueError, match="n1, n2 >= 2"):
        min_detectable_effect(1, 5, 1.0)


def test_with_diag_adds_the_layer_mean_of_each_diagnostic(tmp_path):
    def diag(name, lr, seed):  # four layers; query_f_ratio undefined for the linear query
        base = 10 * (name == "res_gelu") + seed
        return {"attn_logit_max": [base + 1.0, base + 2.0, base + 3.0, base + 6.0], "attn_entropy": [2.0] * 4,
                "query_f_ratio": [0.5, 0.7, None, None] if name == "res_gelu" else [None] * 4}

    dirs = held_out_runs(tmp_path, diag=diag)
    out = run_compare(*dirs, "--best_over=learning_rate", "--select_on=seed=0", "--with_diag", "--format=csv")
    table = csv_rows(out.stdout)
    base, res = table["baseline learning_rate=0.001"], table["res_gelu learning_rate=0.003"]
    # layer means 3 + seed, over the held-out seeds 1-3: 5 ± 1
    assert (float(base["diag/attn_logit_max_mean"]), float(base["diag/attn_logit_max_std"])) == (5.0, 1.0)
    assert float(res["diag/attn_logit_max_mean"]) == 15.0 and float(res["diag/attn_entropy_mean"]) == 2.0
    assert "diag/query_f_ratio_mean" not in base  # the default columns: attn_logit_max and attn_entropy
    table = csv_rows(run_compare(*dirs, "--with_diag=query_f_ratio", "--best_over=learning_rate",
                                 "--format=csv").stdout)
    assert float(table["res_gelu learning_rate=0.001"]["diag/query_f_ratio_mean"]) == pytest.approx(0.6)
    assert table["baseline learning_rate=0.003"]["diag/query_f_ratio_n"] == "0"  # no f: no value
    text = run_compare(*dirs, "--with_diag", "--best_over=learning_rate", "--select_on=seed=0").stdout
    assert "diag/attn_logit_max @ 2000" in text and "5.0000 ± 1.0000" in text
    assert "the diagnostic's mean over the layers" in text


@pytest.mark.parametrize("args, message", [
    (["--select_on=seed=0"], "give --best_over too"),
    (["--best_over=learning_rate", "--select_on=data_seed=1337"], "data_seed is not pooled over"),
    (["--best_over=learning_rate", "--select_on=seed"], "write key=value"),
    (["--best_over=learning_rate", "--select_on=seed=7"], "no run has seed=7"),
    (["--with_diag=attn_logit_mux"], "--with_diag=attn_logit_mux: no run has that diagnostic"),
])
def test_selection_and_diag_options_refuse_bad_input(tmp_path, args, message):
    proc = run_compare(*held_out_runs(tmp_path), *args, check=False)
    assert proc.returncode in (1, 2) and message in proc.stderr and proc.stdout == ""


def test_select_on_names_an_arm_it_cannot_choose_for_or_report(tmp_path):
    # res_gelu without a tuning run: its rate cannot be chosen
    grid = {**HELD_OUT, ("res_gelu", 1e-3): [3.00, 3.02, 3.04], ("res_gelu", 3e-3): [3.10, 3.22, 3.14]}
    dirs = [d for d in held_out_runs(tmp_path / "a", grid) if "res_gelu" not in d or not d.endswith("-0")]
    dirs = [d for d in dirs if not (d.endswith("-3") and "res_gelu" in d)]
    proc = run_compare(*dirs, "--best_over=learning_rate", "--select_on=seed=0", check=False)
    assert proc.returncode == 1 and "no run of the arm of res_gelu" in proc.stderr
    # the baseline chosen at 1e-3 on seed 0, but only seed 0 ran there
    dirs = [d for d in held_out_runs(tmp_path / "b") if not ("baseline-0.001" in d and not d.endswith("-0"))]
    proc = run_compare(*dirs, "--best_over=learning_rate", "--select_on=seed=0", check=False)
    assert proc.returncode == 1 and "baseline learning_rate=0.001, chosen on the tuning runs, has no other runs" \
        in proc.stderr


def test_plot_gives_each_of_more_than_ten_groups_its_own_color(tmp_path):
    # the ablation study's 11 arms: matplotlib's default cycle would give the 11th the 1st one's color
    dirs = [make_run(tmp_path / f"wd{k}", "baseline", {1000: 3.5, 2000: 3.0 + k / 100}, weight_decay=k / 10)
            for k in range(11)]
    groups = make_arms([load_run(d) for d in dirs], {"seed"})
    top, _ = loss_curves(groups, groups[0]).axes
    solid = [line for line in top.lines if line.get_linestyle() == "-"]
    assert len(solid) == 11 and len({tuple(np.round(to_rgba(line.get_color()), 6)) for line in solid}) == 11


def texts_outside(fig):
    """The titles, axis labels and legend texts of a matplotlib Figure that reach past its edges once it is drawn
    as savefig draws it (laid out, titles wrapped): [(text, its extent (x0, y0, width, height) in pixels)]."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    texts = [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label)]
    texts += [t for legend in [*fig.legends, *(ax.get_legend() for ax in fig.axes)] if legend
              for t in (legend.get_title(), *legend.get_texts())]
    renderer, edge = fig.canvas.get_renderer(), fig.bbox
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in texts if t.get_visible() and t.get_text()]
    return [(text, box.bounds) for text, box in boxes
            if box.x0 < edge.x0 or box.x1 > edge.x1 or box.y0 < edge.y0 or box.y1 > edge.y1]


def test_plot_titles_fit_the_figure_when_the_labels_are_long(tmp_path):
    # results/long_horizon's arms differ in several settings; its figure cut the lower title, which names the
    # baseline, at the figure's left edge ("e - L) / L_base, baseline: baseline attn_scale=0.0 ...")
    settings = [dict(attn_scale=0.0, learning_rate=3e-3), dict(attn_scale=0.35355339059327373, learning_rate=3e-3),
                dict(attn_scale=0.5, learning_rate=6e-3, weight_decay=0.03125, warmup_iters=40)]
    dirs = [make_run(tmp_path / f"arm{k}", "baseline_qk_norm", {1000: 3.5, 2000: 3.0 + k / 100}, **s)
            for k, s in enumerate(settings)]
    groups = make_arms([load_run(d) for d in dirs], {"seed"})
    assert [len(g.label) for g in groups] == [86, 102, 88]
    for baseline in groups:
        fig = loss_curves(groups, baseline)
        assert texts_outside(fig) == []
        assert fig.axes[1].title.get_text().endswith(f"baseline: {baseline.label}")
    # Figure 2's legend, beside the axes, narrows them as its labels grow: its title wraps to stay in the figure
    curves = [Curve(g.label, 787_584, np.array([1000, 2000]), np.array([3.5, 3.0])) for g in groups]
    curves[2].label = " ".join([curves[2].label] * 2)
    fig = figure2(curves, groups[0].label)
    assert texts_outside(fig) == []


def test_seeds_of_one_arm_run_on_different_numerics_are_warned_of(tmp_path):
    # three replicas that differ only in their thread count would pool as "n = 3 seeds"
    cpu = {"torch_threads": 2, "interop_threads": 2, "omp_num_threads": "", "cpu_capability": "AVX512",
           "cpu_model": "AMD EPYC", "blas": "mkl"}
    for seed, threads in ((1, 2), (2, 2), (3, 1)):
        out = make_run(tmp_path / f"s{seed}", "baseline", {1000: 3.0 + seed / 100}, seed=seed)
        head = {**header("baseline", out_dir=out, seed=seed), "numerics": {**cpu, "torch_threads": threads}}
        write_records(out, [head, *evals({1000: 3.0 + seed / 100})])
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(head, f)
    proc = run_compare(tmp_path / "s1", tmp_path / "s2", tmp_path / "s3")
    assert proc.stderr.strip() == ("warning: the runs of baseline differ in torch_threads (torch_threads: 2 (s1), 2 "
                                   "(s2), 1 (s3)), which change a run's numbers as a seed does: its n and std pool "
                                   "machines with seeds")
    assert "baseline" in proc.stdout and " 3 " in proc.stdout
    assert run_compare(tmp_path / "s1", tmp_path / "s2").stderr == ""  # equal numerics: nothing to say


def test_a_copied_run_is_refused_not_counted_as_a_second_seed(seeds, tmp_path, capsys):
    # `cp -r RUN RUN_copy`: the copy's config (seed included) and records are the run's, so n would be 2, ± 0
    copy = tmp_path / "baseline-0_copy"
    shutil.copytree(seeds[0], copy)
    with pytest.raises(SystemExit) as e:
        compare.main([seeds[0], str(copy), seeds[3]])
    assert str(e.value) == (f"error: {seeds[0]} and {copy} have the same settings and seed (seed=0, data_seed=1337), "
                            f"so they are one run given twice (a copy?), not two seeds; pass one of them")
    assert capsys.readouterr().out == ""
    # the same settings at another seed are a second seed; a setting that cannot change the numbers does not count
    again = make_run(tmp_path / "baseline-again", "baseline", {0: 10.9, 1000: 3.4, 2000: 2.95}, seed=0,
                     compile=False, wandb_name="other")
    with pytest.raises(SystemExit, match="baseline-again have the same settings and seed"):
        compare.main([seeds[0], again])
    compare.main([seeds[0], seeds[1], seeds[3]])
    assert rows(capsys.readouterr().out)["baseline"]["n"] == "2"


@pytest.mark.slow
def test_a_table_piped_into_head_ends_by_sigpipe_not_as_bad_input(seeds):
    # `python compare.py ... | head -1`: the reader goes after its line; status 1 is kept for bad input
    read, write = os.pipe()
    os.close(read)  # every write to the pipe now fails, as once head has read its line
    try:
        proc = subprocess.run([sys.executable, "compare.py", *seeds], cwd=REPO, stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=120)
    finally:
        os.close(write)
    assert (proc.returncode, proc.stderr) == (-signal.SIGPIPE, "")


def help_examples(match):
    """compare.py's --help examples (its docstring's `python compare.py` lines, a line ending in a backslash
    joined to the next, the comment cut off) that contain `match`."""
    text = re.sub(r"\\\n\s*", "", compare.__doc__)
    return [line.split("  #")[0].strip() for line in text.splitlines()
            if line.strip().startswith("python compare.py") and match in line]


@pytest.mark.slow
def test_the_help_s_width_ladder_example_names_its_baseline_and_prints_the_readme_s_tables(tmp_path):
    # a glob over results/width_ladder/*_w* took baseline_temp2 as the baseline (the first arm in sort order),
    # labelled the plain baseline "baseline attn_scale=0.0" and had no width 128 (long_horizon's runs)
    (example,) = help_examples("--width_ladder")
    assert "--baseline=baseline" in example
    proc = subprocess.run(["bash", "-c", example.replace("python", shlex.quote(sys.executable), 1)
                           + " --format=markdown"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    readme = open(os.path.join(REPO, "results", "width_ladder", "README.md")).read().splitlines()
    start = readme.index("## The gap, width by width")
    tables, previous = [], ""
    for line in readme[start:]:
        if line.startswith("|"):
            if not previous.startswith("|"):
                tables.append([])
            tables[-1].append(line)
        elif line.startswith("## ") and tables:
            break
        previous = line
    gaps, slopes = tables[:2]  # the README's gap per width, 64 to 384 (128 included), and its slopes
    assert [cells[:2] for cells in (row.split(" | ") for row in gaps[2:])] == [
        [f"| {arm}", str(w)] for arm in ("res_gelu", "res_gelu_no_half") for w in (64, 128, 256, 384)]
    printed = proc.stdout.splitlines()
    for table in (gaps, slopes):
        start = printed.index(table[0])
        assert printed[start:start + len(table)] == table
    assert "with the baseline baseline at the same width" in proc.stdout and "attn_scale" not in proc.stdout
