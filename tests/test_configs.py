"""The config files carry the paper's Table 1 hyperparameters (§3.1) and parameter counts (docs/design.md)."""

import glob
import os
import re

import pytest

from helpers import REPO, markdown_table, run_script
from nonlinear_queries.config.configurator import read_config_file

TABLE1 = {  # config: (query_mode, mlp_ratio, max lr, min lr, weight decay)
    "baseline": ("linear", 4.0, 6e-4, 6e-5, 0.1),
    "mlp475": ("linear", 4.75, 6e-4, 6e-5, 0.1),
    "mlp475_scaled": ("linear", 4.75, 5.66e-4, 5.66e-5, 0.1),
    "res_gelu_lr2p6": ("res_gelu", 4.0, 2.6e-3, 3e-5, 2**-5),
    "res_gelu": ("res_gelu", 4.0, 3e-3, 3e-5, 2**-5),
    "identity": ("identity", 4.0, 6e-4, 6e-5, 2**-5),  # the official identity run's weight decay
}


@pytest.mark.parametrize("name", sorted(TABLE1))
def test_paper_config_hyperparameters(name):
    c = read_config_file(os.path.join(REPO, "config", f"{name}.py"))
    assert (c["query_mode"], c["mlp_ratio"], c["learning_rate"], c["min_lr"], c["weight_decay"]) == TABLE1[name]
    assert (c["n_layer"], c["n_head"], c["n_embd"], c["block_size"]) == (12, 12, 768, 1024)
    assert c["batch_size"] * c["gradient_accumulation_steps"] * c["block_size"] == 491_520
    assert (c["max_iters"], c["lr_decay_iters"], c["warmup_iters"]) == (60_000, 60_000, 2_000)
    assert (c["eval_interval"], c["eval_iters"] * c["batch_size"]) == (1000, 2400)
    assert c["dataset"] == "openwebtext" and c["wandb_log"] is True
    assert (c["wandb_project"], c["wandb_group"]) == ("nonlinear-queries", "table1")
    assert c["out_dir"] == f"out-{name.replace('_', '-')}"


# the μP twins (docs/width.md): config: (its SP config, max lr, min lr), the rate the base width 128 chose
MUP = {"baseline_mup": ("baseline", 3e-3, 3e-4), "res_gelu_mup": ("res_gelu", 3e-3, 3e-5)}


@pytest.mark.parametrize("name", sorted(MUP))
def test_a_mup_twin_is_its_table1_config_under_mup_at_the_base_widths_rate(name):
    twin, (sp_name, lr, min_lr) = read_config_file(os.path.join(REPO, "config", f"{name}.py")), MUP[name]
    sp = read_config_file(os.path.join(REPO, "config", f"{sp_name}.py"))
    changed = {k for k in {*twin, *sp} if twin.get(k) != sp.get(k)}
    assert changed - {"learning_rate", "min_lr"} == {"parametrization", "mup_base_width", "out_dir", "wandb_group"}
    assert (twin["parametrization"], twin["mup_base_width"], twin["learning_rate"], twin["min_lr"]) == (
        "mup", 128, lr, min_lr)
    assert min_lr / lr == pytest.approx(sp["min_lr"] / sp["learning_rate"])  # the SP config's decay, kept


def test_every_config_is_listed():
    names = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "config", "*.py"))}
    assert names == set(TABLE1) | set(MUP) | {"quickstart"}
    # the modern recipe (tests/test_modern.py holds its settings), its model and optimizers in recipe.py
    assert {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "config", "modern", "*.py"))} == {
        "baseline", "res_gelu", "recipe"}
    assert {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "config", "gpt3", "*.py"))} == {
        f"{size}_{arm}" for size in GPT3 for arm in ("baseline", "res_gelu")}


@pytest.fixture(scope="module")
def params_table():
    """bench/params.py's table, {config: {column: cell}}."""
    return markdown_table(run_script("bench/params.py").stdout, "config")


