"""
Checkpoints of train.py, the training state alone: listed, written atomically, and read back
with every check. train.py holds them through one Checkpointer: which checkpoint a run continues,
its checks and restore, and when and where to save (should_save). Files are read through
checkpoint_file.load_checkpoint_file, the repo's one torch.load; a program that only reads a
model loads it with pretrained.load_model, which never comes here.

The checkpoint format, described here alone (the docs link here):

Under parallelism='ddp' a checkpoint is one file. Files in a run's out_dir: ckpt_<step>.pt
(6 digits) for the newest keep_last_n steps and for the save_checkpoint_steps, and ckpt.pt,
the newest of them (the same file under a second name). A checkpoint is a dict of tensors
and plain containers, read with torch.load(weights_only=True), which never unpickles
arbitrary objects:

    model                   the model's state dict
    optimizer               a list of state dicts, one per optimizer of optimizers.py (a
                            single state dict in checkpoints written before Muon was added)
    model_args              the GPTConfig fields the model was built with
    step                    optimizer updates done
    evaluated               whether the evaluation of `step` is in metrics.jsonl already
    steps_above_threshold   the divergence guard's streak at `step`
    config                  the whole resolved training config
    data                    fingerprints of the token files and index streams (batches.py)
    wandb_id                the wandb run to continue, '' if none
    grad_scaler             the float16 GradScaler's state_dict (loss scale, growth count), {} when
                            disabled; absent in checkpoints written before it was saved

Under parallelism='fsdp' a checkpoint is a directory, ckpt_<step>.dcp, written by every
process at once through torch.distributed.checkpoint (DCP): each process writes its shards
of the weights and optimizer states (get_state_dict: names as in the model's state dict,
tensors as FSDP's DTensor shards), DCP adds its index (.metadata), and rank 0 adds meta.pt,
the dict above without model and optimizer but with the optimizers' names and param_groups
(their hyperparameters, which DCP would otherwise store as pickles). ckpt.dcp is a symbolic
link to the newest. DCP reads the shards on any number of processes (set_state_dict), and
without any (consolidate(), which makes a ckpt.pt for sample.py and export.py):

    python -m nonlinear_queries.weights.checkpoint --out_dir=out-gpt3-xl   # out-gpt3-xl/ckpt.dcp -> ckpt.pt

The shards and meta.pt are read with torch.load(weights_only=True); DCP reads its own
.metadata index with pickle, so load sharded checkpoints only from directories you trust.
"""

import errno
import os
import shutil
import sys
import warnings
from dataclasses import asdict, dataclass, fields

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from model import GPT, GPTConfig
from nonlinear_queries.config.configurator import config_from_argv
from nonlinear_queries.config.train_config import TrainConfig
from nonlinear_queries.data.batches import fingerprint_change
from nonlinear_queries.errors import CheckpointError, DiskFullError
from nonlinear_queries.record.atomic import atomic_path, fsync_path, in_flight
from nonlinear_queries.record.runs import RunDir
from nonlinear_queries.trainer.optimizers import build_optimizers, load_optimizer_states
from nonlinear_queries.weights.checkpoint_file import load_checkpoint_file, unreadable_checkpoint, upgrade_model_args


@dataclass
class TrainState:
    """The training loop's own state, saved in every checkpoint (the module docstring's format) and restored as
    one unit (its fields are checkpoint keys, spelled only here)."""

    step: int = 0  # optimizer updates done
    evaluated: bool = False  # whether the evaluation of `step` is in metrics.jsonl already
    steps_above_threshold: int = 0  # the divergence guard's streak at `step` (training.divergence_reason)
    wandb_id: str = ""  # the wandb run to continue, '' if none

    def state_dict(self):
        """The checkpoint entries of this state: {field: value}."""
        return asdict(self)

    @classmethod
    def from_checkpoint(cls, ckpt):
        """The state a checkpoint dict (or a sharded checkpoint's meta) was saved with."""
        return cls(**{f.name: ckpt[f.name] for f in fields(cls)})


CHECKPOINT_KEYS = {"model", "optimizer", "model_args", "data", *(f.name for f in fields(TrainState))}
# what meta.pt of a sharded checkpoint holds: the keys above but the weights and states, which are shards
SHARDED_KEYS = CHECKPOINT_KEYS - {"model", "optimizer"} | {"optimizers", "param_groups"}


