"""
Ctrl-C at any moment ends a program at the root with one line, not a traceback.

Each program imports this module first, before torch (pyproject.toml's isort section
"interrupt" keeps it there). Python's own SIGINT handler raises KeyboardInterrupt wherever the
program is; while torch loads (the first second or two) that is inside importlib's module
locks, and the traceback runs to dozens of lines ending in a RecursionError. From here on,
SIGINT prints one line and exits with status 130 (128 + SIGINT, the shell's convention) until
the program installs a handler of its own: train.py's stopping.StopFlag (undo the setup, or finish
the step, checkpoint and exit 0), sweep.py's and study.py's (forward the signal to their runs). Exiting at once writes
nothing half-way: every file this repo writes is written to a temporary name and renamed
(atomic.py).

The handler is installed only when the program being run (`__main__`) is one of the root's,
so a test session that imports compare.py keeps pytest's own Ctrl-C.
"""

import os
import signal
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _interrupted(signum, frame):
    # os.write and os._exit: nothing here may raise into whatever the program was doing
    program = os.path.basename(sys.argv[0]) if sys.argv else "the program"
    os.write(2, f"\n{program}: interrupted ({signal.Signals(signum).name}); exiting\n".encode())
    os._exit(128 + signum)


def _run_as_root_program():
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    return path is not None and os.path.dirname(os.path.abspath(path)) == REPO


if _run_as_root_program():
    signal.signal(signal.SIGINT, _interrupted)
