"""
The errors a run's setup raises before its first step, at the bottom of the import graph: every module that
raises them, the torch-free ones (lock, runs) too, imports them from here without importing the training runtime.
train.py, sample.py, eval.py and analyze.py end on each with one line, `error: ...`, and exit status 1.
"""


class SetupError(ValueError):
    """A device, dtype or backend that cannot work on this machine or in this process layout, or a run directory
    that cannot be held (lock.py's errors)."""


class CheckpointError(Exception):
    """A checkpoint that cannot be read or written, or that does not belong to the run being resumed, and a run
    directory that a new run would replace unasked (runs.RunDir.check_start)."""
