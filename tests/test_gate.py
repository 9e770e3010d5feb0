"""The output gate on attention (`attn_gate`; Qiu et al. 2025, arXiv:2505.06708, G1; docs/design.md): its forward
held against the equation written out, its counts, μP's role for W_θ, the KV cache, and the refusals."""

import os
from dataclasses import asdict

import pytest
import torch
from test_study import TOML, write_study

import study
from helpers import REPO, randomize, reference_attention_logits, run_script, train
from model import GPT, GPTConfig
from nonlinear_queries.config.configurator import parse_config
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.errors import CheckpointError
from nonlinear_queries.experiments import protocol
from nonlinear_queries.trainer.optimizers import configure_optimizers, muon_parameters
from nonlinear_queries.weights.checkpoint import check_resumable
from nonlinear_queries.weights.pretrained import hf_incompatibility, load_model

SMALL = dict(block_size=16, vocab_size=97, n_layer=2, n_head=4, n_embd=32)
GATES = ["headwise", "elementwise"]
# the gate beside a non-linear query, biases, QK-norm with GQA, and the modern recipe (RoPE, GQA, RMSNorm,
# QK-norm, SwiGLU)
VARIANTS = [dict(attn_gate=g, **v) for g in GATES for v in (
    dict(query_mode="linear"), dict(query_mode="res_gelu"), dict(query_mode="identity"),
    dict(query_mode="anchored_res_gelu", bias=True), dict(query_mode="linear", bias=True),
    dict(query_mode="res_gelu", bias=True), dict(query_mode="res_gelu", qk_norm=True, n_kv_head=2),
    dict(query_mode="res_gelu", pos_encoding="rope", n_kv_head=2, norm="rmsnorm", qk_norm=True,
         mlp_activation="swiglu"))]


