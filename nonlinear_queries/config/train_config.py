"""
TrainConfig: every setting of train.py, with its default and its check. Its own module
so that sweep.py can check a whole grid of configs before the first run starts. The model's
settings are flat among the others (--n_layer=12, as nanoGPT's command line) and make the
model's one GPTConfig (TrainConfig.model_config; docs/design.md, "The model's settings").
"""

import ast
import copy
import os
from dataclasses import dataclass, fields
from typing import ClassVar

from model import GPTConfig

# torch.compile's modes (its `mode` argument)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")


@dataclass
class TrainConfig(GPTConfig):
    """Every training setting; the model fields are inherited from GPTConfig.
    Defaults are the paper's baseline (Table 1, first column) on OpenWebText. A field's comment
    (the comment lines above it, then the one at the end of its line) is its line in
    `train.py --help` (configurator.field_comments); a comment after a blank line opens a
    section, its first line the section's title. The model fields are checked by GPTConfig alone: a
    TrainConfig makes its model's GPTConfig once, when it is made (model_config)."""

    # settings that a config file may not hold, with why (configurator.parse_config): deleting a run takes a
    # request on the command line, never a line inherited from a config someone builds on
    COMMAND_LINE_ONLY: ClassVar[dict] = {
        "overwrite": "it deletes the run already in out_dir; pass --overwrite=True on the command line where you "
                     "mean it"}
    # the keys the config files and the command line assign, whatever their values (configurator.parse_config
    # sets it); None for a config built in code
    set_keys: ClassVar[frozenset | None] = None

    # I/O
    out_dir: str = "out"  # the run directory: checkpoints, metrics.jsonl, config.json
    # allow a new run to replace what a run left in out_dir (its checkpoints, metrics.jsonl, config.json, wandb/)
    overwrite: bool = False
    # hold out_dir/.lock (flock) for the run's life, so that a second run on out_dir is refused (lock.py); False
    # on a file system without file locks (Lustre mounted without -o flock), where you see to one run per out_dir
    lock_out_dir: bool = True
    eval_interval: int = 1000  # steps between evaluations (and checkpoints); the last step is always evaluated
    log_interval: int = 10  # steps between train-loss lines and records
    eval_iters: int = 200  # eval batches of eval_batch_size sequences: 200 x 12 = 2400 (paper §3.1)
    # sequences per evaluation batch, 0 = batch_size; set it to the old batch_size to change a run's micro-batch
    # split and keep its evaluations (docs/speed.md)
    eval_batch_size: int = 0
    eval_only: bool = False  # evaluate the model once (scratch, resumed or pretrained) and exit, no checkpoint
    # per-layer attention and query diagnostics at every evaluation (diagnostics.py, docs/diagnostics.md) on
    # the first diagnostics_batches of the eval_iters fixed val batches: a `diag` record in metrics.jsonl
    diagnostics: bool = True
    diagnostics_batches: int = 1  # val batches the diagnostics run on, the first of the eval_iters
    # 'scratch'; 'resume' (from out_dir/ckpt.pt, or from resume_from); or a pretrained model to fine-tune,
    # anything pretrained.load_model reads: gpt2[-medium|-large|-xl], a Hugging Face GPT-2
    # directory, a checkpoint of the official code or of this repo
    init_from: str = "scratch"
    resume_from: str = ""  # a checkpoint file to resume from instead of out_dir/ckpt.pt; implies init_from='resume'
    keep_last_n: int = 2  # newest step checkpoints out_dir/ckpt_<step>.pt kept; the newest is also ckpt.pt
    save_checkpoint_steps: tuple = ()  # steps that also get a checkpoint, never pruned, e.g. (59000, 60000)

    # downstream evaluation with lm-eval on the master rank (downstream.py)
    eval_tasks: str = ""  # comma-separated lm-eval task names, e.g. 'hellaswag,arc_easy'; '' = none (not imported)
    eval_tasks_interval: int = 0  # steps between task runs (also after the last update); 0 = eval_interval
    eval_tasks_limit: int = 0  # examples per task, the first ones; 0 = all
    eval_tasks_include_path: str = ""  # a directory of task YAMLs, e.g. over local data (docs/evaluation.md)

    # wandb
    wandb_log: bool = False  # log to wandb as well as to metrics.jsonl
    wandb_project: str = "nonlinear-queries"  # the wandb project
    # wandb's group, '' = none; sweep.py and study.py set it to the arm (a study's arm, a sweep's named point or
    # grid point but for its seed), so that grouping by it shows each arm as one line with its spread over seeds
    wandb_group: str = ""
    # the run's name in compare.py's tables (its arm's label) and, where wandb_name is '', in wandb; '' = the last
    # config file's name in the tables and the out_dir's last component in wandb
    wandb_run_name: str = ""
    # the run's name in wandb, '' = as wandb_run_name says; sweep.py and study.py set it to the run's directory
    # under the sweep's (the study's) directory, which names its arm and seed, so that no two of their runs share it
    wandb_name: str = ""
    wandb_job_type: str = ""  # wandb's job type, '' = none; study.py sets the stage: tuning, pilot or held-out
    wandb_tags: str = ""  # wandb's tags, comma-separated, '' = none; sweep.py and study.py tag a point's seed: seed=3

    # data
    dataset: str = "openwebtext"  # the data/<dataset> whose prepare.py wrote train.bin and val.bin
    data_dir: str = ""  # '' = data/<dataset> in the repo
    data_seed: int = 1337  # batch order; the same for every model variant
    batch_size: int = 12  # micro-batch, sequences
    gradient_accumulation_steps: int = 40  # 12 x 40 x 1024 = 491,520 tokens per step

    # AdamW
    learning_rate: float = 6e-4  # AdamW's peak rate, reached after warmup_iters (the schedule below)
    max_iters: int = 60000  # optimizer steps (updates) the run trains for
    weight_decay: float = 0.1  # AdamW's decoupled weight decay on the 2-D weights
    beta1: float = 0.9  # AdamW's first-moment decay
    beta2: float = 0.95  # AdamW's second-moment decay
    grad_clip: float = 1.0  # 0 disables clipping
    # 'adamw', or 'muon': Muon for the blocks' 2-D matrices, AdamW (the settings above) for the rest (optimizers.py)
    optimizer: str = "adamw"
    muon_learning_rate: float = 0.02  # Muon's peak rate; the schedule scales it as it scales learning_rate
    muon_momentum: float = 0.95  # Muon's Nesterov momentum
    muon_weight_decay: float = 0.0  # decoupled: each step multiplies a matrix by 1 - lr * muon_weight_decay
    # Muon's rate per matrix of shape (A, B): 'original' lr * sqrt(max(1, A / B)) (Jordan et al.),
    # 'match_rms_adamw' lr * 0.2 * sqrt(max(A, B)), an update RMS like AdamW's (Liu et al. 2025, Moonlight)
    muon_adjust_lr_fn: str = "original"
    z_loss: float = 0.0  # coefficient of the penalty z_loss * mean(log Z^2) on the log-partition log Z; 0 = off

    # learning-rate schedule
    # after a linear warmup over warmup_iters: 'cosine', a cosine decay to min_lr at lr_decay_iters (the paper's)
    # and min_lr after; 'linear_to_zero', a linear decay to 0 at lr_decay_iters (min_lr unused) and 0 after
    lr_schedule: str = "cosine"
    decay_lr: bool = True  # False: constant learning_rate, no warmup
    warmup_iters: int = 2000  # steps of the linear warmup to the peak rate
    lr_decay_iters: int = 60000  # the step at which the decay ends
    min_lr: float = 6e-5  # the rate the cosine decay ends at

    # system
    device: str = "auto"  # 'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:1', ...
    # on the CPU, start a run whose steps would take more than a week even at the rate of this CPU's matmuls
    # (budget.SLOW_RUN_S; the paper's config: decades), which is refused otherwise
    allow_slow: bool = False
    dtype: str = "auto"  # 'auto' (bfloat16 on CUDA, float32 on CPU), 'float32', 'bfloat16', 'float16'
    compile: bool = True  # torch.compile the model
    # torch.compile's mode: 'default', 'reduce-overhead' (CUDA graphs), 'max-autotune-no-cudagraphs' (inductor tries
    # matmul and fusion choices), 'max-autotune' (both); it changes the speed and the compile time, not the model
    compile_mode: str = "default"
    # inductor's lowering of a cat: True (its default) one kernel that runs every input's math under a mask; False
    # each input writes its own slice (processes.compile_kwargs: tried for res_gelu's backward); exact either way
    compile_pointwise_cat: bool = True
    # inductor's options (torch._inductor.config names) as NAME=VALUE[,NAME=VALUE], e.g. 'online_softmax=False',
    # joined to compile_mode's own and passed to torch.compile under ddp and fsdp (processes.compile_kwargs); '' = none
    compile_options: str = ""
    # res_gelu's f through Triton kernels registered as custom ops (nonlinear_queries/ops/kernels.py): on CUDA,
    # or on the CPU under TRITON_INTERPRET=1; elsewhere the ops' PyTorch path. The same math; other query modes
    # unchanged
    kernels: bool = False
    seed: int = 1337  # model init and dropout
    peak_flops: float = 0.0  # device peak FLOP/s for MFU; 0 = look it up by GPU name
    # torch.distributed backend under torchrun: 'auto' (nccl on CUDA, gloo on CPU), 'nccl', 'gloo'
    backend: str = "auto"
    # how the processes under torchrun share the model: 'ddp' (every process holds all of it, PyTorch DDP)
    # or 'fsdp' (each holds 1/W of the weights, gradients and optimizer states, FSDP2; runtime/processes.py);
    # checkpoints follow: one file under ddp, a sharded directory under fsdp (checkpoint.py)
    parallelism: str = "ddp"
    # recompute each block's activations in the backward pass instead of keeping them: less memory,
    # about one more forward pass of compute, the same gradients (torch.utils.checkpoint, non-reentrant)
    activation_checkpointing: bool = False

    # divergence guard; a non-finite loss or gradient norm always stops the run
    # the loss above which a step counts toward divergence_patience: uniform guessing scores ln(50304) = 10.83,
    # an untrained GPT-2 about 11.0; 0 disables
    divergence_threshold: float = 12.0
    divergence_patience: int = 100  # consecutive steps with the loss above divergence_threshold that stop the run

    def __post_init__(self):
        # the model's settings made into the model's config here, once: GPTConfig's checks are theirs
        self._model_config = GPTConfig(**{f.name: getattr(self, f.name) for f in fields(GPTConfig)})
        self.check_training()

    def model_config(self):
        """The model's GPTConfig: this config's model settings, made and checked once, when this config was
        (or, after with_model, the built model's own). train.py builds the GPT from it, and the checkpoint
        records it (asdict of the model's config)."""
        return self._model_config

    def with_model(self, model_config):
        """This run's config as its model was built: its model settings those of model_config (the built GPT's
        GPTConfig: a resumed checkpoint's, a pretrained source's, or this config's own, which returns this
        config), and model_config() that same object, so that config.json, the metrics header and the printed
        config say the model's actual settings. Only the training settings are checked again (check_training):
        model_config was checked when it was made. Raises ValueError for a training setting the model's rule
        out (parametrization='mup' when fine-tuning)."""
        if model_config is self._model_config:
            return self
        run = copy.copy(self)  # set_keys, what the config files and the command line gave, kept
        for f in fields(GPTConfig):
            setattr(run, f.name, getattr(model_config, f.name))
        run._model_config = model_config
        run.check_training()
        return run

    def check_training(self):
        """Check the training settings (the model's are GPTConfig's to check); resume_from implies
        init_from='resume'. Raises ValueError naming the setting and what to do."""
        if not self.init_from:
            raise ValueError("init_from must be 'scratch', 'resume' or a pretrained model (see pretrained.py)")
        if self.resume_from:
            self.init_from = "resume"
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.lr_schedule not in ("cosine", "linear_to_zero"):
            raise ValueError(f"lr_schedule must be 'cosine' or 'linear_to_zero', got {self.lr_schedule!r}")
        if self.optimizer not in ("adamw", "muon"):
            raise ValueError(f"optimizer must be 'adamw' or 'muon', got {self.optimizer!r}")
        if self.muon_adjust_lr_fn not in ("original", "match_rms_adamw"):
            raise ValueError(f"muon_adjust_lr_fn must be 'original' or 'match_rms_adamw', "
                             f"got {self.muon_adjust_lr_fn!r}")
        if self.muon_learning_rate < 0 or self.muon_weight_decay < 0 or not 0 <= self.muon_momentum < 1:
            raise ValueError(f"Muon needs muon_learning_rate >= 0, muon_weight_decay >= 0 and 0 <= muon_momentum < 1, "
                             f"got {self.muon_learning_rate}, {self.muon_weight_decay}, {self.muon_momentum}")
        if self.z_loss < 0:
            raise ValueError(f"z_loss must be >= 0 (0 = off), got {self.z_loss}")
        if self.compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {', '.join(COMPILE_MODES)}, got {self.compile_mode!r}")
        if self.max_iters == 0 and not self.eval_only:
            raise ValueError(f"max_iters={self.max_iters} trains no step, so the run would end without a checkpoint; "
                             f"to evaluate a model without training it, pass --eval_only=True (one evaluation, no "
                             f"checkpoint written)")
        parse_compile_options(self.compile_options)
        if self.eval_batch_size < 0:
            raise ValueError(f"eval_batch_size must be >= 0 (0 = batch_size), got {self.eval_batch_size}")
        if self.backend not in ("auto", "nccl", "gloo"):
            raise ValueError(f"backend must be auto, nccl or gloo, got {self.backend!r}")
        if self.parallelism not in ("ddp", "fsdp"):
            raise ValueError(f"parallelism must be 'ddp' or 'fsdp', got {self.parallelism!r}")
        if self.parallelism == "fsdp" and self.dtype == "float16":
            raise ValueError("parallelism='fsdp' with dtype='float16' cannot work here: float16 needs loss scaling, "
                             "and the GradScaler checks for overflow in the gradients it sees, which under FSDP are "
                             "this process's shard only, so the processes could skip different steps. Use "
                             "dtype='bfloat16' (no loss scaling) or parallelism='ddp'")
        if self.parametrization == "mup" and self.init_from not in ("scratch", "resume"):
            raise ValueError(f"parametrization='mup' trains a model from scratch (or resumes one); init_from="
                             f"{self.init_from!r} loads weights trained under SP, whose logits and rates μP would "
                             f"rescale. Fine-tune with parametrization='sp'")
        if self.parallelism == "fsdp" and self.eval_tasks:
            raise ValueError("eval_tasks with parallelism='fsdp' cannot work here: the tasks run on rank 0 alone, "
                             "which holds only its shard of the weights. Leave eval_tasks empty and run eval.py on "
                             "a checkpoint made whole by "
                             "`python -m nonlinear_queries.weights.checkpoint --out_dir=RUN`")
        for key in ("eval_interval", "log_interval", "eval_iters", "batch_size", "gradient_accumulation_steps",
                    "keep_last_n", "divergence_patience", "diagnostics_batches"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        for key in ("max_iters", "warmup_iters", "lr_decay_iters", "learning_rate", "min_lr", "weight_decay",
                    "grad_clip", "peak_flops", "divergence_threshold", "seed", "data_seed"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be >= 0, got {getattr(self, key)}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"AdamW's beta1 and beta2 must be in [0, 1), got {self.beta1} and {self.beta2}")
        if self.diagnostics_batches > self.eval_iters:
            raise ValueError(f"diagnostics_batches={self.diagnostics_batches} exceeds eval_iters={self.eval_iters}: "
                             f"the diagnostics run on the first diagnostics_batches of the eval_iters fixed val "
                             f"batches; lower diagnostics_batches or raise eval_iters")
        if self.eval_tasks_interval < 0 or self.eval_tasks_limit < 0:
            raise ValueError(f"eval_tasks_interval and eval_tasks_limit must be >= 0 (0 = eval_interval, 0 = all "
                             f"examples), got {self.eval_tasks_interval} and {self.eval_tasks_limit}")
        unused = [k for k in ("eval_tasks_interval", "eval_tasks_limit", "eval_tasks_include_path") if getattr(self, k)]
        if unused and not self.eval_tasks.strip():
            raise ValueError(f"{', '.join(unused)} set but eval_tasks is empty: name the tasks to run, e.g. "
                             f"eval_tasks='hellaswag'")
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in self.save_checkpoint_steps):
            raise ValueError(f"save_checkpoint_steps must be steps >= 1, got {self.save_checkpoint_steps!r}")

    def model_settings(self):
        """{GPTConfig field: value} of the model settings this config gives: those its config files and
        command line set, to any value (set_keys: `--query_mode=linear` is a setting even though linear is
        the default), or, for a config built in code, those that differ from GPTConfig's defaults. A run
        that resumes or fine-tunes takes its model from the checkpoint or the pretrained source, and these
        must agree with it (or be overrides the source allows)."""
        def given(f):
            return f.name in self.set_keys if self.set_keys is not None else getattr(self, f.name) != f.default

        return {f.name: getattr(self, f.name) for f in fields(GPTConfig) if given(f)}

    def wandb_init(self):
        """wandb.init's project, group, name, job_type and tags for this run (each None where unset): the name is
        wandb_name, else wandb_run_name, else out_dir's last component, since a config file's name is shared by
        every run of it; the tags are wandb_tags split at its commas."""
        return {"project": self.wandb_project, "group": self.wandb_group or None,
                "name": self.wandb_name or self.wandb_run_name or os.path.basename(os.path.abspath(self.out_dir)),
                "job_type": self.wandb_job_type or None,
                "tags": [t.strip() for t in self.wandb_tags.split(",") if t.strip()] or None}


def parse_compile_options(text, what="compile_options"):
    """{name: value} of compile_options' NAME=VALUE[,NAME=VALUE] ('' gives {}): each value a Python literal
    (False, 0, 'x'), else the string as written. Raises ValueError for a pair without '=' or a name; the
    names and types are inductor's to check (torch.compile refuses an unknown one when it compiles). `what`
    names the setting in the message."""
    options = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{what} takes NAME=VALUE pairs separated by commas, e.g. "
                             f"'online_softmax=False'; got {pair!r} in {text!r}")
        try:
            options[name.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            options[name.strip()] = value.strip()
    return options
