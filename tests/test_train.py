"""End-to-end tests of train.py, batches.py, configurator.py and sample.py on real Shakespeare tokens."""

import glob
import importlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch

from helpers import (
    ONE_THREAD,
    REPO,
    TINY,
    losses_by_step,
    read_metrics,
    run_in_process,
    run_script,
    train,
    train_in_process,
    wandb_records,
)
from model import GPT, QUERY_MODULES, GPTConfig
from nonlinear_queries.config.configurator import parse_config
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.data.batches import index_file, row_offsets
from nonlinear_queries.trainer import training
from nonlinear_queries.trainer.training import get_lr
from nonlinear_queries.weights import checkpoint
from nonlinear_queries.weights.checkpoint import read_checkpoint

# ---------------------------------------------------------------------------------------
# fixed-seed batch indices


@pytest.mark.slow
def test_linear_and_res_gelu_runs_see_identical_batches(shakespeare_dir, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(shakespeare_dir, data_dir, ignore=shutil.ignore_patterns("indices"))  # other tests' indices
    train(data_dir, tmp_path / "a", "--query_mode=linear", "--max_iters=3", "--eval_interval=3")
    first = {os.path.basename(p): np.load(p) for p in glob.glob(str(data_dir / "indices" / "*.npy"))}
    n_train = len(np.memmap(data_dir / "train.bin", np.uint16))
    n_val = len(np.memmap(data_dir / "val.bin", np.uint16))
    # named by what determines them (not by the model), so every variant shares them
    assert sorted(first) == [f"train_eval_seed1337_2x4_T32_N{n_train}.npy", f"train_seed1337_3x4_T32_N{n_train}.npy",
                             f"val_eval_seed1337_2x4_T32_N{n_val}.npy"]
    shutil.rmtree(data_dir / "indices")  # the second run must regenerate them from the seed
    train(data_dir, tmp_path / "b", "--query_mode=res_gelu", "--max_iters=3", "--eval_interval=3")
    for name, arr in first.items():
        assert np.array_equal(np.load(data_dir / "indices" / name), arr), name


def test_index_rows_depend_only_on_seed_stream_and_row(tmp_path):
    n = 10_000
    short = index_file(str(tmp_path), "train", 7, 5, 6, 32, n)
    long = index_file(str(tmp_path), "train", 7, 3000, 6, 32, n)  # spans several chunks
    assert long.dtype == np.int64 and long.shape == (3000, 6)
    assert np.array_equal(long[:5], short)
    assert np.array_equal(long[2500], row_offsets(7, "train", 2500, 6, n - 32))
    other_seed = index_file(str(tmp_path), "train", 8, 5, 6, 32, n)
    other_stream = index_file(str(tmp_path), "val_eval", 7, 5, 6, 32, n)
    assert not np.array_equal(other_seed, short) and not np.array_equal(other_stream, short)
    assert not glob.glob(str(tmp_path / "*.tmp"))


def test_no_offset_runs_past_the_data(tmp_path):
    n, T = 300, 64
    idx = index_file(str(tmp_path), "train", 0, 2000, 16, T, n)
    assert idx.min() >= 0 and idx.max() + T + 1 <= n
    assert idx.max() == n - T - 1  # the last valid offset is reachable
    with pytest.raises(ValueError, match="block_size=300 needs at least 301 tokens"):
        index_file(str(tmp_path), "val_eval", 0, 2, 2, 300, 300)


# ---------------------------------------------------------------------------------------
# training


@pytest.mark.slow
def test_training_lowers_val_loss_on_shakespeare(shakespeare_dir, tmp_path):
    out = tmp_path / "out"
    train(shakespeare_dir, out, "--query_mode=res_gelu", "--n_embd=64", "--block_size=64",
          "--max_iters=120", "--lr_decay_iters=120", "--eval_interval=60", "--eval_iters=8",
          "--learning_rate=6e-3", "--warmup_iters=10", "--log_interval=20")
    evals = read_metrics(out, "eval")
    assert [e["step"] for e in evals] == [0, 60, 120]
    assert evals[0]["val_loss"] > 10.5  # ln(50304) = 10.83 at init
    # Uniform guessing scores 10.83 and the train split's unigram frequencies 6.54 on this
    # val split: 7.0 means most of the token statistics were learned (this run: 6.74).
    assert evals[-1]["val_loss"] < 7.0, evals


def test_step_time_counts_training_steps_only(shakespeare_dir, tmp_path, monkeypatch):
    # the clock of train.py and of its steps (training.StepClock), advanced only by the work patched below: 0.25 s
    # per training step, and much more by the evaluations, the diagnostics and the checkpoints, which a logged step
    # time must leave out
    script = importlib.import_module("train")
    clock = [1000.0]
    for module in (script, training):
        monkeypatch.setattr(module, "time", types.SimpleNamespace(time=lambda: clock[0]))

    def taking(seconds, work):
        def timed(*args, **kwargs):
            result = work(*args, **kwargs)
            clock[0] += seconds
            return result
        return timed

    for name, seconds in (("train_step", 0.25), ("evaluate", 100.0), ("diagnose", 10.0)):
        monkeypatch.setattr(script, name, taking(seconds, getattr(script, name)))
    monkeypatch.setattr(checkpoint, "save_training_state", taking(1000.0, checkpoint.save_training_state))
    out = tmp_path / "out"
    # a checkpoint at step 6, between the logs of steps 4 and 8 (issue 33, item 9)
    assert train_in_process(shakespeare_dir, out, "--max_iters=12", "--log_interval=4", "--eval_interval=6",
                            "--peak_flops=1e12") == 0
    records = read_metrics(out, "train")
    assert [r["step"] for r in records] == [4, 8, 12]
    assert [e["step"] for e in read_metrics(out, "eval")] == [0, 6, 12]
    header = read_metrics(out, "config")[0]
    tokens_per_step = header["tokens_per_iter"]
    flops_per_token = GPT(GPTConfig(**{k: header["config"][k] for k in GPTConfig.__dataclass_fields__})
                          ).flops_per_token()
    for r in records:
        assert r["ms_per_step"] == 250.0 and r["tokens_per_s"] == tokens_per_step / 0.25, r
        assert r["mfu"] == pytest.approx(flops_per_token * tokens_per_step / 0.25 / 1e12, rel=1e-12), r


@pytest.mark.slow
def test_resumed_run_equals_unbroken_run(shakespeare_dir, tmp_path):
    common = ["--max_iters=8", "--lr_decay_iters=8", "--eval_interval=4", "--dropout=0.1"]
    train(shakespeare_dir, tmp_path / "full", *common, env=ONE_THREAD)
    train(shakespeare_dir, tmp_path / "broken", *common[1:], "--max_iters=4", env=ONE_THREAD)
    train(shakespeare_dir, tmp_path / "broken", *common, "--init_from=resume", env=ONE_THREAD)
    full, broken = losses_by_step(tmp_path / "full"), losses_by_step(tmp_path / "broken")
    # the record of step s logs the learning rate of the update s-1 -> s, get_lr(s - 1)
    cfg, _ = parse_config(TrainConfig, [*TINY, *common])
    assert [r["lr"] for r in read_metrics(tmp_path / "broken", "train")] == [get_lr(s, cfg) for s in range(8)]
    assert sorted(broken) == list(range(1, 9))
    for step in range(1, 9):
        assert abs(full[step] - broken[step]) <= 1e-6, (step, full[step], broken[step])
    full_evals = [(e["step"], e["val_loss"]) for e in read_metrics(tmp_path / "full", "eval")]
    broken_evals = [(e["step"], e["val_loss"]) for e in read_metrics(tmp_path / "broken", "eval")]
    assert broken_evals == full_evals  # step 4 logged once, before the break


def test_a_resumed_float16_run_keeps_its_loss_scale(shakespeare_dir, tmp_path, monkeypatch):
    # float16 runs only on CUDA, so here the GradScaler is switched on under float32 (its scaling by powers of
    # two is exact there) and grows its scale x2 every 2 clean steps: 2^16 -> 2^20 over 8 steps. A resumed run
    # that starts a fresh scaler is back at 2^16 at step 5 and ends at 2^17; it must end where the unbroken
    # run does, the checkpoint carrying the scale and the count of clean steps towards the next growth.
    real = torch.amp.GradScaler
    monkeypatch.setattr(torch.amp, "GradScaler", lambda device, enabled: real(device, growth_interval=2))
    common = ["--max_iters=8", "--lr_decay_iters=8", "--eval_interval=3"]
    assert train_in_process(shakespeare_dir, tmp_path / "full", *common) == 0
    assert train_in_process(shakespeare_dir, tmp_path / "broken", *common[1:], "--max_iters=5") == 0
    assert read_checkpoint(str(tmp_path / "broken" / "ckpt.pt"))["grad_scaler"]["scale"] == 2.0**18
    assert train_in_process(shakespeare_dir, tmp_path / "broken", *common, "--init_from=resume") == 0
    full, broken = (read_checkpoint(str(tmp_path / run / "ckpt.pt"))["grad_scaler"] for run in ("full", "broken"))
    assert full["scale"] == 2.0**20 and full["_growth_tracker"] == 0
    assert broken == full
    assert losses_by_step(tmp_path / "broken") == losses_by_step(tmp_path / "full")


@pytest.mark.slow
def test_logged_loss_is_mean_over_micro_batches(shakespeare_dir, tmp_path):
    # 8 sequences per step either way, from the same index row: the same losses
    train(shakespeare_dir, tmp_path / "one", "--batch_size=8", "--max_iters=3", "--eval_interval=3")
    train(shakespeare_dir, tmp_path / "four", "--batch_size=2", "--gradient_accumulation_steps=4",
          "--max_iters=3", "--eval_interval=3")
    one, four = losses_by_step(tmp_path / "one"), losses_by_step(tmp_path / "four")
    for step in (1, 2, 3):
        assert one[step] == pytest.approx(four[step], abs=1e-5)


@pytest.mark.slow
def test_metrics_start_with_resolved_config_and_commit(shakespeare_dir, tmp_path):
    out = tmp_path / "out"
    train(shakespeare_dir, out, "--max_iters=2", "--eval_interval=2", "--query_mode=identity")
    header = read_metrics(out)[0]
    head = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert header["type"] == "config" and header["git_commit"] == head and len(head) == 40
    assert "--query_mode=identity" in header["argv"] and header["non_embedding_params"] > 0
    assert header["config"]["query_mode"] == "identity" and header["config"]["n_embd"] == 32
    # the model's size and cost, for compare.py and study.py to read instead of rebuilding the model
    model = GPT(GPTConfig(**{k: header["config"][k] for k in GPTConfig.__dataclass_fields__}))
    assert (header["params"], header["flops_per_token"]) == (model.get_num_params(False), model.flops_per_token())
    assert header["non_embedding_params"] == model.get_num_params() < header["params"]
    # what decides a CPU run's bits beside its config: the run's own thread count, instruction set and BLAS
    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count())
    assert header["numerics"] == {"torch_threads": threads, "interop_threads": header["numerics"]["interop_threads"],
                                  "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
                                  "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                                  "cpu_model": header["numerics"]["cpu_model"], "blas": "mkl"}
    with open(out / "config.json") as f:
        assert json.load(f)["config"] == header["config"]
    assert os.path.exists(out / "ckpt.pt") and not os.path.exists(out / "ckpt.pt.tmp")


@pytest.mark.slow
def test_wandb_offline_run_read_back_by_wandb_has_its_name_group_job_type_tags_and_history(shakespeare_dir,
                                                                                             tmp_path):
    out = tmp_path / "arm" / "seed=3"
    # as a study's sweep starts a run (protocol.wandb_args, sweeps.Point.train_args): the arm its group and the
    # label of its row in compare.py's tables (wandb_run_name), its directory under the study's its wandb name
    proc = train(shakespeare_dir, out, "--max_iters=4", "--eval_interval=2", "--wandb_log=True",
                 "--wandb_group=study/arm", "--wandb_job_type=held-out", "--wandb_tags=seed=3,x",
                 "--wandb_run_name=arm", "--wandb_name=arm/seed=3", env={"WANDB_MODE": "offline"})
    (run_file,) = glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    records = wandb_records(run_file)
    (run,) = [r["run"] for r in records if r["type"] == "run"]
    # the name is the run's own, unique in the study (not the label, shared by the arm's seeds)
    assert (run["display_name"], run["run_group"], run["job_type"], run["tags"], run["project"]) == (
        "arm/seed=3", "study/arm", "held-out", ["seed=3", "x"], "nonlinear-queries")
    # what wandb got is what the header and config.json record, and what the run says where it starts
    (header,) = read_metrics(out, "config")
    assert header["wandb"] == {"project": "nonlinear-queries", "name": "arm/seed=3", "group": "study/arm",
                               "job_type": "held-out", "tags": ["seed=3", "x"], "id": run["run_id"]}
    assert header["run_name"] == "arm"
    assert json.loads((out / "config.json").read_text())["wandb"] == header["wandb"]
    assert f"wandb offline run arm/seed=3 in group study/arm in {os.path.dirname(run_file)};" in proc.stdout
    rows = [r["history"]["item"] for r in records if r["type"] == "history"]
    val = [(r["_step"], r["eval/val_loss"]) for r in rows if "eval/val_loss" in r]
    expected = [(e["step"], e["val_loss"]) for e in read_metrics(out, "eval")]
    assert [s for s, _ in val] == [s for s, _ in expected] == [0, 2, 4]
    assert [v for _, v in val] == pytest.approx([v for _, v in expected], rel=1e-6)
    logged = set().union(*rows)
    assert {"train/loss", "train/lr", "eval/train_loss", "diag/layer1/attn_entropy"} <= logged
    assert {f"train/{k}" for r in read_metrics(out, "train") for k in r if k not in ("type", "step")} <= logged


@pytest.mark.slow
def test_full_size_res_gelu_config_trains(shakespeare_dir, tmp_path):
    # the paper's 124M res_gelu model on real tokens, as in the acceptance command; without the
    # diagnostics, whose forward pass and 36 SVDs of 768-wide matrices would add 15 s of CPU to this run's 38 s
    # (tests/test_diagnostics.py holds them on tiny models)
    proc = run_script("train.py", "config/res_gelu.py", "--dataset=shakespeare", f"--data_dir={shakespeare_dir}",
                      f"--out_dir={tmp_path / 'out'}", "--device=cpu", "--compile=False", "--batch_size=1",
                      "--gradient_accumulation_steps=1", "--max_iters=1", "--eval_iters=1", "--log_interval=1",
                      "--wandb_log=False", "--diagnostics=False")
    assert "84,972,288 non-embedding parameters" in proc.stdout
    losses = losses_by_step(tmp_path / "out")
    assert sorted(losses) == [1] and all(np.isfinite(v) and 9 < v < 12 for v in losses.values())


# ---------------------------------------------------------------------------------------
# bad input: a clear message naming the problem and a non-zero exit


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        # every registered mode, the six of model.py among them (any added one too: the list is the registry's)
        (["--query_mode=nonlinear"], f"valid query modes: {', '.join(sorted(QUERY_MODULES))}"),
        (["--learning_rte=1e-3"], "unknown config key 'learning_rte'; did you mean 'learning_rate'"),
        (["--max_iters=ten"], "max_iters must be int, got str 'ten'"),
        (["--compile=1"], "compile must be bool, got int 1"),
        (["--block_size=200000"], "block_size=200000 needs at least 200001 tokens"),
        (["config/missing.py"], "config file 'config/missing.py' not found"),
    ],
)
def test_bad_config_is_a_clear_error(shakespeare_dir, tmp_path, args, message):
    proc = train(shakespeare_dir, tmp_path / "out", *args, check=False)
    # a config error exits 2 (configurator.config_from_argv), data that cannot serve the config 1
    assert proc.returncode == (1 if "tokens" in message else 2)
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_missing_data_says_how_to_prepare(tmp_path):
    proc = run_script("train.py", *TINY, f"--data_dir={tmp_path}", f"--out_dir={tmp_path / 'out'}", check=False)
    assert proc.returncode != 0
    assert "train.bin not found" in proc.stderr and "python data/shakespeare/prepare.py" in proc.stderr


