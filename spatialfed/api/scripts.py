"""Starting the embedded Dask cluster from a script without ``if __name__ == "__main__":``, or from a notebook.

The embedded LocalCluster runs its workers as *spawned* processes. Python's spawn start method re-runs the parent's
main script in every child (as ``__mp_main__``) so that functions defined there can be unpickled; a script that fits
at top level, without the guard, then starts a second fit inside each child, which multiprocessing refuses: a dozen
tracebacks and no workers.

spatialfed's workers need nothing from the user's script (every task is a ``spatialfed.runtime.site`` function),
so ``spawn_safe`` hides the main module's file and spec while spatialfed's own cluster is up: the children start
like a notebook's (which has no main file) and never re-run the script. The guard is then unnecessary; a script
with it behaves the same. Only the embedded cluster is affected (not ``client=``, ``scheduler=`` or ``jobqueue=``,
whose workers spatialfed does not spawn from this process).

If a child process reaches ``fit`` anyway while it is still starting up (a process pool of the user's own),
``check_not_bootstrapping`` raises one line naming the fix.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
from contextlib import contextmanager

from spatialfed.errors import SpatialFedError

_lock = threading.Lock()
_depth = 0
_saved: dict = {}

GUARD_MESSAGE = ('this script is being re-imported by a child process while it starts (multiprocessing\'s spawn '
                 'method); put the code that fits under `if __name__ == "__main__":`')


class ScriptGuardError(SpatialFedError, RuntimeError):
    """A fit was started from a child process's re-import of the main script."""


def check_not_bootstrapping() -> None:
    """Raise ScriptGuardError when called while a spawned child process re-runs the main script."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise ScriptGuardError(GUARD_MESSAGE)


def embedded_cluster(runtime: str, *, client=None, scheduler=None, jobqueue=None) -> bool:
    """Whether these settings make spatialfed spawn a LocalCluster's worker processes from this process."""
    return runtime == "dask" and client is None and not scheduler and not jobqueue


@contextmanager
def spawn_safe(active: bool = True):
    """While inside: the main module has no ``__file__`` and ``__spec__`` for multiprocessing (see the module
    docstring), so spawned children do not re-run the user's script. Re-entrant; restores them on exit."""
    global _depth
    main = sys.modules.get("__main__")
    if not active or main is None:
        yield
        return
    with _lock:
        if _depth == 0:
            _saved.clear()
            _saved.update({k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__})
            main.__dict__.pop("__file__", None)
            main.__dict__["__spec__"] = None
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                main.__dict__.pop("__spec__", None)
                main.__dict__.update(_saved)
