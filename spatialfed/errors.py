"""Input validation shared by every layer: errors that name the offending input and the fix.

A fix names the option the caller can change, as the caller's interface spells it: `option("duplicates='merge'",
"--duplicates merge")` is the Python keyword argument when a library function is called from Python, and the flag
while the `spatialfed` command runs (`command_line()`, entered by spatialfed.cli.main).
"""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager

import numpy as np

#: "cli" while the `spatialfed` command runs; an environment variable, so the Dask worker processes it starts agree
INTERFACE_ENV = "SPATIALFED_INTERFACE"


def option(python: str, cli: str) -> str:
    """The option a message advises, in the caller's spelling: `cli` (e.g. "--overwrite") under the `spatialfed`
    command (`command_line`), else `python` (e.g. "overwrite=True")."""
    return cli if os.environ.get(INTERFACE_ENV) == "cli" else python


_SAID: set[str] = set()   # the warnings `warn` has shown in this process


def warn(message: str, once: bool = True) -> None:
    """A warning for the user: one line attributed to "spatialfed" (Python prints no path or source line of
    spatialfed's own code), shown once per process for the same text (`once`: the warnings of a fit, so that the
    folds of a cross-validation, each a fit of its own, do not repeat them; a prediction's warn every time)."""
    if once and message in _SAID:
        return
    _SAID.add(message)
    warnings.warn_explicit(message, UserWarning, "spatialfed", 0, module="spatialfed")


def forget_warnings() -> None:
    """Show every warning again (a new session of work: the command line's commands, the tests)."""
    _SAID.clear()


@contextmanager
def command_line():
    """Messages raised inside this block advise command-line flags (`option`) and its warnings are shown afresh; the
    previous setting is restored."""
    before = os.environ.get(INTERFACE_ENV)
    os.environ[INTERFACE_ENV] = "cli"
    forget_warnings()  # a command's warnings are its own
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(INTERFACE_ENV, None)
        else:
            os.environ[INTERFACE_ENV] = before


class SpatialFedError(Exception):
    """Base class for errors raised by spatialfed with a user-facing explanation."""


class StoreError(SpatialFedError, ValueError):
    """A partitioned Zarr store is missing, malformed or inconsistent (SPEC §5)."""


class WorkerTaskError(SpatialFedError, RuntimeError):
    """A federated worker's local computation failed; names the worker and the sub-step."""


def check_finite(arr, name: str) -> np.ndarray:
    """Raise ValueError naming `name` if `arr` holds NaN or infinite values."""
    arr = np.asarray(arr, dtype=float)
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"{name} contains {bad} non-finite value(s) (NaN or inf); remove or impute them first")
    return arr


def check_positive(value, name: str) -> float:
    """Raise ValueError naming `name` unless `value` is a finite number > 0."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not np.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return v


class DataError(SpatialFedError, ValueError):
    """Input data, coordinates, CRS or geometry cannot be used as given; names the cause and the fix."""


class OutputError(SpatialFedError, OSError):
    """An output file or directory cannot be written (read-only disk, no space, path is a file, ...); names the fix."""
