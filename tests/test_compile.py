"""The compile contract (docs/gpu-path.md), checked on the CPU: what a GPU run compiles, how often
it recompiles, and the FLOPs behind its MFU.

Dynamo's tracing (graph breaks, guards, recompiles) is the same on every device, so these tests
trace with backends that run the captured graphs without generating code: 'eager' (dynamo
alone) or 'aot_eager' (dynamo and AOTAutograd, which also traces the backward pass). Inductor's
code generation is left to tests/test_cuda.py, on the GPU.
"""

import importlib
import os

import pytest
import torch
import torch._dynamo
import torch.distributed as dist
from torch._dynamo.testing import CompileCounterWithBackend
from torch.distributed.tensor import DTensor
from torch.utils.flop_counter import FlopCounterMode

from helpers import read_metrics, train_in_process
from model import GPT, QUERY_MODULES, GPTConfig
from nonlinear_queries.config.configurator import parse_config
from nonlinear_queries.config.train_config import COMPILE_MODES, TrainConfig, parse_compile_options
from nonlinear_queries.runtime.processes import compile_kwargs, parallelize, setup
from nonlinear_queries.trainer.optimizers import build_optimizers

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(n_layer=2, n_head=2, n_embd=32, block_size=16, vocab_size=64)
ONE_LAYER = {**TINY, "n_layer": 1}  # what dynamo traces once per block, at half the tracing time
BF16 = torch.autocast("cpu", dtype=torch.bfloat16)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Every test starts without compiled code and with a recompile limit that fails loudly."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield
    torch._dynamo.reset()


