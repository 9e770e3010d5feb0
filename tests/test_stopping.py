"""How a run stops on a signal (stopping.py), in this process: the request recorded and acknowledged, a
forwarded copy of it counted once, setup's signals raised as Interrupted, signals held back where setup must
not be cut, signals changing nothing once the run has ended, and the ranks' agreement; and a second request
exiting at once, in a subprocess. The runs that stop are in tests/test_faults.py."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import REPO
from nonlinear_queries.record import atomic
from nonlinear_queries.trainer import stopping
from nonlinear_queries.trainer.stopping import Interrupted, StopFlag


@pytest.fixture
def handlers():
    """Put back the handlers a StopFlag installs."""
    before = {s: signal.getsignal(s) for s in stopping.STOP_SIGNALS}
    yield
    for s, handler in before.items():
        signal.signal(s, handler)


def test_the_first_signal_is_recorded_and_acknowledged_and_a_forwarded_copy_is_the_same_request(handlers, capfd):
    stop = StopFlag("train.py").install()
    stop.start()
    stop.stepped()
    assert stop.signal is None and not stop.agreed(None, distributed=False)
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)  # within REPEAT_S: torchrun's or sweep.py's copy, not a second request
    assert stop.signal == "SIGTERM" and stop.agreed(None, distributed=False)
    assert capfd.readouterr().err == ("train.py: SIGTERM: stopping: a checkpoint at the next step boundary; send it "
                                      "again to stop now\n")


def test_a_schedulers_warning_never_stops_at_once(handlers, capfd, monkeypatch):
    monkeypatch.setattr(stopping, "REPEAT_S", 0.0)
    stop = StopFlag("train.py").install()
    stop.start()
    stop.stepped()
    for _ in range(3):  # submitit repeats SIGUSR2 to a job's train.py
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.01)
    assert stop.signal == "SIGUSR2"
    assert "send SIGINT or SIGTERM again to stop now" in capfd.readouterr().err


def test_a_signal_during_setup_raises_interrupted_and_deferred_holds_it_to_the_block_end(handlers, capfd):
    stop = StopFlag("train.py").install()
    with pytest.raises(Interrupted) as e:
        os.kill(os.getpid(), signal.SIGINT)
    assert e.value.status == 130
    os.kill(os.getpid(), signal.SIGTERM)  # while setup is undone: changes nothing
    assert stop.ended == 130
    stop, reached = StopFlag("train.py").install(), []
    with pytest.raises(Interrupted):
        with stop.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            reached.append("the block ran to its end")
    assert reached == ["the block ran to its end"]
    err = capfd.readouterr().err
    assert err.count("during setup; stopping (nothing to checkpoint yet)") == 2
    assert "train.py: SIGTERM: the run has ended already; exiting with its status, 130\n" in err


@pytest.mark.parametrize("training", [False, True], ids=["before the first step", "after"])
def test_once_the_run_has_ended_a_signal_changes_nothing(handlers, capfd, monkeypatch, training):
    monkeypatch.setattr(stopping, "REPEAT_S", 0.0)  # every signal below would be a second request
    stop = StopFlag("train.py").install()
    if training:
        stop.start()
        stop.stepped()
        os.kill(os.getpid(), signal.SIGINT)  # the stop a run ends with
    assert stop.end(0 if training else 130) == (0 if training else 130)
    capfd.readouterr()
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2):  # no Interrupted, no exit at once
        os.kill(os.getpid(), s)
    assert stop.signal == ("SIGINT" if training else None)
    status = 0 if training else 130
    assert capfd.readouterr().err == "".join(f"train.py: {name}: the run has ended already; exiting with its status, "
                                             f"{status}\n" for name in ("SIGINT", "SIGTERM", "SIGUSR2"))


@pytest.mark.parametrize("resumes", [False, True], ids=["new run", "resumed run"])
def test_a_signal_before_the_first_step_ends_the_run_now_and_says_so(handlers, capfd, resumes):
    # issue 82: a signal while torch.compile compiled the first evaluation or step promised a checkpoint at the next
    # step boundary, then waited 20-31 s for the compilation to end, then said there was nothing to resume
    stop = StopFlag("train.py").install()
    stop.start(resumes=resumes)
    with pytest.raises(Interrupted) as e:
        with stop.evaluating(0):  # step 0's evaluation
            os.kill(os.getpid(), signal.SIGTERM)
    assert e.value.status == 143 and stop.signal == "SIGTERM"
    assert stop.ended == (0 if resumes else 143)  # a resumed run's checkpoint is there to resume
    assert capfd.readouterr().err == "train.py: SIGTERM before the first step: nothing to save; the run ends now\n"


def test_a_signal_during_an_evaluation_says_about_how_long_the_stop_takes(handlers, capfd, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(stopping.time, "monotonic", lambda: clock[0])
    stop = StopFlag("train.py").install()
    stop.start()
    stop.stepped()

    def evaluation(step, batch_s, batches):
        with stop.evaluating(step):
            for k in range(batches):
                clock[0] += 30.0 if k == 0 else batch_s  # the first batch of an evaluation may compile
                stop.agreed(None, distributed=False)
    evaluation(4, 2.5, 4)
    evaluation(8, 3.5, 2)  # the last whole evaluation's batches after its first: 3.5 s
    with stop.evaluating(12):  # its first batch in flight
        os.kill(os.getpid(), signal.SIGINT)
    assert capfd.readouterr().err == ("train.py: SIGINT: stopping: the evaluation of step 12 is given up after the "
                                      "batch in flight (an evaluation batch takes about 3.5 s), then a checkpoint of "
                                      "step 12; send it again to stop now\n")
    stop = StopFlag("train.py").install()  # no evaluation measured yet: this one's batches after its first
    stop.start()
    stop.stepped()
    with stop.evaluating(4):
        for batch_s in (40.0, 0.25, 0.35):
            clock[0] += batch_s
            stop.agreed(None, distributed=False)
        os.kill(os.getpid(), signal.SIGTERM)
    assert "the evaluation of step 4 is given up after the batch in flight (an evaluation batch takes about 0.3 s)" \
        in capfd.readouterr().err
    stop = StopFlag("train.py").install()  # nothing measured: no time said
    stop.start()
    stop.stepped()
    with stop.evaluating(4):
        os.kill(os.getpid(), signal.SIGTERM)
    assert capfd.readouterr().err == ("train.py: SIGTERM: stopping: the evaluation of step 4 is given up after the "
                                      "batch in flight, then a checkpoint of step 4; send it again to stop now\n")


def test_the_ranks_agree_on_the_summed_vote():
    stop = StopFlag()
    loss = torch.zeros(())
    assert stop.vote(loss).item() == 0.0
    stop.signal = "SIGTERM"
    assert stop.vote(loss).item() == 1.0 and stop.vote(loss).dtype == loss.dtype
    # distributed, on the CPU: the sum over the ranks decides, whatever this rank was asked
    assert stop.agreed(torch.tensor(1.0), distributed=True)
    stop.signal = None
    assert stop.agreed(torch.tensor(2.0), distributed=True) and not stop.agreed(torch.tensor(0.0), distributed=True)


def test_discard_in_flight_removes_the_temporary_files_of_writes_in_progress(tmp_path):
    final = tmp_path / "ckpt.pt"
    with atomic.atomic_path(str(final)) as tmp:
        with open(tmp, "w") as f:
            f.write("half")
        shard_dir = tmp_path / "ckpt_000004.dcp.tmp"
        with atomic.in_flight(str(shard_dir)):
            shard_dir.mkdir()
            (shard_dir / "0.distcp").write_text("x")
            atomic.discard_in_flight()
            assert not shard_dir.exists() and not os.path.exists(tmp)
        with open(tmp, "w") as f:  # the write goes on here; a process exiting would not
            f.write("whole")
    assert final.read_text() == "whole" and not atomic._IN_FLIGHT


def test_a_second_request_exits_at_once_with_128_plus_its_number(tmp_path):
    code = "\n".join([
        "import os, signal, time",
        "from nonlinear_queries.record import atomic",
        "from nonlinear_queries.trainer.stopping import StopFlag",
        "stop = StopFlag('train.py').install()",
        "stop.start()",
        "stop.stepped()",
        f"with atomic.atomic_write({str(tmp_path / 'f.json')!r}) as f:",
        "    f.write('{')",
        "    os.kill(os.getpid(), signal.SIGINT)",
        "    time.sleep(1.2)",
        "    os.kill(os.getpid(), signal.SIGINT)",
        "    time.sleep(30)",
        "print('not reached')"])
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 130 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1] == ("train.py: SIGINT again: exiting now, without a checkpoint of this step "
                                            "(the files written before it are kept)")
    assert os.listdir(tmp_path) == []  # f.json.tmp removed; f.json never written