def latest_checkpoint(run_dir, parallelism):
    """The checkpoint that --init_from=resume continues in the run directory `run_dir` (a runs.RunDir): its
    ckpt.pt (written under ddp) or ckpt.dcp (under fsdp), whichever holds the later step; the one `parallelism`
    writes when both hold the same step (a ckpt.pt made from ckpt.dcp by consolidate) or neither exists."""
    paths = {p: run_dir.latest_checkpoint(p) for p in RunDir.LATEST}
    found = [k for k, p in paths.items() if os.path.exists(p)]
    if len(found) < 2:
        return paths[found[0] if found else parallelism]

    def step(path):
        try:
            return read_checkpoint(path, mmap=True)["step"]
        except CheckpointError:  # said when it is resumed from
            return -1

    steps = {k: step(p) for k, p in paths.items()}
    other = "ddp" if parallelism == "fsdp" else "fsdp"
    return paths[other if steps[other] > steps[parallelism] else parallelism]


def tensor_bytes(obj, seen=None):
    """Bytes of the tensor storages in a nested dict/list/tuple, each storage once (tied weights
    share one): what torch.save writes, less its small framing (names, pickled containers). A
    DTensor (an FSDP shard) counts as the whole tensor it is a shard of, at every entry: what the
    processes of a sharded checkpoint write together, since DCP writes each entry on its own (tied
    weights twice)."""
    seen = set() if seen is None else seen
    if isinstance(obj, DTensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        if storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return storage.nbytes()
    if isinstance(obj, dict):
        obj = obj.values()
    if isinstance(obj, (list, tuple, type({}.values()))):
        return sum(tensor_bytes(v, seen) for v in obj)
    return 0


def _disk_full(path, need, cause=""):
    directory = os.path.dirname(os.path.abspath(path))
    free = shutil.disk_usage(directory).free
    kept = (f"the previous checkpoint, {path}, is intact" if os.path.exists(path)
            else "no earlier checkpoint of this run was written")
    return DiskFullError(f"no space to write the checkpoint {path}{cause}: it needs {need / 2**20:,.1f} MiB and "
                         f"{directory} has {free / 2**20:,.1f} MiB free; nothing was left half written and {kept}. "
                         f"Free space there, then continue the run with --init_from=resume")


def _is_disk_full(e):
    """Whether a write failed for want of space: ENOSPC/EDQUOT, or torch.save's writer failing
    (it reports a short write as a RuntimeError, 'enforce fail at inline_container.cc')."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return isinstance(e, RuntimeError) and any(m in str(e) for m in ("inline_container", "PytorchStreamWriter",
                                                                     "file write failed"))


def _save_file(obj, path):
    """torch.save to path.tmp, fsync, rename over path (atomic: path is the old or the new file).
    Raises DiskFullError, before writing, if the disk has less free space than the tensors
    take (plus 1% and 1 MiB for the framing), or if the write runs out of space; either way no
    partial file is left and path is untouched."""
    need = int(tensor_bytes(obj) * 1.01) + 2**20
    if shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free < need:
        raise _disk_full(path, need)
    try:
        with atomic_path(path) as tmp:
            torch.save(obj, tmp)
    except (OSError, RuntimeError) as e:
        if not _is_disk_full(e):
            raise
        raise _disk_full(path, need, f" (the disk filled while it was written: {str(e).splitlines()[0][:100]})"
                         ) from None


def save_checkpoint(run_dir, ckpt, keep_last_n, keep_steps=()):
    """Write the checkpoint dict `ckpt` (of step ckpt['step']) into the run directory `run_dir` (a
    runs.RunDir) so that a crash at any moment leaves the previous one loadable: torch.save to
    ckpt.pt.tmp, fsync, rename over ckpt.pt (atomic; the previous checkpoint keeps its step name),
    add the step name as a hard link (no second copy on disk), fsync the directory so the renames
    survive a power loss, and only then delete the step checkpoints beyond the newest keep_last_n
    that are not in keep_steps. Checkpoints of later steps than ckpt['step'] are left alone: they belong to
    a run that was resumed from an older checkpoint. Returns the path of ckpt.pt."""
    step = ckpt["step"]
    path = run_dir.latest_checkpoint()
    _save_file(ckpt, path)
    link = RunDir.linking(path)
    if os.path.lexists(link):  # left by a crash in the next three lines
        os.remove(link)
    try:
        os.link(path, link)
    except OSError:  # a file system without hard links: a second copy
        shutil.copyfile(path, link)
        fsync_path(link)
    os.replace(link, run_dir.step_checkpoint(step))
    fsync_path(run_dir.path)
    older = [(s, p) for s, p in run_dir.step_checkpoints() if s <= step]
    for s, old in older[keep_last_n:]:
        if s not in keep_steps:
            os.remove(old)
    return path


def _failed_write(e, path, need):
    """("full", the DiskFullError message) if the write that raised `e` (a CheckpointException of DCP,
    naming each rank's error, or an OSError or RuntimeError) ran out of space (_is_disk_full), else
    ("failed", its first line)."""
    causes = [c for c, _ in e.failures.values()] if isinstance(e, CheckpointException) else [e]
    full = [c for c in causes if _is_disk_full(c)]
    if full:
        detail = str(full[0]).splitlines()[0][:100]
        return "full", str(_disk_full(path, need, f" (the disk filled while it was written: {detail})"))
    return "failed", f"{type(causes[0]).__name__}: {str(causes[0]).splitlines()[0] if str(causes[0]) else ''}"


def _broadcast(value):
    """Rank 0's `value` (a small picklable object) on every process of the group."""
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def save_sharded_checkpoint(run_dir, model, optimizers, meta, keep_last_n, keep_steps=()):
    """Write the sharded checkpoint of step meta['step'] into the run directory `run_dir` (a runs.RunDir)
    from every process of the group, so that a crash at any moment leaves the previous one loadable:
    all processes write their shards of the model and the optimizers (DCP, get_state_dict) into
    ckpt_<step>.dcp.tmp, rank 0 adds meta.pt (`meta`: the keys of a checkpoint file but model and
    optimizer, plus the optimizers' names and param_groups), fsyncs it and the directory, renames the
    directory to ckpt_<step>.dcp (atomic), points the symbolic link ckpt.dcp at it (a new link renamed
    over the old: atomic too), fsyncs out_dir, and only then deletes the step checkpoints beyond the
    newest keep_last_n not in keep_steps. Call it on every process. Returns the path of ckpt.dcp.

    A full disk is a DiskFullError on every process, as for a checkpoint file (_save_file): before
    writing when rank 0 sees less free space than the whole checkpoint takes (every shard, plus 1%
    and 1 MiB), or when a write runs out of space (DCP reports it as a CheckpointException, a
    BaseException, naming each rank's error); ckpt_<step>.dcp.tmp is then removed, so the disk is
    not left fuller, and the previous checkpoint is untouched. Any other failure also removes it and
    is raised as it came (on the other processes, a CheckpointError saying that rank 0 failed)."""
    master = dist.get_rank() == 0
    final = run_dir.step_checkpoint(meta["step"], ".dcp")
    tmp, old = RunDir.writing(final), RunDir.replaced(final)
    path = run_dir.latest_checkpoint("fsdp")
    model_state, optim_state = get_state_dict(model, optimizers)
    state = {"model": model_state, "optimizer": optim_state["state"]}
    need = int(tensor_bytes(state) * 1.01) + 2**20
    full = None
    if master:
        for left in (tmp, old):  # by a crash during an earlier write
            if os.path.exists(left):
                shutil.rmtree(left)
        if shutil.disk_usage(run_dir.path).free < need:
            full = str(_disk_full(path, need))
    full = _broadcast(full)  # every process waits for rank 0's cleanup and check
    if full:
        raise DiskFullError(full)
    failure = None
    try:
        with in_flight(tmp):  # a process that must exit mid-write removes it (atomic.discard_in_flight)
            dcp.save(state, checkpoint_id=tmp)
    except CheckpointException as e:  # raised on every process, once all have stopped writing
        failure = e
    outcome = None  # rank 0's verdict: None, ("full", message) or ("failed", what failed)
    if master:
        if failure is None:
            try:
                with atomic_path(os.path.join(tmp, "meta.pt")) as meta_tmp:
                    torch.save({**meta, "optimizers": [type(o).__name__ for o in optimizers],
                                "param_groups": optim_state["param_groups"]}, meta_tmp)
                fsync_path(tmp)
            except (OSError, RuntimeError) as e:
                failure = e
        if failure is not None:
            shutil.rmtree(tmp, ignore_errors=True)
            outcome = _failed_write(failure, path, need)
    outcome = _broadcast(outcome)
    if outcome and outcome[0] == "full":
        raise DiskFullError(outcome[1])
    if outcome:
        if failure is not None:
            raise failure  # DCP's error, or on rank 0 its own, as it came
        raise CheckpointError(f"rank 0 could not finish the checkpoint {final}: {outcome[1]}")
    if master:
        if os.path.exists(final):  # this step again, by a run resumed from an older checkpoint
            os.replace(final, old)
        os.replace(tmp, final)
        link = RunDir.linking(path)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(os.path.basename(final), link)
        os.replace(link, path)
        fsync_path(run_dir.path)
        if os.path.exists(old):
            shutil.rmtree(old)
        older = [(s, p) for s, p in run_dir.step_checkpoints((".dcp",)) if s <= meta["step"]]
        for s, stale in older[keep_last_n:]:
            if s not in keep_steps:
                shutil.rmtree(stale)
    return path


def save_training_state(run_dir, model, optimizers, meta, keep_last_n, keep_steps, sharded):
    """Checkpoint `model` and `optimizers` with `meta` (the other keys of the module docstring's format) into the
    run directory `run_dir` (a runs.RunDir): sharded, a directory written by every process
    (save_sharded_checkpoint); otherwise one file written by rank 0 (save_checkpoint; other
    processes write nothing). Call it on every process. Returns the path of ckpt.dcp or ckpt.pt."""
    if sharded:
        return save_sharded_checkpoint(run_dir, model, optimizers, meta, keep_last_n, keep_steps)
    if not dist.is_initialized() or dist.get_rank() == 0:
        save_checkpoint(run_dir, {"model": model.state_dict(), "optimizer": [o.state_dict() for o in optimizers],
                                  **meta}, keep_last_n, keep_steps)
    return run_dir.latest_checkpoint()


def restore_grad_scaler(scaler, ckpt):
    """Set `scaler` (torch.amp.GradScaler) to the loss scale and growth count that `ckpt` (a
    checkpoint dict or a sharded checkpoint's meta) saved under "grad_scaler" (GradScaler.state_dict()),
    so a resumed float16 run scales its losses as the unbroken run would: a fresh scaler starts again at
    2^16 and skips the steps that overflow while it backs off to the run's scale. A disabled scaler
    (float32, bfloat16), or a checkpoint without a saved scale (a run that was not float16, or one
    written before the scale was saved), leaves `scaler` as it is."""
    saved = ckpt.get("grad_scaler") or {}
    if scaler.is_enabled() and saved:
        scaler.load_state_dict(saved)


def read_checkpoint(path, map_location="cpu", mmap=False):
    """The checkpoint dict of a file written by save_checkpoint (load_checkpoint_file, then
    upgrade_model_args), or of a sharded checkpoint directory its meta.pt, without the weights
    and optimizer states (load_training_state reads those). Raises CheckpointError if the file
    or directory is missing, truncated, corrupt or not a checkpoint of train.py; the message
    lists the other checkpoints in its directory."""
    sharded = os.path.isdir(path)
    if sharded and not os.path.isfile(os.path.join(path, ".metadata")):
        raise unreadable_checkpoint(path, "it is incomplete: it has no .metadata, the index DCP writes last")
    ckpt = load_checkpoint_file(os.path.join(path, "meta.pt") if sharded else path, map_location, mmap)
    missing = (SHARDED_KEYS if sharded else CHECKPOINT_KEYS) - set(ckpt if isinstance(ckpt, dict) else ())
    if missing:
        raise unreadable_checkpoint(path, f"it is not a checkpoint of train.py: it has no {', '.join(sorted(missing))}")
    ckpt["model_args"] = upgrade_model_args(ckpt["model_args"])
    return ckpt


def load_training_state(ckpt, path, model, optimizers, scaler=None):
    """Load the weights and optimizer states of the checkpoint at `path` (ckpt: what
    read_checkpoint(path) returned) into `model`, a GPT (plain, or sharded by FSDP), and
    `optimizers` (optimizers.build_optimizers on it), and the loss scale and growth count of a
    float16 run into `scaler`, an enabled torch.amp.GradScaler (restore_grad_scaler). A sharded
    checkpoint loads on any number of processes, or without a process group at all: DCP reads each
    process's part of every tensor (get_state_dict / set_state_dict reshard it). Call it on every
    process. Raises CheckpointError when the checkpoint holds other optimizers than the config
    builds, or when a checkpoint file (written under ddp) meets a sharded model."""
    if scaler is not None:
        restore_grad_scaler(scaler, ckpt)
    names = [type(o).__name__ for o in optimizers]
    if os.path.isdir(path):
        if ckpt["optimizers"] != names:
            raise CheckpointError(f"{path} holds the states of {', '.join(ckpt['optimizers'])} but this config "
                                  f"builds {', '.join(names)}; resume with the run's own `optimizer`")
        model_state, optim_state = get_state_dict(model, optimizers)
        state = {"model": model_state, "optimizer": optim_state["state"]}
        with warnings.catch_warnings():  # without a process group DCP warns that one process reads it all: the intent
            warnings.filterwarnings("ignore", "torch.distributed is disabled")
            dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizers, model_state_dict=state["model"],
                       optim_state_dict={"state": state["optimizer"], "param_groups": ckpt["param_groups"]})
        return
    if any(isinstance(p, DTensor) for p in model.parameters()):
        raise CheckpointError(f"{path} is a checkpoint file, written under parallelism=ddp: continue that run with "
                              f"--parallelism=ddp (FSDP resumes from the sharded checkpoints it writes, ckpt.dcp)")
    model.load_state_dict(ckpt["model"])
    try:
        load_optimizer_states(optimizers, ckpt["optimizer"])
    except ValueError as e:
        raise CheckpointError(f"{path}: {e}") from e


def consolidate(path, to):
    """Write the sharded checkpoint directory `path` as one checkpoint file `to` (atomically), in
    save_checkpoint's format, weights and optimizer states included, so that sample.py, export.py
    and a ddp run read it. Runs in one process without a process group: the whole model and its
    optimizer states are built on the CPU (16 bytes a parameter with AdamW). Raises CheckpointError."""
    meta = read_checkpoint(path)
    cfg = TrainConfig(**{f.name: meta["config"][f.name] for f in fields(TrainConfig) if f.name in meta["config"]})
    model = GPT(GPTConfig(**meta["model_args"]))
    optimizers = build_optimizers(model, cfg, "cpu")
    load_training_state(meta, path, model, optimizers)
    ckpt = {k: v for k, v in meta.items() if k not in ("optimizers", "param_groups")}
    _save_file({**ckpt, "model": model.state_dict(), "optimizer": [o.state_dict() for o in optimizers]}, to)
    return meta["step"]


def check_resumable(ckpt, path, model_settings, data_fingerprint, data_paths):
    """Raise CheckpointError unless the run in `ckpt` (read from `path`) can go on with this
    config: every model setting the config gives (model_settings, {GPTConfig field: value},
    e.g. TrainConfig.model_settings()) equal to the checkpoint's, and the same token files
    and index streams, by the fingerprints of batches.py. data_paths {name: file} names the
    files in the message."""
    trained = {**{f.name: f.default for f in fields(GPTConfig)}, **ckpt["model_args"]}
    for key, value in model_settings.items():
        if trained[key] != value:
            raise CheckpointError(f"{path} was trained with {key}={trained[key]!r} but the config asks for "
                                  f"{key}={value!r}; use the run's own config to resume it")
    for name, saved in ckpt["data"].items():
        change = fingerprint_change(saved, data_fingerprint[name])
        if change:
            raise CheckpointError(
                f"{data_paths[name]} changed since {path} was written ({change}), so the run would go on with "
                f"other tokens than it started with. Restore the run's data, or start a new run "
                f"(--init_from=scratch and another --out_dir)")


def should_save(step, cfg, start_step, evaluated, stopping):
    """Whether to write a checkpoint at `step`: after each evaluation, before stopping on a
    signal, and at the save_checkpoint_steps; never at the step the run started from, which
    is on disk already, and never with eval_only."""
    return (evaluated or stopping or step in cfg.save_checkpoint_steps) and step > start_step and not cfg.eval_only


class Checkpointer:
    """train.py's checkpoints, one object per run: which checkpoint the run continues, its checks and its
    restore, and when and where the run writes its own. In the order train.py calls them:

        checkpoints = Checkpointer(cfg, runtime, run_dir, start)  # the checkpoint to resume, read (or none)
        checkpoints.model_args                                    # its model_args ({} for a new run)
        checkpoints.check(model_settings, fingerprint, files)     # the config and the data are the run's
        state = checkpoints.restore(model, optimizers, scaler)    # a TrainState
        checkpoints.save(state, stopping, model, optimizers, scaler, run_info)   # if should_save says so

    path is the newest checkpoint (the one resumed from, then the run's own latest) and step its step,
    None until there is one. Every method raises CheckpointError for a run that cannot go on."""

    def __init__(self, cfg, runtime, run_dir, start):
        """The checkpoint that a resumed run continues, read with its meta and weights on runtime.device (path
        None for a new run, from scratch or fine-tuning; whether it may replace the run in out_dir is
        runs.RunDir's). cfg: the TrainConfig; runtime: processes.setup's processes; run_dir: the run's runs.RunDir,
        where it writes its checkpoints; start: where the run starts (start.Start: its `resumes`, and the
        checkpoint `path` it resumes, which runs.RunDir.check_start has found there). Raises CheckpointError for
        a checkpoint to resume that cannot be read."""
        self.cfg, self.run_dir, self.step, self.path = cfg, run_dir, None, None
        if start.resumes:
            self.path = start.path
        self.ckpt = read_checkpoint(self.path, map_location=runtime.device) if self.path else None

    @property
    def resumed_step(self):
        """The step of the resumed checkpoint, 0 for a new run."""
        return self.ckpt["step"] if self.ckpt else 0

    @property
    def model_args(self):
        """The resumed checkpoint's model_args (GPTConfig fields), {} for a new run."""
        return self.ckpt["model_args"] if self.ckpt else {}

    def check(self, model_settings, data_fingerprint, data_paths):
        """check_resumable on the resumed checkpoint; nothing for a new run."""
        if self.ckpt:
            check_resumable(self.ckpt, self.path, model_settings, data_fingerprint, data_paths)

    def restore(self, model, optimizers, scaler):
        """The TrainState the run starts from. Resumed: the checkpoint's, its weights, optimizer states and
        loss scale loaded into `model`, `optimizers` and `scaler` (load_training_state), and the checkpoint
        dict let go; raises CheckpointError if its step is past max_iters. New: step 0 (the run it replaces
        in out_dir is removed by runs.RunDir.replace)."""
        state = TrainState()
        if self.ckpt:
            load_training_state(self.ckpt, self.path, model, optimizers, scaler)
            state = TrainState.from_checkpoint(self.ckpt)
            self.ckpt, self.step = None, state.step
        if state.step > self.cfg.max_iters:
            raise CheckpointError(f"the checkpoint is at step {state.step}, past max_iters={self.cfg.max_iters}")
        self.start_step = state.step
        return state

    def save(self, state, stopping, model, optimizers, scaler, run_info):
        """Checkpoint the run at state.step if should_save says so (after restore; `stopping`: a signal
        stops the run after this step): `model` (the GPT) and its model_args (asdict of model.config, the object the
        GPT was built from), `optimizers`, the loss scale of `scaler` and `state`, with run_info (the run's config
        and data) as save_training_state writes them. Call it on every process.
        Returns the path written (ckpt.pt or ckpt.dcp, also self.path), or None where none is due."""
        if not should_save(state.step, self.cfg, self.start_step, state.evaluated, stopping):
            return None
        cfg = self.cfg
        self.path = save_training_state(self.run_dir, model, optimizers, {
            "model_args": asdict(model.config), **run_info, "grad_scaler": scaler.state_dict(), **state.state_dict()},
            cfg.keep_last_n, cfg.save_checkpoint_steps, sharded=cfg.parallelism == "fsdp")
        self.step = state.step
        return self.path


@dataclass
class ConsolidateConfig:
    """`python -m nonlinear_queries.weights.checkpoint`: settings, each --key=value."""

    out_dir: str = "out"  # the run whose ckpt.dcp becomes ckpt.pt
    checkpoint: str = ""  # a sharded checkpoint to convert instead of out_dir/ckpt.dcp, e.g. out/ckpt_059000.dcp
    to: str = ""  # the file to write instead of out_dir/ckpt.pt


if __name__ == "__main__":
    args, _ = config_from_argv(ConsolidateConfig)
    source = args.checkpoint or RunDir(args.out_dir).latest_checkpoint("fsdp")
    target = args.to or RunDir(args.out_dir).latest_checkpoint()
    try:
        step = consolidate(source, target)
    except CheckpointError as e:
        sys.exit(f"error: {e}")
    print(f"wrote {target}: the checkpoint of step {step} from {source}, as one file (sample.py, export.py and "
          f"--parallelism=ddp read it)")