class Graphs:
    """A torch.compile backend that keeps every graph dynamo captures and runs it as traced."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, example_inputs):
        self.graphs.append(gm)
        return gm.forward

    def calls(self, name):
        """Calls of operators whose name contains `name` in all captured graphs, the bodies of
        higher-order operators (activation checkpointing's) included."""
        return sum(name in str(node.target) for gm in self.graphs for sub in gm.modules()
                   if isinstance(sub, torch.fx.GraphModule) for node in sub.graph.nodes
                   if node.op == "call_function")


@pytest.fixture
def process_group_of_one():
    """This process as a process group of one (gloo), as train.py runs FSDP without torchrun; under
    ddp it makes parallelize wrap the model in DistributedDataParallel, as under torchrun."""
    runtime = setup("cpu", "float32", parallelism="fsdp")
    yield runtime
    dist.destroy_process_group()


@pytest.mark.parametrize("parallelism, checkpointing, parametrization", [
    (p, c, "sp") for p in ("ddp", "fsdp") for c in (False, True)] + [(p, True, "mup") for p in ("ddp", "fsdp")],
    ids=lambda v: {False: "plain", True: "checkpointing"}.get(v, v))
def test_every_parallelism_compiles_its_blocks(process_group_of_one, parallelism, checkpointing, parametrization):
    # μP at m = 32 / 16 = 2: its 1/m on the logits is one more op in the root's graph, and nothing else changes
    config = GPTConfig(**TINY, query_mode="res_gelu", parametrization=parametrization, mup_base_width=16)
    x, y = torch.randint(0, 64, (2, 2, 16), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    reference = GPT(config)
    loss = reference(x, y)[1]
    loss.backward()
    torch.manual_seed(0)
    graphs = Graphs()
    model, train_model = parallelize(GPT(config), process_group_of_one, parallelism, compile=True,
                                     activation_checkpointing=checkpointing, backend=graphs)
    compiled_loss = train_model(x, y)[1]
    compiled_loss.backward()

    # ddp: the whole model is one graph with every block in it; fsdp: one graph that every block reuses
    blocks = TINY["n_layer"] if parallelism == "ddp" else 1
    assert graphs.calls("scaled_dot_product_attention") == blocks
    # the recomputation is inside the compiled graph, not around it
    assert graphs.calls("tag_activation_checkpoint") == (blocks if checkpointing else 0)
    # and so are the root's embeddings and the LM head with the cross-entropy; the final norm too under
    # ddp (under fsdp it runs eager, between the blocks' graphs and the head's)
    assert graphs.calls("embedding") == 1 + (config.pos_encoding == "learned")
    norms = sum(isinstance(m, torch.nn.LayerNorm) for m in reference.transformer.h[0].modules())  # 3: res_gelu's f
    assert graphs.calls("layer_norm") == norms * blocks + (parallelism == "ddp")
    assert graphs.calls("cross_entropy") == 1
    assert compiled_loss.item() == pytest.approx(loss.item(), rel=1e-6)
    for (name, p), q in zip(reference.named_parameters(), model.parameters()):
        grad = q.grad.full_tensor() if isinstance(q.grad, DTensor) else q.grad
        torch.testing.assert_close(grad, p.grad, rtol=1e-5, atol=1e-7, msg=name)


def modern_settings():
    """The GPTConfig settings of the modern recipe (config/modern/baseline.py) and its config."""
    cfg, _ = parse_config(TrainConfig, [os.path.join(REPO, "config", "modern", "baseline.py")])
    return {k: v for k, v in cfg.model_settings().items() if k not in (*TINY, "query_mode")}, cfg


@pytest.mark.parametrize("recipe, mode", [("gpt2", m) for m in sorted(QUERY_MODULES)]
                         + [("modern", "linear"), ("modern", "res_gelu")])
def test_training_with_evaluations_compiles_one_graph_each(recipe, mode):
    # fullgraph=True: a graph break is an error. bf16 autocast, dropout on, as in training.
    options, cfg = modern_settings() if recipe == "modern" else ({}, TrainConfig())
    torch.manual_seed(0)
    model = GPT(GPTConfig(**ONE_LAYER, **options, query_mode=mode, dropout=0.1))
    optimizers = build_optimizers(model, cfg, "cpu")
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, fullgraph=True, backend=counter)
    x, y = torch.randint(0, 64, (2, 2, 16), generator=torch.Generator().manual_seed(0))

    def train_steps():
        for _ in range(2):
            with BF16:
                loss = compiled(x, y, return_logits=False)[1]  # as training.train_step calls it
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

    def evaluate():
        model.eval()
        with torch.no_grad(), BF16:
            loss = compiled(x, y, return_logits=False)[1]  # as training.evaluate calls it
        model.train()
        return loss

    train_steps()
    assert counter.frame_count == 1
    compiled_eval = evaluate()
    train_steps()
    evaluate()
    train_steps()
    # the training graph, and the evaluation graph that eval mode's guards call for: nothing more
    assert counter.frame_count == 2
    model.eval()
    with torch.no_grad(), BF16:
        eager_eval = model(x, y)[1]
    assert torch.isfinite(compiled_eval) and abs(evaluate() - eager_eval) < 1e-2


def test_cached_generation_compiles_prefill_and_decode_once():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**ONE_LAYER, "block_size": 32}, query_mode="res_gelu")).eval()
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    want = model.generate(prompt, 8, temperature=0)
    counter = CompileCounterWithBackend("eager")
    # as bench/sample_speed.py compiles it: the prompt length and the cache length are symbolic
    model.forward = torch.compile(model.forward, fullgraph=True, dynamic=True, backend=counter)
    assert torch.equal(model.generate(prompt, 8, temperature=0), want)
    assert counter.frame_count == 2  # the prefill (an empty cache) and one decode graph for all 7 tokens
    model.generate(prompt[:, :3].contiguous(), 12, temperature=0)
    assert counter.frame_count == 2  # another prompt length and more tokens: the same two graphs


