"""Tests of pretrained.py and export.py (docs/pretrained.md): every kind of source loads to the
logits of the model it holds, the anchored query starts at the linear model's logits and
learns f, export round-trips through transformers, and each bad source is a clear error."""

import argparse
import glob
import json
import math
import os
from dataclasses import asdict

import huggingface_hub
import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from helpers import TINY, losses_by_step, randomize, read_metrics, run_in_process, run_script, train
from model import GPT, GPTConfig
from nonlinear_queries.errors import PretrainedError
from nonlinear_queries.record.atomic import atomic_path
from nonlinear_queries.weights.pretrained import export, load_model

SMALL = dict(block_size=16, vocab_size=97, n_layer=2, n_head=4, n_embd=32)
IDX = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(0))


def logits(model, idx=IDX):
    """Logits (B, T, vocab) of every position."""
    with torch.no_grad():
        return model(idx, idx)[0] if isinstance(model, GPT) else model(idx).logits


def hf_gpt2(seed=0, biases=True, **config):
    """A small random GPT2LMHeadModel (vocab 97, 16 positions, 2 layers of width 32)."""
    config = {**dict(n_layer=2, n_head=4, n_embd=32, n_positions=16, vocab_size=97, bos_token_id=96,
                     eos_token_id=96), **config}
    return randomize(GPT2LMHeadModel(GPT2Config(**config)), seed, biases).eval()


def save_run(model, directory, step=7):
    """model as train.py's checkpoint directory/ckpt.pt (its keys; the run config train.py saves)."""
    os.makedirs(directory, exist_ok=True)
    ckpt = {"model": model.state_dict(), "optimizer": torch.optim.AdamW(model.parameters()).state_dict(),
            "model_args": asdict(model.config), "step": step, "evaluated": True, "steps_above_threshold": 0,
            "config": {**asdict(model.config), "dataset": "shakespeare", "data_dir": ""}, "data": {},
            "wandb_id": ""}
    torch.save(ckpt, os.path.join(directory, "ckpt.pt"))
    return os.path.join(directory, "ckpt.pt")


# ---------------------------------------------------------------------------------------
# Hugging Face GPT-2


@pytest.mark.parametrize(
    "config, biases, weights, activation",
    [
        (dict(), True, "model.safetensors", "gelu_tanh"),  # as OpenAI's: gelu_new, tied
        (dict(tie_word_embeddings=False), False, "model.safetensors", "gelu_tanh"),  # zero biases, own LM head
        (dict(activation_function="gelu", n_inner=48), True, "pytorch_model.bin", "gelu"),
        (dict(activation_function="gelu_pytorch_tanh", scale_attn_weights=False), True, "model.safetensors",
         "gelu_tanh"),
    ],
    ids=str,
)
def test_hf_gpt2_directory_gives_the_logits_of_gpt2lmheadmodel(tmp_path, config, biases, weights, activation):
    hf = hf_gpt2(1, biases, **config)
    hf.save_pretrained(tmp_path)
    if weights == "pytorch_model.bin":  # the older format: a torch.save'd state dict
        os.remove(tmp_path / "model.safetensors")
        torch.save(hf.state_dict(), tmp_path / weights)
    model = load_model(str(tmp_path)).eval()
    cfg = model.config
    assert (cfg.bias, cfg.mlp_activation, cfg.vocab_size, cfg.block_size) == (True, activation, 97, 16)
    assert cfg.tie_weights == config.get("tie_word_embeddings", True) and model.loaded_from.kind == "hf"
    torch.testing.assert_close(logits(model), logits(hf), rtol=0, atol=1e-5)


