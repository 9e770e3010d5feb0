"""Tests of model.py: exact parameter counts, the query modules' math, init, generate."""

import math

import pytest
import torch
import torch.nn.functional as F

from helpers import randomize, reference_attention
from model import (
    GPT,
    QUERY_MODULES,
    QUERY_OPTIONS,
    GPTConfig,
    QueryModule,
    ResGELUQuery,
    model_config_keys,
    query_modes_phrase,
)
from nonlinear_queries.trainer.optimizers import configure_optimizers

SMALL = dict(block_size=16, vocab_size=97, n_layer=2, n_head=4, n_embd=32)
# the ablations of issue 5 (the paper's open questions) beside the plain query modes
ABLATIONS = [
    dict(query_mode="res_gelu", query_activation="relu"),
    dict(query_mode="res_gelu", query_activation="relu2"),
    dict(query_mode="res_gelu", query_norm=False),
    dict(query_mode="res_linear", query_norm=False),
    dict(query_mode="linear", qk_norm=True),
    dict(query_mode="res_gelu", qk_norm=True),
]
# the options of issue 12: GPT-2's biases and activation, an untied LM head
OPTIONS = [
    dict(query_mode="linear", bias=True, tie_weights=False, mlp_activation="gelu_tanh"),
    dict(query_mode="residual", bias=True),
    dict(query_mode="res_gelu", bias=True),
    dict(query_mode="anchored_res_gelu", bias=True),
]
VARIANTS = [dict(query_mode=m) for m in sorted(QUERY_MODULES)] + ABLATIONS + OPTIONS
# every query mode under the modern recipe (RoPE, GQA, RMSNorm, QK-norm, SwiGLU; issue 13)
MODERN_VARIANTS = [dict(query_mode=m, pos_encoding="rope", n_kv_head=2, norm="rmsnorm", qk_norm=True,
                        mlp_activation="swiglu") for m in sorted(QUERY_MODULES)]


def case_id(value):
    """A parametrized case's id: the variant's dict and numbers as written, a function by its name (pytest's own
    id): a function's repr holds an address that differs between pytest-xdist's workers, which must agree on ids."""
    return None if callable(value) else str(value)


# non-embedding parameters at d = 768, L = 12 (all parameters minus wte and wpe)
@pytest.mark.parametrize(
    "query_mode, mlp_ratio, expected",
    [
        ("linear", 4.0, 84_953_856),
        ("res_gelu", 4.0, 84_972_288),
        ("identity", 4.0, 77_875_968),
        ("linear", 4.75, 95_570_688),
    ],
)
def test_non_embedding_param_counts_match_spec(query_mode, mlp_ratio, expected):
    with torch.device("meta"):  # shapes only: no 124M-parameter init on the CPU
        model = GPT(GPTConfig(query_mode=query_mode, mlp_ratio=mlp_ratio))
    assert model.get_num_params(non_embedding=True) == expected
    embeddings = 50304 * 768 + 1024 * 768  # wte (tied to lm_head, counted once) + wpe
    assert model.get_num_params(non_embedding=False) == expected + embeddings


def test_res_gelu_query_parameters_are_2dr_plus_2d():
    cfg = GPTConfig(**SMALL, query_mode="res_gelu")
    q = QUERY_MODULES["res_gelu"](cfg)
    assert sum(p.numel() for p in q.parameters()) == 2 * 32 * 16 + 2 * 32
    cfg = GPTConfig(**SMALL, query_mode="res_gelu", query_rank=8)
    assert QUERY_MODULES["res_gelu"](cfg).w1.weight.shape == (8, 32)


def gelu(h):
    """GELU written out: h Phi(h), Phi the standard normal CDF."""
    return 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))


def reference_f(qm, x, act, norm):
    """f(x) of eq. 3 written out, with `act` for GELU and the two norms optional."""
    h = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * qm.rms.weight if norm else x
    z = act(h @ qm.w1.weight.T) @ qm.w2.weight.T
    if norm:
        z = (z - z.mean(-1, keepdim=True)) / torch.sqrt(z.var(-1, unbiased=False, keepdim=True) + 1e-5) * qm.ln.weight
    return z


