"""Downstream evaluation (downstream.py, eval.py, train.py's eval_tasks) on tasks this file writes as local jsonl +
YAML, with a tiny model: the adapter's scores against the model's log-probabilities computed token by token, batch
sizes, stop strings, the errors a user meets, and tasks run during training. No network: HF_*_OFFLINE is set
(conftest.py), and the unreachable hub is a closed local port."""

import json
import os
import shlex
import socket
import subprocess
import sys
import time

import lm_eval
import numpy as np
import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.tasks import TaskManager

from eval_tasks import MC_YAML, MULTIPLE_CHOICE, TEXT_YAML, TEXTS, write_task
from helpers import (
    ONE_THREAD,
    REPO,
    TINY,
    losses_by_step,
    patched_train,
    read_metrics,
    run_in_process,
    run_script,
    train,
    val_losses_by_step,
)
from model import GPT, GPTConfig
from nonlinear_queries.data.tokenizer import GPT2Tokenizer
from nonlinear_queries.evaluation.downstream import GPTLM, TasksStopped
from nonlinear_queries.weights.pretrained import export

BLOCK = 16  # the test model's block_size: the long contexts and texts below need several windows of it


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny res_gelu GPT (GPT-2 vocabulary, block_size BLOCK) exported to a directory, and a directory of the two
    local tasks. Returns (model, model_dir, tasks_dir)."""
    root = tmp_path_factory.mktemp("eval")
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=BLOCK, query_mode="res_gelu")).eval()
    export(model, str(root / "model"))
    write_task(root / "tasks", "tiny_mc", MC_YAML, MULTIPLE_CHOICE)
    write_task(root / "tasks", "tiny_text", TEXT_YAML, TEXTS)
    return model, str(root / "model"), str(root / "tasks")


@torch.no_grad()
def logprob(model, tokens, start, j):
    """log P(tokens[j] | tokens[start:j]), from one forward pass over tokens[start:j]."""
    logits, _ = model(torch.tensor([tokens[start:j]]))
    return torch.log_softmax(logits[0, -1], dim=-1)[tokens[j]].item()


def direct_loglikelihood(model, enc, context, continuation):
    """log P(continuation | context) token by token: the continuation's tokens are those of context + continuation
    after context's, and the input is cut from the left to the last BLOCK tokens before the final one."""
    tokens, n_context = enc.encode(context + continuation), len(enc.encode(context))
    start = max(0, len(tokens) - 1 - BLOCK)
    return sum(logprob(model, tokens, start, j) for j in range(n_context, len(tokens)))


def direct_rolling(model, enc, text):
    """log P(text | end-of-text) token by token in lm-eval's windows: the text's tokens in consecutive blocks of
    BLOCK, each token conditioned on its block's earlier tokens only, the last block on the BLOCK tokens before
    its end."""
    tokens = [enc.eot_token] + enc.encode(text)  # tokens[i + 1] is the text's token i
    n, total = len(tokens) - 1, 0.0
    for first in range(0, n, BLOCK):
        last = min(first + BLOCK, n)  # this block predicts the text's tokens first .. last - 1
        total += sum(logprob(model, tokens, max(0, last - BLOCK), i + 1) for i in range(first, last))
    return total


