"""Every example command a user is shown, pasted as they would paste it: the lines starting with `python ` that each
program's --help prints (the root programs and data/*/prepare.py) and those in the fenced code blocks of README.md
and docs/*.md. Each one either exits 0 here, run by bash (globs and braces expanded) from a copy of the checkout's
root in a temporary directory, or is listed in EXCLUDED with why it cannot run on a CPU in seconds: a new example
fails this test until it does one or the other."""

import os
import re
import subprocess
import sys

import pytest

from helpers import REPO, run_in_process

# the programs whose --help is read (tests/test_help.py holds that each answers it)
PROGRAMS = sorted([f for f in os.listdir(REPO) if f.endswith(".py") and f != "model.py"]
                  + [os.path.join("data", d, "prepare.py") for d in os.listdir(os.path.join(REPO, "data"))
                     if os.path.isfile(os.path.join(REPO, "data", d, "prepare.py"))])
DOCS = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(REPO, "docs"))
                              if f.endswith(".md"))

# what the examples that use a trained run need, made first: a run of the quickstart's config shortened to 2 steps
# (the README trains it for 500, minutes), and the prompt file sample.py's example reads
SETUP = [
    "python train.py config/quickstart.py --max_iters=2 --eval_interval=2 --eval_iters=1 --diagnostics=False",
    "echo 'To be, or not to be' > prompt.txt",
]