def test_res_gelu_equals_direct_transcription_of_eq_2_3():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL, query_mode="res_gelu"))
    randomize(model)
    attn = model.transformer.h[0].attn
    x = torch.randn(3, 16, 32)
    q = (x + reference_f(attn.query, x, gelu, norm=True)) / 2  # eq. 2, with f(x) of eq. 3
    y = reference_attention(attn, x, q, 1 / math.sqrt(8))  # the paper's plain scale 1/sqrt(d_head)
    torch.testing.assert_close(attn(x), y, rtol=1e-5, atol=1e-5)
    # the model computes x + f(x) and folds the 1/2 into the scale (the official code's form)
    assert attn.scale == pytest.approx(1 / (2 * math.sqrt(8)))


# ---------------------------------------------------------------------------------------
# ablations (issue 5): each one's parameter count and forward pass, against hand-written math


@pytest.mark.parametrize(
    "variant, expected",
    [
        (dict(query_mode="res_linear"), 84_972_288),  # res_gelu's parameters exactly
        (dict(query_mode="res_gelu", query_activation="relu"), 84_972_288),
        (dict(query_mode="res_gelu", query_activation="relu2"), 84_972_288),
        (dict(query_mode="res_gelu", query_norm=False), 84_972_288 - 12 * 2 * 768),  # no g, no LN weight
        (dict(query_mode="res_linear", query_norm=False), 84_972_288 - 12 * 2 * 768),
        (dict(query_mode="linear", qk_norm=True), 84_953_856 + 12 * 2 * 64),  # a (head_dim,) weight for q and k
        (dict(query_mode="res_gelu", qk_norm=True), 84_972_288 + 12 * 2 * 64),
    ],
    ids=str,
)
def test_ablation_param_counts(variant, expected):
    with torch.device("meta"):
        model = GPT(GPTConfig(**variant))
    assert model.get_num_params() == expected


@pytest.mark.parametrize(
    "variant, act",
    [
        (dict(query_mode="res_gelu", query_activation="relu"), lambda h: torch.clamp(h, min=0)),
        (dict(query_mode="res_gelu", query_activation="relu2"), lambda h: torch.clamp(h, min=0) ** 2),
        (dict(query_mode="res_gelu", query_norm=False), gelu),
        (dict(query_mode="res_linear"), lambda h: h),
        (dict(query_mode="res_linear", query_norm=False), lambda h: h),
    ],
    ids=case_id,
)
def test_ablation_queries_equal_direct_transcription(variant, act):
    cfg = GPTConfig(**SMALL, **variant)
    qm = QUERY_MODULES[cfg.query_mode](cfg)
    randomize(qm, seed=3)
    x = torch.randn(2, 7, 32)
    torch.testing.assert_close(qm(x), x + reference_f(qm, x, act, cfg.query_norm), rtol=1e-5, atol=1e-5)
    assert qm.scale_mult == 0.5  # Q = (x + f(x)) / 2 for every variant of the bottleneck
    if not cfg.query_norm:
        assert not any(isinstance(m, (torch.nn.RMSNorm, torch.nn.LayerNorm)) for m in qm.modules())


@pytest.mark.parametrize("query_mode", ["linear", "res_gelu"])
def test_qk_norm_attention_equals_direct_transcription(query_mode):
    torch.manual_seed(4)
    model = GPT(GPTConfig(**SMALL, query_mode=query_mode, qk_norm=True))
    randomize(model, seed=4)
    attn = model.transformer.h[0].attn
    x = torch.randn(2, 16, 32)
    # the norm cancels res_gelu's 1/2, so every mode uses the plain 1/sqrt(head_dim)
    y = reference_attention(attn, x, attn.query(x), 1 / math.sqrt(8), qk_norm=True)
    torch.testing.assert_close(attn(x), y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "variant, message",
    [
        (dict(query_activation="swish"), "unknown query_activation 'swish'"),
        (dict(query_mode="linear", query_activation="relu"), "applies to query_mode[= ]'res_gelu'.* only, not 'linear"),
        (dict(query_mode="res_linear", query_activation="relu2"), "applies to query_mode[= ]'res_gelu'.* only"),
        (dict(query_mode="identity", query_norm=False), "query_norm=False applies to"),
    ],
    ids=str,
)
def test_ablation_options_reject_modes_they_do_not_apply_to(variant, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**variant)


