"""The bench scripts run end to end (tiny sizes) and their tables hold what they claim.

Speed itself is never asserted here: targets are measured by the scripts, side by side
in one run, and recorded in bench/RESULTS.md.
"""

import os
import re
import statistics

import op_bytes
import pytest
import torch
import torch._dynamo.testing
import train_speed

from common import fresh_compiler
from helpers import REPO, markdown_rows, markdown_table, run_script
from model import GPT, GPTConfig
from nonlinear_queries.trainer.optimizers import Muon

TINY_MODEL = ["--device=cpu", "--n_layer=1", "--n_head=2", "--n_embd=32", "--vocab_size=512"]


@pytest.mark.slow
def test_train_speed_table_has_every_variant_against_linear():
    out = run_script("bench/train_speed.py", *TINY_MODEL, "--block_size=16", "--batch_size=2", "--rounds=2",
                     "--warmup=1", "--unfused", "--mup").stdout
    rows = markdown_table(out, "variant")
    assert list(rows) == ["linear", "identity", "res_gelu", "residual", "mlp475", "linear unfused", "res_gelu unfused",
                          "linear mup", "res_gelu mup"]
    params = {name: int(row["non-emb params"].replace(",", "")) for name, row in rows.items()}
    assert params["linear"] - params["identity"] == 32 * 32  # the one layer's W_Q
    assert params["res_gelu unfused"] == params["res_gelu"] and params["linear unfused"] == params["linear"]
    assert params["res_gelu mup"] == params["res_gelu"] and params["linear mup"] == params["linear"]
    assert rows["linear"]["vs linear"] == "1.000" and all(row["MFU"] == "-" for row in rows.values())  # CPU
    assert "command: python bench/train_speed.py --device=cpu" in out


@pytest.mark.slow
def test_train_speed_times_splits_of_one_global_batch_and_profiles_each_row():
    out = run_script("bench/train_speed.py", *TINY_MODEL, "--block_size=16", "--rounds=1", "--warmup=1",
                     "--modes=linear,res_gelu", "--no_mlp475", "--splits=2x2,4x1", "--plain", "--profile").stdout
    rows = markdown_table(out, "variant")
    assert list(rows) == ["linear 2x2", "linear 4x1", "res_gelu 2x2", "res_gelu 4x1", "linear plain 2x2",
                          "linear plain 4x1"]
    assert rows["linear 2x2"]["vs linear"] == rows["linear 4x1"]["vs linear"] == "1.000"  # linear at its split
    assert "2 x 2, 4 x 1 (micro-batch x accumulation) of 4 sequences" in out
    tokens = {row["tokens/s"] for name, row in rows.items() if "plain" not in name}
    assert len(tokens) == 4 and all(float(t.replace(",", "")) > 0 for t in tokens)
    for name in rows:  # each row's top operators on the CPU, by self time, each with its input shapes
        kernels = markdown_rows(out.split(f"### top kernels: {name} (one step, self CPU time per operator)")[1],
                                "kernel")
        # every matmul of a step has one micro-batch's tokens as a dimension: its rows (M), or the sum (K) of a
        # weight gradient; at 4 x 1 that is 64, a size nothing else in the model has
        tokens = str(2 * 16 if "2x2" in name else 4 * 16)
        matmuls = [k["launched by (input shapes)"] for k in kernels if k["kernel"] == "aten::mm"]
        assert matmuls and all(tokens in re.findall(r"\d+", shapes) for shapes in matmuls), (name, matmuls)
        for k in kernels:  # a matmul row's TFLOP is 2 M K N per call over its calls, its TFLOP/s that over its time
            if k["kernel"] == "aten::mm":
                (m, n_k), (_, n) = (map(int, dims.split("x")) for dims in k["launched by (input shapes)"].split(", "))
                assert float(k["TFLOP"]) == pytest.approx(2 * m * n_k * n * int(k["calls"]) / 1e12, rel=1e-3)
                assert float(k["TFLOP/s"]) > 0
            else:
                assert k["TFLOP"] == k["TFLOP/s"] == "-"
        assert 1 <= len(kernels) <= 40
        shares = [float(k["share"].rstrip("%")) for k in kernels]
        assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 100.1
    bad = run_script("bench/train_speed.py", *TINY_MODEL, "--splits=2x2,2x1", check=False)
    assert bad.returncode == 2 and "--splits must share one global batch" in bad.stderr


