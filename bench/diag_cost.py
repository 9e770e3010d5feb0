"""
Cost of the per-layer diagnostics (diagnostics.py) against one evaluation, measured side by side.

    OMP_NUM_THREADS=1 python bench/diag_cost.py            # GPT-2 small with config/baseline.py's evaluation
    python bench/diag_cost.py --device=cuda --compile --rounds=10

train.py evaluates on 2 splits x eval_iters fixed batches (config/baseline.py: 2 x 200 batches of 12 x 1024
tokens) and then, by default, runs the diagnostics on 1 of the val batches. An evaluation of GPT-2 small
takes hours on one CPU thread, so each round times training.evaluate (the function train.py calls) over
--eval_batches batches per split, and diagnostics.diagnose over --diag_batches batches, in turns (A B B A),
on random tokens, after one untimed call of each. Columns:

- eval s/batch: median over rounds of the evaluate time / (2 x eval_batches)
- diag s: median over rounds of the diagnostics' time (the weight norms' SVDs included)
- diag / eval batch: median over rounds of the ratio within the round
- diag / evaluation: the same ratio over a whole evaluation, 2 x eval_iters batches of the config; the target
  is below 5% on the CPU (docs/diagnostics.md)
"""

import statistics
from types import SimpleNamespace

import numpy as np
import torch

from common import REPO, command_line, header, interleaved, paired_ratio, parser, query_modes, resolve_device
from model import GPT, GPTConfig
from nonlinear_queries.config.configurator import read_config_file
from nonlinear_queries.evaluation.diagnostics import diagnose
from nonlinear_queries.trainer.training import evaluate

SIZE_KEYS = ("n_layer", "n_head", "n_embd", "block_size", "vocab_size", "batch_size", "eval_iters")


def main():
    p = parser(__doc__.split("\n\n")[1].strip())
    p.add_argument("--config", default=f"{REPO}/config/baseline.py",
                   help="the config whose model and evaluation (batch_size, eval_iters) are measured")
    for key in SIZE_KEYS:
        p.add_argument(f"--{key}", type=int, default=0, help="override the config's")
    p.add_argument("--modes", default="linear,res_gelu", help="comma-separated query modes")
    p.add_argument("--eval_batches", type=int, default=1, help="evaluation batches per split timed per round")
    p.add_argument("--diag_batches", type=int, default=1, help="batches of the diagnostics (diagnostics_batches)")
    p.add_argument("--rounds", type=int, default=0, help="timed rounds (default 4 on CPU, 10 on CUDA)")
    args = p.parse_args()
    modes = query_modes(p, args)
    device, dtype, autocast = resolve_device(args)
    rounds = args.rounds or (10 if device.startswith("cuda") else 4)
    cfg = read_config_file(args.config)
    size = {k: getattr(args, k) or cfg.get(k, getattr(GPTConfig, k, None)) for k in SIZE_KEYS}
    B, T = size["batch_size"], size["block_size"]

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, min(size["vocab_size"], 50257), size=max(10 * B * T, 100_000)).astype(np.uint16)
    index = rng.integers(0, len(tokens) - T, size=(max(args.eval_batches, args.diag_batches), B))
    splits = {"train": (tokens, index[:args.eval_batches]), "val": (tokens, index[:args.eval_batches])}
    one_process = SimpleNamespace(rank=0, world_size=1, distributed=False, master=True)
    rows = []
    for mode in modes:
        torch.manual_seed(0)
        model = GPT(GPTConfig(**{k: size[k] for k in SIZE_KEYS[:5]}, query_mode=mode)).to(device)
        compiled = torch.compile(model) if args.compile else model
        fns = {"eval": lambda: evaluate(compiled, splits, T, device, autocast, one_process),
               "diag": lambda: diagnose(model, tokens, index[:args.diag_batches], T, device, autocast)}
        for fn in fns.values():
            fn()
        times = interleaved(fns, rounds, device)
        per_batch = statistics.median(t / (2 * args.eval_batches) for t in times["eval"])
        to_batch = paired_ratio(times, "diag", "eval") * 2 * args.eval_batches
        rows.append((mode, per_batch, statistics.median(times["diag"]), to_batch, to_batch / (2 * size["eval_iters"])))

    print(header(f"Diagnostics against one evaluation: {size['n_layer']} layers, d={size['n_embd']}, block {T}, "
                 f"evaluation 2 x {size['eval_iters']} batches of {B} sequences; timed per round: "
                 f"{2 * args.eval_batches} eval batches, diagnostics on {args.diag_batches}; {rounds} rounds",
                 device, dtype, args.compile, command_line()))
    print("| query_mode | eval s/batch | diag s | diag / eval batch | diag / evaluation |")
    print("|---|---|---|---|---|")
    for mode, per_batch, diag, to_batch, to_eval in rows:
        print(f"| {mode} | {per_batch:.3f} | {diag:.3f} | {to_batch:.3f} | {100 * to_eval:.2f}% |")


if __name__ == "__main__":
    main()
