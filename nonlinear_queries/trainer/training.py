"""
The pieces of train.py's loop, each a function of what it uses: the learning-rate
schedule, the dropout seeds, one training step, the divergence rule (on the host, and
kept on the device between the loop's reads), the update that a diverged step skips,
evaluation, and the loop's decisions of when to evaluate and when to read the device's
numbers back (when to checkpoint is checkpoint.should_save's); how the processes share a step's
micro-batches (micro_steps_per_process), and the steps' own clock (StepClock: ms/step, tokens/s, MFU).

Step numbering: "step s" is the state after s optimizer updates; the update that takes
step s to s + 1 uses get_lr(s).
"""

import math
import time
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm import tqdm

from nonlinear_queries.data.batches import get_batch
from nonlinear_queries.errors import SetupError
from nonlinear_queries.runtime.processes import all_reduce_sum, mfu


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
            with autocast:  # logits only for the z-loss: a compiled step pays for a logits output (GPT.forward)
                logits, loss = model(x, y, return_logits=bool(z_loss))
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


class DivergenceGuard:
    """divergence_reason's rule kept on the device, so that the training loop reads it back only where it
    reads the device's numbers anyway (should_read_back: log steps, and before an evaluation, a checkpoint
    or the end), not after every step: a host read waits for the device to finish everything queued.

    check() applies the rule to one step without a host sync and returns whether that step's update is to
    be skipped: once a step has diverged, its update and every later one are (apply_updates skips them on
    the device), so the weights stay as they were before the diverged step until the loop reads the guard
    and stops. values() and outcome() give divergence_reason the first diverged step's numbers on the host,
    so the reason and the streak are the ones the rule gives there.

    streak: the streak before the first checked step (a checkpoint's steps_above_threshold); threshold,
    patience, check_grad_norm: as divergence_reason's; device: where the steps' losses are.
    """

    def __init__(self, streak, threshold, patience, check_grad_norm, device):
        self.threshold, self.patience, self.check_grad_norm = threshold, patience, check_grad_norm
        self.streak = torch.full((), float(streak), dtype=torch.float64, device=device)
        self.halted = torch.zeros((), dtype=torch.bool, device=device)
        # the first diverged step's number, loss, gradient norm and the streak before it (zeros until one diverges)
        self.first = torch.zeros(4, dtype=torch.float64, device=device)

    def check(self, step, loss, grad_norm):
        """Apply the rule to the update that makes `step` (an int, as logged: the state after the update).
        loss: the step's mean loss over the global batch, a 0-dim float64 tensor on the device (float64 as the
        host's Python floats, so the threshold compares alike); grad_norm: its gradient norm, 0-dim float32.
        Returns a 0-dim float32 tensor on the device: 1.0 if the update is to be skipped (this step or an earlier
        one diverged), else 0.0. Queues a few scalar kernels; never waits for the device."""
        above = loss > self.threshold if self.threshold > 0 else torch.zeros_like(self.halted)
        streak = torch.where(above, self.streak + 1, torch.zeros_like(self.streak))
        bad = ~torch.isfinite(loss) | (streak >= self.patience)
        if self.check_grad_norm:
            bad = bad | ~torch.isfinite(grad_norm)
        # torch.full_like fills on the device: a tensor made from the host's step number would be a copy that waits
        numbers = torch.stack([torch.full_like(loss, step), loss, grad_norm.double(), self.streak])
        self.first = torch.where(bad & ~self.halted, numbers, self.first)
        self.halted = self.halted | bad
        self.streak = streak
        return self.halted.float()

    def values(self):
        """The guard as one float64 tensor (6,) on the device, for the loop's one host read (with its other
        numbers): whether a step diverged, the streak, then the first diverged step's number, loss, gradient
        norm and the streak before it."""
        return torch.cat([torch.stack([self.halted.double(), self.streak]), self.first])

    def outcome(self, values):
        """(diverged, streak) from values() read on the host: diverged is None, or (reason, step, loss,
        grad_norm) of the first step that diverged, the reason being divergence_reason's; streak counts the
        steps above the threshold up to the last checked one (a checkpoint's steps_above_threshold)."""
        halted, streak, step, loss, grad_norm, before = values
        if not halted:
            return None, int(streak)
        reason, _ = divergence_reason(loss, grad_norm, int(before), self.threshold, self.patience,
                                      self.check_grad_norm)
        return (reason, int(step), loss, grad_norm), int(streak)


def apply_updates(optimizers, scaler, skip):
    """Step every optimizer through the GradScaler `scaler` unless `skip` (DivergenceGuard.check's 0-dim float32
    tensor on the device) is 1.0, then clear the gradients and update the scaler.

    An optimizer that takes GradScaler's `found_inf` (its `_step_supports_amp_scaling`: fused AdamW, and
    optimizers.Muon) is given `skip` as its found_inf and skips on the device, leaving its parameters and
    states as they were, with no host read. Otherwise (the CPU's AdamW, which is not fused; float16, whose
    GradScaler sets found_inf itself) the host reads `skip` first: on the CPU that costs nothing, as nothing
    is queued. A step that is not skipped is the optimizer's own step, bit for bit.
    """
    if scaler.is_enabled() or not all(getattr(o, "_step_supports_amp_scaling", False) for o in optimizers):
        if not skip.item():
            for optimizer in optimizers:
                scaler.step(optimizer)
    else:
        for optimizer in optimizers:
            optimizer.found_inf = skip
            optimizer.step()
            del optimizer.found_inf
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)
    scaler.update()