def test_train_speed_steps_as_train_py_between_log_steps(monkeypatch):
    # the bench's step is train.py's: the guard on the device and the update through apply_updates, nothing read
    args = type("Args", (), dict(recipe="gpt2", size="cpu", n_layer=1, n_head=2, n_embd=32, block_size=8,
                                 vocab_size=64, compile=False))
    model, compiled, optimizers = train_speed.build(args, {"query_mode": "res_gelu"}, "cpu")
    calls = []
    real = train_speed.apply_updates
    monkeypatch.setattr(train_speed, "apply_updates", lambda *a: calls.append(a[2].item()) or real(*a))
    before = [p.detach().clone() for p in model.parameters()]
    step = train_speed.make_step(model, compiled, optimizers, train_speed.micro_batches((2, 2), model.config, "cpu"),
                                 "float32", torch.autocast("cpu", enabled=False))
    step()
    assert calls == [0.0] and all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_cat_copies_rows_compile_with_inductors_cats_as_copies_and_the_same_model(monkeypatch):
    # --cat_copies: linear and res_gelu again, compiled with compile_pointwise_cat=False (processes.compile_kwargs),
    # the model itself unchanged; the key is a compile option, so the bench refuses it without --compile
    args = type("Args", (), dict(recipe="gpt2", size="cpu", n_layer=1, n_head=2, n_embd=32, block_size=8,
                                 vocab_size=64, compile=True, compile_mode="default", modes="linear,res_gelu",
                                 no_mlp475=True, unfused=False, mup=False, cat_copies=True, inductor=[],
                                 with_logits=False, kernels=False))
    specs = train_speed.variants(args)
    assert list(specs) == ["linear", "res_gelu", "linear cat copies", "res_gelu cat copies"]
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: calls.append(kwargs) or model)
    built = {name: train_speed.build(args, specs[name], "cpu")[0] for name in ("res_gelu", "res_gelu cat copies")}
    copies = {"max_pointwise_cat_inputs": 0, "max_complex_pointwise_cat_inputs": 0}
    assert calls == [{"dynamic": False, "mode": "default"}, {"dynamic": False, "options": copies}]
    assert built["res_gelu"].config == built["res_gelu cat copies"].config
    assert all(torch.equal(a, b) for a, b in zip(*(m.state_dict().values() for m in built.values())))
    bad = run_script("bench/train_speed.py", *TINY_MODEL, "--cat_copies", check=False)
    assert bad.returncode == 2 and "--cat_copies changes how inductor compiles: add --compile" in bad.stderr


def test_inductor_rows_compile_with_their_options_and_the_same_model(monkeypatch):
    # --inductor=NAME=VALUE,...: linear and res_gelu again, a row per flag, compiled with those options on top of
    # the mode's (processes.compile_kwargs); names and types are checked as torch.compile checks them
    text, options = train_speed.inductor_options("online_softmax=False,max_pointwise_cat_inputs=0")
    assert (text, options) == ("online_softmax=False,max_pointwise_cat_inputs=0",
                               {"online_softmax": False, "max_pointwise_cat_inputs": 0})
    args = type("Args", (), dict(recipe="gpt2", size="cpu", n_layer=1, n_head=2, n_embd=32, block_size=8,
                                 vocab_size=64, compile=True, compile_mode="max-autotune-no-cudagraphs",
                                 modes="linear,res_gelu", no_mlp475=True, unfused=False, mup=False,
                                 cat_copies=False, inductor=[(text, options)], with_logits=False,
                                 kernels=False))
    specs = train_speed.variants(args)
    assert list(specs) == ["linear", "res_gelu", f"linear {text}", f"res_gelu {text}"]
    calls = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: calls.append(kwargs) or model)
    built = {name: train_speed.build(args, specs[name], "cpu")[0] for name in ("res_gelu", f"res_gelu {text}")}
    from torch._inductor import list_mode_options
    assert calls == [{"dynamic": False, "mode": "max-autotune-no-cudagraphs"},
                     {"dynamic": False, "options": {**list_mode_options("max-autotune-no-cudagraphs"), **options}}]
    assert all(torch.equal(a, b) for a, b in zip(*(m.state_dict().values() for m in built.values())))
    for flag, message in [("--inductor=no_such_option=1", "no_such_option"),
                          ("--inductor=online_softmax=3", "online_softmax"),
                          ("--inductor=online_softmax", "--inductor takes NAME=VALUE pairs")]:
        bad = run_script("bench/train_speed.py", *TINY_MODEL, "--compile", flag, check=False)
        assert bad.returncode == 2 and message in bad.stderr and "Traceback" not in bad.stderr, flag
    bad = run_script("bench/train_speed.py", *TINY_MODEL, "--inductor=online_softmax=False", check=False)
    assert bad.returncode == 2 and "--inductor changes how inductor compiles: add --compile" in bad.stderr