@pytest.mark.slow
def test_resume_refuses_a_different_model_and_scratch_refuses_to_overwrite(shakespeare_dir, tmp_path):
    out = tmp_path / "out"
    train(shakespeare_dir, out, "--max_iters=2", "--eval_interval=2")
    proc = train(shakespeare_dir, out, "--max_iters=4", "--init_from=resume", "--n_embd=64", check=False)
    assert proc.returncode != 0 and "trained with n_embd=32" in proc.stderr
    proc = train(shakespeare_dir, out, "--max_iters=2", check=False)
    assert proc.returncode != 0 and "already holds a run" in proc.stderr
    assert len(losses_by_step(out)) == 2  # nothing of the first run was lost


@pytest.mark.slow
def test_a_config_built_on_the_quickstart_does_not_delete_a_run(shakespeare_dir, tmp_path):
    # config/quickstart.py once set overwrite = True: a user's --out_dir on top of it replaced the run there
    out = tmp_path / "mine"
    train(shakespeare_dir, out, "--max_iters=2", "--eval_interval=2")
    before = sorted(os.listdir(out)), losses_by_step(out)
    proc = run_script("train.py", "config/quickstart.py", *TINY, f"--data_dir={shakespeare_dir}", f"--out_dir={out}",
                      "--max_iters=2", check=False)
    assert proc.returncode == 1 and "already holds a run" in proc.stderr and "--overwrite=True" in proc.stderr
    assert (sorted(os.listdir(out)), losses_by_step(out)) == before


