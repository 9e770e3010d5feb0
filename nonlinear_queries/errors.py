"""
The package's errors, one class a concern, in one module at the bottom of the import graph: it imports nothing,
so every module that raises or catches one, the torch-free ones (config, record, data) too, imports it from here.
Each is bad input or a machine that cannot do what was asked, never a bug: train.py, sample.py, eval.py,
export.py, analyze.py, sweep.py and study.py end on one with one line, `error: ...` (its message, which says what to
do), and exit status 1.

Kept elsewhere: what is control flow and never reaches a user (downstream.TasksStopped, configurator's _Unfit).
"""


class SetupError(ValueError):
    """A run that cannot start on this machine or in this process layout: a device, dtype or backend it lacks
    (runtime.processes.setup), a batch the processes cannot share (training), a model μP cannot classify
    (start.build_model), memory the run cannot fit (budget), or a run directory that cannot be held (the three
    below). The user changes the setting the message names (--device, --dtype, --batch_size, ...)."""


class OutDirBusy(SetupError):
    """out_dir is held by another live run (lock.hold_out_dir; the message names its host and PID). The user waits
    for that run, or chooses another --out_dir."""


class NoFileLocks(SetupError):
    """out_dir's file system does not support flock (lock.hold_out_dir). The user chooses an --out_dir on a file
    system that does, or runs with --lock_out_dir=False where no second run can start there."""


class OutDirUnwritable(SetupError):
    """out_dir is a file, or a directory this process cannot write in (lock.make_out_dir, lock.hold_out_dir). The
    user chooses an --out_dir they can write to, or changes its permissions."""


class CheckpointError(Exception):
    """A checkpoint that cannot be read or written, or that does not belong to the run being resumed
    (checkpoint_file, checkpoint), and a run directory that a new run would replace unasked
    (runs.RunDir.check_start). The user resumes with the settings the message names, or starts anew with
    --overwrite=True or another --out_dir."""


class DiskFullError(CheckpointError):
    """No room on the disk for a checkpoint (checkpoint, before or while it is written); the previous checkpoint
    is left as it was. The user frees space (or chooses an --out_dir on a larger disk) and resumes."""


class ConfigError(ValueError):
    """A config file or override that names an unknown key or has a wrong type (configurator; the message names
    the key, file and line), a sweep's malformed axis (sweeps) or SLURM setting (slurm). The user fixes what the
    message names; `--help` lists every key with its type and default."""


class DataError(Exception):
    """Bad data input or an unreachable source (hub, corpus, batches: a missing or too small data set, a file of an
    unknown kind, a Hugging Face hub that does not answer). The user prepares the data set, or passes local copies
    as the message says."""


class EvalError(DataError):
    """A downstream task that cannot run: an unknown name, a missing local file, or data on a hub that cannot be
    reached (downstream). A DataError, so train.py reports it like any other missing data, before the run starts.
    The user names a task lm-eval knows, or passes its files with eval.py's --include_path (train.py's
    eval_tasks_include_path)."""


class PretrainedError(ValueError):
    """A source that cannot be loaded (missing, corrupt, of an unknown kind), an override it cannot take, or a
    destination export refuses to write (pretrained). The user names another source or destination, or drops the
    override the message names."""


class RunsError(ValueError):
    """Run directories that cannot be read as asked (runs, arms, comparison, width: a missing or unfinished run, runs
    that do not pair, a copy given twice). The message says what to pass instead: compare.py, analyze.py and
    study.py end on it."""


class StudyError(Exception):
    """A study file that cannot be run (protocol, declaration, looks, design): an unknown or ill-typed key, a
    declaration changed after its first recorded decision, runs that do not match the plan. The message names
    the file and the key; the user fixes the file, or asks a changed question as a new study."""


class PilotError(ValueError):
    """A pilot that cannot give a spread for a power plan (power): a missing run, seeds that do not pair, too few
    pairs. The user names other pilot runs, or gives the spread itself."""
