"""The per-layer diagnostics (diagnostics.py, issue 14): their numbers on tiny models with hand-set weights
against direct computations, training unchanged by them (losses and checkpoints), a `diag` record per
evaluation for every query mode, and compare.py and analyze.py on such records."""

import contextlib
import csv
import io
import json
import math
import os
import sys
from dataclasses import asdict

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

import analyze
from helpers import ONE_THREAD, TINY, read_metrics, reference_attention_logits, run_script, train
from model import GPT, QUERY_MODULES, GPTConfig
from nonlinear_queries.analysis.arms import make_arms
from nonlinear_queries.analysis.plots import diagnostics as plot_diagnostics
from nonlinear_queries.config.configurator import parse_config
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.errors import ConfigError
from nonlinear_queries.evaluation.diagnostics import ACTIVATIONS, diagnose
from nonlinear_queries.record.runs import RunLog, load_run
from nonlinear_queries.runtime.processes import parallelize, setup
from nonlinear_queries.weights.checkpoint_file import load_checkpoint_file

SMALL = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=32)
TOKENS = ((np.arange(200) * 7) % 32).astype(np.uint16)
INDEX = np.array([[0, 13, 50], [91, 120, 170]])  # 2 batches of 3 sequences
ROPE_GQA = dict(pos_encoding="rope", n_head=4, n_kv_head=2)


def model_with(seed=0, scale=1.0, **config):
    """A SMALL GPT whose every parameter is set by hand: N(0, scale^2) from `seed`, norm weights included."""
    model = GPT(GPTConfig(**{**SMALL, **config}))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return model


def layer_inputs(model):
    """Every block's input for the sequences of INDEX, batch by batch: [[x (B, T, C) per layer] per batch]."""
    out = []
    with torch.no_grad():
        for row in INDEX:
            idx = torch.from_numpy(np.stack([TOKENS[o : o + SMALL["block_size"]] for o in row]).astype(np.int64))
            x, rope = model.embed(idx)
            xs = []
            for block in model.transformer.h:
                xs.append(x)
                x = block(x, rope=rope)
            out.append((xs, rope))
    return out


