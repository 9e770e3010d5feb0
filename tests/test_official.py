"""The official repository's runs as configs here (docs/official.md): every twin in config/official/ has the
official file's model and recipe, transcribed below, and the parameter count of a hand formula; the res_gelu
grid and Figure 2's controls are sweep.py points files with those settings; Figure 2 is drawn from runs."""

import glob
import json
import math
import os
from dataclasses import asdict

import numpy as np
import pytest
import torch

from helpers import REPO, TINY, run_script
from model import GPT, GPTConfig, model_config_keys
from nonlinear_queries.analysis.plots import Curve, figure2, relative_improvement
from nonlinear_queries.config.configurator import parse_config
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.experiments import sweeps
from nonlinear_queries.record.runs import load_run

OFFICIAL = os.path.join(REPO, "config", "official")
_S1 = 1 / math.sqrt(768 // 12)  # the official "scale" of the linear query, 1/(math.sqrt(768//12))
_S2 = 1 / (2 * math.sqrt(768 // 12))  # of identity, residual and residual_gelu, 1/(2*math.sqrt(768//12))
_LR = (6e-4, 6e-5)  # the baseline's learning_rate, min_lr
# Transcribed from the official files' model_args (MarkoKarbevski/beyond_query_linearity), this repo's names:
# official query_mode original | identity | residual | residual_gelu = linear | identity | residual | res_gelu.
# (query_mode, n_embd, num_heads, head_size, mlp_hidden_size, tie_weights, scale, learning_rate, min_lr,
#  weight_decay, lr_decay_iters, max_iters); warmup_iters is 2000 in all (train.py's), dropout 0, bias False.
TIED, UNTIED = (60002, 60002), (600000, 105001)
TABLE = {
    # configs/configs_tied/config_tiedw_original.py
    "config_tiedw_original": ("linear", 768, 12, 64, 768 * 4, True, _S1, *_LR, 0.1, *TIED),
    # configs/configs_tied/config_tiedw_original_005wd.py
    "config_tiedw_original_005wd": ("linear", 768, 12, 64, 768 * 4, True, _S1, *_LR, 0.05, *TIED),
    # configs/configs_tied/config_tiedw_original_headsize_68.py
    "config_tiedw_original_headsize_68": ("linear", 768 + 4 * 12, 12, 68, (768 + 4 * 12) * 4, True,
                                          1 / math.sqrt((768 + 4 * 12) // 12), *_LR, 0.1, *TIED),
    # configs/configs_tied/config_tiedw_original_mlp_4_33_times.py
    "config_tiedw_original_mlp_4_33_times": ("linear", 768, 12, 64, int(768 * 4 + 768 * (1 / 3)), True, _S1, *_LR,
                                             0.1, *TIED),
    # configs/configs_tied/config_tiedw_original_mlp_4_5_times.py
    "config_tiedw_original_mlp_4_5_times": ("linear", 768, 12, 64, int(768 * 4.5), True, _S1, *_LR, 0.1, *TIED),
    # configs/configs_tied/config_tiedw_original_mlp_4_625_times.py
    "config_tiedw_original_mlp_4_625_times": ("linear", 768, 12, 64, int(768 * (4 + 5 / 8)), True, _S1, *_LR, 0.1,
                                              *TIED),
    # configs/configs_tied/config_tiedw_original_mlp_4_75_times.py
    "config_tiedw_original_mlp_4_75_times": ("linear", 768, 12, 64, int(768 * (4 + 6 / 8)), True, _S1, *_LR, 0.1,
                                             *TIED),
    # configs/configs_tied/config_tiedw_original_mlp_4_75_times_lrscaled.py
    "config_tiedw_original_mlp_4_75_times_lrscaled": ("linear", 768, 12, 64, int(768 * (4 + 6 / 8)), True, _S1,
                                                      6e-4 / math.sqrt(1.125), 6e-5 / math.sqrt(1.125), 0.1, *TIED),
    # configs/configs_tied/config_tiedw_original_mlp_5times.py
    "config_tiedw_original_mlp_5times": ("linear", 768, 12, 64, 768 * 5, True, _S1, *_LR, 0.1, *TIED),
    # configs/configs_tied/config_tiedw_original_smaller_mlp.py
    "config_tiedw_original_smaller_mlp": ("linear", 768, 12, 64, int(768 * 3.5), True, _S1, *_LR, 0.1, *TIED),
    # configs/configs_tied/config_tiedw_original_smaller_overall.py
    "config_tiedw_original_smaller_overall": ("linear", 744, 12, 62, 744 * 4, True, 1 / math.sqrt(744 // 12), *_LR,
                                              0.1, *TIED),
    # configs/configs_tied/config_tiedw_residual.py
    "config_tiedw_residual": ("residual", 768, 12, 64, 768 * 4, True, _S2, *_LR, 0.1, *TIED),
    # configs/configs_tied/config_tiedw_residual_gelu.py
    "config_tiedw_residual_gelu": ("res_gelu", 768, 12, 64, 768 * 4, True, _S2, 8e-4, 8e-5, 0.1, *TIED),
    # configs/configs_untied/config_untiedw_identity.py
    "config_untiedw_identity": ("identity", 768, 12, 64, 768 * 4, False, _S2, *_LR, 2**-5, *UNTIED),
    # configs/configs_untied/config_untiedw_identity_larger_mlp.py
    "config_untiedw_identity_larger_mlp": ("identity", 768, 12, 64, int(768 * 4.5), False, _S2, *_LR, 2**-5,
                                           *UNTIED),
    # configs/configs_untied/config_untiedw_original.py
    "config_untiedw_original": ("linear", 768, 12, 64, 768 * 4, False, _S1, *_LR, 0.1, *UNTIED),
    # configs/configs_untied/config_untiedw_original_smaller_mlp.py
    "config_untiedw_original_smaller_mlp": ("linear", 768, 12, 64, int(768 * 3.5), False, _S1, *_LR, 0.1, *UNTIED),
    # configs/configs_untied/config_untiedw_original_smaller_overall.py
    "config_untiedw_original_smaller_overall": ("linear", 744, 12, 62, 744 * 4, False, 1 / math.sqrt(744 // 12),
                                                *_LR, 0.1, *UNTIED),
    # configs/configs_untied/config_untiedw_residual.py
    "config_untiedw_residual": ("residual", 768, 12, 64, 768 * 4, False, _S2, *_LR, 0.1, *UNTIED),
    # configs/configs_untied/config_untiedw_residual_gelu.py
    "config_untiedw_residual_gelu": ("res_gelu", 768, 12, 64, 768 * 4, False, _S2, *_LR, 0.1, *UNTIED),
}
# The res_gelu grid, configs/configs_tied/config_tiedw_residual_gelu_<suffix>.py: (learning_rate, weight_decay,
# min_lr); otherwise config_tiedw_residual_gelu's model and 60002 steps on a 60002-step schedule.
GRID = {
    "0025wd_1_7e-3lr_3e-5": (1.7e-3, 0.025, 3e-5), "0025wd_2_4e-3lr_3e-5": (2.4e-3, 0.025, 3e-5),
    "0025wd_3e-3lr_3e-5": (3e-3, 0.025, 3e-5), "005wd": (8e-4, 0.05, 8e-5), "005wd_1_1e-3lr": (1.1e-3, 0.05, 1.1e-4),
    "005wd_2_4e-3lr_3e-5": (2.4e-3, 0.05, 3e-5), "005wd_3e-3lr_3e-5": (3e-3, 0.05, 3e-5),
    "2-5wd_1_2e-3lr": (1.2e-3, 2**-5, 1.2e-4), "2-5wd_1_2e-3lr_3e-4": (1.2e-3, 2**-5, 3e-4),
    "2-5wd_1_2e-3lr_7e-5": (1.2e-3, 2**-5, 7e-5), "2-5wd_1_5e-3lr_3e-5": (1.5e-3, 2**-5, 3e-5),
    "2-5wd_1_5e-3lr_4e-5": (1.5e-3, 2**-5, 4e-5), "2-5wd_1_5e-3lr_6e-5": (1.5e-3, 2**-5, 6e-5),
    "2-5wd_1_7e-3lr_3e-5": (1.7e-3, 2**-5, 3e-5), "2-5wd_1_7e-3lr_5e-5": (1.7e-3, 2**-5, 5e-5),
    "2-5wd_2_2e-3lr_3e-5": (2.2e-3, 2**-5, 3e-5), "2-5wd_2_4e-3lr_3e-5": (2.4e-3, 2**-5, 3e-5),
    "2-5wd_2_6e-3lr_3e-5": (2.6e-3, 2**-5, 3e-5), "2-5wd_2_8e-3lr_3e-5": (2.8e-3, 2**-5, 3e-5),
    "2-5wd_2e-3lr_3e-5": (2e-3, 2**-5, 3e-5), "2-5wd_3_2e-3lr_3e-5": (3.2e-3, 2**-5, 3e-5),
    "2-5wd_3_4e-3lr_3e-5": (3.4e-3, 2**-5, 3e-5), "2-5wd_3e-3lr_3e-5": (3e-3, 2**-5, 3e-5),
    "2-6wd_1_5e-3lr_4e-5": (1.5e-3, 2**-6, 4e-5), "2-6wd_1_5e-3lr_8e-5": (1.5e-3, 2**-6, 8e-5),
    "2-6wd_2e-3lr_1_2e-4": (2e-3, 2**-6, 1.2e-4), "2-6wd_2e-3lr_2e-5": (2e-3, 2**-6, 2e-5),
    "2-6wd_2e-3lr_8e-5": (2e-3, 2**-6, 8e-5),
}
GRID = {f"config_tiedw_residual_gelu_{suffix}": v for suffix, v in GRID.items()}
FIGURE2_CONTROLS = ["config_tiedw_original", "config_tiedw_original_mlp_4_33_times",
                    "config_tiedw_original_mlp_4_5_times", "config_tiedw_original_mlp_4_625_times",
                    "config_tiedw_original_mlp_4_75_times", "config_tiedw_original_mlp_4_75_times_lrscaled",
                    "config_tiedw_original_mlp_5times"]


def resolve(*argv):
    """The TrainConfig of config files and --key=value overrides (paths relative to the repo)."""
    return parse_config(TrainConfig, [a if a.startswith("--") else os.path.join(REPO, a) for a in argv])[0]


def build(cfg):
    """GPT of a config's model settings on the meta device: the real shapes, no memory."""
    with torch.device("meta"):
        return GPT(GPTConfig(**{k: getattr(cfg, k) for k in model_config_keys()}))


def non_embedding(query_mode, d, hidden, layers=12):
    """By hand: per block W_K, W_V, W_O (3 d^2), the query (linear and residual: W_Q, d^2; res_gelu: W1 and W2 of
    r = d/2, d^2, and its two norms' weights, 2 d; identity: none), the MLP (2 d hidden) and ln_1, ln_2 (2 d);
    then ln_f (d). The embeddings and the LM head, tied or not, are not counted."""
    query = {"linear": d * d, "residual": d * d, "res_gelu": d * d + 2 * d, "identity": 0}[query_mode]
    return layers * (3 * d * d + query + 2 * d * hidden + 2 * d) + d


def test_every_distinct_official_config_has_one_twin():
    twins = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(OFFICIAL, "*.py"))}
    assert twins == set(TABLE) and len(twins) == 20


@pytest.mark.parametrize("stem", sorted(TABLE))
def test_twin_has_the_official_model_and_recipe(stem):
    mode, d, heads, head_size, hidden, tied, scale, lr, min_lr, wd, decay_iters, max_iters = TABLE[stem]
    cfg = resolve(f"config/official/{stem}.py")
    assert (cfg.query_mode, cfg.n_embd, cfg.n_head, cfg.n_embd // cfg.n_head) == (mode, d, heads, head_size)
    assert (cfg.mlp_hidden, cfg.tie_weights) == (hidden, tied)
    assert (cfg.learning_rate, cfg.min_lr, cfg.weight_decay) == (lr, min_lr, wd)  # exactly, as floats
    assert (cfg.warmup_iters, cfg.lr_decay_iters, cfg.max_iters, cfg.decay_lr) == (2000, decay_iters, max_iters, True)
    assert cfg.save_checkpoint_steps == (50000, 100000, 105000)
    # the rest of the official model_args and train.py, the same in every file
    assert (cfg.n_layer, cfg.block_size, cfg.vocab_size, cfg.dropout, cfg.bias) == (12, 1024, 50304, 0.0, False)
    assert (cfg.batch_size, cfg.gradient_accumulation_steps, cfg.beta1, cfg.beta2, cfg.grad_clip) == (
        12, 40, 0.9, 0.95, 1.0)
    assert (cfg.eval_interval, cfg.eval_iters, cfg.dataset) == (1000, 200, "openwebtext")
    assert cfg.out_dir == f"out-official/{stem}"
    model = build(cfg)
    attn = model.transformer.h[0].attn
    assert attn.scale == pytest.approx(scale, rel=1e-15)
    assert model.transformer.h[0].mlp.c_fc.weight.shape == (hidden, d)
    assert (model.lm_head.weight is model.transformer.wte.weight) == tied


@pytest.mark.parametrize("stem", sorted(TABLE))
def test_twin_has_the_hand_counted_parameters(stem):
    mode, d, _, _, hidden, tied, *_ = TABLE[stem]
    model = build(resolve(f"config/official/{stem}.py"))
    n = non_embedding(mode, d, hidden)
    assert model.get_num_params() == n
    assert model.get_num_params(non_embedding=False) == n + 50304 * d * (1 if tied else 2) + 1024 * d


def test_parameter_counts_of_the_paper():
    counts = {stem: build(resolve(f"config/official/{stem}.py")).get_num_params() for stem in TABLE}
    assert counts["config_tiedw_original"] == 84_953_856  # Table 1's "85M"
    assert counts["config_tiedw_residual_gelu"] == 84_972_288  # Figure 2: "84.97M"
    # Figure 2: "MLP-widened controls: 89.6 to 95.6M", the 4.33x to the 4.75x control
    assert counts["config_tiedw_original_mlp_4_33_times"] == 89_672_448
    assert counts["config_tiedw_original_mlp_4_75_times"] == 95_570_688  # +12.5%
    assert counts["config_tiedw_original_mlp_4_75_times"] / counts["config_tiedw_original"] == pytest.approx(1.125,
                                                                                                             abs=1e-4)


def test_res_gelu_grid_points_are_the_official_files():
    shared, points = sweeps.read_points(os.path.join(OFFICIAL, "res_gelu_grid.toml"))
    assert sorted(name for name, _ in points) == sorted(GRID) and len(points) == 28
    for name, settings in points:
        cfg = resolve("config/res_gelu.py", *(f"--{k}={v}" for k, v in shared if k != "out_dir"),
                      *(f"--{k}={v}" for k, v in settings))
        assert (cfg.learning_rate, cfg.weight_decay, cfg.min_lr) == GRID[name]
        twin = resolve("config/official/config_tiedw_residual_gelu.py")
        # all else is the official res_gelu run's: model, schedule, batches
        assert {k for k, v in asdict(cfg).items() if getattr(twin, k) != v} <= {
            "learning_rate", "weight_decay", "min_lr", "out_dir"}


def test_res_gelu_grid_dry_run_lists_every_point_by_its_official_name(tmp_path):
    out = run_script("sweep.py", "config/res_gelu.py", "--points", "config/official/res_gelu_grid.toml",
                     "--dry_run").stdout
    listed = [line.split("] ", 1)[1].split(":")[0] for line in out.splitlines() if line.startswith("[")]
    assert sorted(listed) == sorted(GRID) and len(listed) == 28
    for name in GRID:
        assert f"--wandb_run_name={name} " in out and f"--out_dir=out-official/res_gelu_grid/{name} " in out
    assert out.count(": starting\n") == 28


def test_figure2_controls_are_the_twins():
    shared, points = sweeps.read_points(os.path.join(OFFICIAL, "figure2_controls.toml"))
    assert [name for name, _ in points] == FIGURE2_CONTROLS
    for name, settings in points:
        cfg = resolve("config/baseline.py", *(f"--{k}={v}" for k, v in shared if k != "out_dir"),
                      *(f"--{k}={v}" for k, v in settings), f"--wandb_run_name={name}")
        twin = resolve(f"config/official/{name}.py", f"--wandb_run_name={name}")
        assert {k for k, v in asdict(cfg).items() if getattr(twin, k) != v} == {"out_dir"}


def test_points_cross_the_grid_axes(tmp_path):
    points = tmp_path / "p.toml"
    points.write_text('max_iters = 7\n\n[a]\nlearning_rate = 1e-3\n\n[b]\nmlp_ratio = 4.5\n')
    out = run_script("sweep.py", "config/mini/baseline.py", f"--points={points}", "--grid", "seed=1,2",
                     f"--sweep_dir={tmp_path / 's'}", "--dry_run").stdout
    commands = [line.strip() for line in out.splitlines() if "train.py" in line]
    assert [line.split("] ", 1)[1].split(":")[0] for line in out.splitlines() if line.startswith("[")] == [
        "a,seed=1", "a,seed=2", "b,seed=1", "b,seed=2"]
    assert all("--max_iters=7 " in c for c in commands)
    assert "--wandb_run_name=a --learning_rate=0.001 --seed=2 " in commands[1]
    assert f"--wandb_run_name=b --mlp_ratio=4.5 --seed=1 --out_dir={tmp_path / 's' / 'b,seed=1'} " in commands[2]


def test_points_file_errors_are_clear(tmp_path):
    cases = {"[a]\nlerning_rate = 1e-3\n": "unknown config key 'lerning_rate'",
             "[a]\nout_dir = 'x'\n": "sweep.py sets out_dir itself",
             "max_iters = 10\n": "no point",
             "[a\n": "not a TOML file"}
    for i, (text, message) in enumerate(cases.items()):
        path = tmp_path / f"p{i}.toml"
        path.write_text(text)
        proc = run_script("sweep.py", "config/baseline.py", f"--points={path}", "--dry_run", check=False)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_figure2_plots_the_relative_improvement_labelled_with_parameters():
    steps = np.array([1000, 2000, 3000])
    base = Curve("baseline", 84_953_856, steps, np.array([3.6, 3.2, 3.0]))
    res = Curve("res_gelu", 84_972_288, steps, np.array([3.5, 3.1, 2.97]))
    mlp = Curve("mlp475", 95_570_688, steps[:2], np.array([3.55, 3.2]))  # stopped at step 2000
    ax = figure2([base, res, mlp], "baseline").axes[0]
    zero, res_line, mlp_line = ax.lines
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "baseline: baseline (84.95M)", "res_gelu (84.97M)", "mlp475 (95.57M)"]
    assert list(zero.get_ydata()) == [0, 0]
    np.testing.assert_array_equal(res_line.get_xdata(), steps)
    np.testing.assert_allclose(res_line.get_ydata(), [100 * 0.1 / 3.6, 100 * 0.1 / 3.2, 100 * 0.03 / 3.0])
    np.testing.assert_allclose(mlp_line.get_ydata(), [100 * 0.05 / 3.6, 0.0], atol=1e-12)
    assert (res_line.get_linestyle(), mlp_line.get_linestyle()) == ("-", "--")  # +12.5% parameters: dashed
    with pytest.raises(ValueError, match="no curve is labelled 'linear'"):
        figure2([base, res], "linear")
    # the grid and the controls: 34 arms, each its own color
    many = [Curve(f"arm{i}", 84_972_288, steps, np.array([3.5, 3.1, 2.9]) + i / 1000) for i in range(34)]
    lines = figure2([base, *many], "baseline").axes[0].lines[1:]
    assert len({tuple(line.get_color()) for line in lines}) == 34


@pytest.mark.slow
def test_figure2_from_a_tiny_points_sweep(shakespeare_dir, tmp_path):
    """Three tiny arms trained by sweep.py --points (the names recorded in each run's config.json), drawn by
    compare.py --figure2; the curve values are (L_base - L) / L_base of the runs' own metrics."""
    points = tmp_path / "arms.toml"
    points.write_text('max_iters = 4\nlr_decay_iters = 4\neval_interval = 2\n\n[linear]\n\n'
                      '[res_gelu]\nquery_mode = "res_gelu"\n\n[mlp475]\nmlp_ratio = 4.75\n')
    sweep_dir = tmp_path / "arms"
    run_script("sweep.py", *TINY, f"--data_dir={shakespeare_dir}", f"--points={points}",
               f"--sweep_dir={sweep_dir}", env={"OMP_NUM_THREADS": "1"})
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert record["points"] == {"linear": "done", "res_gelu": "done", "mlp475": "done"}
    for name in record["points"]:
        header = json.loads((sweep_dir / name / "config.json").read_text())
        assert header["run_name"] == header["config"]["wandb_run_name"] == name
    png = tmp_path / "figure2.png"
    proc = run_script("compare.py", str(sweep_dir), "--baseline=linear", f"--figure2={png}")
    assert f"wrote {png}" in proc.stdout and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the same figure in-process: labels carry the hand-counted parameters of the tiny model (d 32, 2 layers)
    runs = [load_run(str(sweep_dir / name)) for name in ("linear", "res_gelu", "mlp475")]
    curves = [Curve(r.header["run_name"], r.header["non_embedding_params"], np.array(sorted(r.evals)[1:]),
                    np.array([r.evals[s][1] for s in sorted(r.evals)[1:]])) for r in runs]
    counts = [non_embedding(mode, 32, hidden, layers=2) for mode, hidden in
              (("linear", 128), ("res_gelu", 128), ("linear", int(4.75 * 32)))]
    assert [c.non_embedding_params for c in curves] == counts == [24_736, 24_864, 27_808]
    ax = figure2(curves, "linear").axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "baseline: linear (0.02474M)", "res_gelu (0.02486M)", "mlp475 (0.02781M)"]
    base = {s: r[1] for s, r in runs[0].evals.items()}
    for line, run in zip(ax.lines[1:], runs[1:]):
        assert list(line.get_xdata()) == [2, 4]
        np.testing.assert_allclose(line.get_ydata(), [100 * (base[s] - run.evals[s][1]) / base[s] for s in (2, 4)])
        steps, values = relative_improvement(next(c for c in curves if c.label == run.header["run_name"]), curves[0])
        np.testing.assert_allclose(line.get_ydata(), values)


def test_docs_table_shows_each_twins_settings_and_parameters():
    rows = {}
    with open(os.path.join(REPO, "docs", "official.md")) as f:
        for line in f:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells[0].startswith("configs_"):
                rows[cells[0].split("/")[1]] = cells
    assert set(rows) == set(TABLE)
    for stem, cells in rows.items():
        model = build(resolve(f"config/official/{stem}.py"))
        assert cells[3] == str(TABLE[stem][4])  # MLP hidden
        assert cells[4] == f"{model.get_num_params():,}"
        assert cells[8] == f"{TABLE[stem][11]:,} / {TABLE[stem][10]:,}"  # max_iters / lr_decay_iters
