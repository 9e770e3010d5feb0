"""
How train.py stops on a signal: at once during setup, at the next step boundary once it trains,
and at once again on a second request.

    stop = StopFlag("train.py").install()   # setup: a signal raises Interrupted
    ...                                       # nothing in out_dir but what setup made
    stop.start()                              # training: a signal asks for a stop
    if stop.agreed(votes):                    # every rank, after a step or an evaluation batch
        ...checkpoint and exit 0

SIGINT (Ctrl-C) and SIGTERM (preemption, a scheduler's time limit, torchrun's shutdown) and
SIGUSR1/SIGUSR2 (a scheduler's warning before either, sbatch --signal) each ask for a stop; the
first is acknowledged on stderr at once. During training the step in flight, or the evaluation
batch in flight, is finished, the run is checkpointed at that step and exits 0, its
resumption exact. A second SIGINT or SIGTERM exits at once with 128 + its number (130, 143),
removing the temporary file of any write in flight (atomic.discard_in_flight), so the files
in out_dir are the ones that were whole before it. A copy of one signal that arrives within
REPEAT_S of it (a terminal's Ctrl-C reaches both torchrun or sweep.py and its children, which
forward it again) is the same request, not a second one; SIGUSR1 and SIGUSR2 are warnings and
never stop a run at once (submitit repeats SIGUSR2 to a job's train.py). Once the run has ended (end():
finished, or stopped with its checkpoint written and its resume command said, or diverged, or stopped before
its first step with its files removed), a signal changes nothing: it is acknowledged and the exit goes on with
the run's status.

Under torchrun every rank must stop at the same step, since each step and each evaluation
batch holds collectives: a rank's request travels as a vote summed over the ranks with the
step's loss (train.py), or over an evaluation batch's vote, and every rank acts on the same sum.
"""

import contextlib
import os
import signal
import time

from nonlinear_queries.record import atomic

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
REPEAT_S = 1.0  # a signal again within this many seconds of the first is a forwarded copy of it


