"""
What the programs at the root share at the shell: a program whose table is piped into one that
stops reading (`python compare.py ... | head -1`) ends quietly, killed by SIGPIPE as Unix tools
are (`yes | head`), instead of with a BrokenPipeError traceback or exit status 1, which the programs
keep for bad input (run_main); and a program's own command line rebuilt from sys.argv, for the command that
goes on from here (run_command, resume_command: train.py's message after a stop, and runs.RunDir.check_start's).
"""

import os
import shlex
import signal
import sys


def run_main(main, *args):
    """main(*args), then stdout flushed; returns main's exit status. Where the reader of stdout has gone
    (BrokenPipeError), stdout is pointed at /dev/null, so that nothing left to flush can fail again, and the
    process ends by SIGPIPE's default action, as a C program that writes to a closed pipe does: the shell sees
    status 128 + 13 (Python ignores SIGPIPE to raise BrokenPipeError instead; its `signal` documentation, "Note
    on SIGPIPE")."""
    try:
        code = main(*args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
        sys.exit(128 + signal.SIGPIPE)  # the same status where a caller blocked SIGPIPE, so that it stays pending


def run_command(runtime, *flags):
    """This process's own command line (sys.argv, under torchrun with its launcher and this machine's process
    count, from runtime, processes.setup's processes) without its --init_from, --resume_from and --overwrite, and with
    `flags` (such as '--init_from=scratch') instead."""
    args = [a for a in sys.argv[1:] if not a.startswith(("--init_from=", "--resume_from=", "--overwrite="))]
    launcher = (f"torchrun --nproc_per_node={os.environ.get('LOCAL_WORLD_SIZE', runtime.world_size)} "
                "[your other torchrun options] " if "RANK" in os.environ else "python ")
    return launcher + shlex.join([sys.argv[0], *args, *flags])


def resume_command(runtime):
    """The command line that continues this run from its checkpoint: run_command with --init_from=resume."""
    return run_command(runtime, "--init_from=resume")
