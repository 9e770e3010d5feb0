"""What a run costs, known before its first step (budget.py): the memory floor, exactly, and train.py's
refusal of a run above it; the CPU step-time floor, its one-line warning and train.py's refusal of a run of more
than a week unless allow_slow; max_iters=0 refused."""

import types

import numpy as np
import pytest
import torch

from helpers import TINY, read_metrics, run_in_process
from nonlinear_queries.config.configurator import parse_config
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.errors import ConfigError, SetupError
from nonlinear_queries.runtime import processes
from nonlinear_queries.trainer import budget


def cfg(**changes):
    values = dict(batch_size=2, eval_batch_size=0, block_size=8, vocab_size=10, n_layer=3, n_embd=4,
                  optimizer="adamw", parallelism="ddp", activation_checkpointing=False)
    return types.SimpleNamespace(**{**values, **changes})


def test_the_memory_floor_counts_state_logits_and_activations():
    # 1000 parameters: 8 bytes of weight and gradient and 8 of AdamW's moments each; 2 x 8 tokens: logits and
    # their gradient, 2 x 16 x 10 x 4 bytes; 4 saved values of n_embd per token and layer, 4 x 3 x 16 x 4 x 4
    assert budget.memory_floor(1000, cfg(), "float32")[0] == 16_000 + 1_280 + 3_072
    assert budget.memory_floor(1000, cfg(), "bfloat16")[0] == 16_000 + 640 + 1_536
    assert budget.memory_floor(1000, cfg(optimizer="muon"), "float32")[0] == 12_000 + 1_280 + 3_072
    assert budget.memory_floor(1000, cfg(parallelism="fsdp"), "float32", world_size=4)[0] == 4_000 + 1_280 + 3_072
    assert budget.memory_floor(1000, cfg(activation_checkpointing=True), "float32")[0] == 16_000 + 1_280 + 768
    assert budget.memory_floor(1000, cfg(eval_batch_size=4), "float32")[0] == 16_000 + 2_560 + 6_144


def test_a_run_above_the_devices_memory_is_refused_before_any_work(tmp_path):
    out, data = tmp_path / "run", tmp_path / "data"
    data.mkdir()
    for split in ("train", "val"):  # splits long enough for the block, so that the memory is what is refused
        np.zeros(1_000_001, dtype=np.uint16).tofile(data / f"{split}.bin")
    # one micro-batch of 4 x 1,000,000 tokens: its logits and their gradient alone are 1.5 TiB
    code, stdout, stderr = run_in_process("train.py", *TINY, f"--data_dir={data}",
                                          f"--out_dir={out}", "--block_size=1000000")
    assert code == 1 and stdout == ""
    have = budget.device_memory("cpu")
    # 33.7M parameters (wpe is 1e6 x 32) x 16 bytes; 2 x 4e6 x 50304 x 4 bytes; 4 x 2 layers x 4e6 x 32 x 4 bytes
    assert stderr == (f"error: this run needs at least 1503.5 GiB of memory per process (0.5 GiB of weights, "
                      f"gradients and optimizer state, 1499.2 GiB of one micro-batch's logits and their gradient, "
                      f"3.8 GiB of its activations), more than the {have / 2**30:.1f} GiB that cpu has; lower "
                      f"batch_size (a larger gradient_accumulation_steps keeps the tokens per step), block_size or "
                      f"the model's size\n")
    assert not out.exists()


@pytest.mark.parametrize("seconds, says", [
    (42, "42 s"), (90, "1.5 min"), (3600 * 7.2, "7.2 h"), (86400 * 12, "12.0 days"), (86400 * 400, "400.0 days"),
    (365 * 86400 * 3.1, "3.1 years")])
def test_durations_read_in_a_persons_unit(seconds, says):
    assert budget.describe_duration(seconds) == says


