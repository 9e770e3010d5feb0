"""
Training memory per process: estimated for every size, measured beside the estimate at a tiny size.

    python bench/memory.py                       # GPT-2 small and the GPT-3 configs on 80 GB GPUs, 8 per node
    python bench/memory.py --world_size=16 --gpu_gib=139.8 --batch_size=16    # another cluster, micro-batch
    python bench/memory.py --measure             # and the tiny model measured on this CPU beside its estimate

For each config (config/baseline.py and config/gpt3/*.py by default) and each way to train
it (DDP, FSDP over --world_size processes, each with and without activation checkpointing),
the estimated peak of one process in GiB, at the config's micro-batch (batch_size x
block_size tokens; --batch_size overrides it), bf16 autocast on CUDA as train.py runs it.
A process's peak is the larger of two moments of a step (gradients are freed between steps):

- end of the forward pass: weights + optimizer states + the activations autograd saved for
  the backward pass + the LM head's logits + the weight copies of the forward pass;
- end of the backward pass: weights + optimizer states + gradients (+ DDP's buckets).

What each part costs, in bytes:

- weights 4 per parameter (float32), gradients 4, optimizer states 8 (AdamW's two moments;
  Muon keeps 4, its momentum, for the blocks' matrices). DDP keeps all of them in every
  process, and a second copy of the gradients in its all-reduce buckets (W > 1). FSDP keeps
  1/W of each, plus the weights it gathers for the units at work: the root unit (embeddings,
  final norm, LM head) for the whole step and up to two blocks (one computing, one
  prefetched), in float32 (autocast casts them as under DDP, processes.parallelize); and while a
  unit's gradients are reduce-scattered, those gradients unsharded and their copy in the
  reduce-scatter's buffer.
- activations: counted, not modelled: one Block of the config at its real width runs a
  forward pass on the CPU (at 16 and 32 tokens, so the bytes per token and the constant part
  separate) under torch.autograd.graph.saved_tensors_hooks, and every tensor it saves for the
  backward pass that is not a parameter is added up once per storage; with bf16 autocast as on
  CUDA, the same under DDP and FSDP (a block computes the same either way). The constant part
  is the weight copies a forward pass makes (autocast's bfloat16 casts, the fused input
  projection's stacked matrix). Times n_layer; with activation checkpointing
  each block keeps only its input, and one block's activations exist again while its
  backward recomputes them (Chen et al. 2016).
- the LM head: per token, the final norm's input and output, then 12 bytes per vocabulary
  entry: the log-softmax output that cross-entropy saves, and in the backward pass its
  gradient and the logits' gradient, all float32.

Not counted: the CUDA context and the allocator's cache and fragmentation (hence "fits"
means at most 90 % of --gpu_gib), torch.compile's workspace, and the optimizer step's
temporaries (the fused AdamW of CUDA has none).

--measure runs the tiny model (--tiny_*) for two steps in a fresh process per setting
(torchrun for FSDP), on this CPU in float32, and prints each process's measured peak beside
the estimate for the same setting: the bytes of the weights and optimizer states before the
second step (counted) plus the resident memory's peak above its level at that moment during
that step (/proc/self/status VmHWM, reset through /proc/self/clear_refs), with glibc's
malloc set to hand every block above 64 KiB back to the system when it is freed.
"""

import argparse
import json
import os
import subprocess
import sys

import torch

from common import REPO, command_line, header, parser, proc_status_kib
from model import GPT, Block
from nonlinear_queries.config.configurator import read_config_file
from nonlinear_queries.config.train_config import TrainConfig

GIB = 2**30


def config_of(path, **overrides):
    """The TrainConfig of a config file (its model and batch settings), with overrides."""
    values = {k: v for k, v in read_config_file(path).items() if not k.startswith("_")}
    return TrainConfig(**{**values, **overrides})


def block_activations(mcfg, bf16):
    """(bytes per token, constant bytes) that one Block of `mcfg` saves for its backward pass:
    counted on the CPU at 16 and 32 tokens (see the module docstring). bf16: bfloat16 autocast
    (CUDA's training)."""
    torch.manual_seed(0)
    block = Block(mcfg)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    totals = []
    for tokens in (16, 32):
        seen = {}

        def pack(t):
            storage = t.untyped_storage()
            if storage.data_ptr() not in params:
                seen[storage.data_ptr()] = storage.nbytes()
            return t

        x = torch.randn(1, tokens, mcfg.n_embd, requires_grad=True)  # the residual stream: float32
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            block(x)
        totals.append(sum(seen.values()))
    per_token = (totals[1] - totals[0]) / 16
    return per_token, totals[0] - 16 * per_token