@pytest.mark.parametrize("repo_id", ["openai-community/gpt2", "gpt2"])  # the hub's name, and the alias of old caches
def test_gpt2_loads_from_the_local_cache_only(tmp_path, monkeypatch, repo_id):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(PretrainedError, match="not in the local Hugging Face cache.*\n  hf download "
                                              "openai-community/gpt2 config.json model.safetensors"):
        load_model("gpt2")
    # the cache's layout: models--OWNER--NAME/refs/main names the snapshot holding the files
    repo = tmp_path / f"models--{repo_id.replace('/', '--')}"
    hf = hf_gpt2(2)
    hf.save_pretrained(repo / "snapshots" / ("a" * 40))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    model = load_model("gpt2").eval()
    assert model.loaded_from.kind == "gpt2"
    torch.testing.assert_close(logits(model), logits(hf), rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------
# export


@pytest.mark.parametrize(
    "variant",
    [dict(), dict(bias=True, tie_weights=False, mlp_activation="gelu_tanh", mlp_ratio=3.0, attn_scale=1.0)],
    ids=str,
)
def test_export_round_trip_through_gpt2lmheadmodel(tmp_path, variant):
    model = randomize(GPT(GPTConfig(**SMALL, **variant)), 3).eval()
    assert export(model, str(tmp_path)) is None
    hf = GPT2LMHeadModel.from_pretrained(str(tmp_path)).eval()
    torch.testing.assert_close(logits(hf), logits(model), rtol=0, atol=1e-5)
    back = load_model(str(tmp_path)).eval()  # a bias-free model comes back with zero biases
    torch.testing.assert_close(logits(back), logits(model), rtol=0, atol=1e-5)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077], ids=oct)
def test_export_files_take_the_umask(tmp_path, mask):
    # safetensors makes its file 0600; the atomic writer gives both files what open() gives under the umask
    model = randomize(GPT(GPTConfig(**SMALL)), 3).eval()
    previous = os.umask(mask)
    try:
        export(model, str(tmp_path / "hf"))
        with atomic_path(str(tmp_path / "private")) as tmp:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600))  # as tempfile.mkstemp makes a file
    finally:
        os.umask(previous)
    for path in (tmp_path / "hf" / "model.safetensors", tmp_path / "hf" / "config.json", tmp_path / "private"):
        assert oct(os.stat(path).st_mode & 0o777) == oct(0o666 & ~mask), path


@pytest.mark.parametrize("variant", [dict(query_mode="res_gelu"), dict(query_mode="identity", tie_weights=False),
                                     dict(query_mode="linear", qk_norm=True)], ids=str)
def test_export_of_what_gpt2_cannot_hold_writes_this_repos_format(tmp_path, variant):
    model = randomize(GPT(GPTConfig(**SMALL, **variant)), 4).eval()
    reason = export(model, str(tmp_path))
    assert reason.startswith(("query_mode=", "qk_norm=True"))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["format"] == "nonlinear-queries" and config["model_args"] == asdict(model.config)
    back = load_model(str(tmp_path)).eval()
    assert back.loaded_from.kind == "export" and back.config == model.config
    torch.testing.assert_close(logits(back), logits(model), rtol=0, atol=0)


@pytest.mark.slow
def test_export_script(tmp_path):
    save_run(randomize(GPT(GPTConfig(**SMALL)), 5).eval(), tmp_path / "linear")
    save_run(randomize(GPT(GPTConfig(**SMALL, query_mode="res_gelu")), 5).eval(), tmp_path / "res_gelu")
    out = run_script("export.py", f"--out_dir={tmp_path / 'linear'}", f"--to={tmp_path / 'hf'}").stdout
    assert "Hugging Face GPT-2 format" in out
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["model_type"] == "gpt2"
    out = run_script("export.py", f"--out_dir={tmp_path / 'res_gelu'}", f"--to={tmp_path / 'own'}").stdout
    assert "query_mode='res_gelu'" in out and "Hugging Face transformers has no such architecture" in out
    assert os.path.isfile(tmp_path / "own" / "model.safetensors")
    proc = run_script("export.py", f"--out_dir={tmp_path / 'none'}", f"--to={tmp_path / 'x'}", check=False)
    assert proc.returncode == 1 and "is none of gpt2" in proc.stderr


# ---------------------------------------------------------------------------------------
# the official code's checkpoints and this repo's