def test_ablation_options_error_names_the_option_the_mode_and_the_modes_that_take_it():
    assert query_modes_phrase(["res_gelu"]) == "query_mode='res_gelu'"
    assert query_modes_phrase(["res_gelu", "res_linear"]) == "query_mode 'res_gelu' or 'res_linear'"
    assert query_modes_phrase(["a", "b", "c"]) == "query_mode 'a', 'b' or 'c'"
    # the modes that declare each option, model.py's first, in the registry's order (a mode added later joins them)
    takers = {o: [m for m, module in QUERY_MODULES.items() if o in module.options] for o in QUERY_OPTIONS}
    assert takers["query_activation"][:1] == ["res_gelu"] and takers["query_norm"][:2] == ["res_gelu", "res_linear"]
    assert not {"linear", "identity", "residual", "anchored_res_gelu"} & {m for t in takers.values() for m in t}
    with pytest.raises(ValueError) as e:
        GPTConfig(query_mode="linear", query_activation="relu")
    assert str(e.value) == (f"query_activation='relu' applies to {query_modes_phrase(takers['query_activation'])} "
                            f"only, not 'linear'")
    with pytest.raises(ValueError) as e:
        GPTConfig(query_mode="anchored_res_gelu", query_norm=False)
    assert str(e.value) == (f"query_norm=False applies to {query_modes_phrase(takers['query_norm'])} only, not "
                            f"'anchored_res_gelu'")
    # every declared option is one GPTConfig checks, and every option it checks is some module's
    assert set(QUERY_OPTIONS) <= set(model_config_keys())
    assert {o for module in QUERY_MODULES.values() for o in module.options} == set(QUERY_OPTIONS)


def test_a_res_gelu_subclass_registered_under_a_new_name_takes_res_gelus_options(monkeypatch):
    class Renamed(ResGELUQuery):  # the documented way: a class and one registry line
        pass

    monkeypatch.setitem(QUERY_MODULES, "res_gelu_renamed", Renamed)
    options = dict(query_activation="relu2", query_norm=False)
    models = {}
    for mode in ("res_gelu_renamed", "res_gelu"):
        torch.manual_seed(0)
        models[mode] = GPT(GPTConfig(**SMALL, query_mode=mode, **options))
    renamed, res_gelu = models.values()
    assert renamed.transformer.h[0].attn.query.act is res_gelu.transformer.h[0].attn.query.act
    assert renamed.state_dict().keys() == res_gelu.state_dict().keys()
    idx = torch.randint(0, 97, (2, 16))
    torch.testing.assert_close(renamed(idx, idx)[0], res_gelu(idx, idx)[0], rtol=0, atol=0)
    # the modes an option applies to are read from the declarations, the new one among them, last
    with pytest.raises(ValueError) as e:
        GPTConfig(query_mode="identity", query_norm=False)
    assert str(e.value).startswith("query_norm=False applies to query_mode 'res_gelu', 'res_linear'")
    assert str(e.value).endswith(" or 'res_gelu_renamed' only, not 'identity'")


def test_identity_equals_linear_with_identity_weight():
    torch.manual_seed(2)
    ident = GPT(GPTConfig(**SMALL, query_mode="identity"))
    linear = GPT(GPTConfig(**SMALL, query_mode="linear"))
    missing, unexpected = linear.load_state_dict(ident.state_dict(), strict=False)
    assert unexpected == [] and all(k.endswith("attn.query.w_q.weight") for k in missing) and len(missing) == 2
    with torch.no_grad():
        for block in linear.transformer.h:
            block.attn.query.w_q.weight.copy_(torch.eye(32) / 2)  # identity's Q = x / 2
    idx = torch.randint(0, 97, (2, 16))
    torch.testing.assert_close(linear(idx, idx)[0], ident(idx, idx)[0], rtol=0, atol=1e-6)


def test_residual_query_is_x_plus_linear():
    cfg = GPTConfig(**SMALL, query_mode="residual")
    q = QUERY_MODULES["residual"](cfg)
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(q(x), x + x @ q.w_q.weight.T)


def test_init_stds_follow_spec():
    torch.manual_seed(3)
    cfg = GPTConfig(block_size=64, vocab_size=512, n_layer=6, n_head=4, n_embd=256, query_mode="res_gelu")
    model = GPT(cfg)
    block = model.transformer.h[0]
    residual_std = 0.02 / math.sqrt(2 * 6)
    for w, std in [
        (block.attn.c_kv.weight, 0.02),
        (block.mlp.c_fc.weight, 0.02),
        (block.attn.query.w1.weight, 0.02),  # the bottleneck gets no residual down-scaling
        (block.attn.query.w2.weight, 0.02),
        (block.attn.c_proj.weight, residual_std),
        (block.mlp.c_proj.weight, residual_std),
        (model.transformer.wte.weight, 0.02),
    ]:
        assert w.std().item() == pytest.approx(std, rel=0.05)
    assert torch.equal(block.attn.query.rms.weight, torch.ones(256))
    assert model.lm_head.weight is model.transformer.wte.weight


