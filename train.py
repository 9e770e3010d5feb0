"""
Train a GPT whose attention query is chosen by `query_mode` (see model.py).

    python train.py config/res_gelu.py                        # the paper's best run, one GPU
    torchrun --standalone --nproc_per_node=8 train.py config/res_gelu.py   # the same run on 8 GPUs
    python train.py config/quickstart.py                      # small res_gelu model, CPU, minutes
    python train.py config/baseline.py --init_from=resume     # continue out_dir/ckpt.pt

Config files in config/ are plain assignments and --key=value overrides them
(configurator.py); every setting, its default and its check is in train_config.py.
Every variant trains on the same pre-generated batches (batches.py), evaluates train and
val loss on the same fixed sequences every eval_interval steps (training.py) with, by
default, per-layer attention and query diagnostics on the first val batches
(diagnostics.py), appends every metric to out_dir/metrics.jsonl and to wandb when
wandb_log (runs.py), and writes a checkpoint atomically after each evaluation
(checkpoint.py). With eval_tasks it also runs lm-evaluation-harness tasks on rank 0
every eval_tasks_interval steps (downstream.py).

Processes (runtime/processes.py): under torchrun (PyTorch DDP) step i still trains on row i of the
train index, batch_size x gradient_accumulation_steps sequences; rank r of W takes the
r-th contiguous W-th of the row as gradient_accumulation_steps / W micro-batches.
Gradients are averaged over the ranks once per step, the logged loss is the mean over
the whole row, the evaluation batches are shared out over the ranks, and only rank 0
writes. So 1, 2 or 8 processes train on the same tokens and log the same losses.
--parallelism=fsdp shards the weights, gradients and optimizer states over the ranks
(FSDP2) on the same batches, and every rank writes its shards of a checkpoint directory;
--activation_checkpointing=True recomputes each block's activations in the backward pass.

Faults (stopping.py): SIGTERM or SIGINT is acknowledged at once; the step in flight, or the
evaluation batch in flight (the evaluation is given up), is finished, every rank stops after the
same step, at most one step after the signal, writes a checkpoint and exits 0; a second one
exits at once (130, 143), and one after the run has ended changes nothing. During setup a signal
undoes what setup made and exits 130 or 143, and so does one before a new run's first step, at once,
during its first evaluation or a compilation too (stopping.end_compilation: inductor's compilers killed,
its compile workers shut down); a compilation that a signal to the process group cut short is the stop,
the step or evaluation being compiled given up, not an error.
A non-finite loss or gradient norm, or a loss above divergence_threshold for
divergence_patience consecutive steps, stops the run before that step's update with a
`diverged` record in metrics.jsonl naming that step: its update, and those of any steps queued
after it, are skipped on the device, and the run stops at the next read; the checkpoints on
disk are left as they were.
Exit status: 0 finished, or stopped by a signal with a checkpoint written; 1 error;
2 config error; 3 diverged; 130 or 143 stopped by SIGINT or SIGTERM with nothing to resume
(during setup, before the first step, or by a second signal).
A new run refuses an out_dir holding anything a run left (checkpoints, metrics.jsonl, config.json,
wandb/, a .lock no process holds) unless --overwrite=True (runs.RunDir.check_start); on the CPU a
run whose steps would take more than a week is refused unless --allow_slow=True (budget.check_cpu_time).

Step numbering: "step s" is the state after s optimizer updates. Evaluation runs at
every multiple of eval_interval and after the last update (step max_iters), so with
max_iters=60000 the paper's 59k and 60k evaluations are both logged.
"""

import nonlinear_queries.interrupt  # noqa: F401  (first: Ctrl-C at any moment ends with one line)

import os
import signal
import sys
import time
from dataclasses import asdict, dataclass

import torch