def official_checkpoint(model, official_mode, scale, compiled):
    """model as the official code saves it: its key names (attn.c_attn rows q | k | v,
    or k | v without W_Q; attn.residual_*), torch.compile's '_orig_mod.' prefix if `compiled`,
    and model_args in its names."""
    cfg = model.config
    names = {".attn.query.rms.": ".attn.residual_rmsnorm_input.", ".attn.query.w1.": ".attn.residual_in.",
             ".attn.query.w2.": ".attn.residual_out.", ".attn.query.ln.": ".attn.residual_layernorm_output."}
    ours = model.state_dict()
    state_dict = {}
    for key, tensor in ours.items():
        for mine, theirs in names.items():
            key = key.replace(mine, theirs)
        if ".attn.c_kv." in key:
            block, param = key.split(".attn.c_kv.")
            w_q = ours.get(f"{block}.attn.query.w_q.{param}")
            key, tensor = f"{block}.attn.c_attn.{param}", tensor if w_q is None else torch.cat([w_q, tensor])
        if ".attn.query.w_q." not in key:
            state_dict[("_orig_mod." if compiled else "") + key] = tensor
    model_args = {"block_size": cfg.block_size, "vocab_size": cfg.vocab_size, "n_layer": cfg.n_layer,
                  "num_heads": cfg.n_head, "n_embd": cfg.n_embd, "head_size": cfg.n_embd // cfg.n_head,
                  "mlp_hidden_size": cfg.mlp_hidden, "tie_weights": cfg.tie_weights, "query_mode": official_mode,
                  "dropout": 0.0, "bias": cfg.bias, "batch_size": 12, "accumulation_size": 40, "scale": scale,
                  "learning_rate": 6e-4, "weight_decay": 2**-5, "save_checkpoint_steps": [50000, 100000]}
    return {"model": state_dict, "optimizer": torch.optim.AdamW(model.parameters()).state_dict(),
            "model_args": model_args, "iter_num": 60000, "best_val_loss": torch.tensor(2.95),
            "config": {"dataset": "openwebtext", "batch_size": 12}}


@pytest.mark.parametrize("tie_weights", [True, False])
@pytest.mark.parametrize(
    "official_mode, query_mode, scale, bias",
    [
        ("original", "linear", 1 / math.sqrt(8), False),
        ("identity", "identity", 1 / (2 * math.sqrt(8)), False),
        ("residual", "residual", 1 / (2 * math.sqrt(8)), True),
        ("residual_gelu", "res_gelu", 1 / (2 * math.sqrt(8)), True),
        ("original", "linear", 0.2, False),  # a scale of its own: attn_scale carries it
    ],
)
def test_official_checkpoint_gives_the_original_logits(tmp_path, official_mode, query_mode, scale, bias,
                                                        tie_weights):
    attn_scale = 0.0 if scale != 0.2 else 0.2
    model = randomize(GPT(GPTConfig(**SMALL, query_mode=query_mode, tie_weights=tie_weights, bias=bias,
                                    attn_scale=attn_scale)), 6).eval()
    torch.save(official_checkpoint(model, official_mode, scale, compiled=tie_weights), tmp_path / "ckpt.pt")
    loaded = load_model(str(tmp_path / "ckpt.pt")).eval()
    assert loaded.config == model.config
    assert (loaded.loaded_from.kind, loaded.loaded_from.step) == ("official", 60000)
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)


def test_repo_checkpoint_loads_from_file_and_run_directory(tmp_path):
    model = randomize(GPT(GPTConfig(**SMALL, query_mode="res_gelu", tie_weights=False, bias=True)), 7).eval()
    path = save_run(model, tmp_path / "run", step=7)
    for source in (path, str(tmp_path / "run")):
        loaded = load_model(source).eval()
        assert loaded.config == model.config and loaded.loaded_from.path == path
        assert loaded.loaded_from.step == 7 and loaded.loaded_from.run_config["dataset"] == "shakespeare"
        torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)


def test_repo_checkpoint_from_before_the_official_half_keeps_its_scale(tmp_path):
    # identity used 1/sqrt(head_dim) until issue 12; its model_args had no attn_scale
    model = randomize(GPT(GPTConfig(**SMALL, query_mode="identity", attn_scale=1 / math.sqrt(8))), 8).eval()
    path = save_run(model, tmp_path)
    ckpt = torch.load(path, weights_only=True)
    for key in ("attn_scale", "tie_weights", "bias", "mlp_activation"):
        del ckpt["model_args"][key]
    torch.save(ckpt, path)
    loaded = load_model(path).eval()
    assert loaded.config.attn_scale == 1 / math.sqrt(8)
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------
# overrides and the anchored query


