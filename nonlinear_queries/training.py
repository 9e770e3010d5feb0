"""
The pieces of train.py's loop, each a function of what it uses: the learning-rate
schedule, the dropout seeds, one training step, the divergence rule, evaluation, and
the loop's decisions of when to evaluate and when to checkpoint.

Step numbering: "step s" is the state after s optimizer updates; the update that takes
step s to s + 1 uses get_lr(s).
"""

import math
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from nonlinear_queries.batches import get_batch
from nonlinear_queries.runtime import all_reduce_sum


def get_lr(step, cfg):
    """Learning rate of the update that takes step -> step + 1.

    cfg: the training config (learning_rate, min_lr, warmup_iters, lr_decay_iters,
    lr_schedule, decay_lr). Linear warmup over warmup_iters, then `lr_schedule`: 'cosine'
    decays to min_lr at lr_decay_iters and stays there (the paper's recipe, §3.1);
    'linear_to_zero' decays linearly to 0 at lr_decay_iters and stays there. decay_lr=False
    gives learning_rate at every step.
    """
    if not cfg.decay_lr:
        return cfg.learning_rate
    if step < cfg.warmup_iters:
        return cfg.learning_rate * (step + 1) / (cfg.warmup_iters + 1)
    if step >= cfg.lr_decay_iters:
        return 0.0 if cfg.lr_schedule == "linear_to_zero" else cfg.min_lr
    ratio = (step - cfg.warmup_iters) / (cfg.lr_decay_iters - cfg.warmup_iters)
    if cfg.lr_schedule == "linear_to_zero":
        return cfg.learning_rate * (1.0 - ratio)
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (cfg.learning_rate - cfg.min_lr)


def dropout_seed(seed, step, micro):
    """Seed of the dropout masks of global micro-batch `micro` of `step`: a function of
    (seed, step, micro) only, so the masks are the same for any number of processes and a
    resumed run needs no generator state."""
    return int(np.random.SeedSequence([seed, step, micro]).generate_state(1, np.uint64)[0])


def train_step(model, params, optimizers, scaler, micro_batch, micro_steps, autocast, seeds, z_loss=0.0,
               grad_clip=0.0):
    """Forward and backward over this process's micro-batches of one step, then unscale and
    clip the gradients. The optimizers' steps are left to the caller (after the divergence check).

    model: the module to call (the DDP wrapper under torchrun: gradients are all-reduced
    once, in the last micro-batch's backward; under FSDP the sharded model, which
    reduce-scatters every micro-batch's gradients so that only shards accumulate);
    params: the model's parameters, whose gradients are measured and clipped (under FSDP
    DTensor shards: the norm is the global one, over every process's shard); optimizers:
    the list of optimizers.build_optimizers, each unscaled by the GradScaler `scaler`.
    micro_batch(k) -> (x, y), int64 (B, T) each, this process's k-th micro-batch;
    micro_steps: their number; seeds[k]: the dropout seed of micro-batch k. The objective
    is the mean cross-entropy over the micro-batches, plus z_loss *
    mean(logsumexp(logits)^2) if z_loss > 0 (PaLM's z-loss, which pulls the log-partition
    towards 0; it joins the gradient, not the returned loss). grad_clip > 0 clips the
    global gradient norm to it.

    Returns (loss_sum, grad_norm), 0-dim float32 tensors on the device: the sum of the
    micro-batches' cross-entropies (divide by the global number of micro-batches after
    summing over processes) and the gradient norm before clipping.
    """
    x, y = micro_batch(0)
    loss_sum = torch.zeros((), device=x.device)
    for k in range(micro_steps):
        torch.manual_seed(seeds[k])
        last = k + 1 == micro_steps
        with model.no_sync() if isinstance(model, DDP) and not last else nullcontext():
            with autocast:
                logits, loss = model(x, y)
            objective = loss
            if z_loss:
                objective = loss + z_loss * torch.logsumexp(logits.float(), dim=-1).pow(2).mean()
            del logits  # (B, T, vocab): not held through the next micro-batch's forward
            if not last:
                x, y = micro_batch(k + 1)  # fetched while the device works on this micro-batch
            loss_sum += loss.detach().float()
            scaler.scale(objective / micro_steps).backward()
    for optimizer in optimizers:  # GradScaler unscales per optimizer: each holds its own found-inf record
        scaler.unscale_(optimizer)
    grad_norm = global_grad_norm([p.grad for p in params if p.grad is not None])
    if grad_clip > 0:
        torch.nn.utils.clip_grads_with_norm_(params, grad_clip, grad_norm)
    return loss_sum, grad_norm