from nonlinear_queries.cli import resume_command
from nonlinear_queries.config.configurator import config_from_argv
from nonlinear_queries.config.train_config import TrainConfig, parse_compile_options
from nonlinear_queries.data.batches import get_batch, open_run_data
from nonlinear_queries.errors import CheckpointError, DataError, PretrainedError, SetupError
from nonlinear_queries.evaluation.diagnostics import diagnose
from nonlinear_queries.record.lock import hold_run_dir, release_new_out_dir, release_out_dir, sign_out_dir
from nonlinear_queries.record.runs import RunDir
from nonlinear_queries.runtime.processes import all_reduce_sum, numerics, parallelize, peak_flops, setup, teardown
from nonlinear_queries.trainer.budget import check_cpu_time, check_memory
from nonlinear_queries.trainer.optimizers import build_optimizers, set_learning_rates
from nonlinear_queries.trainer.stopping import Interrupted, StopFlag, compile_cut_by_stop, end_compilation
from nonlinear_queries.trainer.training import (
    DivergenceGuard,
    StepClock,
    apply_updates,
    dropout_seed,
    evaluate,
    get_lr,
    micro_steps_per_process,
    should_eval,
    should_read_back,
    train_step,
)
from nonlinear_queries.weights.checkpoint import Checkpointer
from nonlinear_queries.weights.start import build_model, resolve_start


def data_dir(cfg):
    """The directory of the run's token files: cfg.data_dir, or data/<dataset> beside train.py."""
    return cfg.data_dir or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", cfg.dataset)


def data_prepared(cfg):
    """Whether the run's token files (train.bin and val.bin) are in data_dir(cfg)."""
    return all(os.path.isfile(os.path.join(data_dir(cfg), f"{split}.bin")) for split in ("train", "val"))


def open_data(cfg):
    """The run's token memmaps and fixed batch index streams (batches.RunData). Raises DataError."""
    return open_run_data(data_dir(cfg), f"python data/{cfg.dataset}/prepare.py", cfg.data_seed, cfg.max_iters,
                         cfg.batch_size * cfg.gradient_accumulation_steps, cfg.eval_batch_size or cfg.batch_size,
                         cfg.block_size, cfg.eval_iters, cfg.vocab_size)


def start_log(cfg, runtime, run_dir, start, state, run_name, config_files, model, data_fingerprint, tokens_per_iter):
    """This session's part of the record, once every check has passed: a new run (`start`, a start.Start, that
    does not resume) first replaces the run in out_dir (runs.RunDir.replace, on rank 0; allowed by
    lock.hold_run_dir) and a killed run's lock file names this run from now on (lock.sign_out_dir), then
    metrics.jsonl (and wandb, continuing state.wandb_id) opens with the run's header, also written to
    out_dir/config.json; prints the resolved config. Returns the runs.RunLog."""
    if runtime.master:
        sign_out_dir(run_dir)
    if runtime.master and not start.resumes:
        run_dir.replace()
    wandb_init = cfg.wandb_init()
    run_log = run_dir.open_log(runtime.master, cfg.wandb_log, state.wandb_id or None, config=asdict(cfg), **wandb_init)
    state.wandb_id = run_log.wandb.id or ""
    run_dir.log_header(run_log, state.step, __file__, run_name=run_name, wandb={**wandb_init, "id": run_log.wandb.id},
                       config_files=config_files,
                       torch=torch.__version__, device=runtime.device, world_size=runtime.world_size,
                       dtype=runtime.dtype, numerics=numerics(runtime.device),
                       tokens_per_iter=tokens_per_iter, non_embedding_params=model.get_num_params(),
                       params=model.get_num_params(non_embedding=False), flops_per_token=model.flops_per_token(),
                       config=asdict(cfg), data=data_fingerprint)
    wandb_dir = getattr(getattr(run_log.wandb, "settings", None), "sync_dir", None)
    run_log.print(f"{run_name}: query_mode={cfg.query_mode}, {model.get_num_params():,} non-embedding parameters, "
                  f"{tokens_per_iter:,} tokens per step, device {runtime.device} ({runtime.dtype})"
                  + (f" x {runtime.world_size} processes ({runtime.backend})" if runtime.distributed else "")
                  + (f", wandb {run_log.wandb.settings.mode} run {wandb_init['name']}"
                 + (f" in group {wandb_init['group']}" if wandb_init["group"] else "") + f" in {wandb_dir}"
                 if wandb_dir else "")
                  + f"; the full config is in {run_dir.config}")
    return run_log


@dataclass
class Trainables:
    """What trains the GPT (which train() holds itself: checkpointed, diagnosed, given to lm-eval's tasks), built
    by build_trainables: `eval_model` what evaluates it and `train_model` what trains it (processes.parallelize:
    compiled, under DDP or FSDP), `params` its parameters (a list), its `optimizers` and `scaler` the loss
    scaler."""

    eval_model: torch.nn.Module
    train_model: torch.nn.Module
    params: list
    optimizers: list
    scaler: torch.amp.GradScaler


