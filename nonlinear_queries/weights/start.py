"""
How train.py's run starts: where its weights come from, settled once (resolve_start: from scratch, resuming a
checkpoint, or fine-tuning a pretrained model; nanoGPT settles the same in one if/elif on init_from), and the
model built from the start (build_model). The run directory is held by lock.hold_run_dir, and the commands that go
on from here are cli.run_command's. After resolve_start nothing reads init_from or resume_from: train.py,
runs.RunDir.check_start and checkpoint.Checkpointer read the Start.
"""

from dataclasses import dataclass, replace

import torch

from model import GPT
from nonlinear_queries.errors import SetupError
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


def build_model(cfg, runtime, start, resumed_args):
    """The run's model on runtime.device (runtime: processes.setup's processes) for the run that starts from `start` (a
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
    return cfg.with_model(model.config), model.to(runtime.device)