def test_a_slow_cpu_step_is_said_and_a_run_of_more_than_a_week_refused_unless_asked_for(monkeypatch, capsys):
    monkeypatch.setattr(budget, "cpu_matmul_flops", lambda: 1e11)
    monkeypatch.setattr(budget.torch, "get_num_threads", lambda: 2)
    model = types.SimpleNamespace(flops_per_token=lambda: 1e9)
    cpu, cuda = types.SimpleNamespace(device_type="cpu", master=True), types.SimpleNamespace(device_type="cuda")

    def config(block_size, allow_slow=False):
        return types.SimpleNamespace(gradient_accumulation_steps=2, batch_size=59, block_size=block_size,
                                     allow_slow=allow_slow)

    rate = "5.9e+13 FLOPs at the rate its float32 matmuls reach on 2 threads"
    budget.check_cpu_time(config(500), cpu, model, 600)  # 590 s a step at 100 GFLOP/s; 600 steps, 4.1 days
    assert capsys.readouterr().err == (f"warning: on this CPU a step of this run takes at least 9.8 min ({rate}), the "
                                       f"600 steps left at least 4.1 days. For a CPU run, use config/quickstart.py "
                                       f"(minutes); this config is meant for a GPU\n")
    with pytest.raises(SetupError) as e:  # 60,000 steps: 409.7 days
        budget.check_cpu_time(config(500), cpu, model, 60_000)
    assert str(e.value) == (f"on this CPU the 60,000 steps of this run take at least 409.7 days (9.8 min a step: "
                            f"{rate}), more than a week; this config is meant for a GPU: for a CPU run, use "
                            f"config/quickstart.py (minutes), or pass --allow_slow=True to start it anyway")
    budget.check_cpu_time(config(500, allow_slow=True), cpu, model, 60_000)
    assert "the 60,000 steps left at least 409.7 days" in capsys.readouterr().err
    budget.check_cpu_time(config(50), cpu, model, 10_000)  # 59 s a step, 6.8 days: said nothing
    budget.check_cpu_time(config(500), cuda, model, 60_000)
    budget.check_cpu_time(config(500), cpu, model, 0)  # eval_only: no step
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("data", ["Shakespeare", "no data"])
def test_the_papers_config_on_a_cpu_is_refused_before_it_compiles_or_writes(shakespeare_dir, tmp_path, monkeypatch,
                                                                             data):
    # issue 82: without OpenWebText the refusal was to prepare its 18 GB; the estimate needs no data, so it comes first
    data_args = (["--dataset=shakespeare", f"--data_dir={shakespeare_dir}"] if data == "Shakespeare"
                 else [f"--data_dir={tmp_path / 'openwebtext'}"])
    monkeypatch.setattr(budget, "cpu_matmul_flops", lambda: 1e11)
    monkeypatch.setattr(budget, "device_memory", lambda device: None)  # whatever this machine's memory
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)

    def compiled(*args, **kwargs):
        raise AssertionError("the model was compiled")

    monkeypatch.setattr(processes, "parallelize", compiled)
    out = tmp_path / "run"
    code, stdout, stderr = run_in_process("train.py", "config/res_gelu.py", *data_args, f"--out_dir={out}",
                                          "--device=cpu")
    # 854,880,768 FLOPs a token x 491,520 tokens a step: 4.2e14 FLOPs, 70 min at 100 GFLOP/s; 60,000 steps
    assert (code, stdout) == (1, "")
    assert stderr == ("error: on this CPU the 60,000 steps of this run take at least 8.0 years (1.2 h a step: 4.2e+14 "
                      "FLOPs at the rate its float32 matmuls reach on 2 threads), more than a week; this config is "
                      "meant for a GPU: for a CPU run, use config/quickstart.py (minutes), or pass --allow_slow=True "
                      "to start it anyway\n")
    assert not out.exists() and not (tmp_path / "openwebtext").exists()


def test_allow_slow_starts_a_run_that_would_be_refused(shakespeare_dir, tmp_path, monkeypatch):
    # a CPU that reaches 1 kFLOP/s: the tiny model's step (1.3e9 FLOPs) takes 14.6 days, so even 2 steps are refused
    monkeypatch.setattr(budget, "cpu_matmul_flops", lambda: 1e3)
    args = [*TINY, f"--data_dir={shakespeare_dir}", "--max_iters=2", "--eval_interval=2"]
    code, stdout, stderr = run_in_process("train.py", *args, f"--out_dir={tmp_path / 'refused'}")
    assert code == 1 and stderr.startswith("error: on this CPU the 2 steps of this run take at least 29.1 days")
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "asked"
    code, stdout, stderr = run_in_process("train.py", *args, f"--out_dir={out}", "--allow_slow=True")
    assert code == 0, stderr
    assert "warning: on this CPU a step of this run takes at least 14.6 days" in stderr
    assert [r["step"] for r in read_metrics(out, "train")] == [1, 2]


def test_the_cpu_matmul_rate_is_measured():
    assert 1e8 < budget.cpu_matmul_flops(n=128, repeats=2) < 1e14


def test_max_iters_0_is_refused_and_eval_only_is_the_evaluation_run():
    with pytest.raises(ConfigError, match="max_iters=0 trains no step, so the run would end without a checkpoint; "
                                          "to evaluate a model without training it, pass --eval_only=True"):
        parse_config(TrainConfig, ["--max_iters=0"])
    assert parse_config(TrainConfig, ["--max_iters=0", "--eval_only=True"])[0].eval_only
