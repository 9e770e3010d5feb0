"""
Sweep throughput: `sweep.py --launcher=local --jobs=N` against `--jobs=1` on the same grid.

    python bench/sweep_speed.py                          # 4 points, jobs 1 and 2, three rounds
    python bench/sweep_speed.py --jobs=1,2,4 --rounds=3  # a bigger machine

Each round runs the grid once per --jobs value into a fresh directory, in turn (the order
reversed every other round, so a slowdown of a shared machine falls on each alike), from the
prepared Shakespeare tokens, with OMP_NUM_THREADS unset so sweep.py gives each point cores / N
threads. The wall time covers the whole sweep: process starts, data loading, training,
evaluations and checkpoints. Ratio: the median over rounds of (wall time with N jobs) /
(wall time with 1 job) of the same round.
"""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from common import REPO, command_line, header, parser


def run_sweep(args, data_dir, sweep_dir, jobs):
    """Seconds of one sweep.py run of the grid with `jobs` points at a time."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    seeds = ",".join(str(s) for s in range(1, args.points + 1))
    cmd = [sys.executable, os.path.join(REPO, "sweep.py"), "--dataset=shakespeare", "--device=cpu", "--compile=False",
           f"--data_dir={data_dir}", f"--n_layer={args.n_layer}", f"--n_head={args.n_head}", f"--n_embd={args.n_embd}",
           f"--block_size={args.block_size}", f"--batch_size={args.batch_size}", "--gradient_accumulation_steps=1",
           f"--max_iters={args.max_iters}", f"--eval_interval={args.max_iters // 2}", "--eval_iters=2",
           "--log_interval=10", "--diagnostics=False", f"--sweep_dir={sweep_dir}", "--grid", f"seed={seeds}",
           f"--jobs={jobs}"]
    start = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=REPO, check=True, capture_output=True, text=True)
    return time.perf_counter() - start


def main():
    p = parser(__doc__, model=False)
    p.add_argument("--jobs", default="1,2", help="the --jobs values to compare, the first the reference")
    p.add_argument("--points", type=int, default=4, help="grid points (seeds)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max_iters", type=int, default=40)
    p.add_argument("--n_layer", type=int, default=2)
    p.add_argument("--n_head", type=int, default=2)
    p.add_argument("--n_embd", type=int, default=32)
    p.add_argument("--block_size", type=int, default=32)
    p.add_argument("--batch_size", type=int, default=4)
    args = p.parse_args()
    jobs = [int(j) for j in args.jobs.split(",")]
    work = tempfile.mkdtemp(prefix="sweep_speed")
    try:
        data_dir = os.path.join(work, "shakespeare")
        subprocess.run([sys.executable, os.path.join(REPO, "data/shakespeare/prepare.py"), f"--out_dir={data_dir}",
                        "--num_proc=1"], cwd=REPO, check=True, capture_output=True)
        times = {j: [] for j in jobs}
        t0 = time.perf_counter()
        for r in range(args.rounds):
            for j in (jobs if r % 2 == 0 else jobs[::-1]):
                times[j].append(run_sweep(args, data_dir, os.path.join(work, f"r{r}-j{j}"), j))
        print(header(f"Sweep wall time: {args.points} points of {args.max_iters} steps ({args.n_layer} x "
                     f"{args.n_embd}, block {args.block_size}, {args.batch_size} sequences), {args.rounds} round(s), "
                     f"{len(os.sched_getaffinity(0))} cores", "cpu", "float32", False, command_line()))
        print(f"| --jobs | wall s (median) | vs --jobs={jobs[0]} |")
        print("|---|---|---|")
        for j in jobs:
            ratio = statistics.median(a / b for a, b in zip(times[j], times[jobs[0]]))
            print(f"| {j} | {statistics.median(times[j]):.1f} | {ratio:.3f} |")
        print(f"\nWall time {time.perf_counter() - t0:.0f} s.")
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