def test_kernels_rows_put_the_ops_in_and_compute_what_the_rows_without_do():
    # --kernels: linear and res_gelu with kernels.use_kernels, res_gelu with them and autograd's split of the fused
    # projection (its cat), with --unfused also res_gelu unfused with them (W1 out of the fused projection); the same
    # model and, through the ops, the same training step
    args = type("Args", (), dict(recipe="gpt2", size="cpu", n_layer=1, n_head=2, n_embd=32, block_size=8,
                                 vocab_size=64, compile=False, modes="linear,res_gelu", no_mlp475=True, unfused=True,
                                 mup=False, cat_copies=False, inductor=[], with_logits=False, kernels=True))
    specs = train_speed.variants(args)
    assert list(specs) == ["linear", "res_gelu", "linear unfused", "res_gelu unfused", "linear kernels",
                           "res_gelu kernels", "res_gelu kernels cat", "res_gelu unfused kernels"]
    after = {}
    for name in ("res_gelu", "res_gelu kernels", "res_gelu kernels cat", "res_gelu unfused kernels"):
        model, compiled, optimizers = train_speed.build(args, specs[name], "cpu")
        assert (model.cross_entropy is not None) == ("kernels" in name)
        assert (model.transformer.h[0].attn.query.kernels is not None) == ("kernels" in name)
        if "kernels" in name:
            one_buffer = getattr(model.transformer.h[0].attn.query.kernels, "keywords", {}).get("one_buffer", True)
            assert one_buffer == ("cat" not in name)
        train_speed.make_step(model, compiled, optimizers, train_speed.micro_batches((2, 2), model.config, "cpu"),
                              "float32", torch.autocast("cpu", enabled=False))()
        after[name] = [p.detach().clone() for p in model.parameters()]
    for name in ("res_gelu kernels", "res_gelu kernels cat", "res_gelu unfused kernels"):
        for a, b in zip(after[name], after["res_gelu"]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_with_logits_rows_step_as_before_the_loss_alone():
    # --with_logits: the model called as train_step called it before issue 44's change, the logits returned
    # with the loss whatever train_step asks; the same loss and update as the row without them
    args = type("Args", (), dict(recipe="gpt2", size="cpu", n_layer=1, n_head=2, n_embd=32, block_size=8,
                                 vocab_size=64, compile=False, modes="linear,res_gelu", no_mlp475=True, unfused=False,
                                 mup=False, cat_copies=False, inductor=[], with_logits=True, kernels=False))
    specs = train_speed.variants(args)
    assert list(specs) == ["linear", "res_gelu", "linear with logits", "res_gelu with logits"]
    after = []
    for name in ("res_gelu", "res_gelu with logits"):
        model, compiled, optimizers = train_speed.build(args, specs[name], "cpu")
        x, y = train_speed.micro_batches((2, 1), model.config, "cpu")[0]
        logits, loss = compiled(x, y, return_logits=False)
        assert (logits is None) == (name == "res_gelu") and loss.dim() == 0
        train_speed.make_step(model, compiled, optimizers, train_speed.micro_batches((2, 2), model.config, "cpu"),
                              "float32", torch.autocast("cpu", enabled=False))()
        after.append([p.detach().clone() for p in model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*after))


def test_targets_score_each_mode_on_its_best_row_that_train_py_runs():
    # every lever's rows: each counts for its mode but μP's, the logits returned, autograd's split with the kernels
    # and linear plain, which train.py does not run as its step
    args = type("Args", (), dict(modes="linear,identity,res_gelu", no_mlp475=False, unfused=True, mup=True,
                                 cat_copies=True, inductor=[("online_softmax=False", {"online_softmax": False})],
                                 with_logits=True, kernels=True))
    specs = train_speed.variants(args)
    modes = {name: train_speed.target_mode(name, spec) for name, spec in specs.items()}
    modes["linear plain"] = train_speed.target_mode("linear plain", {})
    assert {name for name, mode in modes.items() if mode is None} == {
        "linear mup", "res_gelu mup", "linear with logits", "res_gelu with logits", "res_gelu kernels cat",
        "linear plain"}
    assert {name for name, mode in modes.items() if mode == "linear"} == {
        "linear", "linear unfused", "linear cat copies", "linear online_softmax=False", "linear kernels"}
    assert modes["mlp475"] == "mlp475" and modes["identity"] == "identity"
    assert modes["res_gelu unfused kernels"] == modes["res_gelu kernels"] == "res_gelu"
    # synthetic rounds (ms): the fastest row of a mode by median, whatever lever or split it is, against linear's
    # fastest in the same round; a faster row that train.py does not run changes nothing
    times = {"linear 12x40": [100, 104, 96], "linear kernels 12x40": [98, 99, 97], "linear 96x5": [97, 101, 95],
             "linear plain 96x5": [90, 90, 90], "res_gelu 96x5": [103, 104, 100],
             "res_gelu kernels 96x5": [99, 102, 101], "res_gelu kernels cat 96x5": [80, 80, 80],
             "mlp475 96x5": [110, 111, 109]}
    row_modes = {"linear 12x40": "linear", "linear kernels 12x40": "linear", "linear 96x5": "linear",
                 "linear plain 96x5": None, "res_gelu 96x5": "res_gelu", "res_gelu kernels 96x5": "res_gelu",
                 "res_gelu kernels cat 96x5": None, "mlp475 96x5": "mlp475"}
    best = train_speed.best_of_modes(row_modes, times)
    assert [(mode, row) for mode, row, _ in best] == [("linear", "linear 96x5"), ("res_gelu", "res_gelu kernels 96x5"),
                                                      ("mlp475", "mlp475 96x5")]
    ratios = {mode: ratio for mode, _, ratio in best}
    assert ratios["linear"] == 1.0
    assert ratios["res_gelu"] == pytest.approx(statistics.median([99 / 97, 102 / 101, 101 / 95]))
    assert ratios["mlp475"] == pytest.approx(statistics.median([110 / 97, 111 / 101, 109 / 95]))
    with pytest.raises(ValueError, match="no linear row"):
        train_speed.best_of_modes({"res_gelu 96x5": "res_gelu", "linear plain 96x5": None}, times)


def test_op_bytes_table_in_docs_speed_is_the_scripts_and_counts_the_logits():
    # docs/speed.md's table of the ops' bytes is bench/op_bytes.py's output at its defaults (96 x 1024 rows, the
    # H200's 4.8 TB/s); the cross-entropy's forward reads N x V bf16 logits and writes their gradient over them,
    # its backward reads and writes as many
    lines = op_bytes.table(96 * 1024, 768, 384, 50304, 4.8e12)
    with open(os.path.join(REPO, "docs", "speed.md")) as f:
        assert "\n".join(lines) in f.read()
    rows = {cells[0]: cells[1:] for cells in ([c.strip() for c in line.split("|")[1:-1]] for line in lines[2:])}
    forward, backward = "nlq::cross_entropy_rows (the gradient written over the logits)", \
        "the gradient scaled in place (CrossEntropy's backward, inductor's mul)"
    assert rows[forward][1] == f"{96 * 1024 * 50304 * 2 / 1e6 + 96 * 1024 * 8 / 1e6:,.1f}"
    assert rows[forward][2] == f"{96 * 1024 * 50304 * 2 / 1e6 + 96 * 1024 * 4 / 1e6:,.1f}"  # the gradient, the loss
    assert rows[backward][1:3] == [f"{96 * 1024 * 50304 * 2 / 1e6:,.1f}"] * 2  # in place: read and written
    assert rows["all of them"][4:6] == ["67.0", "101.8 ms a step"]


def test_launched_by_sums_each_kernel_under_the_operator_and_shapes_that_launched_it():
    from torch.autograd.profiler_util import FunctionEvent

    def op(name, shapes, kernels):
        event = FunctionEvent(id=0, name=name, thread=0, start_us=0, end_us=1, input_shapes=shapes)
        for kernel, us in kernels:
            event.append_kernel(kernel, 0, us)
        return event

    events = [op("aten::mm", [[768, 98304], [98304, 384]], [("splitK", 400.0)]),
              op("aten::mm", [[768, 98304], [98304, 384]], [("splitK", 420.0)]),
              op("aten::mm", [[98304, 768], [768, 2304]], [("splitK", 300.0), ("reduce", 5.0)]),
              op("aten::fill_", [[98304, 50304], []], [("FillFunctor", 2000.0)]),
              op("triton_poi_fused_gelu_4", [[96, 1024, 3072], [96, 1024, 3072], []],
                 [("triton_poi_fused_gelu_4", 500.0)]),
              op("aten::add", [[4], [4]], [])]
    # a matmul's FLOPs, 2 M K N a call, go to its first kernel (a split-K's reduction, second, gets none)
    assert train_speed.launched_by(events) == {
        ("splitK", "aten::mm (768x98304, 98304x384)"): [2, 820.0, 2 * 2 * 768 * 98304 * 384],
        ("splitK", "aten::mm (98304x768, 768x2304)"): [1, 300.0, 2 * 98304 * 768 * 2304],
        ("reduce", "aten::mm (98304x768, 768x2304)"): [1, 5.0, 0],
        ("FillFunctor", "aten::fill_ (98304x50304)"): [1, 2000.0, 0],
        ("triton_poi_fused_gelu_4", "96x1024x3072, 96x1024x3072"): [1, 500.0, 0]}
    assert train_speed.matmul_flops("aten::addmm", [[2304], [98304, 768], [768, 2304]]) == 2 * 98304 * 768 * 2304
    assert train_speed.matmul_flops("aten::bmm", [[12, 64, 32], [12, 32, 16]]) == 2 * 12 * 64 * 32 * 16
    assert train_speed.matmul_flops("aten::add", [[4], [4]]) is None


def test_the_plain_step_makes_the_update_train_py_makes():
    # --plain's reference loop and train.py's step: two computations of one update (the norm in float32 against
    # float64 is the only difference)
    args = type("Args", (), dict(recipe="gpt2", size="cpu", n_layer=1, n_head=2, n_embd=32, block_size=8,
                                 vocab_size=64, compile=False))
    after = []
    for make in (train_speed.make_step, train_speed.make_plain_step):
        model, compiled, optimizers = train_speed.build(args, {"query_mode": "linear"}, "cpu")
        before = [p.detach().clone() for p in model.parameters()]
        make(model, compiled, optimizers, train_speed.micro_batches((2, 2), model.config, "cpu"), "float32",
             torch.autocast("cpu", enabled=False))()
        assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
        after.append([p.detach().clone() for p in model.parameters()])
    for a, b in zip(*after):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_train_speed_modern_recipe_is_config_modern_with_its_optimizers():
    options, _ = train_speed.recipe("modern")
    assert options == {"pos_encoding": "rope", "norm": "rmsnorm", "mlp_activation": "relu2", "qk_norm": True,
                       "tie_weights": False}
    assert train_speed.recipe("gpt2")[0] == {}  # the paper's model is GPTConfig's defaults
    args = type("Args", (), dict(
        recipe="modern", size="cpu", n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=512, compile=False))
    model, _, optimizers = train_speed.build(args, {"query_mode": "res_gelu"}, "cpu")
    assert model.config.pos_encoding == "rope" and model.config.query_mode == "res_gelu"
    assert [type(o) for o in optimizers] == [torch.optim.AdamW, Muon]  # torch.optim.Muon's, FSDP-aware
    out = run_script("bench/train_speed.py", "--recipe=modern", *TINY_MODEL, "--block_size=16", "--batch_size=2",
                     "--rounds=1", "--warmup=1", "--modes=linear,res_gelu", "--no_mlp475").stdout
    assert list(markdown_table(out, "variant")) == ["linear", "res_gelu"] and "modern recipe" in out


@pytest.mark.slow
def test_sample_speed_cached_generation_gives_the_same_tokens():
    out = run_script("bench/sample_speed.py", *TINY_MODEL, "--new_tokens=24", "--prompt_len=4").stdout
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.splitlines() if line.startswith("| ")]
    rows = [dict(zip(rows[0], r)) for r in rows[1:]]  # the table's first column repeats: keyed by header here
    assert [(r["query_mode"], r["sequences"]) for r in rows] == [
        (mode, batch) for mode in ("linear", "identity", "res_gelu", "residual") for batch in ("1", "8")]
    assert all(r["same tokens"] == "yes" for r in rows)


