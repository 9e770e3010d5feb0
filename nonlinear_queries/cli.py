"""
What the programs at the root share at the shell: a program whose table is piped into one that
stops reading (`python study.py ... --dry_run | head`) ends quietly, as Unix tools do, instead
of with a BrokenPipeError traceback.
"""

import os
import sys


def run_main(main, *args):
    """main(*args), then stdout flushed; returns main's exit status. Where the reader of stdout has gone
    (BrokenPipeError), stdout is pointed at /dev/null, so that Python's own flush at exit cannot fail again,
    and the program exits with status 1, as Python itself does on EPIPE (the recipe of Python's `signal`
    documentation, "Note on SIGPIPE")."""
    try:
        code = main(*args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(1)