def reference_gated_attention(attn, x, kind):
    """One attention layer with the output gate, written from Qiu et al.'s G1: Y' = Y ⊙ σ(X W_θ + b), X the layer's
    input (the block's normed x), Y the heads' softmax(q k^T scale) v; headwise one gate a head over its head_dim
    channels, elementwise one a channel; then c_proj. x: (B, T, C) -> (B, T, C)."""
    B, T, C = x.shape
    H = attn.n_head
    qk_norm = isinstance(attn.q_norm, torch.nn.RMSNorm)
    logits, v = reference_attention_logits(attn, x, attn.query(x), attn.scale, qk_norm=qk_norm)
    y = torch.softmax(logits, dim=-1) @ v  # (B, H, T, head_dim)
    scores = x @ attn.c_gate.weight.T + (attn.c_gate.bias if attn.c_gate.bias is not None else 0)
    gate = torch.sigmoid(scores)  # (B, T, H) or (B, T, C)
    if kind == "headwise":
        y = y * gate.transpose(1, 2)[..., None]  # head h's channels all times gate h
    else:
        y = y * gate.view(B, T, H, C // H).transpose(1, 2)  # channel c = head c // head_dim, dim c % head_dim
    return attn.c_proj(y.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("variant", [v for v in VARIANTS if "pos_encoding" not in v], ids=str)
def test_the_gated_attention_is_the_equation_written_out(variant, fused):
    torch.manual_seed(1)
    model = randomize(GPT(GPTConfig(**SMALL, **variant, fused_qkv=fused)).double(), seed=1)
    attn = model.transformer.h[0].attn
    if attn.c_gate.bias is not None:  # randomize's biases are small; the gate's should matter
        with torch.no_grad():
            attn.c_gate.bias.normal_(0.0, 1.0)
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    torch.testing.assert_close(attn(x), reference_gated_attention(attn, x, variant["attn_gate"]))


@pytest.mark.parametrize("kind", GATES)
def test_the_gate_reads_the_blocks_normed_input(kind):
    # the block as a whole: x + attention(ln_1(x)), the gate from ln_1(x) too, whose weight randomize moves off 1
    torch.manual_seed(2)
    model = randomize(GPT(GPTConfig(**SMALL, attn_gate=kind, query_mode="res_gelu")).double(), seed=2)
    block = model.transformer.h[0]
    x = 3.0 * torch.randn(2, 16, 32, dtype=torch.float64) + 1.0  # far from its own norm
    h = x + reference_gated_attention(block.attn, block.ln_1(x), kind)
    torch.testing.assert_close(block(x), h + block.mlp(block.ln_2(h)))


@pytest.mark.parametrize("kind", GATES)
def test_a_zero_gate_weight_scales_each_heads_output_by_sigmoid_of_its_bias(kind):
    torch.manual_seed(3)
    gated = randomize(GPT(GPTConfig(**SMALL, attn_gate=kind, bias=True)).double(), seed=3)
    attn = gated.transformer.h[0].attn
    b = torch.randn(attn.c_gate.out_features, dtype=torch.float64)
    with torch.no_grad():
        attn.c_gate.weight.zero_()
        attn.c_gate.bias.copy_(b)
    plain = GPT(GPTConfig(**SMALL, bias=True)).double()
    missing, unexpected = plain.load_state_dict(gated.state_dict(), strict=False)
    assert missing == [] and sorted(unexpected) == [f"transformer.h.{i}.attn.c_gate.{p}" for i in (0, 1)
                                                    for p in ("bias", "weight")]
    x = torch.randn(2, 16, 32, dtype=torch.float64)
    # a gate constant over tokens is c_proj's input columns times σ(b): head h's head_dim columns times σ(b_h)
    columns = torch.sigmoid(b).repeat_interleave(32 // attn.c_gate.out_features)
    ungated = plain.transformer.h[0].attn
    with torch.no_grad():
        ungated.c_proj.weight.mul_(columns)
    torch.testing.assert_close(attn(x), ungated(x))
    # and with one b for all and no c_proj bias, the attention's output is σ(b) times the ungated one
    with torch.no_grad():
        attn.c_gate.bias.fill_(0.7)
        attn.c_proj.bias.zero_()
    ungated = GPT(GPTConfig(**SMALL, bias=True)).double()
    ungated.load_state_dict(gated.state_dict(), strict=False)
    ungated = ungated.transformer.h[0].attn
    torch.testing.assert_close(attn(x), torch.sigmoid(torch.tensor(0.7, dtype=torch.float64)) * ungated(x))


@pytest.mark.parametrize("kind, bias, per_layer", [("headwise", False, 768 * 12), ("elementwise", False, 589_824),
                                                   ("headwise", True, 768 * 12 + 12),
                                                   ("elementwise", True, 589_824 + 768)])
def test_gpt2_smalls_parameter_and_flop_counts_hold_the_gate(kind, bias, per_layer):
    with torch.device("meta"):
        plain, gated = (GPT(GPTConfig(attn_gate=g, bias=bias)) for g in ("none", kind))
    assert gated.get_num_params() - plain.get_num_params() == 12 * per_layer
    assert gated.get_num_params(non_embedding=False) - plain.get_num_params(non_embedding=False) == 12 * per_layer
    assert gated.flops_per_token() - plain.flops_per_token() == 6 * 12 * per_layer  # MFU's FLOPs per token
    if not bias:
        assert gated.get_num_params() == 84_953_856 + 12 * per_layer  # over the baseline's Table 1 count


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_fused_and_unfused_gated_models_agree_and_so_do_cached_and_uncached_generations(variant):
    torch.manual_seed(4)
    fused = randomize(GPT(GPTConfig(**SMALL, **variant)), seed=4)
    plain = GPT(GPTConfig(**SMALL, **variant, fused_qkv=False))
    plain.load_state_dict(fused.state_dict())
    idx, targets = torch.randint(0, 97, (3, 16)), torch.randint(0, 97, (3, 16))
    (a, loss_a), (b, loss_b) = fused(idx, targets), plain(idx, targets)
    torch.testing.assert_close((a, loss_a), (b, loss_b), rtol=1e-5, atol=1e-5)
    loss_a.backward()
    loss_b.backward()
    assert fused.transformer.h[0].attn.c_gate.weight.grad.abs().sum() > 0
    torch.testing.assert_close([p.grad for p in fused.parameters()], [p.grad for p in plain.parameters()],
                               rtol=1e-4, atol=1e-6)
    # the gate depends on the current token alone, so decoding with the KV cache is exact; 5 + 20 tokens outgrow
    # block_size 16, so the cached run also switches to the cropped window
    model = fused.double().eval()
    prompt = torch.randint(0, 97, (3, 5))
    cached = model.generate(prompt, 20, temperature=0)
    assert torch.equal(cached, model.generate(prompt, 20, temperature=0, use_kv_cache=False))
    assert len(set(cached[:, 5:].flatten().tolist())) > 3


@pytest.mark.parametrize("variant, draw, n_tensors", [
    (dict(query_mode="res_gelu"), 0.4943394064903259, 24),
    (dict(query_mode="linear", bias=True, pos_encoding="rope", n_kv_head=2), 0.921918511390686, 32),
], ids=str)
def test_without_the_gate_the_model_and_its_init_draws_are_those_of_before_the_option(variant, draw, n_tensors):
    # attn_gate='none' makes no module and draws nothing: the generator's next draw after the init, and the number
    # of tensors, are those model.py gave before attn_gate existed (measured at commit 32e883d), so every committed
    # run reproduces; a gate module made but unused, or a draw for it, would move both
    torch.manual_seed(5)
    model = GPT(GPTConfig(**SMALL, **variant, attn_gate="none"))
    assert torch.rand(1).item() == draw
    assert len(model.state_dict()) == n_tensors and not any("gate" in n for n in model.state_dict())
    torch.manual_seed(5)
    gated = GPT(GPTConfig(**SMALL, **variant, attn_gate="headwise"))
    assert torch.rand(1).item() != draw and gated.transformer.h[0].attn.c_gate.weight.shape == (4, 32)


@pytest.mark.parametrize("kind", GATES)
def test_under_mup_the_gate_weight_is_a_hidden_matrix(kind):
    models = []
    for p in ("sp", "mup"):
        torch.manual_seed(0)
        models.append(GPT(GPTConfig(**SMALL, attn_gate=kind, bias=True, parametrization=p, mup_base_width=16)))
    sp, mup = models
    roles = mup.mup_roles
    assert roles["transformer.h.0.attn.c_gate.weight"] == "hidden"
    assert roles["transformer.h.0.attn.c_gate.bias"] == "vector"
    # N(0, 0.02) as every other Linear, times μP's 1/sqrt(m) at m = 32 / 16 = 2
    w_sp, w_mup = sp.transformer.h[0].attn.c_gate.weight, mup.transformer.h[0].attn.c_gate.weight
    torch.testing.assert_close(w_mup, w_sp * 2**-0.5)
    # AdamW puts it in the hidden group: rate η/m, weight decay wd·m; Muon (2-D matrices of the blocks) takes it
    hidden = configure_optimizers(mup, 0.1, 1e-3, (0.9, 0.95), "cpu").param_groups[0]
    assert any(p is w_mup for p in hidden["params"]) and (hidden["lr_mult"], hidden["weight_decay"]) == (0.5, 0.2)
    assert any(p is w_mup for p in muon_parameters(mup))
    big = GPT(GPTConfig(n_embd=768, n_head=12, n_layer=1, vocab_size=64, block_size=8, attn_gate=kind))
    assert abs(big.transformer.h[0].attn.c_gate.weight.std().item() - 0.02) < 0.002


def test_resuming_with_another_gate_is_refused():
    # a checkpoint from before the option has no attn_gate in its model_args: 'none'
    ckpt = {"model_args": asdict(GPTConfig(**SMALL)), "data": {}}
    del ckpt["model_args"]["attn_gate"]
    check_resumable(ckpt, "ckpt.pt", {"attn_gate": "none"}, {}, {})
    with pytest.raises(CheckpointError, match="ckpt.pt was trained with attn_gate='none' but the config asks for "
                                              "attn_gate='elementwise'; use the run's own config to resume it"):
        check_resumable(ckpt, "ckpt.pt", {"attn_gate": "elementwise"}, {}, {})


def test_config_files_and_the_command_line_set_the_gate_and_a_wrong_one_is_named():
    cfg = parse_config(TrainConfig, [os.path.join(REPO, "config/mini/res_gelu.py"), "--attn_gate=headwise"])[0]
    assert cfg.attn_gate == "headwise" and cfg.model_settings()["attn_gate"] == "headwise"
    with pytest.raises(ValueError, match="unknown attn_gate 'channel'; valid: none, headwise, elementwise"):
        GPTConfig(attn_gate="channel")


def test_a_study_arm_sets_the_gate_as_an_override_and_a_wrong_one_is_one_error(tmp_path):
    text = TOML.replace('name = "b"', 'name = "b"\noverrides = { attn_gate = "elementwise" }')
    spec = write_study(tmp_path, text)
    a, b = spec.arms
    configs = [protocol.arm_config(spec, arm, spec.horizons[0], {"learning_rate": 2e-3}) for arm in (a, b)]
    assert [c.attn_gate for c in configs] == ["none", "elementwise"]
    with pytest.raises(study.StudyError, match="unknown attn_gate 'channel'"):
        write_study(tmp_path, text.replace('"elementwise"', '"channel"'))


def test_hugging_faces_gpt2_has_no_gate():
    assert hf_incompatibility(GPTConfig()) is None
    assert hf_incompatibility(GPTConfig(attn_gate="headwise")) == (
        "attn_gate='headwise': GPT-2 has no output gate on its attention")


@pytest.mark.slow
def test_a_gated_run_records_its_gate_samples_with_the_cache_refuses_another_and_exports_with_why(shakespeare_dir,
                                                                                                  tmp_path):
    out = tmp_path / "run"
    train(shakespeare_dir, out, "--attn_gate=elementwise", "--max_iters=4", "--eval_interval=4")
    ckpt = torch.load(out / "ckpt.pt", weights_only=True)
    assert ckpt["model_args"]["attn_gate"] == "elementwise"
    assert ckpt["model"]["transformer.h.0.attn.c_gate.weight"].shape == (32, 32)
    proc = train(shakespeare_dir, out, "--attn_gate=headwise", "--init_from=resume", "--max_iters=6", check=False)
    assert proc.returncode != 0
    assert (f"{out}/ckpt.pt was trained with attn_gate='elementwise' but the config asks for attn_gate='headwise'; "
            f"use the run's own config to resume it") in proc.stderr
    assert load_model(str(out)).config.attn_gate == "elementwise"
    assert run_script("sample.py", f"--out_dir={out}", "--device=cpu", "--num_samples=1", "--max_new_tokens=8",
                      "--start=To be").returncode == 0
    proc = run_script("export.py", f"--out_dir={out}", f"--to={tmp_path / 'hf'}")
    assert proc.stdout.startswith("attn_gate='elementwise': GPT-2 has no output gate on its attention. Hugging Face")
    assert load_model(str(tmp_path / "hf")).config.attn_gate == "elementwise"
