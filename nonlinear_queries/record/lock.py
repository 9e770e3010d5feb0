"""
One run per out_dir: a run holds an exclusive lock on out_dir/.lock for its whole life.

The lock is the operating system's (flock(2)), held through an open file, so it dies with
the process: a run that is killed, crashes or is requeued by a scheduler never leaves a
stale lock behind. The lock file names its holder (host, PID, start time) for the error a
second run gets. A lock file that a killed run left keeps naming that run until the run that takes it over
is accepted (sign_out_dir): a run refused meanwhile leaves it as it was, the one record of which process
died there. Under torchrun only rank 0 takes it. A run that ends cleanly (finished, or
stopped by a signal with its checkpoint) removes the file (release_out_dir), so a .lock in
out_dir means a run is in it now, or one was killed or crashed there (no process holds its
lock: out_dir_holder says None). flock works across the machines of
an NFS mount on Linux (it is emulated with byte-range locks there). A file system without
file locks (Lustre mounted without -o flock or -o localflock, an NFS mount whose lock
service does not answer) is a NoFileLocks error that says how to go on; train.py's
lock_out_dir=False skips the lock there.

try_lock and lock_holder are the same lock on any file: sweep.py claims a point with
out_dir/.sweep.lock for as long as it runs the point's train.py, so two sweeps never launch one point.
`exclusive` waits for the lock instead: sweep.py updates SWEEP_DIR/sweep.json under it, so two sweeps
on one sweep_dir never overwrite each other's statuses with a stale copy.

hold_run_dir is train.py's run taking its out_dir: the lock, and no run replaced unasked (runs.RunDir.check_start).
"""

import contextlib
import datetime
import errno
import fcntl
import os
import socket
import time

from nonlinear_queries.cli import run_command
from nonlinear_queries.errors import NoFileLocks, OutDirBusy, OutDirUnwritable


def unwritable(run_dir, e):
    """The OutDirUnwritable for the OSError `e` that creating or writing in the run directory `run_dir` (a
    runs.RunDir) raised: one sentence naming the path and what to do."""
    out_dir = run_dir.path
    if e.errno in (errno.EEXIST, errno.ENOTDIR):
        return OutDirUnwritable(f"out_dir {out_dir} cannot be a run directory: {e.filename or out_dir} is a file, not "
                                f"a directory; choose another --out_dir, or move the file away")
    if e.errno == errno.EROFS:
        return OutDirUnwritable(f"cannot write in out_dir {out_dir}: its file system is read-only; choose an "
                                f"--out_dir on a writable file system")
    if e.errno in (errno.EACCES, errno.EPERM):
        return OutDirUnwritable(f"cannot write in out_dir {out_dir}: permission denied on {e.filename or out_dir} "
                                f"(its permissions, an immutable attribute or another user's directory); choose an "
                                f"--out_dir you can write to, or change its permissions")
    return OutDirUnwritable(f"cannot write in out_dir {out_dir}: {e.strerror or e}; choose another --out_dir")


def make_out_dir(run_dir):
    """Create the run directory `run_dir` (a runs.RunDir; its parents too) if missing. Raises OutDirUnwritable
    where it cannot be made."""
    try:
        os.makedirs(run_dir.path, exist_ok=True)
    except OSError as e:
        raise unwritable(run_dir, e) from None


# flock's errors for a file system that cannot lock (flock(2), errno(3)): ENOSYS "Function not implemented",
# Lustre mounted without -o flock (its noflock default); EOPNOTSUPP "Operation not supported", a file system
# without lock support; ENOLCK "No locks available", NFS whose lock manager cannot be reached
UNSUPPORTED = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK)


_HELD = {}  # out_dir -> its open lock file, for the life of the process
_UNSIGNED = {}  # out_dir -> the holder not yet written into its lock file, which names a killed run (sign_out_dir)
_CREATED = {}  # out_dir -> (the paths hold_out_dir created: the lock file, out_dir itself; what out_dir held then)


