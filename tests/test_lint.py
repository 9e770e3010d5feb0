"""The code passes the linter configured in pyproject.toml (ruff: pycodestyle, pyflakes, import order)."""

import subprocess
import sys

from helpers import REPO


def test_ruff_finds_nothing():
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", REPO], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
