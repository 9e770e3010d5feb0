"""
How train.py's run starts: where its weights come from, settled once (resolve_start: from scratch, resuming a
checkpoint, or fine-tuning a pretrained model; nanoGPT settles the same in one if/elif on init_from), its run
directory held (hold_run_dir: the lock, no run replaced unasked, no resume of a checkpoint that is not there), the
model built from the start (build_model), and the commands that go on from here (run_command, resume_command).
After resolve_start nothing reads init_from or resume_from: train.py, runs.RunDir.check_start and
checkpoint.Checkpointer read the Start.
"""

import os
import shlex
import sys
from dataclasses import dataclass, replace

import torch

from model import GPT
from nonlinear_queries.record.errors import SetupError
from nonlinear_queries.record.lock import hold_out_dir, left_lock_holder, make_out_dir
from nonlinear_queries.weights.checkpoint import latest_checkpoint
from nonlinear_queries.weights.pretrained import load_model

# the kinds of Start
SCRATCH = "scratch"
RESUME = "resume"
FINE_TUNE = "fine-tune"


@dataclass(frozen=True)
class Start:
    """Where a training run's weights come from (resolve_start makes it).

    kind: SCRATCH (new weights, seeded by the config's seed), RESUME (a checkpoint of this run, its training state
    included) or FINE_TUNE (a pretrained model's weights, for a new run). path: for RESUME the checkpoint to
    continue (a file or a sharded directory, not yet checked to exist: checkpoint.Checkpointer says so); for
    FINE_TUNE the source pretrained.load_model reads (gpt2, a Hugging Face or export directory, a run directory, a
    checkpoint file); '' for SCRATCH."""

    kind: str
    path: str = ""

    @property
    def resumes(self):
        """Whether the run continues a checkpoint of its own (the run in out_dir, or resume_from)."""
        return self.kind == RESUME

    @property
    def fine_tunes(self):
        """Whether the run is a new one on a pretrained model's weights."""
        return self.kind == FINE_TUNE


def resolve_start(cfg, run_dir):
    """The Start of the run that `cfg` describes (a TrainConfig: init_from, resume_from, parallelism), whose out_dir
    is `run_dir` (a runs.RunDir): a resume_from, or init_from='resume', resumes resume_from or else the newest
    checkpoint in run_dir (checkpoint.latest_checkpoint: ckpt.pt or ckpt.dcp, whichever holds the later step);
    init_from='scratch' starts from scratch; any other init_from fine-tunes the pretrained source it names.
    Raises nothing: a checkpoint that is missing or unreadable is checkpoint.Checkpointer's error."""
    if cfg.resume_from or cfg.init_from == "resume":
        return Start(RESUME, cfg.resume_from or latest_checkpoint(run_dir, cfg.parallelism))
    if cfg.init_from == "scratch":
        return Start(SCRATCH)
    return Start(FINE_TUNE, cfg.init_from)


def run_command(rt, *flags):
    """This process's own command line (sys.argv, under torchrun with its launcher and this machine's process
    count, from rt, runtime.setup's processes) without its --init_from, --resume_from and --overwrite, and with
    `flags` (such as '--init_from=scratch') instead."""
    args = [a for a in sys.argv[1:] if not a.startswith(("--init_from=", "--resume_from=", "--overwrite="))]
    launcher = (f"torchrun --nproc_per_node={os.environ.get('LOCAL_WORLD_SIZE', rt.world_size)} "
                "[your other torchrun options] " if "RANK" in os.environ else "python ")
    return launcher + shlex.join([sys.argv[0], *args, *flags])


def resume_command(rt):
    """The command line that continues this run from its checkpoint: run_command with --init_from=resume."""
    return run_command(rt, "--init_from=resume")


def hold_run_dir(cfg, rt, run_dir, source, stop):
    """Hold the run directory `run_dir` (a runs.RunDir, cfg.out_dir's) for the run that starts from `source` (a
    Start): on rank 0 created and, with cfg.lock_out_dir, locked for this process's life (lock.py; one run per
    out_dir); a run that resumes a checkpoint that is not there, and a new run that would replace or append to
    what a run left there unasked (checkpoints, metrics.jsonl, config.json, wandb/, a .lock no process holds)
    unless cfg.overwrite, are refused on every rank (runs.RunDir.check_start), every file there left as it was,
    a killed run's lock file included (lock.py). rt: runtime.setup's processes; stop: the run's stopping.StopFlag,
    which defers a signal while the lock is taken. Raises SetupError (OutDirBusy, NoFileLocks, OutDirUnwritable)
    or CheckpointError."""
    left_lock = left_lock_holder(run_dir)  # before this run takes the lock
    if rt.master and cfg.lock_out_dir:
        with stop.deferred():  # a signal now would leave a lock file that nothing records to remove
            hold_out_dir(run_dir)
    elif rt.master:
        make_out_dir(run_dir)
    run_dir.check_start(source, cfg.overwrite, lambda *flags: run_command(rt, *flags), left_lock)


def build_model(cfg, rt, start, resumed_args):
    """The run's model on rt.device (rt: runtime.setup's processes) for the run that starts from `start` (a
    Start), built from one GPTConfig: the config's own (cfg.model_config(), a TrainConfig's; init seeded by
    cfg.seed), resumed_args (a resumed checkpoint's model_args, {} for a new run) over it, or a pretrained
    source's to fine-tune (its new parameters, such as anchored_res_gelu's f, seeded by cfg.seed). Returns (cfg
    with the model's settings, TrainConfig.with_model, model). Raises PretrainedError, or SetupError for
    model_args GPTConfig refuses or a model μP cannot classify."""
    torch.manual_seed(cfg.seed)
    if start.fine_tunes:
        model = load_model(start.path, **cfg.model_settings())
    else:
        try:
            # a checkpoint's model_args win; settings it predates keep the config's values
            model = GPT(replace(cfg.model_config(), **resumed_args) if resumed_args else cfg.model_config())
        except ValueError as e:  # model_args GPTConfig refuses, a parameter μP cannot classify (GPT._mup_roles)
            raise SetupError(str(e)) from None
    return cfg.with_model(model.config), model.to(rt.device)