@pytest.mark.parametrize("mode", ["linear", "res_gelu"])
def test_flops_per_token_matches_the_counted_flops_at_gpt2_small(mode):
    # one forward and backward pass of one 1024-token sequence on the meta device (shapes only).
    # FlopCounterMode counts the attention's two matmuls over the full T x T square, as
    # flops_per_token does (PaLM's and nanoGPT's convention; docs/gpu-path.md).
    with torch.device("meta"):
        model = GPT(GPTConfig(query_mode=mode))
        x = torch.zeros(1, model.config.block_size, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        model(x, x)[1].backward()
    per_token = counter.get_total_flops() / model.config.block_size
    assert per_token == pytest.approx(model.flops_per_token(), rel=5e-3)


class ModeRecorder(Graphs):
    """A Graphs backend that also records the `mode` torch.compile passes to a backend other than inductor."""

    def __init__(self):
        super().__init__()
        self.modes = []

    def __call__(self, gm, example_inputs, mode="default"):
        self.modes.append(mode)
        return super().__call__(gm, example_inputs)


def test_compile_mode_is_checked_and_reaches_torch_compile(shakespeare_dir, tmp_path, monkeypatch):
    assert [TrainConfig(compile_mode=m).compile_mode for m in COMPILE_MODES] == list(COMPILE_MODES)
    with pytest.raises(ValueError, match="compile_mode must be one of default, reduce-overhead, "
                                         "max-autotune-no-cudagraphs, max-autotune, got 'fast'"):
        TrainConfig(compile_mode="fast")
    # a tiny run of train.py, compiled in max-autotune-no-cudagraphs by a backend that records the mode (inductor's
    # autotuning is for the GPU), reports its first step's time once, as the compile time
    recorder = ModeRecorder()
    script = importlib.import_module("train")
    monkeypatch.setattr(script, "parallelize", lambda *args, **kwargs: parallelize(*args, **kwargs, backend=recorder))
    out = tmp_path / "out"
    assert train_in_process(shakespeare_dir, out, "--compile=True", "--compile_mode=max-autotune-no-cudagraphs",
                            "--max_iters=4", "--log_interval=2", "--eval_interval=4") == 0
    assert recorder.graphs and set(recorder.modes) == {"max-autotune-no-cudagraphs"}
    (record,) = read_metrics(out, "compile")
    assert record["step"] == 2 and record["compile_mode"] == "max-autotune-no-cudagraphs"
    assert record["first_step_s"] > 0 and record["later_step_s"] > 0
    assert [r["step"] for r in read_metrics(out, "train")] == [2, 4]


def test_compile_pointwise_cat_reaches_inductor_as_its_cat_options_in_every_mode(shakespeare_dir, tmp_path,
                                                                                  monkeypatch):
    from torch._inductor import list_mode_options

    copies = {"max_pointwise_cat_inputs": 0, "max_complex_pointwise_cat_inputs": 0}
    assert compile_kwargs() == {"mode": "default"} == compile_kwargs("default", "aot_eager", pointwise_cat=False)
    for mode in COMPILE_MODES:  # torch.compile takes a mode or options: the mode's own options come along
        kwargs = compile_kwargs(mode, pointwise_cat=False)
        assert kwargs == {"options": {**list_mode_options(mode), **copies}}
        torch.compile(torch.nn.Linear(2, 2), **kwargs)  # checks every option's name against inductor's config
    # train.py hands the key to torch.compile (recorded here, then compiled by dynamo alone)
    calls, compile_ = [], torch.compile
    monkeypatch.setattr(torch, "compile",
                        lambda model, **kwargs: calls.append(kwargs) or compile_(model, backend="eager"))
    assert train_in_process(shakespeare_dir, tmp_path / "out", "--compile=True", "--compile_pointwise_cat=False",
                            "--max_iters=2", "--log_interval=1", "--eval_interval=2") == 0
    assert calls == [{"backend": "inductor", "options": copies}]


def test_compile_options_are_parsed_and_reach_torch_compile_under_ddp(shakespeare_dir, tmp_path, monkeypatch):
    from torch._inductor import list_mode_options

    assert parse_compile_options("") == {}
    assert parse_compile_options(" online_softmax=False, max_autotune_gemm_backends=ATEN,x=2") == {
        "online_softmax": False, "max_autotune_gemm_backends": "ATEN", "x": 2}
    with pytest.raises(ValueError, match="compile_options takes NAME=VALUE pairs separated by commas"):
        TrainConfig(compile_options="online_softmax")
    # train.py hands the key to torch.compile with the mode's options (recorded, then compiled by dynamo alone)
    calls, compile_ = [], torch.compile
    monkeypatch.setattr(torch, "compile",
                        lambda model, **kwargs: calls.append(kwargs) or compile_(model, backend="eager"))
    assert train_in_process(shakespeare_dir, tmp_path / "out", "--compile=True",
                            "--compile_options=online_softmax=False", "--compile_mode=max-autotune-no-cudagraphs",
                            "--max_iters=2", "--log_interval=1", "--eval_interval=2") == 0
    assert calls == [{"backend": "inductor",
                      "options": {**list_mode_options("max-autotune-no-cudagraphs"), "online_softmax": False}}]


def test_compile_options_reach_every_compiled_unit_under_fsdp(process_group_of_one, monkeypatch):
    from torch._inductor import list_mode_options

    calls, compile_ = [], torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile",
                        lambda self, **kwargs: calls.append(kwargs) or compile_(self, backend="eager"))
    parallelize(GPT(GPTConfig(**TINY)), process_group_of_one, "fsdp", compile=True, mode="max-autotune-no-cudagraphs",
                options={"online_softmax": False})
    want = {"backend": "inductor",
            "options": {**list_mode_options("max-autotune-no-cudagraphs"), "online_softmax": False}}
    assert calls == [want] * (TINY["n_layer"] + 1)  # each block, then the root