@pytest.mark.slow
def test_data_speed_tokenizes_the_same_tokens_with_any_number_of_workers():
    out = run_script("bench/data_speed.py", "--device=cpu", "--copies=1", "--fetch_gib=0.01", "--fetches=5",
                     "--workers=1,2").stdout
    rows = markdown_table(out, "num_proc")
    assert [rows[w]["documents"] for w in "12"] == ["1,258", "1,258"]
    assert [rows[w]["tokens"] for w in "12"] == ["1,568,239", "1,568,239"]
    (index_row,) = markdown_table(out, "seconds").values()
    seconds, peak_mib, file_mib = (float(index_row[c].replace(",", "")) for c in
                                   ("seconds", "peak RSS MiB (whole process)", "file MiB"))
    # measured in the fresh process that built the 220 MiB file: torch alone is >100 MiB resident
    assert seconds > 0 and peak_mib > 100 and file_mib == 220


@pytest.mark.slow
def test_diag_cost_gives_the_diagnostics_share_of_an_evaluation():
    out = run_script("bench/diag_cost.py", *TINY_MODEL, "--block_size=16", "--batch_size=2", "--eval_iters=10",
                     "--rounds=2").stdout
    assert "evaluation 2 x 10 batches of 2 sequences" in out
    rows = markdown_table(out, "query_mode")
    assert list(rows) == ["linear", "res_gelu"]
    for row in rows.values():  # the share of a whole evaluation: the ratio to one batch over its 20 batches
        share = float(row["diag / evaluation"].rstrip("%"))
        assert share == pytest.approx(100 * float(row["diag / eval batch"]) / 20, abs=0.01) and share > 0


