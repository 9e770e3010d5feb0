"""The config files carry the paper's Table 1 hyperparameters (SPEC §3) and parameter counts (SPEC §1)."""

import glob
import os

import pytest

from configurator import read_config_file
from conftest import REPO, markdown_table, run_script

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


def test_every_config_is_listed():
    names = {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "config", "*.py"))}
    assert names == set(TABLE1) | {"quickstart"}
    # the modern recipe (tests/test_modern.py holds its settings)
    assert {os.path.basename(p)[:-3] for p in glob.glob(os.path.join(REPO, "config", "modern", "*.py"))} == {
        "baseline", "res_gelu"}


def test_params_table_shows_spec_counts():
    rows = markdown_table(run_script("bench/params.py").stdout, "config")
    assert rows["baseline"]["non-emb"] == "84,953,856"
    assert rows["res_gelu"]["non-emb"] == rows["res_gelu_lr2p6"]["non-emb"] == "84,972,288"
    assert rows["identity"]["non-emb"] == "77,875,968"
    assert rows["mlp475"]["non-emb"] == rows["mlp475_scaled"]["non-emb"] == "95,570,688"
    assert rows["mlp475"]["vs baseline"] == "+12.50%" and rows["baseline"]["vs baseline"] == "+0.00%"
    # the modern recipe: + QK-norm's 12 x 2 x 64; its untied head doubles the embedding count, no wpe
    assert rows["modern/baseline"]["non-emb"] == "84,955,392" and rows["modern/baseline"]["total"] == "162,222,336"
    assert rows["modern/res_gelu"]["non-emb"] == "84,973,824"
    assert rows["modern/res_gelu"]["vs baseline"] == "+0.02%"  # against modern/baseline