def test_anchored_query_starts_at_the_pretrained_logits_and_its_gradient_reaches_f(tmp_path):
    hf = hf_gpt2(9)
    hf.save_pretrained(tmp_path)
    model = load_model(str(tmp_path), query_mode="anchored_res_gelu", query_rank=8)
    assert model.transformer.h[0].attn.query.w1.weight.shape == (8, 32)
    torch.testing.assert_close(logits(model.eval()), logits(hf), rtol=0, atol=1e-5)
    linear = load_model(str(tmp_path)).eval()
    torch.testing.assert_close(logits(model), logits(linear), rtol=0, atol=1e-6)
    # step 0: f = 0, so only its closing LayerNorm weight gets a gradient; after one step all of f does
    model.train()
    f_params = {n: p for n, p in model.named_parameters() if ".attn.query." in n and ".w_q." not in n}
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        opt.zero_grad()
        model(IDX, IDX)[1].backward()
        for name, p in f_params.items():
            assert (torch.count_nonzero(p.grad) > 0) == (step == 1 or ".query.ln." in name), name
        opt.step()
    assert not torch.allclose(logits(model.eval()), logits(linear), atol=1e-4)


def test_overrides_that_keep_the_weights_meaning(tmp_path):
    model = randomize(GPT(GPTConfig(**SMALL)), 10).eval()
    path = save_run(model, tmp_path)
    loaded = load_model(path, dropout=0.1, fused_qkv=False, block_size=8, n_layer=2).eval()
    assert (loaded.config.dropout, loaded.config.fused_qkv, loaded.config.block_size) == (0.1, False, 8)
    first8 = IDX[:, :8].contiguous()
    torch.testing.assert_close(logits(loaded, first8), logits(model, first8), rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "source_mode, overrides, message",
    [
        ("linear", dict(n_layer=3), "has n_layer=2 and cannot be loaded with n_layer=3: only dropout"),
        ("linear", dict(block_size=32), "has block_size=16 and cannot be loaded with block_size=32"),
        ("res_gelu", dict(query_mode="anchored_res_gelu"), "has query_mode='res_gelu' and cannot be loaded"),
        ("linear", dict(n_heads=4), r"unknown model settings \['n_heads'\]"),
    ],
    ids=str,
)
def test_overrides_that_would_change_the_model_are_refused(tmp_path, source_mode, overrides, message):
    path = save_run(GPT(GPTConfig(**SMALL, query_mode=source_mode)), tmp_path)
    with pytest.raises(PretrainedError, match=message):
        load_model(path, **overrides)


# ---------------------------------------------------------------------------------------
# sources that are not what they should be


def test_directory_that_is_not_gpt2(tmp_path):
    with pytest.raises(PretrainedError, match="holds neither config.json .* nor ckpt.pt"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    with pytest.raises(PretrainedError, match="model_type='llama': expected a Hugging Face GPT-2"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 32}))
    with pytest.raises(PretrainedError, match="has no model.safetensors or pytorch_model.bin"):
        load_model(str(tmp_path))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not a torch file")  # named as read, nothing offered instead
    with pytest.raises(PretrainedError, match=r"pytorch_model.bin: it is damaged, not a PyTorch file[^\n]*loaded\.$"):
        load_model(str(tmp_path))
    with pytest.raises(PretrainedError, match="'nowhere' is none of gpt2, gpt2-medium, gpt2-large, gpt2-xl"):
        load_model("nowhere")