def test_mlp_ratio_sets_hidden_width():
    assert GPTConfig(n_embd=768, mlp_ratio=4.75).mlp_hidden == 3648
    model = GPT(GPTConfig(**SMALL, mlp_ratio=4.75))
    assert model.transformer.h[0].mlp.c_fc.weight.shape == (152, 32)


def test_unknown_query_mode_lists_valid_ones():
    with pytest.raises(ValueError) as e:
        GPTConfig(query_mode="nonlinear")
    # the registry's modes in order, model.py's six among them (and any a user adds)
    assert str(e.value) == f"unknown query_mode 'nonlinear'; valid query modes: {', '.join(sorted(QUERY_MODULES))}"
    assert {"anchored_res_gelu", "identity", "linear", "res_gelu", "res_linear", "residual"} <= set(QUERY_MODULES)


def test_weight_decay_only_on_matrices():
    model = GPT(GPTConfig(**SMALL, query_mode="res_gelu"))
    opt = configure_optimizers(model, 0.1, 1e-3, (0.9, 0.95), "cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    # per layer: ln_1, ln_2, RMSNorm and LayerNorm of f; plus ln_f
    assert len(no_decay["params"]) == 2 * 4 + 1
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == model.get_num_params(False)


def test_loss_is_cross_entropy_of_logits():
    torch.manual_seed(4)
    model = GPT(GPTConfig(**SMALL, query_mode="res_gelu"))
    idx, targets = torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16))
    logits, loss = model(idx, targets)
    assert logits.shape == (2, 16, 97)
    torch.testing.assert_close(loss, F.cross_entropy(logits.reshape(-1, 97), targets.reshape(-1)))
    last, none = model(idx)
    assert none is None
    torch.testing.assert_close(last[:, 0], logits[:, -1])
    with pytest.raises(ValueError, match="exceeds block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_targets_may_be_a_slice_of_a_longer_sequence():
    # x, y = seq[:, :-1], seq[:, 1:]: y is not contiguous (found on an H100 by test_cuda's memory test)
    torch.manual_seed(4)
    model = GPT(GPTConfig(**SMALL, query_mode="res_gelu"))
    seq = torch.randint(0, 97, (2, 17))
    x, y = seq[:, :-1], seq[:, 1:]
    assert not y.is_contiguous()
    assert torch.equal(model(x, y)[1], model(x, y.contiguous())[1])


def test_generate_top_k_1_is_greedy():
    torch.manual_seed(5)
    model = GPT(GPTConfig(**SMALL, query_mode="res_gelu")).eval()
    prompt = torch.randint(0, 97, (2, 4))
    out = model.generate(prompt, 20, temperature=0.7, top_k=1)
    assert out.shape == (2, 24) and torch.equal(out[:, :4], prompt)
    greedy = prompt
    with torch.no_grad():
        for _ in range(20):
            logits, _ = model(greedy[:, -16:])
            greedy = torch.cat([greedy, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, greedy)
    assert torch.equal(model.generate(prompt, 20, temperature=0), greedy)


# ---------------------------------------------------------------------------------------
# fused input projection (docs/design.md) and the KV cache, each held against the plain computation


@pytest.mark.parametrize("variant", VARIANTS + MODERN_VARIANTS, ids=str)
def test_fused_and_unfused_projections_agree_in_loss_and_gradients(variant):
    torch.manual_seed(6)
    fused = GPT(GPTConfig(**SMALL, **variant))
    randomize(fused, seed=6)
    plain = GPT(GPTConfig(**SMALL, **variant, fused_qkv=False))
    plain.load_state_dict(fused.state_dict())  # strict: the same parameters either way
    idx, targets = torch.randint(0, 97, (3, 16)), torch.randint(0, 97, (3, 16))
    losses = []
    for model in (fused, plain):
        logits, loss = model(idx, targets)
        loss.backward()
        losses.append((logits, loss))
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-5, atol=1e-5)
    grads = [{name: p.grad for name, p in model.named_parameters()} for model in (fused, plain)]
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)  # names the parameter on failure