@pytest.mark.slow
def test_resume_refuses_a_model_key_set_to_its_default(shakespeare_dir, tmp_path):
    # linear is query_mode's default, but --query_mode=linear asks for it: a res_gelu run must not resume under it
    out = tmp_path / "out"
    train(shakespeare_dir, out, "--max_iters=2", "--eval_interval=2", "--query_mode=res_gelu")
    proc = train(shakespeare_dir, out, "--max_iters=4", "--init_from=resume", "--query_mode=linear", check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (f"error: {out}/ckpt.pt was trained with query_mode='res_gelu' but the config asks "
                                   f"for query_mode='linear'; use the run's own config to resume it")
    assert len(losses_by_step(out)) == 2


@pytest.mark.slow
def test_a_run_that_cannot_start_leaves_no_out_dir(tmp_path):
    out = tmp_path / "new" / "run"
    proc = run_script("train.py", *TINY, f"--data_dir={tmp_path / 'nodata'}", f"--out_dir={out}", check=False)
    assert proc.returncode == 1 and "train.bin not found" in proc.stderr
    assert not out.exists()  # it held only .lock


@pytest.mark.slow
def test_a_token_file_of_odd_size_is_named_as_truncated(shakespeare_dir, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(shakespeare_dir, data_dir, ignore=shutil.ignore_patterns("indices"))
    size = os.path.getsize(data_dir / "train.bin")
    with open(data_dir / "train.bin", "r+b") as f:
        f.truncate(size - 1)
    proc = train(data_dir, tmp_path / "out", "--max_iters=2", check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        f"error: {data_dir}/train.bin holds {size - 1:,} bytes, an odd number, so it is not a file of uint16 tokens "
        f"(2 bytes each): it is truncated or in another format. Recreate it with: python data/shakespeare/prepare.py")


@pytest.mark.slow
def test_ctrl_c_while_torch_loads_ends_with_one_line(tmp_path):
    # SIGINT once torch's library is mapped, i.e. mid-import: Python's own handler would print dozens of lines
    proc = subprocess.Popen([sys.executable, "train.py", *TINY, f"--out_dir={tmp_path / 'out'}"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and "libtorch" not in open(f"/proc/{proc.pid}/maps").read():
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert [line for line in (stdout + stderr).splitlines() if line] == ["train.py: interrupted (SIGINT); exiting"]
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------
# sampling


@pytest.mark.slow
def test_sample_from_checkpoint(shakespeare_dir, tmp_path):
    out = tmp_path / "out"
    train(shakespeare_dir, out, "--max_iters=2", "--eval_interval=2", "--query_mode=res_gelu")
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("ROMEO. But soft, what light")
    args = [f"--out_dir={out}", f"--start=FILE:{prompt}", "--num_samples=2", "--max_new_tokens=12", "--device=cpu"]
    first = run_script("sample.py", *args, "--seed=3")
    again = run_script("sample.py", *args, "--seed=3")
    other = run_script("sample.py", *args, "--seed=4")
    assert first.stdout.count("ROMEO. But soft, what light") == 2
    assert "query_mode=res_gelu" in first.stdout
    assert first.stdout == again.stdout and first.stdout != other.stdout
    # --init_from as train.py means it: 'resume' (the default) is the run in out_dir, and the run's directory as
    # a source is the same model
    for init_from in ("resume", out):
        assert run_script("sample.py", *args, "--seed=3", f"--init_from={init_from}").stdout == first.stdout
    missing = run_script("sample.py", f"--out_dir={tmp_path / 'nope'}", check=False)
    assert missing.returncode != 0 and "no checkpoint" in missing.stderr


@pytest.mark.parametrize("arg, status, message", [
    ("--start=FILE:{tmp}/missing.txt", 1, "error: cannot read the prompt file {tmp}/missing.txt: No such file or "
                                          "directory; pass --start=FILE:PATH of a text file, or the prompt itself"),
    ("--start=FILE:{tmp}", 1, "error: cannot read the prompt file {tmp}: Is a directory"),
    ("--temperature=-1", 2, "config error: temperature must be >= 0 (0 = greedy, always the most likely token), "
                            "got -1"),
    ("--top_k=-3", 2, "config error: top_k must be >= 0 (0 keeps every token), got -3"),
    ("--max_new_tokens=-5", 2, "config error: max_new_tokens must be >= 1, got -5"),
    ("--num_samples=0", 2, "config error: num_samples must be >= 1, got 0"),
], ids=["missing prompt file", "prompt file a directory", "temperature", "top_k", "max_new_tokens", "num_samples"])
def test_sample_refuses_bad_settings_before_loading(tmp_path, arg, status, message):
    # no checkpoint at --out_dir: each setting is refused before the model is looked for
    code, out, err = run_in_process("sample.py", f"--out_dir={tmp_path / 'none'}", arg.format(tmp=tmp_path))
    assert (code, out) == (status, "") and err.startswith(message.format(tmp=tmp_path)), err
    assert len(err.strip().splitlines()) == 1