def test_scores_equal_direct_computation(assets):
    model, model_dir, tasks_dir = assets
    enc = GPT2Tokenizer()
    results = lm_eval.simple_evaluate(
        model="nonlinear-queries", model_args={"pretrained": model_dir, "batch_size": 3, "device": "cpu"},
        tasks=["tiny_mc", "tiny_text"], task_manager=TaskManager(include_path=tasks_dir, include_defaults=False),
        log_samples=True, bootstrap_iters=0)

    # multiple choice: each choice's loglikelihood, then the argmax accuracies by hand
    direct = [[direct_loglikelihood(model, enc, doc["query"], " " + choice) for choice in doc["choices"]]
              for doc in MULTIPLE_CHOICE]
    samples = sorted(results["samples"]["tiny_mc"], key=lambda s: s["doc_id"])
    assert [[ll for ll, _ in s["filtered_resps"]] for s in samples] == [pytest.approx(d, abs=1e-4) for d in direct]
    gold = [doc["label"] for doc in MULTIPLE_CHOICE]
    acc = np.mean([np.argmax(d) == g for d, g in zip(direct, gold)])
    acc_norm = np.mean([np.argmax(np.array(d) / [len(c) for c in doc["choices"]]) == g
                        for d, g, doc in zip(direct, gold, MULTIPLE_CHOICE)])
    assert results["results"]["tiny_mc"]["acc,none"] == acc
    assert results["results"]["tiny_mc"]["acc_norm,none"] == acc_norm
    assert 0 < acc < 1 or 0 < acc_norm < 1  # the untrained model is right on some and wrong on others

    # rolling loglikelihood of a short text and of one several blocks long
    assert len(enc.encode(TEXTS[1]["text"])) > 2 * BLOCK
    samples = sorted(results["samples"]["tiny_text"], key=lambda s: s["doc_id"])
    assert [s["filtered_resps"][0] for s in samples] == [pytest.approx(direct_rolling(model, enc, t["text"]), abs=1e-4)
                                                      for t in TEXTS]


def doc_command(name):
    """The argv (after `python eval.py`) of the command in docs/evaluation.md that runs the task `name`."""
    with open(os.path.join(REPO, "docs", "evaluation.md")) as f:
        lines = [line for line in f if line.startswith("python eval.py") and f"--tasks={name} " in line]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])[2:]


def test_the_docs_command_runs_the_shipped_example_task(assets, tmp_path, monkeypatch):
    model, model_dir, _ = assets
    with open(os.path.join(REPO, "tasks", "example_mc.jsonl")) as f:
        docs = [json.loads(line) for line in f]
    # the command as docs/evaluation.md gives it, from the repo's root, on the tiny model instead of out-quickstart
    argv = [a if not a.startswith("--init_from=") else f"--init_from={model_dir}" for a in doc_command("example_mc")]
    monkeypatch.chdir(REPO)
    code, out, err = run_in_process("eval.py", *argv, f"--output={tmp_path / 'results.json'}")
    assert code == 0, err
    assert f"{len(docs)} examples in" in out
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["n-samples"]["example_mc"] == {"original": len(docs), "effective": len(docs)}
    # the accuracies are those of the model's own log-likelihoods of each ending
    enc = GPT2Tokenizer()
    direct = [[direct_loglikelihood(model, enc, doc["query"], " " + c) for c in doc["choices"]] for doc in docs]
    gold = [doc["label"] for doc in docs]
    acc = np.mean([np.argmax(d) == g for d, g in zip(direct, gold)])
    acc_norm = np.mean([np.argmax(np.array(d) / [len(c) for c in doc["choices"]]) == g
                        for d, g, doc in zip(direct, gold, docs)])
    assert results["results"]["example_mc"]["acc,none"] == pytest.approx(acc, abs=1e-12)
    assert results["results"]["example_mc"]["acc_norm,none"] == pytest.approx(acc_norm, abs=1e-12)
    assert 1 <= len(docs) * acc <= len(docs) - 1  # right on some and wrong on others: the comparison means something
    # four endings each, the label one of them
    assert len(docs) >= 30 and all(len(doc["choices"]) == 4 and 0 <= doc["label"] < 4 for doc in docs)
    # the YAML the page shows is the shipped one, its comment aside
    with open(os.path.join(REPO, "tasks", "example_mc.yaml")) as f:
        shipped = "".join(line for line in f if not line.startswith("#"))
    with open(os.path.join(REPO, "docs", "evaluation.md")) as f:
        assert f"```yaml\n{shipped}```" in f.read()