@pytest.mark.slow
def test_params_table_shows_spec_counts(params_table):
    rows = params_table
    assert rows["baseline"]["non-emb"] == "84,953,856"
    assert rows["res_gelu"]["non-emb"] == rows["res_gelu_lr2p6"]["non-emb"] == "84,972,288"
    assert rows["identity"]["non-emb"] == "77,875,968"
    assert rows["mlp475"]["non-emb"] == rows["mlp475_scaled"]["non-emb"] == "95,570,688"
    assert rows["mlp475"]["vs baseline"] == "+12.50%" and rows["baseline"]["vs baseline"] == "+0.00%"
    # the output gate (attn_gate): W_θ of 768 x 12 (headwise) or 768 x 768 (elementwise) a layer
    for arm, count in (("baseline", 84_953_856), ("res_gelu", 84_972_288)):
        assert rows[f"{arm}, attn_gate=headwise"]["non-emb"] == f"{count + 12 * 768 * 12:,}"
        assert rows[f"{arm}, attn_gate=elementwise"]["non-emb"] == f"{count + 12 * 768 * 768:,}"
    assert rows["baseline, attn_gate=elementwise"]["vs baseline"] == "+8.33%"
    # the modern recipe: + QK-norm's 12 x 2 x 64; its untied head doubles the embedding count, no wpe
    assert rows["modern/baseline"]["non-emb"] == "84,955,392" and rows["modern/baseline"]["total"] == "162,222,336"
    assert rows["modern/res_gelu"]["non-emb"] == "84,973,824"
    assert rows["modern/res_gelu"]["vs baseline"] == "+0.02%"  # against modern/baseline


GPT3 = {  # Brown et al. 2020, Table 2.1: (n_layer, n_embd, n_head, lr); XL's 24 heads of 128 do not divide its
    # d = 2048, so it has 16 of 128 here (config/gpt3/xl_baseline.py)
    "medium": (24, 1024, 16, 3e-4), "large": (24, 1536, 16, 2.5e-4), "xl": (24, 2048, 16, 2e-4),
    "2p7b": (32, 2560, 32, 1.6e-4),
}


@pytest.mark.slow
@pytest.mark.parametrize("size", GPT3)
def test_gpt3_configs_and_their_parameter_counts(params_table, size):
    layers, d, heads, lr = GPT3[size]
    base = read_config_file(os.path.join(REPO, "config", "gpt3", f"{size}_baseline.py"))
    res = read_config_file(os.path.join(REPO, "config", "gpt3", f"{size}_res_gelu.py"))
    assert (base["n_layer"], base["n_embd"], base["n_head"], base["learning_rate"]) == (layers, d, heads, lr)
    assert (base["block_size"], base["query_mode"], res["query_mode"]) == (1024, "linear", "res_gelu")
    # res_gelu's rate: the paper's GPT-2 small ratio, 3e-3 / 6e-4, and min lr at 1/100 of it
    assert res["learning_rate"] == pytest.approx(5 * lr) and res["min_lr"] == pytest.approx(res["learning_rate"] / 100)
    # by hand: per block W_K, W_V, W_Q, W_O (4 d^2), the MLP (8 d^2) and two norm weights, then the final norm;
    # res_gelu's f has W1 and W2 (d^2 together, in place of W_Q) and two norm weights more
    linear = layers * (12 * d * d + 2 * d) + d
    for arm, non_embedding in {"baseline": linear, "res_gelu": linear + layers * 2 * d}.items():
        row = params_table[f"gpt3/{size}_{arm}"]
        assert row["non-emb"] == f"{non_embedding:,}"
        assert row["total"] == f"{non_embedding + 50304 * d + 1024 * d:,}"  # tied wte and the positions


def test_the_quickstarts_val_loss_is_said_once():
    # docs/training.md's table holds step 500's val loss per thread count and CPU; the README and the walk
    # through the run give the reference machine's row, and every other doc that states the number one of its rows
    def read(path):
        return open(os.path.join(REPO, path)).read()

    training = read("docs/training.md").split("## The quickstart in detail")[1].split("\n## ")[0]
    table = training.split("| machine")[1].split("\n\n")[0].splitlines()[2:]
    rows = [(cells[0].strip(), cells[-1].strip()) for cells in (line.split("|")[1:-1] for line in table)]
    reference = dict(rows)["AMD EPYC, the reference machine (README)"]
    assert len(rows) == 7 and reference == "5.7649"
    assert f"reaches val loss {reference} at step 500" in " ".join(read("README.md").split())
    assert f"**{reference}** (500)" in training
    for path in ("docs/evaluation.md", "config/quickstart.py"):
        assert set(re.findall(r"\b5\.\d{2,4}\b", read(path))) <= {loss for _, loss in rows}, path
