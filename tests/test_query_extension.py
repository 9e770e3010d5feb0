"""A query mode added as README's "Adding a query module" says, a QueryModule subclass and one line in
QUERY_MODULES (registered here by monkeypatch, for each test alone), through every per-mode check of the suite:
build and parameter count, the fused and unfused projections, the KV cache, the diagnostics, torch.compile, the
kernels' fallback, and a run of train.py that saves, resumes and is sampled from (issue 84). The checks are the
suite's own test functions, called with the toy modes; the modules are imported whole, so pytest collects their
tests once, from their own files."""

import math

import pytest
import test_compile
import test_diagnostics
import test_kernels
import test_model
import test_modern
import torch
import torch.nn as nn

from helpers import losses_by_step, read_metrics, run_in_process, train_in_process
from model import GPT, QUERY_MODULES, GPTConfig, QueryModule, ResGELUQuery
from nonlinear_queries.weights.checkpoint_file import load_checkpoint_file


class LowRankQuery(QueryModule):
    """q = x W_a W_b, W_a (C, r), W_b (r, C), r = query_bottleneck (query_rank, or n_embd // 2): 2Cr parameters
    (+ r + C with `bias`), no anchor; it joins the fused input matmul with W_a's rows."""

    def __init__(self, config):
        super().__init__()
        self.w_a = nn.Linear(config.n_embd, config.query_bottleneck, bias=config.bias)
        self.w_b = nn.Linear(config.query_bottleneck, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.w_b(self.w_a(x))

    def fused_weight(self):
        return self.w_a.weight

    def from_fused(self, x, h):
        return self.w_b(h if self.w_a.bias is None else h + self.w_a.bias)


class RenamedResGELUQuery(ResGELUQuery):
    """res_gelu under a name of its own: it inherits res_gelu's math and its options (query_activation, query_norm)."""


TOY_MODES = {"low_rank": LowRankQuery, "res_gelu_renamed": RenamedResGELUQuery}
# each toy mode plain and with the options it takes (res_gelu's, for the subclass)
TOY_VARIANTS = [
    dict(query_mode="low_rank"),
    dict(query_mode="low_rank", query_rank=8, bias=True),
    dict(query_mode="res_gelu_renamed"),
    dict(query_mode="res_gelu_renamed", query_activation="relu2", query_norm=False),
]


@pytest.fixture
def toy_modes(monkeypatch):
    """TOY_MODES in QUERY_MODULES for one test: each, as the docs say, one registry line."""
    for name, module in TOY_MODES.items():
        monkeypatch.setitem(QUERY_MODULES, name, module)


@pytest.mark.parametrize("variant", TOY_VARIANTS, ids=str)
def test_a_toy_mode_builds_and_has_the_parameters_of_its_formula(toy_modes, variant):
    # the parameter table's count: the linear model's less W_Q (C^2, + C with bias) a layer, plus the toy's own
    L, C = 12, 768
    options = {k: v for k, v in variant.items() if k != "query_mode"}
    with torch.device("meta"):
        model = GPT(GPTConfig(**variant))
        linear = GPT(GPTConfig(bias=variant.get("bias", False)))
    bias = variant.get("bias", False)
    r = variant.get("query_rank") or C // 2
    own = {"low_rank": 2 * C * r + (r + C if bias else 0),
           "res_gelu_renamed": 2 * C * r + (2 * C if variant.get("query_norm", True) else 0)}[variant["query_mode"]]
    assert model.get_num_params() == linear.get_num_params() - L * (C * C + (C if bias else 0)) + L * own
    if variant["query_mode"] == "res_gelu_renamed":  # res_gelu's parameters, name for name, under the same options
        with torch.device("meta"):
            res_gelu = GPT(GPTConfig(query_mode="res_gelu", **options))
        assert {k: v.shape for k, v in model.state_dict().items()} == {
            k: v.shape for k, v in res_gelu.state_dict().items()}
    # under μP: with r = n_embd / 2 its matrices follow n_embd and are hidden, as W_Q is; a bottleneck fixed in
    # width (query_rank) has no rule, and the model refuses it, naming the first such matrix
    mup = GPTConfig(**test_model.SMALL, **variant, parametrization="mup", mup_base_width=16)
    if variant.get("query_rank"):
        with pytest.raises(ValueError, match=r"has no rule for transformer\.h\.0\.attn\.query\.w_a\.weight"):
            GPT(mup)
        return
    roles = {name.removeprefix("transformer.h.0.attn.query."): role for name, role in GPT(mup).mup_roles.items()
             if name.startswith("transformer.h.0.attn.query.")}
    assert roles == {"low_rank": {"w_a.weight": "hidden", "w_b.weight": "hidden"},
                     "res_gelu_renamed": {"w1.weight": "hidden", "w2.weight": "hidden", "rms.weight": "vector",
                                          "ln.weight": "vector"} if variant.get("query_norm", True) else
                     {"w1.weight": "hidden", "w2.weight": "hidden"}}[variant["query_mode"]]


@pytest.mark.parametrize("variant", TOY_VARIANTS, ids=str)
def test_a_toy_mode_passes_the_per_mode_checks_of_the_model(toy_modes, variant):
    test_model.test_fused_and_unfused_projections_agree_in_loss_and_gradients(variant)
    modern = {k: v for k, v in test_model.MODERN_VARIANTS[0].items() if k != "query_mode"}  # RMSNorm: no bias
    test_model.test_fused_and_unfused_projections_agree_in_loss_and_gradients(
        {**{k: v for k, v in variant.items() if k != "bias"}, **modern})
    test_model.test_greedy_generation_is_identical_with_and_without_kv_cache(variant)
    options = {k: v for k, v in variant.items() if k != "query_mode"}
    for extra in ({}, test_diagnostics.ROPE_GQA):
        test_diagnostics.check_diagnostics_of_a_query_mode(variant["query_mode"], **options, **extra)


@pytest.mark.parametrize("mode", TOY_MODES)
def test_a_toy_mode_passes_the_per_mode_checks_of_rope_compile_and_the_kernels(toy_modes, mode):
    test_modern.test_kv_cache_equals_uncached_with_rope_and_gqa(mode)
    torch._dynamo.reset()  # as test_compile.py's fresh_dynamo: no compiled code of another test's model
    try:
        with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
            test_compile.test_training_with_evaluations_compiles_one_graph_each("gpt2", mode)
    finally:
        torch._dynamo.reset()
    # the ops cover res_gelu and anchored_res_gelu themselves: a new mode, a res_gelu subclass too, runs its own
    # PyTorch path beside the kernels' cross-entropy, and computes what it computes without them
    for fused_qkv in (True, False):
        test_kernels.test_model_with_kernels_computes_what_the_model_without_does("pytorch", mode, "none", fused_qkv)


@pytest.mark.slow
@pytest.mark.parametrize("variant", [TOY_VARIANTS[1], TOY_VARIANTS[3]], ids=str)
def test_a_toy_mode_trains_saves_resumes_and_is_sampled_with_the_cache(toy_modes, variant, shakespeare_dir,
                                                                         tmp_path):
    args = [f"--{k}={v}" for k, v in variant.items()]
    common = [*args, "--max_iters=4", "--lr_decay_iters=4", "--eval_interval=2"]
    assert train_in_process(shakespeare_dir, tmp_path / "full", *common) == 0
    assert train_in_process(shakespeare_dir, tmp_path / "broken", *common[:-3], "--max_iters=2",
                            "--lr_decay_iters=4", "--eval_interval=2") == 0
    assert train_in_process(shakespeare_dir, tmp_path / "broken", *common, "--init_from=resume") == 0
    full, broken = losses_by_step(tmp_path / "full"), losses_by_step(tmp_path / "broken")
    assert sorted(broken) == [1, 2, 3, 4] and all(abs(full[s] - broken[s]) <= 1e-6 for s in full), (full, broken)
    ckpt = load_checkpoint_file(str(tmp_path / "broken" / "ckpt.pt"))
    assert {k: ckpt["model_args"][k] for k in variant} == variant and ckpt["step"] == 4
    # a diag record at each evaluation: query_cos where the module has an anchor (res_gelu's x), None where not
    diags = read_metrics(tmp_path / "full", "diag")
    assert [d["step"] for d in diags] == [0, 2, 4]
    anchored = variant["query_mode"] == "res_gelu_renamed"
    assert all((d["query_cos"] != [None, None]) == anchored for d in diags)
    assert all(math.isfinite(x) for d in diags for x in d["attn_entropy"])
    # sample.py from the run, with the KV cache and without: the same tokens
    sample = ["sample.py", f"--out_dir={tmp_path / 'full'}", "--device=cpu", "--num_samples=2",
              "--max_new_tokens=12", "--start=ROMEO.", "--seed=3", "--temperature=0"]
    cached, plain = run_in_process(*sample), run_in_process(*sample, "--kv_cache=False")
    assert cached[0] == plain[0] == 0, (cached, plain)
    assert f"query_mode={variant['query_mode']}" in cached[1] and cached[1].count("ROMEO.") == 2
    assert cached[1] == plain[1]