def test_batch_sizes_agree(assets):
    _, model_dir, _ = assets
    pairs = [(doc["query"], " " + choice) for doc in MULTIPLE_CHOICE for choice in doc["choices"]]
    choices = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    texts = [Instance("loglikelihood_rolling", {}, (t["text"],), i) for i, t in enumerate(TEXTS)]
    one, eight = (GPTLM(model_dir, batch_size=b, device="cpu", progress=False) for b in (1, 8))
    assert [ll for ll, _ in one.loglikelihood(choices)] == pytest.approx([ll for ll, _ in eight.loglikelihood(choices)],
                                                                         abs=1e-4)
    assert one.loglikelihood_rolling(texts) == pytest.approx(eight.loglikelihood_rolling(texts), abs=1e-4)


def test_generate_until_stops_at_stop_string(assets):
    model, model_dir, _ = assets
    lm, enc = GPTLM(model_dir, device="cpu", progress=False), GPT2Tokenizer()
    context = "The baker opened the oven and"
    prompt = enc.encode(context)
    with torch.no_grad():
        greedy = enc.decode(model.generate(torch.tensor([prompt]), 40, temperature=0)[0, len(prompt):].tolist())
    stop = greedy[len(greedy) // 2 : len(greedy) // 2 + 2]
    expected = greedy[: greedy.index(stop)]
    assert 0 < len(expected) < len(greedy)
    requests = [Instance("generate_until", {}, (context, {"until": [stop], "max_gen_toks": 40}), 0),
                Instance("generate_until", {}, (context, {"until": ["no such text"], "max_gen_toks": 40}), 1)]
    assert lm.generate_until(requests) == [expected, greedy]


def test_a_stop_request_gives_the_tasks_up_before_the_next_batch(assets):
    _, model_dir, _ = assets
    pairs = [(doc["query"], " " + choice) for doc in MULTIPLE_CHOICE for choice in doc["choices"]]
    choices = [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)]
    asked = []

    def stop_after_two_batches():
        asked.append(None)
        return len(asked) > 2

    lm = GPTLM(model_dir, batch_size=1, device="cpu", progress=False, should_stop=stop_after_two_batches)
    with pytest.raises(TasksStopped):
        lm.loglikelihood(choices)
    assert len(asked) == 3 < len(choices)  # two batches ran, the third was never started
    generate = [Instance("generate_until", {}, ("The baker", {"until": ["."], "max_gen_toks": 4}), 0)]
    with pytest.raises(TasksStopped):
        lm.generate_until(generate)


