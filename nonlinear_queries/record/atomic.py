"""
Every file the repo writes appears whole or not at all: it is written under a temporary
name beside its final one, flushed to disk, and renamed over the final name (os.replace,
atomic on POSIX), so a crash, a full disk or a kill at any moment leaves the previous
file, or none, never half of one. A failed write removes its temporary file, so a full
disk is not left fuller. A process that must exit at once mid-write (a second stop signal,
stopping.py) removes the temporary files of its writes in flight with discard_in_flight.
The file gets the mode open() would give it under the process's umask (0644 under the usual
022), whatever mode its writer gave the temporary file (safetensors and tempfile.mkstemp make
theirs 0600).
"""

import contextlib
import json
import os
import shutil

_IN_FLIGHT = set()  # the temporary paths of this process's writes in progress (discard_in_flight)


def fsync_path(path):
    """fsync a file or a directory by path (a directory's fsync makes its renames durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask():
    """The process's umask, read without changing it: os.umask can only be read by setting it, and a file that
    another thread (wandb's, say) creates in between would get the wrong mode, so Linux's /proc is read where
    there is one."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration):  # no /proc (macOS), or a kernel before 4.7: set it (to 022, so that a
        # file made in that instant gets at most 0644) and put it back
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


@contextlib.contextmanager
def atomic_path(path, per_process=False):
    """Yield a temporary path to write `path`'s content to, by any means (np.memmap,
    torch.save, tofile); on a clean exit fsync it and rename it over `path`; on an
    exception remove it and re-raise. The temporary name is path + ".tmp", or
    path + ".<pid>.tmp" with per_process=True where several processes may write the same
    file at once (the last rename wins, and every version is complete). The file's mode is 0666 less the
    umask, as open() makes it."""
    tmp = f"{path}.{os.getpid()}.tmp" if per_process else f"{path}.tmp"
    with in_flight(tmp):
        try:
            yield tmp
            os.chmod(tmp, 0o666 & ~_umask())
            fsync_path(tmp)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            raise


@contextlib.contextmanager
def in_flight(tmp):
    """Mark `tmp`, a temporary file or directory that the `with` block writes and renames into place, as a
    write in progress for discard_in_flight (atomic_path does; so does a sharded checkpoint's directory)."""
    _IN_FLIGHT.add(tmp)
    try:
        yield tmp
    finally:
        _IN_FLIGHT.discard(tmp)


def discard_in_flight():
    """Remove the temporary files (or directories) of this process's writes in progress, for a process about
    to exit without finishing them (os._exit): what it leaves is the files that were whole before. Never
    raises: it runs in a signal handler."""
    for tmp in list(_IN_FLIGHT):
        with contextlib.suppress(OSError):
            if os.path.isdir(tmp):
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                os.remove(tmp)


@contextlib.contextmanager
def atomic_write(path, mode="w", per_process=False):
    """open() for writing `path` atomically (see atomic_path, and its per_process for a file that several
    processes write): `with atomic_write(p) as f: f.write(...)`. mode is "w" (text, UTF-8) or "wb"."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write writes a whole file: mode 'w' or 'wb', got {mode!r}")
    with atomic_path(path, per_process) as tmp:
        with open(tmp, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as f:
            yield f


def write_json(path, obj, per_process=False):
    """Write `obj` as indented JSON and a final newline to `path`, atomically (per_process: see atomic_path)."""
    with atomic_write(path, per_process=per_process) as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