def test_a_bench_with_more_variants_than_the_recompile_limit_compiles_each_or_fails():
    x = torch.zeros(1, 8, dtype=torch.long)
    models = [GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, block_size=8, vocab_size=32, mlp_ratio=4 + k / 4))
              for k in range(10)]  # ten variants: past dynamo's default limit of 8
    with torch._dynamo.config.patch(recompile_limit=8, fail_on_recompile_limit_hit=False):
        fresh_compiler(len(models))
        counter = torch._dynamo.testing.CompileCounter()
        for model in models:
            torch.compile(model, backend=counter)(x, x)
        assert counter.frame_count == 10  # every variant compiled, none run eager
        fresh_compiler(9)
        with pytest.raises(torch._dynamo.exc.FailOnRecompileLimitHit):
            for model in models:
                torch.compile(model, backend="eager")(x, x)
    torch._dynamo.reset()


@pytest.mark.slow
def test_sweep_speed_times_each_jobs_value_against_the_first():
    out = run_script("bench/sweep_speed.py", "--points=2", "--max_iters=2", "--rounds=1", "--n_layer=1").stdout
    rows = markdown_table(out, "--jobs")
    assert list(rows) == ["1", "2"] and rows["1"]["vs --jobs=1"] == "1.000"
    assert float(rows["2"]["wall s (median)"]) > 0 and "command: python bench/sweep_speed.py --points=2" in out