def test_corrupt_and_foreign_files(tmp_path):
    path = save_run(GPT(GPTConfig(**SMALL)), tmp_path / "run")
    data = open(path, "rb").read()
    cases = [
        (data[: len(data) // 2], "truncated or corrupt"),
        (b"not a checkpoint at all", "it is damaged, not a PyTorch file, or it holds pickled Python objects"),
    ]
    for content, message in cases:
        with open(tmp_path / "bad.pt", "wb") as f:
            f.write(content)
        with pytest.raises(PretrainedError, match=message):
            load_model(str(tmp_path / "bad.pt"))
    torch.save(argparse.Namespace(model={}), tmp_path / "object.pt")  # a pickled object of a class
    with pytest.raises(PretrainedError, match="it holds pickled Python objects other than tensors and plain "
                                              "containers, which are never loaded"):
        load_model(str(tmp_path / "object.pt"))
    torch.save({"weights": torch.zeros(3)}, tmp_path / "other.pt")
    with pytest.raises(PretrainedError, match=r"not a checkpoint: expected a dict with 'model'.*found \['weights'\]"):
        load_model(str(tmp_path / "other.pt"))
    torch.save({"model": {}, "model_args": {"num_heads": 4, "query_mode": "swiglu"}}, tmp_path / "mode.pt")
    with pytest.raises(PretrainedError, match="the official query_mode 'swiglu' is none of original, identity"):
        load_model(str(tmp_path / "mode.pt"))
    # model_args that do not match the weights: an 'original' run whose c_attn lacks the W_Q rows
    ckpt = official_checkpoint(GPT(GPTConfig(**SMALL, query_mode="identity")), "original", 0.125, compiled=False)
    torch.save(ckpt, tmp_path / "mismatch.pt")
    with pytest.raises(PretrainedError, match="the weights do not fit the model its config describes"):
        load_model(str(tmp_path / "mismatch.pt"))
    hf_gpt2().save_pretrained(tmp_path / "hf")
    with open(tmp_path / "hf" / "model.safetensors", "r+b") as f:
        f.truncate(100)
    with pytest.raises(PretrainedError, match="not a safetensors file, or truncated or corrupt"):
        load_model(str(tmp_path / "hf"))


def test_export_refuses_a_destination_it_would_destroy(tmp_path):
    model = randomize(GPT(GPTConfig(**SMALL)), 6).eval()
    save_run(model, tmp_path / "run")
    run_config = json.dumps({"type": "config", "run_name": "baseline", "config": {"seed": 0}})
    (tmp_path / "run" / "config.json").write_text(run_config)  # what train.py writes beside ckpt.pt
    (tmp_path / "notes.txt").write_text("mine")
    hint = "; name a new directory with --to=DIR"
    for to, message in [
        ("notes.txt", "{tmp}/notes.txt is a file, not a directory (an export writes model.safetensors and "
                      "config.json into one)"),
        ("notes.txt/hf", "{tmp}/notes.txt is a file, so the directory {tmp}/notes.txt/hf cannot be made"),
        ("run", "{tmp}/run/config.json was not written by export (it is neither Hugging Face GPT-2's config nor "
                "this repo's export format: a run's config.json?), and an export would replace it"),
    ]:
        code, out, err = run_in_process("export.py", f"--out_dir={tmp_path / 'run'}", f"--to={tmp_path / to}")
        assert (code, out, err) == (1, "", "error: " + message.format(tmp=tmp_path) + hint + "\n")
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert (tmp_path / "run" / "config.json").read_text() == run_config
    assert sorted(os.listdir(tmp_path / "run")) == ["ckpt.pt", "config.json"]
    with pytest.raises(PretrainedError, match="was not written by export"):
        export(model, str(tmp_path / "run"))
    # an earlier export, in either format, is replaced: the new weights are the ones read back
    other = randomize(GPT(GPTConfig(**SMALL)), 7).eval()
    for kind, first in (("hf", model), ("own", GPT(GPTConfig(**SMALL, query_mode="res_gelu")))):
        export(first, str(tmp_path / kind))
        export(other, str(tmp_path / kind))
        torch.testing.assert_close(logits(load_model(str(tmp_path / kind)).eval()), logits(other), rtol=0,
                                   atol=1e-5)


# ---------------------------------------------------------------------------------------
# train.py and sample.py with --init_from=SOURCE


@pytest.mark.slow
def test_fine_tune_a_gpt2_directory_with_the_anchored_query_then_resume_and_sample(shakespeare_dir, tmp_path):
    # a random GPT-2 with the real vocabulary (Shakespeare's BPE tokens), saved as Hugging Face saves it
    hf = hf_gpt2(3, n_positions=32, vocab_size=50257, bos_token_id=50256, eos_token_id=50256)
    hf.save_pretrained(tmp_path / "hf")
    args = ["--init_from=" + str(tmp_path / "hf"), "--query_mode=anchored_res_gelu", "--max_iters=2",
            "--eval_interval=2", "--n_layer=2", "--n_embd=32", "--n_head=4"]
    proc = train(shakespeare_dir, tmp_path / "ft", *args)
    assert f"fine-tuning from {tmp_path / 'hf'} (hf)" in proc.stdout
    header = read_metrics(tmp_path / "ft", "config")[0]["config"]
    # the model is the pretrained one: GPT-2's biases, gelu_new and vocabulary, and the anchored query
    assert (header["bias"], header["mlp_activation"], header["vocab_size"], header["query_mode"]) == (
        True, "gelu_tanh", 50257, "anchored_res_gelu")
    # at step 0 the anchored model computes the pretrained logits: the same val loss as GPT2LMHeadModel's
    tokens = np.memmap(os.path.join(shakespeare_dir, "val.bin"), dtype=np.uint16, mode="r")
    index = np.load(glob.glob(os.path.join(shakespeare_dir, "indices", "val_eval_seed1337_2x4_T32_*.npy"))[0])
    with torch.no_grad():
        xy = [torch.from_numpy(np.stack([tokens[o : o + 33] for o in row]).astype(np.int64)) for row in index]
        want = np.mean([torch.nn.functional.cross_entropy(hf(b[:, :-1]).logits.flatten(0, 1), b[:, 1:].flatten())
                        .item() for b in xy])
    assert read_metrics(tmp_path / "ft", "eval")[0]["val_loss"] == pytest.approx(want, rel=1e-5)
    # the fine-tuned run resumes without naming the source again: its model is in its checkpoint
    train(shakespeare_dir, tmp_path / "ft", "--max_iters=4", "--eval_interval=2", "--n_head=4", "--init_from=resume")
    assert sorted(losses_by_step(tmp_path / "ft")) == [1, 2, 3, 4]
    proc = run_script("sample.py", f"--init_from={tmp_path / 'hf'}", "--max_new_tokens=5", "--device=cpu",
                      "--start=ROMEO.")
    assert f"loaded {tmp_path / 'hf'}, query_mode=linear" in proc.stdout and "ROMEO." in proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("source, message", [
    ("gpt2", "gpt2 is not in the local Hugging Face cache"),
    ("not-gpt2", "describes model_type='llama': expected a Hugging Face GPT-2"),
    ("corrupt.pt", "cannot read checkpoint {tmp}/corrupt.pt: it is truncated or corrupt"),
    ("random.pt", "cannot read checkpoint {tmp}/random.pt: it is damaged, not a PyTorch file, or it holds pickled "
                  "Python objects other than tensors and plain containers, which are never loaded."),
])
def test_bad_sources_are_clear_errors(shakespeare_dir, tmp_path, monkeypatch, source, message):
    (tmp_path / "not-gpt2").mkdir()
    (tmp_path / "not-gpt2" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "corrupt.pt").write_bytes(b"PK\x03\x04 half a zip archive")
    (tmp_path / "random.pt").write_bytes(np.random.default_rng(0).bytes(4096))
    path = source if source == "gpt2" else str(tmp_path / source)
    env = {"HF_HUB_CACHE": str(tmp_path / "empty-cache")}  # no GPT-2 cached, whatever this machine has
    for script, args in (("train.py", [*TINY, f"--data_dir={shakespeare_dir}", f"--out_dir={tmp_path / 'out'}"]),
                         ("sample.py", ["--device=cpu"])):
        proc = run_script(script, *args, f"--init_from={path}", check=False, env=env)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert message.format(tmp=tmp_path) in proc.stderr and "weights_only" not in proc.stderr, proc.stderr
    assert not os.path.exists(tmp_path / "out" / "ckpt.pt")
