"""train.py's step as the device sees it (issue 44): the loss, the gradient norm, the divergence guard and the
stop vote stay on the device between log steps, the guard still keeps a diverged step from the weights, the
logged numbers are those of a loop that reads them after every step, and any split of the global batch into
micro-batches trains on the same sequences."""

import importlib
import os
import signal
from contextlib import nullcontext

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import TINY, read_metrics, train_in_process
from model import GPT, GPTConfig, model_config_keys
from nonlinear_queries.config.configurator import parse_config
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.data.batches import get_batch
from nonlinear_queries.trainer.optimizers import build_optimizers, set_learning_rates
from nonlinear_queries.trainer.training import dropout_seed, get_lr, train_step


@pytest.fixture
def one_thread():
    """Runs compared bit for bit, in this process: one thread, so that no kernel sums in another order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def reference_steps(data_dir, steps, *args):
    """{step: (loss, gradient norm)} of the TINY run with `args`, trained by a loop written out here as train.py's
    was before issue 44: the loss and the norm read back after every step, the optimizers stepped on the host."""
    script = importlib.import_module("train")
    cfg, _ = parse_config(TrainConfig, [*TINY, f"--data_dir={data_dir}", *args])
    torch.manual_seed(cfg.seed)
    model = GPT(GPTConfig(**{k: getattr(cfg, k) for k in model_config_keys()}))
    data = script.open_data(cfg)
    optimizers = build_optimizers(model, cfg, "cpu")
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    params, B, micro = list(model.parameters()), cfg.batch_size, cfg.gradient_accumulation_steps
    out = {}
    for step in range(steps):
        set_learning_rates(optimizers, get_lr(step, cfg), cfg)
        row = data.train_idx[step]
        loss_sum, norm = train_step(model, params, optimizers, scaler,
                                    lambda k: get_batch(data.train, row[k * B : (k + 1) * B], cfg.block_size, "cpu"),
                                    micro, nullcontext(), [dropout_seed(cfg.seed, step, k) for k in range(micro)],
                                    cfg.z_loss, cfg.grad_clip)
        out[step + 1] = (loss_sum.item() / micro, norm.item())
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("log_interval", [1, 3])
def test_logged_numbers_are_bit_for_bit_those_of_a_loop_that_reads_every_step(shakespeare_dir, tmp_path, one_thread,
                                                                             log_interval):
    # fp32 on the CPU, dropout on and two micro-batches: the losses and norms logged every step, or every third
    # (read back only then), are the reference loop's exactly
    args = ["--dropout=0.1", "--batch_size=2", "--gradient_accumulation_steps=2", "--eval_interval=6"]
    assert train_in_process(shakespeare_dir, tmp_path / "out", *args, "--max_iters=6",
                            f"--log_interval={log_interval}") == 0
    want = reference_steps(shakespeare_dir, 6, *args)
    got = {r["step"]: (r["loss"], r["grad_norm"]) for r in read_metrics(tmp_path / "out", "train")}
    assert got == {s: want[s] for s in range(log_interval, 7, log_interval)}


class HostReads(TorchDispatchMode):
    """Counts the reads of a tensor's value by the host (item(), bool(), float(): aten._local_scalar_dense) while
    active; tolist() reads without dispatching, so Tensor.tolist is patched to count too."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.count = 0
        tolist = torch.Tensor.tolist

        def counted(tensor):
            self.count += 1
            return tolist(tensor)

        monkeypatch.setattr(torch.Tensor, "tolist", counted)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_the_loop_reads_the_device_only_at_log_steps_and_evaluations(shakespeare_dir, tmp_path, monkeypatch):
    # the optimizers as train.py builds them on CUDA (fused AdamW, which takes found_inf), here on the CPU: the
    # host then never reads a tensor between two steps but at a log step (4, 8) or before an evaluation (6, 8)
    script = importlib.import_module("train")
    monkeypatch.setattr(script, "build_optimizers", lambda model, cfg, device_type: build_optimizers(model, cfg,
                                                                                                      "cuda"))
    reads = HostReads(monkeypatch)
    between = []  # host reads from one train_step call to the next (or to the end)
    real_step = script.train_step

    def step(*args, **kwargs):
        between.append(reads.count)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(script, "train_step", step)
    with reads:
        assert train_in_process(shakespeare_dir, tmp_path / "out", "--max_iters=8", "--log_interval=4",
                                "--eval_interval=6", "--diagnostics=False") == 0
    between.append(reads.count)
    per_step = {s: after - before for s, (before, after) in enumerate(zip(between, between[1:]), start=1)}
    assert [s for s, n in per_step.items() if n] == [4, 6, 8], per_step
    assert [r["step"] for r in read_metrics(tmp_path / "out", "train")] == [4, 8]


