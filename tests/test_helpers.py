"""The test helpers' own promises: a program run past its time is killed with every process it started."""

import time

import pytest

import helpers


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