def estimate(cfg, parallelism, world_size, checkpointing, bf16, activations=None):
    """{part: bytes} of one process's training step (module docstring) and 'peak', for the
    TrainConfig cfg trained with `parallelism` ('ddp' or 'fsdp') over world_size processes,
    with activation checkpointing or not; bf16: CUDA's bfloat16 autocast (else float32 as on
    the CPU). activations: block_activations' result, computed here if not given."""
    mcfg = cfg.model_config()
    with torch.device("meta"):
        model = GPT(mcfg)
    n_params = model.get_num_params(non_embedding=False)
    block_params = sum(p.numel() for p in model.transformer.h[0].parameters())
    root_params = n_params - mcfg.n_layer * block_params
    muon = sum(p.numel() for p in model.transformer.h.parameters() if p.dim() == 2) if cfg.optimizer == "muon" else 0
    states = 8 * (n_params - muon) + 4 * muon
    sharded = parallelism == "fsdp"
    per_token, constant = activations or block_activations(mcfg, bf16)
    tokens = cfg.batch_size * cfg.block_size
    d, vocab = mcfg.n_embd, mcfg.vocab_size
    head = tokens * (4 * d + (2 if bf16 else 4) * d + 12 * vocab)
    if checkpointing:  # each block keeps its input; one block's activations exist again in its backward,
        # which comes after the head's, whose buffers are freed by then
        activations = mcfg.n_layer * 4 * d * tokens + max(
            per_token * tokens + constant, head)
    else:
        activations = mcfg.n_layer * (per_token * tokens + constant) + head
    if sharded:
        shard = 1 / world_size
        parts = {"weights": 4 * n_params * shard, "optimizer states": states * shard,
                 "gathered weights": 4 * (root_params + 2 * block_params), "activations": activations}
        forward_end = sum(parts.values()) + 4 * root_params  # + the root's first gradients (the LM head's)
        parts["gradients"] = 4 * n_params * shard + 8 * max(root_params, block_params)
        backward_end = parts["weights"] + parts["optimizer states"] + parts["gradients"] + 4 * root_params
    else:
        parts = {"weights": 4 * n_params, "optimizer states": states, "activations": activations}
        forward_end = sum(parts.values()) + 4 * root_params
        parts["gradients"] = 4 * n_params * (2 if world_size > 1 else 1)  # DDP's buckets: a second copy
        backward_end = parts["weights"] + parts["optimizer states"] + parts["gradients"]
    parts["peak"] = max(forward_end, backward_end)
    return parts


# in the order "fits with" tries them: no recomputation before recomputation (activation checkpointing
# costs about a third more compute), no sharding before sharding
SETTINGS = [("DDP", "ddp", False), ("FSDP", "fsdp", False), ("DDP + AC", "ddp", True), ("FSDP + AC", "fsdp", True)]
GPT3_SIZES = ["medium", "large", "xl", "2p7b"]


def how_it_fits(peaks, budget):
    """The first setting, in SETTINGS' order, whose peak is within budget."""
    return next((name for name, peak in peaks.items() if peak <= budget), "none")


def estimate_table(paths, args):
    budget = 0.9 * args.gpu_gib * GIB
    w = args.world_size
    print(f"| config | params | micro-batch | DDP | FSDP x {w} | DDP + AC | FSDP x {w} + AC | fits on {args.gpu_gib:g} "
          f"GiB with |")
    print("|---|---|---|---|---|---|---|---|")
    for path in paths:
        overrides = {"batch_size": args.batch_size} if args.batch_size else {}
        cfg = config_of(path, **overrides)
        activations = block_activations(cfg.model_config(), True)
        peaks = {name: estimate(cfg, parallelism, args.world_size, checkpointing, True, activations)["peak"]
                 for name, parallelism, checkpointing in SETTINGS}
        with torch.device("meta"):
            n_params = GPT(cfg.model_config()).get_num_params(non_embedding=False)
        name = os.path.relpath(path, os.path.join(REPO, "config"))[:-3]
        cells = [name, f"{n_params / 1e6:,.0f}M", f"{cfg.batch_size} x {cfg.block_size}",
                 *(f"{peak / GIB:.1f}" for peak in peaks.values()), how_it_fits(peaks, budget)]
        print("| " + " | ".join(cells) + " |")


def tiny_config(args):
    return TrainConfig(n_layer=args.tiny_layers, n_head=args.tiny_heads, n_embd=args.tiny_embd,
                       block_size=args.tiny_block, batch_size=args.tiny_batch, vocab_size=args.tiny_vocab,
                       query_mode=args.tiny_query_mode, dropout=0.0, device="cpu", compile=False)