def build_trainables(cfg, runtime, raw_model):
    """The Trainables of raw_model: its Triton kernels put in (with kernels, before compile and sharding see
    the model; kernels.py), the processes' model (under torchrun DDP around the compiled model, or FSDP shards of
    it in place), and the optimizers built on what the processes hold (under FSDP, the shards)."""
    if cfg.kernels:
        from nonlinear_queries.ops.kernels import use_kernels  # Triton is imported only by a run that asks for it

        use_kernels(raw_model)
    eval_model, train_model = parallelize(raw_model, runtime, cfg.parallelism, cfg.compile,
                                          cfg.activation_checkpointing, mode=cfg.compile_mode,
                                          pointwise_cat=cfg.compile_pointwise_cat,
                                          options=parse_compile_options(cfg.compile_options))
    return Trainables(eval_model, train_model, list(raw_model.parameters()),
                      build_optimizers(raw_model, cfg, runtime.device_type),
                      torch.amp.GradScaler(runtime.device_type, enabled=runtime.dtype == "float16"))


def open_tasks(cfg, runtime):
    """lm-eval's tasks (downstream.DownstreamEval), imported only when eval_tasks asks for them and checked here,
    before the run; None without eval_tasks."""
    if not cfg.eval_tasks:
        return None
    from nonlinear_queries.evaluation.downstream import DownstreamEval

    return DownstreamEval(cfg, runtime)


def say_start(run_log, start, checkpoints, model):
    """Say what the run starts from (`start`, a start.Start): the checkpoint it resumes, or the model it
    fine-tunes."""
    if checkpoints.path:
        run_log.print(f"resuming from {checkpoints.path} at step {checkpoints.start_step}")
    elif start.fine_tunes:
        run_log.print(f"fine-tuning from {model.loaded_from.path} ({model.loaded_from.kind})")


def run_evaluation(cfg, runtime, eval_model, eval_splits, step, stop):
    """The evaluation of `step`: {split: mean loss, nats per token} of `eval_model` (what evaluates the GPT) on
    the fixed batches of `eval_splits` ({split: (tokens, batch index)}), or None where a signal gave it up
    between batches, or cut short the compilation it waited on (stopping.compile_cut_by_stop): it runs again
    when the run resumes at this step."""
    try:
        with stop.evaluating(step):
            return evaluate(eval_model, eval_splits, cfg.block_size, runtime.device, runtime.autocast, runtime, stop)
    except Exception as e:
        if not compile_cut_by_stop(cfg, stop, e):
            raise
        return None