# the examples that cannot run here, each with why; a stale entry (no longer an example) fails the test too
GPU = "the paper's model: a GPU, hours to days of training"
PAPER_RUNS = "needs the paper's runs (out-baseline, out-res-gelu, ...): days on GPUs"
MINI_RUNS = "needs the config/mini sweeps' runs (out-mini/...): an hour of CPU each"
EXCLUDED = {
    # training and launching
    "python train.py config/res_gelu.py": GPU,
    "python train.py config/baseline.py": GPU,
    "python train.py config/baseline.py --init_from=resume": GPU,
    "python train.py config/quickstart.py": "500 steps, minutes of CPU; SETUP runs it for 2 (tests/test_train.py "
                                            "holds the loss falling)",
    "python train.py config/res_gelu.py --eval_tasks=hellaswag --eval_tasks_limit=1000": GPU + ", and hellaswag "
                                                                                          "from the network",
    "python train.py config/quickstart.py --out_dir=out-quickstart-tasks --eval_tasks=example_mc "
    "--eval_tasks_include_path=tasks": "500 steps, minutes of CPU (tests/test_eval.py runs example_mc in training)",
    "python train.py config/baseline.py --init_from=gpt2 --query_mode=anchored_res_gelu --out_dir=out-gpt2-anchored":
        "GPT-2's weights from the Hugging Face hub (network), then a GPU",
    "python train.py config/mini/res_gelu.py --parametrization=mup --n_embd=256 --n_head=8": MINI_RUNS,
    "python sweep.py config/mini/res_gelu.py --grid learning_rate=1.5e-3,3e-3,6e-3 --grid seed=1,2,3":
        "nine runs of the mini config: hours of CPU",
    "python sweep.py config/mini/res_gelu.py --grid seed=1,2,3,4 --jobs=2": "four runs of the mini config: an hour",
    "python sweep.py config/mini/$arm.py --grid learning_rate=1.5e-3,3e-3,6e-3 --grid seed=1,2,3":
        "a line of a shell loop over $arm (docs/sweeps.md), hours of CPU",
    "python sweep.py config/res_gelu.py --grid seed=1,2,3 --launcher=slurm --gpus_per_run=8 --slurm_partition=gpu":
        "a SLURM cluster with GPUs",
    "python sweep.py config/res_gelu.py --grid seed=1,2,3 --gpus_per_run=8": GPU,
    "python sweep.py config/res_gelu.py --points config/official/res_gelu_grid.toml": GPU,
    "python sweep.py config/gpt3/medium_res_gelu.py --grid learning_rate=7.5e-4,1.5e-3,3e-3 --gpus_per_run=8": GPU,
    "python sweep.py --status out-mini/res_gelu": MINI_RUNS,
    "python study.py studies/ablations.toml": "the ablations' runs: days of CPU",
    "python study.py studies/long_horizon.toml": "the long-horizon runs: days of CPU",
    "python -m pytest -q -n 2 --dist loadgroup tests": "the whole suite, which holds this test",
    # data from the network
    "python data/openwebtext/prepare.py": "OpenWebText from the Hugging Face hub: network, tens of GB",
    "python data/openwebtext/prepare.py --input /path/to/openwebtext/*.parquet --num_proc 8":
        "a local copy of OpenWebText (tests/test_data.py runs --input on a small corpus)",
    "python data/openwebtext/prepare.py --input /datasets/openwebtext/*.parquet --num_proc 16":
        "a local copy of OpenWebText (tests/test_data.py runs --input on a small corpus)",
    # reading runs that take hours or days to make
    "python compare.py out-baseline out-res-gelu": PAPER_RUNS,
    "python compare.py sweeps/seeds --baseline=baseline": "needs a sweep of seeds in sweeps/seeds: GPU days",
    "python compare.py out-* --step=59000 --baseline=baseline --format=markdown": PAPER_RUNS,
    "python compare.py sweeps/lr --group_over=seed,data_seed --format=csv > lr.csv": "needs a learning-rate sweep "
                                                                                     "in sweeps/lr: GPU days",
    "python compare.py out-baseline out-res-gelu --plot=figure1.png": PAPER_RUNS,
    "python compare.py out-mini/* --best_over=learning_rate": MINI_RUNS,
    "python compare.py out-baseline out-res-gelu --metric=hellaswag/acc_norm": PAPER_RUNS,
    "python compare.py out-mini/res_gelu": MINI_RUNS,
    "python compare.py out-baseline out-mlp475 out-res-gelu --step=59000": PAPER_RUNS,
    "python compare.py out-mini/baseline out-mini/res_gelu --best_over=learning_rate --plot=fig1.png": MINI_RUNS,
    "python compare.py out-mini/baseline out-mini/mlp475 out-mini/res_gelu --best_over=learning_rate "
    "--plot=fig1.png": MINI_RUNS,
    "python compare.py /shared/ablations/* --select_on=seed=0": "a cluster's shared file system (docs/cluster.md)",
    "python analyze.py out-mini/baseline out-mini/res_gelu": MINI_RUNS,
    "python analyze.py out-diag/* --step=600 --format=markdown --plot=diag.png": "needs runs with diagnostics in "
                                                                                "out-diag/: hours of CPU",
    "python analyze.py --checkpoint=out-mini/res_gelu/learning_rate=3e-3,seed=1": MINI_RUNS,
    "python analyze.py --checkpoint=gpt2 --data_dir=data/openwebtext": "GPT-2 from the hub and OpenWebText",
    "python sample.py --out_dir=out-res-gelu --start=\"To be, or not to be\" --num_samples=3": PAPER_RUNS,
    "python sample.py --out_dir=out-res-gelu --start=\"The meaning of life is\" --num_samples=3": PAPER_RUNS,
    "python sample.py --init_from=gpt2 --start=\"Hello\"": "GPT-2's weights from the Hugging Face hub (network)",
    "python sample.py --init_from=gpt2 --start=\"The meaning of life is\"": "GPT-2's weights from the hub (network)",
    "python eval.py --init_from=out-res-gelu --tasks=hellaswag,arc_easy,piqa,lambada_openai":
        PAPER_RUNS + ", and the tasks' data from the network",
    "python eval.py --init_from=gpt2 --tasks=hellaswag --limit=1000 --batch_size=32 --output=gpt2_hellaswag.json":
        "GPT-2 and hellaswag from the Hugging Face hub (network)",
    "python export.py --out_dir=out-baseline --to=hf-baseline": PAPER_RUNS,
    "python -c \"from transformers import GPT2LMHeadModel; GPT2LMHeadModel.from_pretrained('hf-baseline')\"":
        "needs hf-baseline, the export of a paper's run (tests/test_pretrained.py round-trips a tiny one)",
    "python -m nonlinear_queries.weights.checkpoint --out_dir=out-gpt3-2p7b-res-gelu":
        "needs a sharded checkpoint of the 2.7B model: GPUs",
    "python analyze.py --coord_check=config/mini/res_gelu.py --plot=coord.png":
        "the coordinate check, widths 64 to 512: minutes of CPU (tests/test_width.py holds it)",
    # benchmarks
    "python bench/train_speed.py": "a benchmark: minutes of timed steps",
    "python bench/sample_speed.py": "a benchmark: minutes of timed generation",
    "python bench/data_speed.py": "a benchmark: minutes of timed tokenization",
    "python bench/train_speed.py --size=gpt2 --compile --device=cuda": "a GPU",
    "python bench/train_speed.py --size=gpt2 --compile --device=cuda --splits=12x40,48x10 --plain --profile":
        "a GPU",
    "python bench/gpu.py --out=out-gpu/check": "a GPU",
}