def hold_out_dir(run_dir):
    """Take the exclusive lock of the run directory `run_dir` (a runs.RunDir; created if missing) for the rest of
    this process's life and write the holder into its lock file, or, where the file names a run that was killed
    (left_lock_holder), once this run is accepted (sign_out_dir). Raises OutDirBusy, naming the holder, if
    another process holds it, NoFileLocks if the file system has no file locks (UNSUPPORTED), OutDirUnwritable
    if out_dir is a file or cannot be written in.
    Taking it again in the same process does nothing."""
    out_dir = run_dir.path
    if out_dir in _HELD:
        return
    created = [p for p in (run_dir.lock, out_dir) if not os.path.exists(p)]
    make_out_dir(run_dir)
    found = _listing(run_dir)
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    me = f"host {socket.gethostname()}, PID {os.getpid()}, started {started}"
    left = run_dir.lock not in created and _holder_written(run_dir.lock)
    try:  # out_dir_holder's probe holds the lock for microseconds: try for half a second
        f, holder = try_lock(run_dir.lock, None if left else me, tries=20)
    except OSError as e:
        _remove_created(created)
        if e.errno not in UNSUPPORTED:
            raise unwritable(run_dir, e) from None
        raise NoFileLocks(
            f"cannot lock {run_dir.lock}: its file system has no file locks (flock: {e.strerror}), "
            f"so train.py cannot make sure that no other run writes to {out_dir}. Mount it with locks "
            f"(Lustre: -o flock), choose an --out_dir on another file system, or pass --lock_out_dir=False "
            f"and see to it yourself that one run at a time uses each out_dir") from None
    if f is None:
        raise OutDirBusy(f"{out_dir} is in use by a running training run: {holder}. Two runs in one out_dir would "
                         f"mix their metrics and overwrite each other's checkpoints; wait for it to end (or stop it), "
                         f"or choose another --out_dir")
    _HELD[out_dir] = f
    _CREATED[out_dir] = created, found
    if left:
        _UNSIGNED[out_dir] = me


def sign_out_dir(run_dir):
    """Write this process as the holder into the lock file of the run directory `run_dir` (a runs.RunDir) where
    hold_out_dir left it naming a killed run: call it once the run is accepted, as it starts to write in
    out_dir. Does nothing where the holder is written already, or this process holds no lock on out_dir."""
    me = _UNSIGNED.pop(run_dir.path, None)
    if me is not None and run_dir.path in _HELD:
        _write_holder(_HELD[run_dir.path], me)


def left_lock_holder(run_dir):
    """Where the run directory `run_dir` (a runs.RunDir) holds a lock file that no process holds, this one
    included, the mark of a run that was killed or crashed there (a run that ends cleanly removes it:
    release_out_dir): the holder it names ('host H, PID P, started T'; '' where that run had not written it
    yet). None where there is none, and where out_dir or its lock file cannot be read: taking the lock then
    says why (OutDirUnwritable). Call it before taking the lock."""
    try:
        if run_dir.path in _HELD or not os.path.lexists(run_dir.lock) or out_dir_holder(run_dir) is not None:
            return None
        return _holder_written(run_dir.lock)
    except OSError:
        return None


def _holder_written(path):
    """What the lock file `path` names as its holder ('' where it is empty, missing or cannot be read: taking the
    lock says why)."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def release_new_out_dir(run_dir):
    """After a run that failed or stopped before writing anything: remove what hold_out_dir created in the run
    directory `run_dir` (a runs.RunDir), the lock file and out_dir itself if it was new, so a failed start leaves
    no trace, also in an out_dir that holds another run it refused to replace. Does nothing where out_dir's
    files differ from what hold_out_dir found (a run that wrote something keeps its lock file, the mark of a run
    that did not end cleanly). Returns True if out_dir is gone."""
    out_dir = run_dir.path
    if out_dir not in _HELD or _listing(run_dir) != _CREATED[out_dir][1]:
        return False
    f = _HELD.pop(out_dir)
    created, _ = _CREATED.pop(out_dir)
    _UNSIGNED.pop(out_dir, None)
    if run_dir.lock in created:
        os.remove(run_dir.lock)
    f.close()
    return _remove_created([p for p in created if p != run_dir.lock])


def _listing(run_dir):
    """The run directory's entries and their modification times, less the lock file."""
    with os.scandir(run_dir.path) as entries:
        return {e.name: e.stat().st_mtime_ns for e in entries if e.name != os.path.basename(run_dir.lock)}


def release_out_dir(run_dir):
    """At the clean end of a run: remove the lock file of the run directory `run_dir` (a runs.RunDir) and give
    its lock back. The file is removed while the lock is held; a process that opened it meanwhile and then takes
    the lock finds it removed and tries again on a new file (try_lock), so the lock stays exclusive. Does nothing
    where this process holds no lock on out_dir."""
    f = _HELD.pop(run_dir.path, None)
    _CREATED.pop(run_dir.path, None)
    _UNSIGNED.pop(run_dir.path, None)
    if f is None:
        return
    with contextlib.suppress(FileNotFoundError):
        os.remove(run_dir.lock)
    f.close()