@pytest.mark.parametrize("config", [{}, ROPE_GQA], ids=["learned", "rope_gqa"])
def test_zero_keys_give_uniform_attention_entropy_mean_log_positions(config):
    model = model_with(**config)
    with torch.no_grad():
        for block in model.transformer.h:  # W_K = 0: every logit 0, each position attends uniformly
            block.attn.c_kv.weight[: block.attn.c_kv.out_features // 2] = 0
    d = diagnose(model, TOKENS, INDEX, SMALL["block_size"], "cpu")
    expected = np.mean([math.log(i + 1) for i in range(SMALL["block_size"])])
    assert d["attn_entropy"] == pytest.approx([expected] * 2, rel=1e-6)
    assert d["attn_logit_max"] == d["attn_logit_mean_max"] == d["key_norm"] == [0.0, 0.0]
    assert d["w_k_fro"] == d["w_k_spec"] == [0.0, 0.0]


@pytest.mark.parametrize("mode, config", [("linear", {}), ("res_gelu", {**ROPE_GQA, "qk_norm": True})],
                         ids=["linear", "res_gelu_rope_gqa_qk_norm"])
def test_logits_norms_and_weight_norms_equal_a_direct_computation(mode, config):
    model = model_with(query_mode=mode, **config)
    n_head, n_kv = model.config.n_head, model.config.kv_heads
    hd = SMALL["n_embd"] // n_head
    want = {k: [] for k in ("attn_logit_max", "attn_logit_mean_max", "attn_entropy", "query_norm", "key_norm")}
    per_batch = layer_inputs(model)
    with torch.no_grad():
        for i, block in enumerate(model.transformer.h):
            attn, found = block.attn, {k: [] for k in want}
            for xs, rope in per_batch:
                h = block.ln_1(xs[i])
                B, T, C = h.shape
                q = attn.query(h).view(B, T, n_head, hd).transpose(1, 2)  # the unfused module; q = x + f(x)
                k = (h @ attn.c_kv.weight[: n_kv * hd].T).view(B, T, n_kv, hd).transpose(1, 2)
                found["query_norm"].append(q.norm(dim=-1).flatten())
                found["key_norm"].append(k.norm(dim=-1).flatten())
                scale = 0.5 / math.sqrt(hd) if mode == "res_gelu" else 1 / math.sqrt(hd)  # res_gelu's halved q
                if model.config.qk_norm:
                    scale = 1 / math.sqrt(hd)
                rope_theta = model.config.rope_theta if rope is not None else None
                logits, _ = reference_attention_logits(attn, h, attn.query(h), scale, model.config.qk_norm, rope_theta)
                p = logits.softmax(-1)
                found["attn_logit_max"].append(logits.max().reshape(1))
                found["attn_logit_mean_max"].append(logits.max(-1).values.flatten())
                found["attn_entropy"].append(-(p * p.clamp_min(1e-30).log()).sum(-1).flatten())
            for k_, v in found.items():
                v = torch.cat(v)
                want[k_].append((v.max() if k_ == "attn_logit_max" else v.mean()).item())
    d = diagnose(model, TOKENS, INDEX, SMALL["block_size"], "cpu")
    for name, values in want.items():
        assert d[name] == pytest.approx(values, rel=1e-5, abs=1e-6), name
    assert max(d["attn_logit_max"]) > 1  # the hand-set weights give logits far from 0
    for i, block in enumerate(model.transformer.h):
        w_k = block.attn.c_kv.weight[: n_kv * hd]
        assert d["w_k_fro"][i] == pytest.approx(w_k.pow(2).sum().sqrt().item(), rel=1e-6)
        assert d["w_k_spec"][i] == pytest.approx(np.linalg.svd(w_k.detach().numpy(), compute_uv=False)[0], rel=1e-5)


def test_identity_query_cos_is_one_and_res_gelu_without_f_has_f_ratio_zero():
    d = diagnose(model_with(query_mode="identity"), TOKENS, INDEX, SMALL["block_size"], "cpu")
    assert d["query_cos"] == pytest.approx([1.0, 1.0], abs=1e-6) and d["query_f_ratio"] == [None, None]
    model = model_with(query_mode="res_gelu")
    with torch.no_grad():
        for block in model.transformer.h:  # f's closing LayerNorm weight 0: f(x) = 0, q = x
            block.attn.query.ln.weight.zero_()
    d = diagnose(model, TOKENS, INDEX, SMALL["block_size"], "cpu")
    assert d["query_f_ratio"] == [0.0, 0.0]
    assert d["query_cos"] == pytest.approx([1.0, 1.0], abs=1e-6)
    # with f back, q leaves its anchor: the cosine drops below 1 and ||f|| / ||x|| is positive
    d = diagnose(model_with(query_mode="res_gelu"), TOKENS, INDEX, SMALL["block_size"], "cpu")
    assert all(c < 0.99 for c in d["query_cos"]) and all(r > 0.1 for r in d["query_f_ratio"])


def check_diagnostics_of_a_query_mode(mode, **extra):
    """diagnose() on a model of query_mode `mode`: one value a layer of every activation diagnostic, the norms of
    W_K and of each matrix of the query module (its 2-D parameters, by the child that holds them), query_cos where
    its decompose() gives an anchor and query_f_ratio where it gives f too (None otherwise), no random number drawn.
    The per-mode check of this file, run for every registered mode and for a mode added in a test."""
    model = model_with(query_mode=mode, dropout=0.5, **extra)
    query = model.transformer.h[0].attn.query
    matrices = {"w_k"} | {name.split(".")[0] for name, p in query.named_parameters() if p.dim() == 2}
    parts = query.decompose(torch.zeros(1, 1, SMALL["n_embd"]))
    rng = torch.get_rng_state()
    d = diagnose(model, TOKENS, INDEX, SMALL["block_size"], "cpu")
    # no random number drawn (dropout is off in the pass), and the model is back in training mode
    assert torch.equal(torch.get_rng_state(), rng) and model.training
    norms = {m + s for m in matrices for s in ("_fro", "_spec")}
    assert list(d) == [*ACTIVATIONS, *(n for n in d if n in norms)] and set(d) == set(ACTIVATIONS) | norms
    assert all(len(v) == 2 for v in d.values()), mode
    assert (d["query_cos"] == [None, None]) == (parts is None), mode
    assert (d["query_f_ratio"] == [None, None]) == (parts is None or parts[1] is None), mode
    assert all(math.isfinite(x) for n, v in d.items() for x in v if x is not None)
    assert all(d[m + "_spec"][i] <= d[m + "_fro"][i] * (1 + 1e-6) for m in matrices for i in range(2))


@pytest.mark.parametrize("extra", [{}, ROPE_GQA], ids=["learned", "rope_gqa"])
@pytest.mark.parametrize("mode", sorted(QUERY_MODULES))
def test_every_query_mode_gives_one_value_per_layer(mode, extra):
    check_diagnostics_of_a_query_mode(mode, **extra)


def test_the_matrices_and_anchors_of_the_papers_query_modes():
    # what the per-mode check above derives from each module, written out for the paper's modes: W_K and the
    # query's matrices, an anchor (query_cos) for every mode but linear, f (query_f_ratio) beside it but identity
    d = {mode: diagnose(model_with(query_mode=mode), TOKENS, INDEX, SMALL["block_size"], "cpu")
         for mode in ("linear", "identity", "residual", "res_gelu", "anchored_res_gelu")}
    assert {mode: {n[: -len("_fro")] for n in v if n.endswith("_fro")} for mode, v in d.items()} == {
        "linear": {"w_k", "w_q"}, "identity": {"w_k"}, "residual": {"w_k", "w_q"}, "res_gelu": {"w_k", "w1", "w2"},
        "anchored_res_gelu": {"w_k", "w_q", "w1", "w2"}}
    assert [mode for mode, v in d.items() if v["query_cos"] == [None, None]] == ["linear"]
    assert [mode for mode, v in d.items() if v["query_f_ratio"] == [None, None]] == ["linear", "identity"]


def test_a_diag_record_goes_to_wandb_per_layer():
    class Wandb:
        logged = []

        def log(self, data, step=None):
            self.logged.append((step, data))

    log = RunLog(os.devnull, Wandb(), master=True)
    log.log({"type": "diag", "step": 7, "attn_logit_max": [1.5, 2.5], "query_cos": [None, None]})
    assert Wandb.logged == [(7, {"diag/layer0/attn_logit_max": 1.5, "diag/layer1/attn_logit_max": 2.5})]


@pytest.mark.parametrize("arg, message", [("--diagnostics_batches=0", "diagnostics_batches must be >= 1"),
                                          ("--diagnostics_batches=3", "diagnostics_batches=3 exceeds eval_iters=2")])
def test_diagnostics_batches_is_checked(arg, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(TrainConfig, [*TINY, arg])


def run_analyze(*args):
    """analyze.py's main() in this process (no interpreter and torch to start) on `args`; returns its stdout."""
    out, argv = io.StringIO(), sys.argv
    sys.argv = ["analyze.py", *args]
    try:
        with contextlib.redirect_stdout(out):
            analyze.main()
    finally:
        sys.argv = argv
    return out.getvalue()


def same(a, b):
    """Whether two checkpoint values are equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.slow
def test_training_is_identical_with_diagnostics_on_and_off_and_checkpoint_mode_agrees(shakespeare_dir, tmp_path):
    # RoPE + GQA, res_gelu, and dropout, whose masks would move if the diagnostics drew random numbers
    args = ["--max_iters=4", "--eval_interval=2", "--query_mode=res_gelu", "--pos_encoding=rope", "--n_kv_head=1",
            "--dropout=0.1"]
    for on in (True, False):
        train(shakespeare_dir, tmp_path / str(on), *args, f"--diagnostics={on}", env=ONE_THREAD)
    on, off = read_metrics(tmp_path / "True"), read_metrics(tmp_path / "False")
    strip = {"ms_per_step", "tokens_per_s"}  # wall-clock
    assert [{k: v for k, v in r.items() if k not in strip} for r in on if r["type"] in ("train", "eval")] == \
        [{k: v for k, v in r.items() if k not in strip} for r in off if r["type"] in ("train", "eval")]
    for step in (2, 4):
        a, b = (load_checkpoint_file(tmp_path / d / f"ckpt_{step:06d}.pt") for d in ("True", "False"))
        assert a.keys() == b.keys() and all(same(a[k], b[k]) for k in a if k != "config"), step
        assert {**a["config"], "diagnostics": False, "out_dir": b["config"]["out_dir"]} == b["config"]
    # one diag record after each eval, one value per layer; none without diagnostics
    diags = [r for r in on if r["type"] == "diag"]
    assert [r["step"] for r in diags] == [r["step"] for r in on if r["type"] == "eval"] == [0, 2, 4]
    assert all(len(v) == 2 for r in diags for k, v in r.items() if k not in ("type", "step"))
    assert not [r for r in off if r["type"] == "diag"]
    # analyze.py --checkpoint measures the run's checkpoint on the run's own batches: the step-4 record
    rows = list(csv.DictReader(io.StringIO(run_analyze(f"--checkpoint={tmp_path / 'True'}", "--format=csv"))))
    assert [int(r["layer"]) for r in rows] == [0, 1]
    for name, values in diags[-1].items():
        if name not in ("type", "step"):
            assert [float(r[name]) for r in rows] == pytest.approx(values, rel=1e-6), name


# ---------------------------------------------------------------------------------------
# compare.py and analyze.py on fabricated runs


def write_run(out_dir, run_name, seed, diags, val_losses, diagnostics=True, **config):
    """A run directory as train.py writes it: the header, then per step an eval and, with diagnostics, a diag
    record; diags {step: {name: [value per layer]}}, val_losses {step: loss}."""
    os.makedirs(out_dir)
    cfg = {**asdict(TrainConfig()), "seed": seed, "diagnostics": diagnostics, "out_dir": str(out_dir), **config}
    records = [{"type": "config", "step": 0, "run_name": run_name, "non_embedding_params": 1000, "config": cfg}]
    for step, val in val_losses.items():
        records.append({"type": "eval", "step": step, "train_loss": val, "val_loss": val})
        if diagnostics:
            records.append({"type": "diag", "step": step, **diags[step]})
    with open(os.path.join(out_dir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return str(out_dir)


def diag(logit_max, cos=None, w_k=1.0):
    """A diag record's values for 2 layers: attn_logit_max per layer, the others fixed."""
    return {"attn_logit_max": logit_max, "attn_logit_mean_max": [1.0, 1.0], "attn_entropy": [2.0, 2.5],
            "query_norm": [4.0, 4.0], "key_norm": [3.0, 3.0], "query_cos": cos or [None, None],
            "query_f_ratio": [None, None], "w_k_fro": [w_k, w_k], "w_k_spec": [0.5, 0.5]}


@pytest.fixture
def runs(tmp_path):
    """baseline with seeds 1 and 2 (attn_logit_max's layer mean 3 and 5 at step 100), res_gelu with seed 1."""
    return [
        write_run(tmp_path / "b1", "baseline", 1, {0: diag([1.0, 1.0]), 100: diag([2.0, 4.0])}, {0: 4.0, 100: 3.0}),
        write_run(tmp_path / "b2", "baseline", 2, {0: diag([1.0, 3.0]), 100: diag([4.0, 6.0])}, {0: 4.0, 100: 3.2}),
        write_run(tmp_path / "r1", "res_gelu", 1, {0: diag([1.0, 1.0], [0.9, 0.7]), 100: diag([1.0, 2.0], [0.8, 0.6])},
                  {0: 4.0, 100: 2.9}, query_mode="res_gelu"),
    ]


def test_compare_reads_diag_records_and_pools_runs_with_diagnostics_on_and_off(runs, tmp_path):
    off = write_run(tmp_path / "b3", "baseline", 3, {}, {0: 4.0, 100: 3.4}, diagnostics=False)
    rows = list(csv.DictReader(run_script("compare.py", *runs, off, "--format=csv").stdout.splitlines()))
    assert [(r["run"], r["n"], float(r["val_loss_mean"])) for r in rows] == [
        ("baseline", "3", pytest.approx(3.2)), ("res_gelu", "1", 2.9)]
    assert load_run(runs[0]).diags[100]["attn_logit_max"] == [2.0, 4.0]


@pytest.mark.slow
def test_analyze_prints_the_table_and_draws_the_figure(runs, tmp_path):
    out = run_analyze(*runs, "--format=csv")
    table = {(r["run"], r["diagnostic"]): r for r in csv.DictReader(io.StringIO(out))}
    assert {r["step"] for r in table.values()} == {"100"}  # the last step all runs have
    row = table["baseline", "attn_logit_max"]  # layer means 3 and 5 over the two seeds
    assert (float(row["mean"]), float(row["std"]), row["n"]) == (4.0, pytest.approx(math.sqrt(2)), "2")
    assert float(table["baseline", "val_loss"]["mean"]) == pytest.approx(3.1)
    cos = table["res_gelu", "query_cos"]  # layer means 0.7, one run: no std
    assert (float(cos["mean"]), cos["std"], cos["n"]) == (pytest.approx(0.7), "", "1")
    assert table["baseline", "query_cos"]["mean"] == "" and table["baseline", "query_cos"]["n"] == "0"
    assert ("baseline", "query_f_ratio") not in table  # undefined in every run: no row
    # the markdown table at another step: one row per diagnostic, one column per arm; the figure, as a user
    # would run it
    png = tmp_path / "fig.png"
    out = run_script("analyze.py", *runs, "--step=0", "--format=markdown", f"--plot={png}").stdout
    lines = [line for line in out.splitlines() if line.startswith("|")]
    assert lines[0] == "| diagnostic | baseline (n=2) | res_gelu (n=1) |"
    assert "| attn_logit_max | 1.5 ± 0.707 | 1 |" in lines and "| query_cos | - | 0.8 |" in lines
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = [load_run(r) for r in runs]
    groups = make_arms(loaded, {"seed"})
    names = analyze.diagnostic_names([d for r in loaded for d in r.diags.values()])
    fig = plot_diagnostics(groups, names)
    # a panel per diagnostic, then a heatmap (with its colorbar) per arm
    assert [ax.get_title() for ax in fig.axes[: len(names)]] == [f"{n}, mean over layers" for n in names]
    assert len(fig.axes) == len(names) + 2 * len(groups)
    heat = fig.axes[len(names)].images[0]
    assert heat.get_array().shape == (2, 2) and heat.get_array()[:, 1].tolist() == [3.0, 5.0]  # layers x steps
    assert heat.get_clim() == fig.axes[len(names) + 2].images[0].get_clim() == (1.0, 5.0)  # one color scale
    with pytest.raises(SystemExit, match="--step=50 is not a diag step"):
        run_analyze(*runs, "--step=50")


def test_an_fsdp_sharded_model_gives_the_same_diagnostics():
    runtime = setup("cpu", "float32", parallelism="fsdp")  # this process as a process group of one, as train.py runs it
    try:
        plain, sharded = (model_with(query_mode="res_gelu", **ROPE_GQA) for _ in range(2))
        parallelize(sharded, runtime, "fsdp", activation_checkpointing=True)
        want, got = (diagnose(m, TOKENS, INDEX, SMALL["block_size"], "cpu") for m in (plain, sharded))
        assert list(got) == list(want)
        for name, values in want.items():
            assert got[name] == pytest.approx(values, rel=1e-6), name
        assert all(isinstance(p, DTensor) for p in sharded.parameters())  # sharded again afterwards
    finally:
        dist.destroy_process_group()