def logits_fills(step, logits_shape):
    """The zero fills (aten::zero_, aten::fill_) of a tensor of `logits_shape` that one call of step() makes."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    return [e.name for e in prof.events() if e.name in ("aten::zero_", "aten::fill_")
            and e.input_shapes and list(e.input_shapes[0]) == list(logits_shape)]


@pytest.mark.parametrize("mode", ["linear", "res_gelu"])
def test_a_compiled_training_step_fills_no_tangent_for_the_logits_and_computes_the_same(mode):
    # A compiled forward whose logits output requires grad gets a tangent for it in the backward graph, which
    # autograd fills with zeros of the logits' size and the backward adds (issue 44: bf16 B x T x vocab,
    # 9.9 GB at 96 x 1024 tokens, in every micro-batch); train_step asks the model for the loss alone. Same
    # loss and gradients, bit for bit, in float32 (adding zeros is exact).
    from nonlinear_queries.trainer.training import train_step

    x, y = torch.randint(0, 64, (2, 2, 16), generator=torch.Generator().manual_seed(0))
    results = {}
    for name in ("logits returned", "train_step"):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = GPT(GPTConfig(**ONE_LAYER, query_mode=mode))
        compiled = torch.compile(model, backend="aot_eager")
        if name == "logits returned":  # the step before issue 44: model(x, y) returns the logits too

            def step():
                compiled(x, y)[1].backward()
        else:

            def step():
                train_step(compiled, list(model.parameters()), [], torch.amp.GradScaler("cpu", enabled=False),
                           lambda k: (x, y), 1, torch.autocast("cpu", enabled=False), [0])

        step()  # compiles
        model.zero_grad(set_to_none=True)
        fills = logits_fills(step, (2, 16, 64))
        results[name] = fills, compiled(x, y)[1].detach(), [p.grad.clone() for p in model.parameters()]
    assert results["logits returned"][0] and not results["train_step"][0]
    assert torch.equal(results["logits returned"][1], results["train_step"][1])
    assert all(torch.equal(a, b) for a, b in zip(results["logits returned"][2], results["train_step"][2]))


def test_the_loss_alone_needs_targets():
    model = GPT(GPTConfig(**ONE_LAYER))
    with pytest.raises(ValueError, match="return_logits=False returns the loss alone, which needs targets"):
        model(torch.zeros(1, 4, dtype=torch.long), return_logits=False)
    logits, loss = model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long), return_logits=False)
    assert logits is None and loss.dim() == 0