def log_evaluation(cfg, runtime, run_log, model, data, step, losses):
    """Log and print the evaluation `losses` ({split: mean loss, nats per token}) of `step` and, with
    diagnostics, the per-layer diagnostics of `model` (the GPT itself, in eval mode: no training number changes)
    on the first diagnostics_batches val batches."""
    run_log.print(f"step {step}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    run_log.log({"type": "eval", "step": step, "train_loss": losses["train"], "val_loss": losses["val"]})
    if cfg.diagnostics:
        diag = diagnose(model, data.val, data.val_eval_idx[:cfg.diagnostics_batches], cfg.block_size, runtime.device,
                        runtime.autocast)
        run_log.log({"type": "diag", "step": step, **diag})
        top = max(diag["attn_logit_max"])
        run_log.print(f"step {step}: max attention logit {top:.2f} (layer {diag['attn_logit_max'].index(top)}), "
                      f"attention entropy {sum(diag['attn_entropy']) / cfg.n_layer:.3f} nats (mean over layers)")


def run_tasks(run_log, downstream, model, step, stop):
    """Run lm-eval's tasks on `model` (the GPT itself) at `step`, on rank 0 while the other ranks wait for it,
    and log and print each task's record; a signal gives the tasks up between batches (said, nothing logged)."""
    records = downstream.evaluate(model, step, should_stop=lambda: stop.signal is not None)
    if records is None:
        run_log.print(f"step {step}: lm-eval tasks given up on a stop request")
    for record in records or []:
        run_log.print(downstream.describe(record))
        run_log.log(record)


def train_one_step(cfg, runtime, data, trainables, guard, stop, step, micro_steps):
    """The update that makes step + 1, on this rank's contiguous share of row `step` of the train index (its
    micro_steps micro-batches), at get_lr's rate. One all-reduce, queued, not waited for, sums the global batch's
    loss (so any accumulation or process count logs the same mean) and how many ranks were asked to stop. The
    divergence guard runs on the device: the update of a step that diverged, and of every step after it until
    the loop reads the guard, is skipped there, so a diverged step never reaches the weights. Returns (the
    learning rate, the reduced (loss sum, stop votes), the gradient norm), the last two on the device."""
    B, T = cfg.batch_size, cfg.block_size
    lr = get_lr(step, cfg)
    set_learning_rates(trainables.optimizers, lr, cfg)
    row = data.train_idx[step][runtime.rank * micro_steps * B : (runtime.rank + 1) * micro_steps * B]
    seeds = [dropout_seed(cfg.seed, step, runtime.rank * micro_steps + k) for k in range(micro_steps)]
    loss_sum, grad_norm = train_step(trainables.train_model, trainables.params, trainables.optimizers,
                                     trainables.scaler,
                                     lambda k: get_batch(data.train, row[k * B : (k + 1) * B], T, runtime.device),
                                     micro_steps, runtime.autocast, seeds, cfg.z_loss, cfg.grad_clip)
    reduced = all_reduce_sum(torch.stack([loss_sum, stop.vote(loss_sum)]), runtime)
    skip = guard.check(step + 1, reduced[0].double() / cfg.gradient_accumulation_steps, grad_norm)
    apply_updates(trainables.optimizers, trainables.scaler, skip)
    return lr, reduced, grad_norm


def read_back(cfg, reduced, grad_norm, guard, stop_agreed):
    """The one host read of the device's numbers (it waits for every step queued since the last read): (the
    step's train loss, the mean over the global batch in nats per token; its gradient norm; whether the ranks
    stop: agreed already, or any rank voted; the guard's outcome, DivergenceGuard.outcome's (diverged, streak))."""
    loss_total, votes, norm, *guarded = torch.cat([reduced.double(), grad_norm.double()[None], guard.values()]).tolist()
    return loss_total / cfg.gradient_accumulation_steps, norm, stop_agreed or votes > 0, guard.outcome(guarded)


def report_divergence(cfg, run_log, checkpoints, diverged, stop):
    """Log the `diverged` record of `diverged` ((reason, step, loss, grad_norm), DivergenceGuard.outcome's), say
    that the checkpoints on disk are untouched and what may avoid it, close the log. Returns 3, the exit status,
    which a signal no longer changes (StopFlag.end)."""
    reason, at, loss, norm = diverged
    run_log.log({"type": "diverged", "step": at, "reason": reason, "loss": loss, "grad_norm": norm,
                 "lr": get_lr(at - 1, cfg), "last_checkpoint_step": checkpoints.step})
    kept = (f"the last checkpoint, {checkpoints.path} (step {checkpoints.step}), is untouched"
            if checkpoints.step is not None else "no checkpoint was written")
    run_log.print(f"diverged at step {at}: {reason}. The run stopped before applying that update; {kept}. A lower "
                  f"learning_rate or a larger warmup_iters may avoid it; metrics.jsonl records it as 'diverged'.",
                  file=sys.stderr)
    run_log.finish(stop.end(3))
    return 3


def log_compile_time(cfg, run_log, step, clock):
    """At this session's first log of a compiled run (before clock.lap), log and print the `compile` record: the
    first step's seconds and, after more steps, the mean of the later ones, whose difference is the compile
    time."""
    record = {"type": "compile", "step": step, "compile_mode": cfg.compile_mode, "first_step_s": clock.first_step_s}
    line = f"compile ({cfg.compile_mode}): the first step took {clock.first_step_s:.1f} s"
    if clock.steps > 1:
        record["later_step_s"] = (clock.seconds - clock.first_step_s) / (clock.steps - 1)
        line += f", {clock.first_step_s - record['later_step_s']:.1f} s more than the next ones"
    run_log.log(record)
    run_log.print(line)


def log_train(run_log, step, loss, lr, grad_norm, speed):
    """Log and print the `train` record of `step`: its loss (nats per token), learning rate, gradient norm and the
    speed since the last log (StepClock.lap)."""
    run_log.print(f"step {step}: loss {loss:.4f}, lr {lr:.3e}, {speed['ms_per_step']:.0f} ms/step, "
                  f"{speed['tokens_per_s']:,.0f} tokens/s"
                  + (f", MFU {100 * speed['mfu']:.1f}%" if "mfu" in speed else ""))
    run_log.log({"type": "train", "step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm, **speed})


def stopped(runtime, run_dir, run_log, stop, state, checkpoints):
    """The end of a run that a signal stopped (stopping.py): says where it stopped and how to resume it, and
    returns 0. A new run stopped before its first update has no checkpoint (step 0 is its seed's): what it wrote
    is removed, as for a run that could not start, and it returns 128 + the signal's number. From here on a
    signal changes neither (StopFlag.end)."""
    by = stop.signal or "a signal to another process"
    if checkpoints.path is None:
        status = stop.end(128 + getattr(signal, stop.signal or "SIGTERM"))
        run_log.print(f"stopped by {by} before the first step: nothing to resume; run the same command to start again")
        run_log.finish(1)
        if runtime.master:
            run_dir.remove_log()
            release_new_out_dir(run_dir)
        return status
    stop.end(0)
    run_log.print(f"stopped by {by} after step {state.step}; the checkpoint is {checkpoints.path}. Resume with:\n"
                  f"  {resume_command(runtime)}")
    run_log.finish(0)
    return 0


def train(cfg, config_files, runtime, run_dir):
    """Train (or resume, or evaluate) the run that `cfg` describes on the processes of `runtime`
    (processes.setup) in its out_dir, `run_dir` (a runs.RunDir). Returns the exit status: 0 finished or
    stopped by a signal with a checkpoint written, 3 diverged. Raises SetupError, DataError,
    CheckpointError or PretrainedError, before anything in out_dir is written, for a run that cannot start."""
    run_name = cfg.wandb_run_name or (os.path.splitext(os.path.basename(config_files[-1]))[0]
                                      if config_files else "train")
    micro_steps = micro_steps_per_process(cfg, runtime)
    stop = StopFlag("train.py").install()  # until stop.start(): a signal raises Interrupted (setup undone)
    start = resolve_start(cfg, run_dir)  # from here on init_from and resume_from are read through `start`
    hold_run_dir(cfg, runtime, run_dir, start, stop)
    checkpoints = Checkpointer(cfg, runtime, run_dir, start)  # the checkpoint a resumed run continues, read
    model_settings = cfg.model_settings()  # what the config itself asks of the model, checked on resume
    cfg, raw_model = build_model(cfg, runtime, start, checkpoints.model_args)  # cfg: with the model's settings
    steps = 0 if cfg.eval_only else cfg.max_iters - checkpoints.resumed_step
    if not data_prepared(cfg):  # the time floor needs no data: a GPU config on a CPU is not sent to prepare 18 GB
        check_cpu_time(cfg, runtime, raw_model, steps)
    data = open_data(cfg)  # a block_size the data cannot serve is said before the memory and time it would need
    check_memory(cfg, runtime, raw_model)
    check_cpu_time(cfg, runtime, raw_model, steps)
    data_fingerprint = data.fingerprint()  # recorded in every checkpoint and compared on resume
    downstream = open_tasks(cfg, runtime)
    checkpoints.check(model_settings, data_fingerprint, data.files())
    trainables = build_trainables(cfg, runtime, raw_model)
    state = checkpoints.restore(raw_model, trainables.optimizers, trainables.scaler)
    start_step, resumed_after_eval = state.step, state.evaluated
    clock = StepClock(cfg.gradient_accumulation_steps * cfg.batch_size * cfg.block_size,
                      raw_model.flops_per_token(), cfg.peak_flops or peak_flops(runtime.device), runtime.world_size)

    # from here a signal ends the run at once until its first step (nothing to save), then stops it at the next
    # step boundary with a checkpoint (stopping.StopFlag)
    stop.start(resumes=start.resumes)
    try:
        with stop.deferred():  # the record opens whole: a new run's stop removes it, a resumed run's keeps it
            run_log = start_log(cfg, runtime, run_dir, start, state, run_name, config_files, raw_model,
                                data_fingerprint, clock.tokens_per_iter)
        say_start(run_log, start, checkpoints, raw_model)
        eval_splits = {"train": (data.train, data.train_eval_idx), "val": (data.val, data.val_eval_idx)}
        # in every checkpoint beside the model's own config (Checkpointer.save): the run's config and the data's
        run_info = {"config": asdict(cfg), "data": data_fingerprint}
        t_start, stopping = time.time(), False
        guard = DivergenceGuard(state.steps_above_threshold, cfg.divergence_threshold, cfg.divergence_patience,
                                check_grad_norm=not trainables.scaler.is_enabled(), device=runtime.device)
        while True:
            # evaluate, then checkpoint what was evaluated
            state.evaluated = should_eval(state.step, cfg, start_step, resumed_after_eval, stopping)
            if state.evaluated:
                losses = run_evaluation(cfg, runtime, trainables.eval_model, eval_splits, state.step, stop)
                if losses is None:  # a signal gave the evaluation up: it runs again when the run resumes at this step
                    state.evaluated, stopping = False, True
            if state.evaluated:
                log_evaluation(cfg, runtime, run_log, raw_model, data, state.step, losses)
            if downstream and downstream.due(state.step, start_step, resumed_after_eval, stopping):
                run_tasks(run_log, downstream, raw_model, state.step, stop)
            if checkpoints.save(state, stopping, raw_model, trainables.optimizers, trainables.scaler, run_info):
                run_log.print(f"saved checkpoint to {checkpoints.path} (step {state.step})")
            if stopping:
                return stopped(runtime, run_dir, run_log, stop, state, checkpoints)
            if state.step >= cfg.max_iters or cfg.eval_only:
                break

            clock.start()
            try:
                lr, reduced, grad_norm = train_one_step(cfg, runtime, data, trainables, guard, stop, state.step,
                                                        micro_steps)
            except Exception as e:  # no update of the step was applied: the run stops at state.step
                if not compile_cut_by_stop(cfg, stop, e):
                    raise
                stopping = True
                continue
            state.step += 1
            stop.stepped()  # a signal from now on stops the run with a checkpoint
            # The host reads the device's numbers at log steps, before anything but another step, and where the ranks
            # agree to stop (stopping.py: one step after the signal at most). Every rank reads at the same steps, so
            # every rank takes the same decisions.
            tasks_due = bool(downstream and downstream.due(state.step, start_step, resumed_after_eval, False))
            stop_agreed = stop.agreed(reduced[1], runtime.distributed)
            if stop_agreed or should_read_back(state.step, cfg, start_step, resumed_after_eval, tasks_due):
                train_loss, norm, stopping, (diverged, state.steps_above_threshold) = read_back(
                    cfg, reduced, grad_norm, guard, stop_agreed)
                if diverged:
                    return report_divergence(cfg, run_log, checkpoints, diverged, stop)
            clock.stop()

            if state.step % cfg.log_interval == 0 or stopping:
                if clock.laps == 0 and cfg.compile:  # the session's first log: the compile time
                    log_compile_time(cfg, run_log, state.step, clock)
                log_train(run_log, state.step, train_loss, lr, norm, clock.lap())
    except Interrupted:  # a signal before the first step, during an evaluation or a compilation too
        end_compilation()
        status = stopped(runtime, run_dir, run_log, stop, state, checkpoints)
        teardown(runtime, clean=False)  # another rank may wait in a collective that this one gave up: no barrier
        return status

    run_log.print(f"done: step {state.step}, {time.time() - t_start:.0f} s of training and evaluation")
    run_log.finish(stop.end(0))
    return 0


if __name__ == "__main__":
    cfg, config_files = config_from_argv(TrainConfig)
    run_dir = RunDir(cfg.out_dir)  # the one RunDir of the run: train() writes in it, and the end releases it
    runtime = None
    try:
        runtime = setup(cfg.device, cfg.dtype, cfg.backend, parallelism=cfg.parallelism)
        code = train(cfg, config_files, runtime, run_dir)
    except (SetupError, DataError, CheckpointError, PretrainedError, Interrupted) as e:
        if int(os.environ.get("LOCAL_RANK", 0)) == 0 and not isinstance(e, Interrupted):  # said once per machine
            print(f"error: {e}", file=sys.stderr)
        release_new_out_dir(run_dir)  # a run that could not start leaves no out_dir holding only .lock
        if runtime is not None:
            teardown(runtime, clean=False)
        sys.exit(e.status if isinstance(e, Interrupted) else 1)
    teardown(runtime)
    release_out_dir(run_dir)  # the run ended cleanly: no .lock is left to read as a run in progress
    sys.exit(code)
