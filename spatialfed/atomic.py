"""The one atomic-write routine of spatialfed: stage a file or directory beside its target, then rename it into place.

Every output (stores, checkpoints, fit results, reports, predictions, maps) is written through `staged`:

    with staged("out/fit.json") as tmp:        # tmp = out/.fit.tmp-1a2b3c4d.json (same directory, same suffix)
        tmp.write_text(text)                   # on leaving the block: fsync, os.replace(tmp, target), fsync the dir

    with staged("sim.zarr", directory=True) as tmp:   # tmp is a fresh empty directory
        zarr.open_group(tmp, mode="w") ...             # an existing sim.zarr is moved aside, replaced, then removed

A reader therefore sees the previous complete output or the new complete one, never a partial one; the temporary
is removed whatever goes wrong (an exception, Ctrl-C), so no `*.tmp*` is left behind. OS errors (read-only disk,
no space, permission denied, a path component that is a file, a missing parent) become one `OutputError` line
naming the path, the cause and the fix. `write_atomic(path, write)`, `write_text` and `write_bytes` are the
one-call forms; `staged_entries(directory, last=("fit.json",))` stages pieces to put into a directory that may hold
other files (a fit's OUT); `replace_path(src, dst)` is the rename step alone.

One overwrite rule for every output (a store, a fit directory, a prediction table and its metrics.json, a map
directory, the demo's directory, pilot-clip's bounds):
`refuse_existing(path, overwrite)` refuses one that exists (an empty directory does not count) in one line naming the
fix, `overwrite=True` from Python and `--overwrite` on the command line; with it the writer replaces it atomically.
"""

from __future__ import annotations

import errno
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from spatialfed.errors import OutputError, option

_FIXES = {
    errno.EROFS: ("the file system is read-only", "choose an output path on a writable disk"),
    errno.ENOSPC: ("no space left on the device", "free some space or choose an output path on another disk"),
    errno.EDQUOT: ("the disk quota is exceeded", "free some space or choose an output path on another disk"),
    errno.EACCES: ("permission denied", "choose a directory you can write to, or fix its permissions"),
    errno.EPERM: ("operation not permitted", "choose a directory you can write to, or fix its permissions"),
    errno.ENOTDIR: ("a component of the path is a file, not a directory", "choose another path"),
    errno.ENOENT: ("its parent directory does not exist", "create the parent directory first or choose another path"),
    errno.ENAMETOOLONG: ("the file name is too long", "choose a shorter path"),
    errno.EMFILE: ("too many open files", "raise the open-file limit (ulimit -n) or close other programs"),
}


def refuse_existing(path, overwrite: bool, *, error: type[Exception] = OutputError, keep: tuple[str, ...] = (),
                    alternative: str = "", instead: str = "choose another path") -> None:
    """Raise `error` (one line naming the fix) when the output `path` exists and `overwrite` is false. An empty
    directory, or one holding only the entries named in `keep` (e.g. the fit's own checkpoint), is not an output
    yet. `instead` is the way out besides overwriting (for a file written beside the one named, e.g. metrics.json:
    another directory); `alternative` a further one (e.g. how to continue a checkpointed fit)."""
    path = Path(path)
    if overwrite or not (path.exists() or path.is_symlink()):
        return
    if path.is_dir() and not path.is_symlink() and all(entry.name in keep for entry in path.iterdir()):
        return
    raise error(f"{path} already exists; {instead} or pass {option('overwrite=True', '--overwrite')} to "
                f"replace it{alternative}")


def output_error(path, exc: OSError, what: str = "write") -> OutputError:
    """One-line OutputError for an OSError met while writing `path`: the path, the cause and the fix."""
    cause, fix = _FIXES.get(getattr(exc, "errno", None) or -1, (None, None))
    if cause is None:
        detail = exc.strerror or str(exc) or type(exc).__name__
        cause, fix = detail, "check the path and the disk, then run again"
    return OutputError(f"cannot {what} {path}: {cause}; {fix}")


def temporary_sibling(path, tag: str = "tmp") -> Path:
    """A fresh hidden name beside `path` that keeps its suffix (writers that pick a format by suffix still work):
    out/.fit.tmp-1a2b3c4d.json."""
    path = Path(path)
    return path.with_name(f".{path.stem}.{tag}-{uuid.uuid4().hex[:8]}{path.suffix}")


