"""The suite's own promises about a test that hangs or crashes: it fails by name, and the suite ends."""

import os
import subprocess
import sys
import time

import pytest

import helpers
from helpers import REPO


@pytest.mark.slow
def test_a_program_past_its_time_is_killed_with_its_children_and_its_output_is_kept(tmp_path, monkeypatch):
    # the child inherits the program's stdout: killing the program alone would leave the pipe open for 300 s
    program = tmp_path / "parent.py"
    program.write_text("import subprocess, sys, time\n"
                       "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
                       "print('started', flush=True)\n"
                       "time.sleep(300)\n")
    monkeypatch.setattr(helpers, "RUN_SCRIPT_TIMEOUT_S", 3)
    start = time.time()
    with pytest.raises(AssertionError, match="ran past 3 s and was killed with its children:\nstarted\n"):
        helpers.run_script(str(program))
    assert time.time() - start < 60


@pytest.mark.slow
def test_a_worker_that_crashes_under_loadgroup_ends_the_run_with_the_test_named(tmp_path):
    # conftest.py's pytest_configure, loaded here as a plugin, ends the run at the first crash
    (tmp_path / "test_crash.py").write_text("import os\n\nimport pytest\n\n"
                                            "pytestmark = pytest.mark.xdist_group('one')\n\n\n"
                                            "def test_crashes():\n    os._exit(1)\n\n\n"
                                            "def test_after_it():\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "-n", "2",
                           "--dist", "loadgroup", "test_crash.py"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.path.join(REPO, "tests")}, timeout=240)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # one crash, no replacement: a replaced worker runs the crashing test again, until the restarts run out or forever
    assert proc.stdout.count("node down") == 1 and "replacing crashed worker" not in proc.stdout, proc.stdout
    assert "FAILED test_crash.py::test_crashes" in proc.stdout, proc.stdout
    assert proc.stdout.splitlines()[-1].startswith("1 failed"), proc.stdout