def measure_child(args, parallelism, checkpointing):
    """In a fresh process (under torchrun for FSDP): two training steps of the tiny model as
    train.py runs them; prints one JSON line with this process's measured peak in bytes."""
    from nonlinear_queries.runtime.processes import parallelize, setup, teardown
    from nonlinear_queries.trainer.optimizers import build_optimizers
    from nonlinear_queries.trainer.training import train_step

    cfg = tiny_config(args)
    runtime = setup("cpu", "float32", parallelism=parallelism)
    torch.manual_seed(0)
    raw = GPT(cfg.model_config())
    _, train_model = parallelize(raw, runtime, parallelism, False, checkpointing)
    params = list(raw.parameters())
    optimizers = build_optimizers(raw, cfg, "cpu")
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    g = torch.Generator().manual_seed(runtime.rank)
    x, y = (torch.randint(0, cfg.vocab_size, (cfg.batch_size, cfg.block_size), generator=g) for _ in range(2))

    def step():
        train_step(train_model, params, optimizers, scaler, lambda k: (x, y), 1, runtime.autocast, [0], 0.0, 1.0)
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    step()  # the first step creates the optimizer states and loads every kernel
    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t
    static = sum(local(p).nbytes for p in params) + sum(
        local(v).nbytes for o in optimizers for s in o.state.values() for v in s.values() if torch.is_tensor(v))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident memory
    before = proc_status_kib("VmRSS")
    step()
    peak = static + (proc_status_kib("VmHWM") - before) * 1024
    print(json.dumps({"rank": runtime.rank, "peak": peak}), flush=True)
    teardown(runtime)


def measure_table(args):
    cfg = tiny_config(args)
    world = 2
    print(f"Tiny model: {cfg.n_layer} layers, d={cfg.n_embd}, {cfg.n_head} heads, vocab {cfg.vocab_size}, "
          f"{cfg.query_mode}, micro-batch {cfg.batch_size} x {cfg.block_size}, AdamW, float32 on the CPU; "
          f"FSDP over {world} processes (gloo)\n")
    print("| setting | estimated MiB | measured MiB (per process) | measured / estimated |")
    print("|---|---|---|---|")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    child = [os.path.abspath(__file__), *sys.argv[1:]]
    for name, parallelism, checkpointing in SETTINGS:
        launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}"]
                    if parallelism == "fsdp" else [sys.executable])
        proc = subprocess.run([*launcher, *child, f"--child={parallelism},{int(checkpointing)}"], env=env,
                              capture_output=True, text=True, cwd=REPO)
        if proc.returncode:
            sys.exit(f"error: the measurement of {name} failed:\n{proc.stdout}\n{proc.stderr}")
        peaks = [json.loads(line)["peak"] for line in proc.stdout.splitlines() if line.startswith('{"rank"')]
        want = estimate(cfg, parallelism, world if parallelism == "fsdp" else 1, checkpointing, False)["peak"]
        label = name.replace("FSDP", f"FSDP x {world}").replace("DDP", "one process")
        got = ", ".join(f"{p / 2**20:,.0f}" for p in peaks)
        print(f"| {label} | {want / 2**20:,.0f} | {got} | {max(peaks) / want:.2f} |")


def main():
    p = parser("Estimated (and measured) training memory per process", model=False)
    p.add_argument("configs", nargs="*", help="config files; default: config/baseline.py and config/gpt3/*.py")
    p.add_argument("--world_size", type=int, default=8, help="FSDP's number of processes (GPUs)")
    p.add_argument("--gpu_gib", type=float, default=79.1, help="a GPU's memory (79.1 GiB: an H100 80GB's)")
    p.add_argument("--batch_size", type=int, default=0, help="micro-batch in sequences; 0 = each config's")
    p.add_argument("--measure", action="store_true", help="also measure the tiny model on this CPU")
    p.add_argument("--tiny_layers", type=int, default=8)
    p.add_argument("--tiny_embd", type=int, default=256)
    p.add_argument("--tiny_heads", type=int, default=4)
    p.add_argument("--tiny_block", type=int, default=256)
    p.add_argument("--tiny_batch", type=int, default=8)
    p.add_argument("--tiny_vocab", type=int, default=4096)
    p.add_argument("--tiny_query_mode", default="res_gelu")
    p.add_argument("--child", default="", help=argparse.SUPPRESS)  # one measurement: 'ddp,0' ... 'fsdp,1'

    args = p.parse_args()
    if args.child:
        parallelism, checkpointing = args.child.split(",")
        return measure_child(args, parallelism, checkpointing == "1")
    gpt3 = [os.path.join(REPO, "config", "gpt3", f"{size}_{arm}.py") for size in GPT3_SIZES
            for arm in ("baseline", "res_gelu")]
    paths = args.configs or [os.path.join(REPO, "config", "baseline.py"), *gpt3]
    print(f"## Training memory per process (estimated): CUDA, bfloat16 autocast, {args.world_size} processes\n"
          f"torch {torch.__version__} | command: {command_line()}\n")
    estimate_table(paths, args)
    if args.measure:
        print()
        print(header("Estimated against measured, tiny model", "cpu", "float32", False, command_line()))
        measure_table(args)


if __name__ == "__main__":
    main()
