"""Worker-side log hygiene for the embedded cluster, loaded into each worker process as a Dask preload.

At shutdown (the fit's end, Ctrl-C, a lost scheduler) a worker's periodic heartbeat can be cut mid-flight by the
scheduler closing its side; distributed logs that as an ERROR with a ~30-line CommClosedError traceback on the
user's terminal, although the fit has already reported its own end in one line. And a task that raises one of
spatialfed's own errors (a damaged partition's StoreError, say) is logged by the worker as "Compute Failed" with the
task's arguments and a traceback (~20 lines), beside the fit's one line naming the site, the sub-step and the same
cause. Only those records are dropped; every other worker message is kept (a failure that is not a SpatialFedError,
i.e. a bug, keeps its traceback).
"""

import logging

HEARTBEAT_CUT = "Failed to communicate with scheduler during heartbeat"


class ShutdownHeartbeatFilter(logging.Filter):
    """Drops the worker's record of a heartbeat whose connection was closed (CommClosedError), nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.getMessage().startswith(HEARTBEAT_CUT):
            return True
        from distributed.comm.core import CommClosedError

        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, CommClosedError)


class OwnErrorFilter(logging.Filter):
    """Drops the worker's "Compute Failed" record of a task that raised a SpatialFedError (the fit reports it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith(COMPUTE_FAILED) or not isinstance(record.args, tuple) or \
                len(record.args) < 4:
            return True
        exception_text = str(record.args[3])  # "Exception: %r" of distributed.worker's record
        return exception_text.split("(", 1)[0] not in _own_error_names()


COMPUTE_FAILED = "Compute Failed"


def _own_error_names() -> set[str]:
    """Names of SpatialFedError and every subclass defined so far (the raising module is imported by then)."""
    from spatialfed.errors import SpatialFedError

    names, todo = set(), [SpatialFedError]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def install() -> None:
    """Install the filters on distributed.worker's logger (once per process)."""
    logger = logging.getLogger("distributed.worker")
    for kind in (ShutdownHeartbeatFilter, OwnErrorFilter):
        if not any(isinstance(f, kind) for f in logger.filters):
            logger.addFilter(kind())


def dask_setup(worker) -> None:  # the preload hook Dask calls in each worker process
    install()