def global_grad_norm(grads):
    """The 2-norm of all of `grads` together, the norm that gradient clipping scales (Pascanu et
    al. 2013), as a 0-dim float32 tensor (inf or nan if a gradient holds one). Summed in float64:
    float32 sums lose about 1e-5 of it over a million elements on the CPU (measured on the
    50304 x 32 embedding), and differently for a tensor than for its halves, so the norm would
    depend on the number of processes FSDP shards it over. Under FSDP the gradients are DTensor
    shards (Shard(0) on one mesh): their sums of squares are all-reduced over the mesh, so every
    process gets the norm of the whole gradient."""
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    total = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) ** 2 for g in local]).sum()
    sharded = [g for g in grads if isinstance(g, DTensor)]
    if sharded:
        dist.all_reduce(total, group=sharded[0].device_mesh.get_group())
    return total.sqrt().float()


def divergence_reason(loss, grad_norm, streak, threshold, patience, check_grad_norm=True):
    """The divergence rule, applied to a step's loss and gradient norm before its update.

    streak: consecutive steps with the loss above threshold before this one; threshold <= 0
    disables that part of the rule. check_grad_norm=False leaves a non-finite gradient norm
    alone (float16's GradScaler skips such steps itself). Returns (reason, streak): reason
    is None, or why the run diverged (a non-finite loss or gradient norm, or `patience`
    steps in a row above threshold); streak counts this step too.
    """
    streak = streak + 1 if threshold > 0 and loss > threshold else 0
    if not math.isfinite(loss):
        return f"the loss is {loss}", streak
    if check_grad_norm and not math.isfinite(grad_norm):
        return f"the gradient norm is {grad_norm}", streak
    if streak >= patience:
        return (f"the loss has been above divergence_threshold={threshold} for {streak} steps (now {loss:.4f})",
                streak)
    return None, streak


@torch.no_grad()
def evaluate(model, splits, block_size, device, autocast, rt):
    """Mean loss over fixed evaluation batches, per split.

    splits: {name: (tokens, index)}, tokens a uint16 memmap and index an int64 (eval_iters, B)
    stream of start offsets (the same at every evaluation). Process r of W evaluates rows
    r, r + W, ... and the sums are all-reduced over the processes of rt. Every process runs
    the same number of forward passes (one that has run out of rows repeats row 0 and drops
    its loss), because under FSDP each forward pass gathers weights from all of them.
    Returns {name: mean cross-entropy in nats}. Leaves the model in training mode.
    """
    model.eval()
    out = {}
    for name, (tokens, index) in splits.items():
        total = torch.zeros((), device=device)
        for k in range(rt.rank, -(-len(index) // rt.world_size) * rt.world_size, rt.world_size):
            x, y = get_batch(tokens, index[k if k < len(index) else 0], block_size, device)
            with autocast:
                _, loss = model(x, y)
            if k < len(index):
                total += loss.float()
        out[name] = all_reduce_sum(total, rt).item() / len(index)
    model.train()
    return out


def should_eval(step, cfg, start_step, resumed_after_eval, stopping):
    """Whether to evaluate at `step`: at every multiple of eval_interval, after the last
    update (step max_iters) and always with eval_only; not when a signal asks to stop fast,
    nor at the step a run resumes from if its checkpoint was written after that step's
    evaluation (it is in metrics.jsonl already)."""
    due = step % cfg.eval_interval == 0 or step == cfg.max_iters or cfg.eval_only
    repeated = step == start_step and resumed_after_eval and not cfg.eval_only
    return due and not stopping and not repeated


def should_save(step, cfg, start_step, evaluated, stopping):
    """Whether to write a checkpoint at `step`: after each evaluation, before stopping on a
    signal, and at the save_checkpoint_steps; never at the step the run started from, which
    is on disk already, and never with eval_only."""
    return (evaluated or stopping or step in cfg.save_checkpoint_steps) and step > start_step and not cfg.eval_only