def closed_port():
    """A local port that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["unknown task", "missing file", "unreachable hub"])
def test_task_errors(assets, tmp_path, case):
    _, model_dir, _ = assets
    env, args = {}, ["--tasks=tiny_mc", f"--include_path={tmp_path}"]
    if case == "unknown task":
        args, message = ["--tasks=hellaswg"], "unknown task 'hellaswg' (did you mean hellaswag"
    elif case == "missing file":
        write_task(tmp_path, "tiny_mc", MC_YAML, [], data_path=tmp_path / "gone.jsonl")
        message = f"a task's data was not found: Unable to find '{tmp_path / 'gone.jsonl'}'"
    else:  # a task on a hub data set, with the hub at a closed port and no offline mode asked for
        (tmp_path / "tiny_mc.yaml").write_text(MC_YAML.replace("json", "someone/hub_only_data").format(path="x"))
        hub = f"http://127.0.0.1:{closed_port()}"
        env = {"HF_HUB_OFFLINE": "", "HF_DATASETS_OFFLINE": "", "HF_ENDPOINT": hub}
        message = f"a task's data is on the Hugging Face hub, which does not answer at {hub}"
    t0 = time.time()
    proc = run_script("eval.py", f"--init_from={model_dir}", "--device=cpu", *args, check=False, env=env)
    assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    if case == "unreachable hub":
        assert "dataset_path: json" in proc.stderr  # how to use a local copy instead
        assert time.time() - t0 < 30  # no retries against the hub (datasets retries for ~25 s)


@pytest.mark.parametrize("init_from", ["resume", "scratch"])
def test_train_pys_own_init_from_is_refused_naming_what_eval_takes(init_from):
    # init_from means one thing in train.py, sample.py and eval.py; eval.py, with no out_dir, takes no 'resume'
    code, out, err = run_in_process("eval.py", f"--init_from={init_from}", "--tasks=hellaswag")
    assert (code, out) == (2, "") and err == (f"config error: init_from={init_from!r} is train.py's; eval.py has no "
                                              f"out_dir: name the run's directory itself, e.g. "
                                              f"--init_from=out-quickstart, or a pretrained model\n"), err


@pytest.mark.slow
def test_eval_tasks_during_training(shakespeare_dir, assets, tmp_path):
    _, _, tasks_dir = assets
    args = ["--max_iters=3", "--eval_interval=2"]
    train(shakespeare_dir, tmp_path / "plain", *args, env=ONE_THREAD)
    out = train(shakespeare_dir, tmp_path / "tasks", *args, "--eval_tasks=tiny_mc", "--eval_tasks_interval=2",
                f"--eval_tasks_include_path={tasks_dir}", env=ONE_THREAD).stdout
    records = read_metrics(tmp_path / "tasks", "downstream")
    assert [(r["step"], r["task"]) for r in records] == [(0, "tiny_mc"), (2, "tiny_mc"), (3, "tiny_mc")]
    assert all(set(r) == {"type", "step", "task", "acc", "acc_norm", "examples"} for r in records)
    assert all(r["examples"] == len(MULTIPLE_CHOICE) for r in records)
    assert "step 3: tiny_mc: acc " in out
    # the tasks leave training alone: the same losses, bit for bit
    assert losses_by_step(tmp_path / "tasks") == losses_by_step(tmp_path / "plain")
    assert val_losses_by_step(tmp_path / "tasks") == val_losses_by_step(tmp_path / "plain")
    # and compare.py puts the score beside val loss
    table = run_script("compare.py", str(tmp_path / "tasks"), "--metric=tiny_mc/acc", "--format=csv").stdout
    header, row = [line.split(",") for line in table.splitlines()[:2]]
    assert float(dict(zip(header, row))["tiny_mc/acc_mean"]) == records[-1]["acc"]


@pytest.mark.slow
def test_eval_tasks_under_torchrun_keep_the_other_ranks_waiting(shakespeare_dir, assets, tmp_path):
    # The process group's time-out cut to 8 s (NCCL's is 10 minutes), and rank 0's first task run made to take
    # 12 s: a rank that went on to the next step's all-reduce while rank 0 evaluates would time out there.
    _, _, tasks_dir = assets
    script = patched_train(tmp_path / "train_slow_tasks.py", "\n".join([
        "import datetime, time",
        "import torch.distributed.distributed_c10d as c10d",
        "from nonlinear_queries.evaluation import downstream",
        "c10d.default_pg_timeout = datetime.timedelta(seconds=8)",
        "run_tasks, calls = downstream.run_tasks, []",
        "def slow_run_tasks(*args, **kwargs):",
        "    calls.append(time.sleep(12) if not calls else None)",
        "    return run_tasks(*args, **kwargs)",
        "downstream.run_tasks = slow_run_tasks"]))
    out = tmp_path / "two"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script,
                           *TINY, f"--data_dir={shakespeare_dir}", f"--out_dir={out}", "--max_iters=3",
                           "--eval_interval=2", "--batch_size=2", "--gradient_accumulation_steps=2",
                           "--eval_tasks=tiny_mc", f"--eval_tasks_include_path={tasks_dir}"],
                          cwd=REPO, env={**os.environ, **ONE_THREAD}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "x 2 processes (gloo)" in proc.stdout
    records = read_metrics(out, "downstream")  # rank 0's alone
    assert [(r["step"], r["task"], r["examples"]) for r in records] == [(s, "tiny_mc", len(MULTIPLE_CHOICE))
                                                                        for s in (0, 2, 3)]
    assert sorted(losses_by_step(out)) == [1, 2, 3]
