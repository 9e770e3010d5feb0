"""
The command that starts train.py's processes on one node: python for one process, else torchrun with the
signals and the shutdown time a checkpoint needs. No torch here: sweep.py and study.py build the command
without loading it.
"""

import sys

# torchrun forwards these signals to its workers (each in a session of its own, which a signal to torchrun's
# process group misses): its defaults, and the warnings a scheduler sends before a time limit or a preemption
# (SIGUSR2 is submitit's and SLURM's here; any other kills torchrun at once and orphans the workers). It then
# waits this long for them to checkpoint and exit before it SIGKILLs them (torchrun's default is 30 s, less than
# a large model's checkpoint takes to write).
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
TORCHRUN_SHUTDOWN_TIMEOUT_S = 600


def launcher(procs, rendezvous=()):
    """The command that starts train.py's `procs` processes on this node: python, or torchrun, which forwards
    TORCHRUN_SIGNALS to the workers and waits TORCHRUN_SHUTDOWN_TIMEOUT_S seconds for them to exit
    (torch.distributed.run's --signals_to_handle and --shutdown_timeout)."""
    if procs == 1 and not rendezvous:
        return [sys.executable]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}",
            f"--signals_to_handle={TORCHRUN_SIGNALS}", f"--shutdown_timeout={TORCHRUN_SHUTDOWN_TIMEOUT_S}",
            *(rendezvous or ["--standalone"])]
