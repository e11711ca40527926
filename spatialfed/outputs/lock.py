"""One writer per output directory: `output_lock(out)` holds an exclusive OS lock on it for a whole run.

Two fits into the same ``--out`` both passed the "does it exist?" check, both ran, both printed "wrote", and one
result silently replaced the other. The lock is ``fcntl.flock`` (exclusive, non-blocking) on a file beside the
directory, ``.NAME.lock`` (the directory itself may not exist yet, and a file inside it would count as content);
it holds the owner's pid, host and command. The kernel drops a flock when its process ends however it ends (kill -9
included), so a lock is never stale: a file left by a dead process is simply locked again. A second run is refused at
once with one line naming the first. The holder removes the file on release; a run that locked a file another run
had just removed (its inode is no longer the path's) opens the path again.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
from contextlib import contextmanager
from pathlib import Path

from spatialfed.atomic import output_error
from spatialfed.errors import OutputError


class OutputLockedError(OutputError):
    """Another run holds the lock of this output directory."""


def lock_path(out) -> Path:
    """The lock file of output directory `out`: `.NAME.lock` beside it (symlinks resolved: one lock per directory
    however it is named)."""
    out = Path(out).resolve()
    return out.parent / f".{out.name}.lock"


@contextmanager
def output_lock(out, what: str = "--out"):
    """Hold the exclusive lock of output directory `out` inside the block (OutputLockedError naming the holder
    when another process has it). Creates `out`'s parent directories if needed (the run writes there anyway)."""
    path = lock_path(out)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise output_error(path.parent, exc, "create") from None
    fd = _acquire(path, out, what)
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)  # before the unlock: a waiting run then finds its inode gone and reopens
        os.close(fd)


def _acquire(path: Path, out, what: str) -> int:
    """An open descriptor of `path` holding its flock; the holder's identity written into it."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise output_error(path, exc, "create") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise OutputLockedError(f"{out} is being written by another run ({holder}); wait for it to finish, or "
                                    f"choose another {what}") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # the previous holder removed this file after we opened it: lock the path's new file
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)[:200]}\n".encode())
    return fd


def _holder(fd: int) -> str:
    """What the holder wrote into the lock file ("pid N on HOST: COMMAND"), or "pid unknown" if not yet."""
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text.splitlines()[0] if text else "pid unknown"