class LinearShapes(torch.overrides.TorchFunctionMode):
    """Records the weight shape of every F.linear call."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear:
            self.shapes.append(tuple(args[1].shape))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("query_mode, width", [("linear", 96), ("residual", 96), ("res_gelu", 80), ("identity", 64),
                                              ("anchored_res_gelu", 112)])
def test_default_path_runs_one_input_matmul_per_layer(query_mode, width):
    # d = 32: linear d -> 3d, res_gelu d -> 2.5d (r = d/2), identity d -> 2d, anchored d -> 3.5d; nothing else reads x
    model = GPT(GPTConfig(**SMALL, query_mode=query_mode))
    with LinearShapes() as rec:
        model(torch.randint(0, 97, (1, 8)))
    w2 = [(32, 16)] if query_mode in ("res_gelu", "anchored_res_gelu") else []
    layer = [(width, 32), *w2, (32, 32), (128, 32), (32, 128)]  # input, [W2], c_proj, c_fc, mlp c_proj
    assert rec.shapes == layer * 2 + [(97, 32)]


def test_kv_cache_logits_equal_full_forward_for_any_chunking():
    torch.manual_seed(7)
    model = GPT(GPTConfig(**SMALL, query_mode="res_gelu")).eval()
    randomize(model, seed=7)
    idx = torch.randint(0, 97, (2, 16))
    full = model.lm_head(model.transformer.ln_f(hidden_states(model, idx)))
    cache, start = model.new_kv_cache(), 0
    for stop in (5, 6, 9, 16):  # a prompt, one token, then chunks that need the offset mask
        logits, _ = model(idx[:, start:stop], kv_cache=cache)
        torch.testing.assert_close(logits[:, 0], full[:, stop - 1], rtol=1e-5, atol=1e-5)
        start = stop
    assert cache[0].length == 16
    with pytest.raises(ValueError, match="exceeds block_size"):
        model(idx[:, :1], kv_cache=cache)


def hidden_states(model, idx):
    """Output of the last block for every position, without the cache. (B, T, C)."""
    x = model.transformer.wte(idx) + model.transformer.wpe(torch.arange(idx.size(1)))
    for block in model.transformer.h:
        x = block(x)
    return x


@pytest.mark.parametrize("variant", VARIANTS, ids=str)
def test_greedy_generation_is_identical_with_and_without_kv_cache(variant):
    torch.manual_seed(8)
    model = GPT(GPTConfig(**SMALL, **variant)).double().eval()
    randomize(model, seed=8)
    prompt = torch.randint(0, 97, (3, 5))
    # 5 + 20 tokens outgrow block_size 16: the cached run must switch to the cropped window
    cached = model.generate(prompt, 20, temperature=0)
    plain = model.generate(prompt, 20, temperature=0, use_kv_cache=False)
    assert cached.shape == (3, 25) and torch.equal(cached, plain)
    assert len(set(cached[:, 5:].flatten().tolist())) > 3  # not a degenerate repetition


# ---------------------------------------------------------------------------------------
# issue 12: attn_scale, tie_weights, bias, mlp_activation, the official 1/2 of identity and
# residual, and the anchored query


@pytest.mark.parametrize(
    "variant, expected",
    [
        (dict(attn_scale=0.1), 84_953_856),  # a scale, no parameters
        (dict(tie_weights=False), 84_953_856),  # the untied LM head is left out like wte
        (dict(mlp_activation="gelu_tanh"), 84_953_856),
        # GPT-2 small's 124,439,808 parameters less its embeddings 50257 x 768 + 1024 x 768
        (dict(bias=True), 85_056_000),
        # res_gelu's biases: per layer those of the linear model less W_Q's d, plus W1's r = d/2, W2's d, LN's d
        (dict(query_mode="res_gelu", bias=True), 84_972_288 + 12 * (11 - 1 + 0.5 + 1 + 1) * 768 + 768),
        (dict(query_mode="anchored_res_gelu"), 84_953_856 + 12 * (2 * 768 * 384 + 2 * 768)),  # linear + res_gelu's f
    ],
    ids=str,
)
def test_option_param_counts(variant, expected):
    with torch.device("meta"):
        model = GPT(GPTConfig(**variant))
    assert model.get_num_params() == expected
    lm_head = 0 if model.config.tie_weights else 50304 * 768
    assert model.get_num_params(non_embedding=False) == expected + 50304 * 768 + 1024 * 768 + lm_head


def test_untied_lm_head_has_its_own_weight_and_the_same_flops():
    with torch.device("meta"):
        tied, untied = GPT(GPTConfig()), GPT(GPTConfig(tie_weights=False))
    assert untied.lm_head.weight is not untied.transformer.wte.weight
    # the untied embedding is a lookup: the LM head's matmul costs the same either way
    assert untied.flops_per_token() == tied.flops_per_token()


def test_biases_start_at_zero_and_anchored_f_at_zero():
    torch.manual_seed(9)
    model = GPT(GPTConfig(**SMALL, query_mode="anchored_res_gelu", bias=True, tie_weights=False))
    biases = [p for n, p in model.named_parameters() if n.endswith(".bias")]
    assert len(biases) == 2 * 10 + 1 and all(torch.count_nonzero(b) == 0 for b in biases)  # 10 per layer, ln_f
    assert torch.count_nonzero(model.transformer.h[0].attn.query.ln.weight) == 0
    assert model.lm_head.weight.std().item() == pytest.approx(0.02, rel=0.1)
    x = torch.randn(2, 5, 32)
    attn = model.transformer.h[0].attn
    torch.testing.assert_close(attn.query.f(x), torch.zeros(2, 5, 32))


@pytest.mark.parametrize(
    "variant, query, scale",
    [
        # the official identity and residual: Q = x / 2 and Q = (x + x W_Q) / 2 with the standard scale
        (dict(query_mode="identity"), lambda qm, x: x / 2, 1 / math.sqrt(8)),
        (dict(query_mode="residual"), lambda qm, x: (x + x @ qm.w_q.weight.T) / 2, 1 / math.sqrt(8)),
        (dict(query_mode="residual", bias=True), lambda qm, x: (x + qm.w_q(x)) / 2, 1 / math.sqrt(8)),
        # attn_scale overrides the query module's own scale
        (dict(query_mode="linear", attn_scale=0.3), lambda qm, x: x @ qm.w_q.weight.T, 0.3),
        # the anchored query as its docstring writes it: (x W_Q + f(x)) / 2 with the scale 2 / sqrt(head_dim)
        (dict(query_mode="anchored_res_gelu"), lambda qm, x: (x @ qm.w_q.weight.T + reference_f(qm, x, gelu, True)) / 2,
         2 / math.sqrt(8)),
    ],
    ids=case_id,
)
def test_query_modes_equal_direct_transcription_with_their_scale(variant, query, scale):
    torch.manual_seed(10)
    model = GPT(GPTConfig(**SMALL, **variant))
    randomize(model, seed=10)
    attn = model.transformer.h[1].attn
    x = torch.randn(2, 16, 32)
    torch.testing.assert_close(attn(x), reference_attention(attn, x, query(attn.query, x), scale), rtol=1e-5, atol=1e-5)


def test_mlp_activation_gelu_tanh_is_gpt2_gelu_new():
    model = GPT(GPTConfig(**SMALL, mlp_activation="gelu_tanh"))
    mlp = model.transformer.h[0].mlp
    x = torch.randn(3, 32)
    h = mlp.c_fc(x)
    gelu_new = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))
    torch.testing.assert_close(mlp(x), mlp.c_proj(gelu_new), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="unknown mlp_activation 'geglu'; valid: gelu, gelu_tanh, relu2, swiglu"):
        GPTConfig(mlp_activation="geglu")


def test_a_query_module_with_forward_alone_trains_with_fused_qkv_on(monkeypatch):
    # the fused projection's hooks are optional: a new module writes forward (and scale_mult) and nothing else
    class TanhQuery(QueryModule):
        scale_mult = 0.5

        def __init__(self, config):
            super().__init__()
            self.w = torch.nn.Linear(config.n_embd, config.n_embd, bias=False)

        def forward(self, x):
            return x + torch.tanh(self.w(x))

    monkeypatch.setitem(QUERY_MODULES, "tanh", TanhQuery)
    logits = {}
    for fused in (True, False):
        torch.manual_seed(0)
        model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=64, query_mode="tanh",
                              fused_qkv=fused))
        x = torch.randint(0, 64, (2, 8))
        logits[fused], loss = model(x, x)
        loss.backward()
        assert model.transformer.h[0].attn.query.w.weight.grad.abs().sum() > 0
    assert torch.equal(logits[True], logits[False])