def command(line):
    """An example line as the key of EXCLUDED: its trailing `# comment` dropped (no example has ' #' quoted)."""
    return re.sub(r"\s+#.*$", "", line.strip())


def help_examples():
    """{command: where} of the example lines each program's --help prints."""
    examples = {}
    for program in PROGRAMS:
        code, out, err = run_in_process(program, "--help")
        assert code == 0, f"{program} --help: {err}"
        for line in out.splitlines():
            if line.strip().startswith("python "):
                examples.setdefault(command(line), f"{program} --help")
    return examples


def doc_examples():
    """{command: where} of the lines starting with `python ` in the fenced code blocks of README.md and docs/."""
    examples = {}
    for doc in DOCS:
        with open(os.path.join(REPO, doc)) as f:
            blocks = re.findall(r"^ *```[^\n]*\n(.*?)^ *```", f.read(), re.S | re.M)  # in a list item too
        for block in blocks:
            for line in block.replace("\\\n", " ").splitlines():
                if line.strip().startswith("python "):
                    examples.setdefault(command(line), doc)
    return examples


def workspace(tmp_path):
    """A copy of the checkout's root to run the examples in: every top-level entry a link to the repo's, but data/,
    whose prepare scripts are linked into directories of its own (they write beside themselves), so nothing an
    example writes lands in the repo."""
    root = tmp_path / "checkout"
    root.mkdir()
    for name in os.listdir(REPO):
        if name not in ("data", ".git") and not name.startswith(("out-", ".")):
            os.symlink(os.path.join(REPO, name), root / name)
    for name in os.listdir(os.path.join(REPO, "data")):
        script = os.path.join(REPO, "data", name, "prepare.py")
        if os.path.isfile(script):
            (root / "data" / name).mkdir(parents=True)
            os.symlink(script, root / "data" / name / "prepare.py")
    return root


def git_status():
    return subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=all"], capture_output=True,
                          text=True, check=True).stdout


@pytest.mark.slow
def test_every_example_command_runs_or_is_excluded_with_its_reason(tmp_path):
    examples = {**doc_examples(), **help_examples()}
    stale = sorted(set(EXCLUDED) - set(examples))
    assert not stale, f"EXCLUDED lists commands that no --help or doc shows any more: {stale}"
    runnable = [c for c in examples if c not in EXCLUDED]
    # the data first (the others read it), then what the others need, then the rest in the order they are shown
    prepares = [c for c in runnable if "prepare.py" in c]
    root, before = workspace(tmp_path), git_status()
    env = {**os.environ, "PYTHONPATH": REPO, "WANDB_MODE": "offline", "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    failed = []
    for line in [*prepares, *SETUP, *(c for c in runnable if c not in prepares)]:
        # `python` is this interpreter, as in the user's virtual environment
        proc = subprocess.run(["bash", "-c", re.sub(r"^python ", f"{sys.executable} ", line)], cwd=root, env=env,
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            failed.append(f"{line}  ({examples.get(line, 'SETUP')}): exit {proc.returncode}\n{proc.stderr[-2000:]}")
    assert not failed, "\n\n".join(failed)
    assert len(runnable) >= 15
    assert git_status() == before  # nothing written into the checkout
