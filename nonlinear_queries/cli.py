"""
What the programs at the root share at the shell: a program whose table is piped into one that
stops reading (`python compare.py ... | head -1`) ends quietly, killed by SIGPIPE as Unix tools
are (`yes | head`), instead of with a BrokenPipeError traceback or exit status 1, which the programs
keep for bad input.
"""

import os
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