def test_a_signal_stops_the_run_after_the_step_in_flight_with_a_checkpoint(shakespeare_dir, tmp_path, monkeypatch):
    # SIGTERM arrives during step 5; one process reads its own request on the host after that step, with no wait
    # for the device, and stops there, though the next log step (log_interval 4) is step 8
    script = importlib.import_module("train")
    real_step, calls = script.train_step, []

    def step(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(script, "train_step", step)
    out = tmp_path / "out"
    assert train_in_process(shakespeare_dir, out, "--max_iters=20", "--log_interval=4", "--eval_interval=20") == 0
    assert len(calls) == 5 and torch.load(out / "ckpt.pt", weights_only=True)["step"] == 5
    assert [r["step"] for r in read_metrics(out, "train")] == [4, 5]  # the stop's read-back is logged


def test_a_diverged_step_never_reaches_the_weights_between_reads(shakespeare_dir, tmp_path, monkeypatch):
    # learning rate 1e30: step 1's update makes the weights huge, step 2's loss is nan. Read back only at step 4,
    # the run still reports step 2, and steps 2 to 4 updated nothing: the weights are finite, AdamW counted one step
    script = importlib.import_module("train")
    built = {}

    def keep(model, cfg, device_type):
        built["model"], built["optimizers"] = model, build_optimizers(model, cfg, "cuda")  # fused: skips on device
        return built["optimizers"]

    monkeypatch.setattr(script, "build_optimizers", keep)
    out = tmp_path / "out"
    assert train_in_process(shakespeare_dir, out, "--max_iters=20", "--log_interval=4", "--eval_interval=20",
                            "--learning_rate=1e30", "--warmup_iters=0", "--decay_lr=False") == 3
    (record,) = read_metrics(out, "diverged")
    assert record["step"] == 2 and record["reason"] == "the loss is nan" and record["lr"] == 1e30
    assert record["last_checkpoint_step"] is None and not read_metrics(out, "train")
    weights = [p.detach() for p in built["model"].parameters()]
    assert all(torch.isfinite(w).all() for w in weights) and max(w.abs().max() for w in weights) > 1e20
    (adamw,) = built["optimizers"]
    assert {int(s["step"]) for s in adamw.state.values()} == {1}


@pytest.mark.parametrize("split", [(4, 2), (2, 4)])
def test_any_split_of_the_global_batch_trains_on_the_same_sequences(shakespeare_dir, tmp_path, one_thread,
                                                                    monkeypatch, split):
    # 8 sequences per step as 8 x 1, 4 x 2 or 2 x 4: the same 8 sequences at every step, in the same order, and
    # the same losses up to float32 rounding (the mean of micro-batch means sums in another order)
    script = importlib.import_module("train")
    real_batch = script.get_batch

    def run(batch_size, accumulation):
        fed = []

        def get_batch(data, offsets, block_size, device):
            x, y = real_batch(data, offsets, block_size, device)
            fed.append(x)
            return x, y

        monkeypatch.setattr(script, "get_batch", get_batch)
        out = tmp_path / f"{batch_size}x{accumulation}"
        assert train_in_process(shakespeare_dir, out, f"--batch_size={batch_size}",
                                f"--gradient_accumulation_steps={accumulation}", "--eval_batch_size=8",
                                "--max_iters=4", "--eval_interval=4") == 0
        steps = [torch.cat(fed[k : k + accumulation]) for k in range(0, len(fed), accumulation)]
        return steps, read_metrics(out, "train"), read_metrics(out, "eval")

    whole_steps, whole, whole_evals = run(8, 1)
    steps, records, evals = run(*split)
    assert len(steps) == len(whole_steps) == 4
    assert all(torch.equal(a, b) for a, b in zip(steps, whole_steps))
    for r, w in zip(records, whole):
        assert r["step"] == w["step"] and r["loss"] == pytest.approx(w["loss"], rel=1e-5, abs=0)
        assert r["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-4, abs=0)
    # eval_batch_size=8: the evaluations see the same fixed sequences as the 8 x 1 run's
    assert [e["step"] for e in evals] == [0, 4]
    for e, w in zip(evals, whole_evals):
        assert e["val_loss"] == pytest.approx(w["val_loss"], rel=1e-5, abs=0)
        assert e["train_loss"] == pytest.approx(w["train_loss"], rel=1e-5, abs=0)
    assert np.isfinite([r["loss"] for r in records]).all()
