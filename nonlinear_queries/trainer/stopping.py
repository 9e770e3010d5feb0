"""
How train.py stops on a signal: at once during setup and before the run's first step, at the next step
boundary once it has trained a step, and at once again on a second request.

    stop = StopFlag("train.py").install()   # setup: a signal raises Interrupted
    ...                                       # nothing in out_dir but what setup made
    stop.start()                              # the loop, before its first step: a signal raises Interrupted too
    stop.stepped()                            # after the first step: a signal asks for a stop
    with stop.evaluating(step): ...           # an evaluation: the acknowledgement says how long the stop takes
    if stop.agreed(votes):                    # every rank, after a step or an evaluation batch
        ...checkpoint and exit 0

SIGINT (Ctrl-C) and SIGTERM (preemption, a scheduler's time limit, torchrun's shutdown) and
SIGUSR1/SIGUSR2 (a scheduler's warning before either, sbatch --signal) each ask for a stop; the
first is acknowledged on stderr at once, saying what will happen. Before the session's first step
there is nothing to save (a new run's step 0 is its seed's; a resumed run's checkpoint is on disk),
so the run ends at once, whatever it is doing: its first evaluation, or torch.compile compiling
(inductor's compile workers are shut down as the process exits). Once a step has been trained the step
in flight, or the evaluation batch in flight (the acknowledgement says about how long one takes), is
finished, the run is checkpointed at that step and exits 0, its resumption exact. A second SIGINT or
SIGTERM exits at once with 128 + its number (130, 143), removing the temporary file of any write in
flight (atomic.discard_in_flight), so the files in out_dir are the ones that were whole before it.
A copy of one signal that arrives within REPEAT_S of it (a terminal's Ctrl-C reaches both torchrun
or sweep.py and its children, which forward it again) is the same request, not a second one; SIGUSR1
and SIGUSR2 are warnings and never stop a trained run at once (submitit repeats SIGUSR2 to a job's
train.py). Once the run has ended (end():
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
import sys
import time

from nonlinear_queries.record import atomic

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
REPEAT_S = 1.0  # a signal again within this many seconds of the first is a forwarded copy of it


class Interrupted(BaseException):
    """A signal during setup or before the run's first step, while the run has nothing to checkpoint: train.py
    removes what setup made (lock.release_new_out_dir; a new run's record too) and exits with `status` (128 + the
    signal's number; 0 for a resumed run, whose checkpoint is there to resume). A BaseException,
    as KeyboardInterrupt is, so that no `except Exception` on the way swallows it."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.status = 128 + signum


class StopFlag:
    """A run's stop requests. `signal` is the name of the first signal that asked for a stop (None
    until one does). install() handles STOP_SIGNALS; until stepped() a signal raises Interrupted in the
    main thread (and the run has ended: end()), after it the handler records the request and the loop
    acts on it through agreed().
    Messages go to stderr from the first process of each machine (LOCAL_RANK 0) alone."""

    def __init__(self, program="train.py"):
        self.program = program
        self.signal = None
        self.training = False  # start() called: the loop runs
        self.trained = False  # stepped() called: the session has trained a step, a stop saves a checkpoint
        self._resumes = False  # the run continues a checkpoint (start's resumes)
        self._evaluation = None  # the step being evaluated, with the host's time of its last batch (evaluating)
        self._batch_s = None  # seconds of an evaluation batch (evaluating)
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

    def start(self, resumes=False):
        """The loop starts: until stepped() a signal ends the run at once (Interrupted), as there is nothing to
        save; with resumes (the run continues a checkpoint) its exit status is then 0, else 128 + its number."""
        self.training, self._resumes = True, resumes

    def stepped(self):
        """The session has trained a step: from now on a signal asks the loop to stop at the next step boundary,
        with a checkpoint."""
        self.trained = True

    @contextlib.contextmanager
    def evaluating(self, step):
        """The `with` block evaluates `step`: a signal's acknowledgement says that the evaluation is given up after
        the batch in flight and about how long that takes, the seconds of an evaluation batch as the host measures
        them between agreed() calls (the batches after the first of the last evaluation, whose first may compile;
        else the batches after the first of this one)."""
        self._evaluation = [step, None, 0, 0.0]  # step; time of the last batch; batches after the first, their s
        try:
            yield
        finally:
            if self._evaluation[2]:
                self._batch_s = self._evaluation[3] / self._evaluation[2]
            self._evaluation = None

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
        if not self.trained:
            if self.training:
                self._say(f"{name} before the first step: nothing to save; the run ends now")
            else:
                self._say(f"{name} during setup; stopping (nothing to checkpoint yet)")
            # what follows is undoing the setup: a signal now must not cut that short
            self.end(0 if self.training and self._resumes else 128 + signum)
            self.signal = name
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
            if self._evaluation is None:
                self._say(f"{name}: stopping: a checkpoint at the next step boundary; {again} to stop now")
                return
            step, batch_s = self._evaluation[0], self._batch_s
            if batch_s is None and self._evaluation[2]:
                batch_s = self._evaluation[3] / self._evaluation[2]
            takes = f" (an evaluation batch takes about {_seconds(batch_s)})" if batch_s is not None else ""
            self._say(f"{name}: stopping: the evaluation of step {step} is given up after the batch in flight{takes}, "
                      f"then a checkpoint of step {step}; {again} to stop now")

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
        if self._evaluation is not None:  # after an evaluation batch: its time
            now = time.monotonic()
            if self._evaluation[1] is not None:
                self._evaluation[2] += 1
                self._evaluation[3] += now - self._evaluation[1]
            self._evaluation[1] = now
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


def _seconds(s):
    """`s` seconds as the acknowledgement says them: '0.04 s', '2.5 s', '40 s'."""
    return f"{s:.2g} s" if s < 10 else f"{s:.0f} s"


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


def end_compilation():
    """Give up what torch.compile's inductor is compiling, for a run that ends while it compiles (a signal before
    the first step): the compile jobs queued in its thread pool are cancelled and the C++ compilers it runs in its
    cache directory killed with the processes they started (cc1plus, as, which hold the pipes its threads read), so
    that the exit does not wait for them (Python joins a ThreadPoolExecutor's threads at exit, each running its queue
    to the end: 10 s and more of C++ builds on two cores), and its compile worker processes are ended
    (async_compile.shutdown_compile_workers, which inductor also runs at exit, terminates them). Does nothing where
    inductor has not been loaded."""
    if "torch._inductor.async_compile" not in sys.modules:
        return
    async_compile = sys.modules["torch._inductor.async_compile"]
    if async_compile.AsyncCompile.pool.cache_info().currsize:  # the thread pool, made on its first job
        async_compile.AsyncCompile.pool().shutdown(wait=False, cancel_futures=True)
    cache = sys.modules["torch._inductor.runtime.cache_dir_utils"].cache_dir()
    processes = _processes()
    compilers = [pid for pid, (parent, command) in processes.items() if parent == os.getpid() and cache in command]
    while compilers:
        pid = compilers.pop()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        compilers += [child for child, (parent, _) in processes.items() if parent == pid]
    async_compile.shutdown_compile_workers()


def _processes():
    """{pid: (parent pid, command line)} of the processes running now, from /proc (Linux; {} elsewhere)."""
    found = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                found[int(entry)] = parent, f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):  # a process that ended meanwhile
            continue
    return found