def _remove_created(created):
    """Remove the paths hold_out_dir created (the lock file, then out_dir if it holds nothing else); returns
    True if out_dir went too."""
    for path in created:
        if os.path.isfile(path):
            os.remove(path)
        elif os.path.isdir(path) and not os.listdir(path):
            os.rmdir(path)
            return True
    return False


def out_dir_holder(run_dir):
    """The holder written in the lock file of the run directory `run_dir` (a runs.RunDir) if a live process holds
    the lock, else None."""
    return lock_holder(run_dir.lock)


def lock_holder(path):
    """The holder written in the lock file `path` if a live process holds its lock, else None (also where there
    is no such file, and on a file system without file locks, where no process can hold it). It asks for a
    shared lock without waiting, and gives it back at once."""
    try:
        f = open(path)
    except FileNotFoundError:
        return None
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno in UNSUPPORTED:
                return None
            return f.read().strip() or "a process"
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def try_lock(path, holder, tries=4):
    """Take the exclusive lock of the file `path` (created, with its directory, if missing) without waiting
    longer than a probe (lock_holder) holds it (`tries` attempts 25 ms apart), and write `holder` into it
    (holder None: the file is left as it is). Returns (the open file, None): the lock is held until the file is
    closed or this process ends; or (None, what the process holding it wrote).
    Raises OSError where the file system has no flock(2)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    f = open(path, "a+")
    for _ in range(tries):
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                f.close()
                raise
            time.sleep(0.025)
            continue
        if _same_file(f, path):
            break
        # its holder removed it at its end (release_out_dir) after this process opened it: the lock is on a
        # file no one else will open, so take the one at `path` now
        f.close()
        f = open(path, "a+")
    else:
        f.seek(0)
        other = f.read().strip() or "another process (it has not written its name yet)"
        f.close()
        return None, other
    if holder is not None:
        _write_holder(f, holder)
    return f, None


def _write_holder(f, holder):
    """Write `holder` alone into the open lock file f (opened 'a+')."""
    f.seek(0)
    f.truncate()
    f.write(f"{holder}\n")
    f.flush()


def _same_file(f, path):
    """Whether the open file f is still the file at `path` (not removed or replaced since it was opened)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(f.fileno())
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


@contextlib.contextmanager
def exclusive(path):
    """Hold the exclusive lock of the file `path` (created if missing) for the `with` block, waiting for
    another process that holds it: a read-modify-write of a file two processes share (sweep.json) under it
    sees the other's last write. On a file system without file locks (UNSUPPORTED) the block runs unlocked,
    as it would without this lock."""
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in UNSUPPORTED:
                raise
        yield  # closing the file gives the lock back


def hold_run_dir(cfg, runtime, run_dir, start, stop):
    """Hold the run directory `run_dir` (a runs.RunDir, cfg.out_dir's) for train.py's run that starts from `start`
    (a start.Start): on rank 0 created and, with cfg.lock_out_dir, locked for this process's life (hold_out_dir; one
    run per out_dir); a run that resumes a checkpoint that is not there, and a new run that would replace or append
    to what a run left there unasked (checkpoints, metrics.jsonl, config.json, wandb/, a .lock no process holds)
    unless cfg.overwrite, are refused on every rank (runs.RunDir.check_start, whose message gives the command to run
    instead: cli.run_command), every file there left as it was, a killed run's lock file included
    (left_lock_holder). Every rank reads out_dir before rank 0 touches it: the ranks meet (runtime.barrier) between
    their reads and rank 0's lock, since a rank that read it later would find the lock file rank 0 is creating
    before rank 0 holds it, and refuse the run as a killed one's. cfg: the TrainConfig; runtime: processes.setup's
    processes; stop: the run's stopping.StopFlag, which defers a signal while the lock is taken. Raises SetupError
    (OutDirBusy, NoFileLocks, OutDirUnwritable) or CheckpointError."""
    left_lock = left_lock_holder(run_dir)  # before this run takes the lock
    runtime.barrier()
    if runtime.master and cfg.lock_out_dir:
        with stop.deferred():  # a signal now would leave a lock file that nothing records to remove
            hold_out_dir(run_dir)
    elif runtime.master:
        make_out_dir(run_dir)
    run_dir.check_start(start, cfg.overwrite, lambda *flags: run_command(runtime, *flags), left_lock)