@torch.no_grad()
def evaluate(model, splits, block_size, device, autocast, runtime, stop=None):
    """Mean loss over fixed evaluation batches, per split.

    splits: {name: (tokens, index)}, tokens a uint16 memmap and index an int64 (eval_iters, B)
    stream of start offsets (the same at every evaluation). Process r of W evaluates rows
    r, r + W, ... and the sums are all-reduced over the processes of runtime. Every process runs
    the same number of forward passes (one that has run out of rows repeats row 0 and drops
    its loss), because under FSDP each forward pass gathers weights from all of them.
    stop: the run's stopping.StopFlag, asked after every batch (every rank at the same batch, by a
    vote summed with the batch: stopping.StopFlag.agreed), so a signal gives up a long evaluation.
    A bar on stderr (tqdm) shows the batches of an evaluation that runs longer than 10 s, on rank 0.
    Returns {name: mean cross-entropy in nats}, or None where `stop` gave it up. Leaves the model
    in training mode.
    """
    model.eval()
    out = {}
    W = runtime.world_size
    batches = [(name, tokens, index, k) for name, (tokens, index) in splits.items()
               for k in range(runtime.rank, -(-len(index) // W) * W, W)]
    totals = {name: torch.zeros((), device=device) for name in splits}
    bar = tqdm(batches, desc="evaluating", unit="batch", delay=10, mininterval=1, leave=False,
               disable=not runtime.master)
    for name, tokens, index, k in bar:
        x, y = get_batch(tokens, index[k if k < len(index) else 0], block_size, device)
        with autocast:
            _, loss = model(x, y, return_logits=False)
        if k < len(index):
            totals[name] += loss.float()
        if stop is not None and stop.agreed(all_reduce_sum(stop.vote(loss), runtime), runtime.distributed):
            bar.close()
            model.train()
            return None
    for name, (_, index) in splits.items():
        out[name] = all_reduce_sum(totals[name], runtime).item() / len(index)
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


def should_read_back(step, cfg, start_step, resumed_after_eval, tasks_due=False):
    """Whether the loop reads the device's numbers back after the update that makes `step` (one host sync):
    at every log step, and wherever the loop does more than another step next (an evaluation, lm-eval tasks,
    a checkpoint, the end), which must never see a diverged run, and where a signal's stop is decided.
    tasks_due: whether lm-eval's tasks run at `step` (DownstreamEval.due, not stopping)."""
    return (step % cfg.log_interval == 0 or step >= cfg.max_iters or step in cfg.save_checkpoint_steps or tasks_due
            or should_eval(step, cfg, start_step, resumed_after_eval, False))


def micro_steps_per_process(cfg, runtime):
    """gradient_accumulation_steps / world size: each process's micro-batches of a step (cfg: the TrainConfig;
    runtime: processes.setup's processes). Raises SetupError when the processes cannot share the step's micro-batches
    evenly."""
    if cfg.gradient_accumulation_steps % runtime.world_size:
        raise SetupError(
            f"gradient_accumulation_steps={cfg.gradient_accumulation_steps} is not divisible by the "
            f"{runtime.world_size} processes; each process runs gradient_accumulation_steps / "
            f"{runtime.world_size} of the step's micro-batches. Choose a multiple of {runtime.world_size} (and adjust "
            f"batch_size to keep the tokens per step)")
    return cfg.gradient_accumulation_steps // runtime.world_size




class StepClock:
    """The training steps' own time, from a step's batch to its update, summed since the last log: evaluations,
    lm-eval tasks and checkpoints between them are left out of ms_per_step, tokens_per_s and MFU. It also keeps
    this session's first step, which compiles the training graph (train.py's log_compile_time). tokens_per_iter:
    tokens a step trains on, over all processes; flops_per_token: the model's (GPT.flops_per_token); peak: one device's
    peak FLOP/s, None where unknown (no MFU); world_size: the processes."""

    def __init__(self, tokens_per_iter, flops_per_token, peak, world_size):
        self.tokens_per_iter, self.flops_per_token, self.peak, self.world_size = (
            tokens_per_iter, flops_per_token, peak, world_size)
        self.steps, self.seconds, self.first_step_s, self.laps, self.started = 0, 0.0, None, 0, None

    def start(self):
        """A step begins."""
        self.started = time.time()

    def stop(self):
        """The step begun last has ended (its numbers read back where they were)."""
        self.seconds += time.time() - self.started
        self.steps += 1
        if self.first_step_s is None:
            self.first_step_s = self.seconds

    def lap(self):
        """The speed of the steps since the last lap, and a new lap begun: {ms_per_step, tokens_per_s, and mfu
        where the peak is known}."""
        dt = self.seconds / self.steps
        self.steps, self.seconds, self.laps = 0, 0.0, self.laps + 1
        speed = {"ms_per_step": 1000 * dt, "tokens_per_s": self.tokens_per_iter / dt}
        if self.peak:
            speed["mfu"] = mfu(self.flops_per_token, self.tokens_per_iter / dt, self.peak, self.world_size)
        return speed