def _remove(path: Path) -> None:
    """Remove a file or directory tree if it exists (best effort: used on cleanup paths)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass


def fsync_path(path: Path) -> None:
    """fsync a file, or every file and directory of a tree (then the tree's root); a no-op where the OS refuses."""
    path = Path(path)
    if path.is_dir():
        for root, dirs, files in os.walk(path, topdown=False):
            for name in files:
                _fsync_one(Path(root) / name, os.O_RDONLY)
            for name in dirs:
                _fsync_one(Path(root) / name, os.O_RDONLY)
    _fsync_one(path, os.O_RDONLY)


def _fsync_one(path: Path, flags: int) -> None:
    try:
        fd = os.open(path, flags)
    except OSError:  # pragma: no cover - e.g. directories on Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover - some file systems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def replace_path(src, dst) -> Path:
    """Move the complete file or directory `src` to `dst` (same file system). A file replaces a file atomically
    (os.replace); an existing directory `dst` is first moved aside, then `src` is renamed into place and the old
    one removed (moved back if the rename fails). The parent directory is fsynced so the rename is durable."""
    src, dst = Path(src), Path(dst)
    if src.is_dir() and dst.exists() and not dst.is_dir():
        raise OutputError(f"cannot write {dst}: it exists and is a file, not a directory; remove it or choose "
                          "another path")
    if not src.is_dir() and dst.is_dir():
        raise OutputError(f"cannot write {dst}: it exists and is a directory; remove it or choose another path")
    if not dst.is_dir():
        os.replace(src, dst)
    else:
        old = temporary_sibling(dst, "old")
        os.replace(dst, old)
        try:
            os.replace(src, dst)
        except BaseException:
            os.replace(old, dst)
            raise
        _remove(old)
    _fsync_one(dst.parent, os.O_RDONLY)
    return dst


@contextmanager
def staged(path, *, directory: bool = False, make_parents: bool = True, fsync: bool = True) -> Iterator[Path]:
    """Yield a temporary sibling of `path` to write into; on a normal exit move it into place (`replace_path`).

    `directory=True` yields a fresh empty directory (the output is a directory tree: a Zarr store, a fit
    directory); otherwise a file name not yet created. `make_parents` creates missing parent directories
    (otherwise a missing parent is an OutputError). `fsync` flushes the staged file (every file of a staged tree)
    to disk before the rename. On any exception, Ctrl-C included, the temporary is removed and the target is left
    as it was; an OSError is re-raised as one OutputError line naming `path` and the fix.
    """
    with _staging(path, directory, make_parents, fsync, lambda tmp: replace_path(tmp, path)) as tmp:
        yield tmp


@contextmanager
def staged_entries(directory, *, last: tuple[str, ...] = (), make_parents: bool = True,
                   fsync: bool = True) -> Iterator[Path]:
    """Stage files and folders to put into `directory`, which may already exist and hold other files (kept).

    A new `directory` is renamed into place whole (as `staged(directory, directory=True)`). Into an existing one,
    the entries named in `last` (e.g. "fit.json", the marker of a complete result) are removed first, every other
    staged entry replaces its namesake (`replace_path`), and the `last` ones go in at the end: a reader that finds
    the marker finds the matching complete set.
    """
    directory = Path(directory)
    if not directory.exists() or not directory.is_dir():
        with staged(directory, directory=True, make_parents=make_parents, fsync=fsync) as tmp:
            yield tmp
        return

    def commit(tmp: Path) -> None:
        for name in last:
            old = directory / name
            if old.exists() and (tmp / name).exists():
                _remove(old)
        names = sorted(p.name for p in tmp.iterdir())
        for name in [n for n in names if n not in last] + [n for n in last if n in names]:
            replace_path(tmp / name, directory / name)

    with _staging(directory, True, make_parents, fsync, commit) as tmp:
        yield tmp


@contextmanager
def _staging(path, directory: bool, make_parents: bool, fsync: bool, commit) -> Iterator[Path]:
    """The temporary sibling's life: create, yield, check, fsync, `commit(tmp)`; removed on failure; OS errors
    translated (`output_error`)."""
    path = Path(path)
    if directory and path.exists() and not path.is_dir():
        raise OutputError(f"cannot write {path}: it exists and is a file, not a directory; remove it or choose "
                          "another path")
    if not directory and path.is_dir():
        raise OutputError(f"cannot write {path}: it exists and is a directory; remove it or choose another path")
    tmp = None
    try:
        parent = path.parent
        if make_parents:
            parent.mkdir(parents=True, exist_ok=True)
        elif not parent.is_dir():
            raise OutputError(f"cannot write {path}: the directory {parent} does not exist; create it first or "
                              "choose another path")
        tmp = temporary_sibling(path)
        if directory:
            tmp.mkdir()
        yield tmp
        if not (tmp.is_dir() if directory else tmp.exists()):
            raise OutputError(f"cannot write {path}: nothing was written to the staged {tmp.name}")
        if fsync:
            fsync_path(tmp)
        commit(tmp)
    except OutputError:
        raise
    except FileExistsError as exc:  # mkdir(parents=True) met a file where a directory belongs
        raise OutputError(f"cannot write {path}: {exc.filename or path.parent} is a file, not a directory; "
                          "choose another path") from exc
    except OSError as exc:
        raise output_error(path, exc) from exc
    finally:
        if tmp is not None and tmp.exists():
            _remove(tmp)


def write_atomic(path, write: Callable[[str], object], *, make_parents: bool = True) -> Path:
    """Call `write(tmp)` with a temporary sibling name of `path` (same suffix), then rename it into place."""
    path = Path(path)
    with staged(path, make_parents=make_parents) as tmp:
        write(str(tmp))
    return path


def write_text(path, text: str, *, encoding: str = "utf-8", make_parents: bool = True) -> Path:
    """Write `text` to `path` atomically."""
    return write_atomic(path, lambda tmp: Path(tmp).write_text(text, encoding=encoding), make_parents=make_parents)


def write_bytes(path, data: bytes, *, make_parents: bool = True) -> Path:
    """Write `data` to `path` atomically."""
    return write_atomic(path, lambda tmp: Path(tmp).write_bytes(data), make_parents=make_parents)
