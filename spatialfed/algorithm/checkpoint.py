"""Checkpoint files of a federated fit: a pickled `FederatedServer.snapshot()`, written atomically.

`write_checkpoint(path, server)` pickles the snapshot into a temporary file in the same directory, flushes and
fsyncs it, renames it over `path` with `os.replace` (atomic on POSIX and Windows within one filesystem) and fsyncs the
directory, so `path` always holds either the previous complete checkpoint or the new one, never a partial file, even
if the process dies mid-write. `read_checkpoint(path)` returns the snapshot dict; `FederatedServer.restore(snapshot)`
continues from it (docs/recovery.md).

Checkpoints are pickles: read only files you (or your own fits) wrote.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from spatialfed.atomic import staged
from spatialfed.errors import SpatialFedError

MAGIC = "spatialfed-checkpoint"


class CheckpointError(SpatialFedError, ValueError):
    """A checkpoint file is missing, truncated or not a spatialfed checkpoint."""


def write_checkpoint(path, server, meta: dict | None = None) -> Path:
    """Write `server.snapshot()` (or a snapshot dict) to `path` atomically (temp file in the same directory, fsync,
    os.replace). `meta`: the runtime's own settings needed to resume (store path, residual, slowdowns, ...), kept
    in the snapshot under "meta" (FederatedServer.restore ignores it)."""
    path = Path(path)
    snapshot = server.snapshot() if hasattr(server, "snapshot") else dict(server)
    if meta is not None:
        snapshot["meta"] = dict(meta)
    payload = {"magic": MAGIC, "snapshot": snapshot}
    with staged(path) as tmp:
        with open(tmp, "wb") as fh:
            pickle.dump(payload, fh, protocol=pickle.HIGHEST_PROTOCOL)
    return path


def read_checkpoint(path) -> dict:
    """The snapshot dict stored at `path` (CheckpointError naming the file if it is missing or not a checkpoint)."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            payload = pickle.load(fh)
    except FileNotFoundError as exc:
        raise CheckpointError(f"no checkpoint at {path}") from exc
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, IndexError) as exc:
        raise CheckpointError(f"{path} is not a readable spatialfed checkpoint ({type(exc).__name__}: {exc})") from exc
    if not isinstance(payload, dict) or payload.get("magic") != MAGIC:
        raise CheckpointError(f"{path} is not a spatialfed checkpoint")
    return payload["snapshot"]