class Interrupted(BaseException):
    """A signal during setup, before the run has anything to checkpoint: train.py removes what setup
    made (lock.release_new_out_dir) and exits with `status` (128 + the signal's number). A BaseException,
    as KeyboardInterrupt is, so that no `except Exception` on the way swallows it."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.status = 128 + signum


class StopFlag:
    """A run's stop requests. `signal` is the name of the first signal that asked for a stop (None
    until one does). install() handles STOP_SIGNALS; until start() a signal raises Interrupted in the
    main thread (and the run has ended: end()), after it the handler records the request and the loop
    acts on it through agreed().
    Messages go to stderr from the first process of each machine (LOCAL_RANK 0) alone."""

    def __init__(self, program="train.py"):
        self.program = program
        self.signal = None
        self.training = False
        self._first_hard = None  # time.monotonic() of the first SIGINT or SIGTERM
        self._loud = os.environ.get("LOCAL_RANK", "0") == "0"
        self._host_vote, self._event = None, None  # the lagged CUDA read (agreed)
        self._deferred, self._pending = False, None  # a setup signal held back by deferred()
        self.ended = None  # the run's exit status once it has ended (end())

    def install(self):
        """Handle STOP_SIGNALS from now on; returns self."""
        for s in STOP_SIGNALS:
            signal.signal(s, self._handle)
        return self

    @contextlib.contextmanager
    def deferred(self):
        """During setup, hold a signal's Interrupted back to the end of the `with` block: for a step that must not
        be cut in two, such as taking out_dir's lock and recording what it created, which undoing the setup
        relies on. (The handler records it; blocking the signal itself would not do: Python runs its handlers
        in the main thread whichever thread the signal reaches.)"""
        self._deferred = True
        try:
            yield
        finally:
            self._deferred = False
            if self._pending is not None:
                raise Interrupted(self._pending)

    def start(self):
        """From now on a signal asks the loop to stop at the next step boundary."""
        self.training = True

    def end(self, status):
        """The run has ended with the exit status `status`, its files as they stay: from now on a signal is
        acknowledged and changes nothing, so the exit (closing wandb, giving out_dir's lock back) goes on and
        ends with `status`. Returns status."""
        self.ended = status
        return status

    def _say(self, text):
        if self._loud:  # os.write: a signal handler must not re-enter a buffered stream mid-write
            os.write(2, f"{self.program}: {text}\n".encode())

    def _handle(self, signum, frame):
        name = signal.Signals(signum).name
        hard = signum in (signal.SIGINT, signal.SIGTERM)
        now = time.monotonic()
        if self.ended is not None:
            self._say(f"{name}: the run has ended already; exiting with its status, {self.ended}")
            return
        if not self.training:
            self._say(f"{name} during setup; stopping (nothing to checkpoint yet)")
            self.end(128 + signum)  # what follows is undoing the setup: a signal now must not cut that short
            if self._deferred:
                self._pending = signum
                return
            raise Interrupted(signum)
        if hard and self._first_hard is not None and now - self._first_hard > REPEAT_S:
            self._say(f"{name} again: exiting now, without a checkpoint of this step (the files written before "
                      f"it are kept)")
            atomic.discard_in_flight()
            os._exit(128 + signum)
        if hard and self._first_hard is None:
            self._first_hard = now
        if self.signal is None:
            self.signal = name
            again = "send SIGINT or SIGTERM again" if not hard else "send it again"
            self._say(f"{name}: stopping: a checkpoint at the next step boundary; {again} to stop now")

    def vote(self, like):
        """This process's stop request as a 0-d tensor of `like`'s dtype and device (1.0 asked, 0.0 not), made
        by a fill on the device: a tensor from the host's value would be a copy that waits for the device."""
        return like.new_full((), float(self.signal is not None))

    def agreed(self, votes, distributed):
        """Whether the processes stop here. distributed False: this process's own request, read on the host
        at no cost. distributed True: `votes`, the sum of vote() over the ranks (a 0-d tensor on the device),
        read as every rank reads it. On the CPU the sum is ready and read now; on CUDA the sum of the previous
        call is read, through a pinned copy and an event queued behind it, so the host waits for the step or
        batch before the one just queued, never for it, and the device always has work queued. Every rank
        makes the same calls, so every rank reads the same sums at the same calls and stops at the same one."""
        if not distributed:
            return self.signal is not None
        if votes.device.type != "cuda":
            return votes.item() > 0
        import torch  # only on CUDA: the module itself stays free of torch (it is imported during setup)

        seen = False
        if self._event is not None:
            self._event.synchronize()
            seen = self._host_vote.item() > 0
        else:
            self._host_vote = torch.zeros((), dtype=votes.dtype, pin_memory=True)
            self._event = torch.cuda.Event()
        self._host_vote.copy_(votes, non_blocking=True)
        self._event.record()
        return seen


def compile_cut_by_stop(cfg, stop, error):
    """Whether `error`, raised by a training step or an evaluation, is torch.compile's compilation cut short by a
    stop request: a signal to the whole process group (a terminal's Ctrl-C, a scheduler's signal to a job) also
    reaches inductor's compiler processes, and their end surfaces as an InductorError (CppCompileError: C++
    compile error). Such an error is the stop itself: the step or evaluation is given up, as a signal gives up
    an evaluation, and the run stops as train.py's stopped() says, with nothing of it reported as an error.
    cfg: the TrainConfig (its compile); stop: the run's StopFlag."""
    if not cfg.compile or stop.signal is None:
        return False
    # loaded already by torch.compile; imported here, as a run without compile never needs them (2 s)
    from torch._dynamo.exc import TorchDynamoException
    from torch._inductor.exc import CppCompileError

    return isinstance(error, (TorchDynamoException, CppCompileError))
