"""Worker-side log hygiene for the embedded cluster, loaded into each worker process as a Dask preload.

At shutdown (the fit's end, Ctrl-C, a lost scheduler) a worker's periodic heartbeat can be cut mid-flight by the
scheduler closing its side; distributed logs that as an ERROR with a ~30-line CommClosedError traceback on the
user's terminal, although the fit has already reported its own end in one line. Only that record is dropped; every
other worker message is kept.
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


def install() -> None:
    """Install the filter on distributed.worker's logger (once per process)."""
    logger = logging.getLogger("distributed.worker")
    if not any(isinstance(f, ShutdownHeartbeatFilter) for f in logger.filters):
        logger.addFilter(ShutdownHeartbeatFilter())


def dask_setup(worker) -> None:  # the preload hook Dask calls in each worker process
    install()
