"""SIGTERM and SIGHUP stop a fit as Ctrl-C does: what a batch system sends at walltime, or a closed terminal.

Python's default for both is to die at once: no checkpoint, no exit handlers (an in-memory fit's temporary store,
holding every raw row, stayed behind) and leaked semaphores. ``stop_as_interrupt()`` installs, for each of the two
signals still at its default action (main thread only: a handler the user or a batch framework set is kept), a
handler that records the signal and raises ``Terminated``, a KeyboardInterrupt: the fit's own Ctrl-C path
(runtime.driver) writes its checkpoint at the point it stopped, context managers close the cluster, and exit
handlers remove temporary stores. The fit's Ctrl-C handler is called first, so a stop raised inside a finalizer and
swallowed there is raised again at the fit's next batch. ``received()`` names the signal; the command line exits
with 128 + its number (143 SIGTERM, 129 SIGHUP), as a shell reports a process the signal ended.
"""

from __future__ import annotations

import logging
import signal
import threading

from spatialfed.runtime.driver import CtrlC

#: the signals handled like SIGINT
SIGNALS = (signal.SIGTERM, signal.SIGHUP)

_received: list[int] = []


class Terminated(KeyboardInterrupt):
    """The process was asked to stop by SIGTERM or SIGHUP (``signum``)."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {name(signum)}")
        self.signum = int(signum)


def _stop(signum, frame) -> None:
    _received.append(int(signum))
    # a process-group signal stops the embedded cluster's workers too: the scheduler's complaints about them are noise
    logging.getLogger("distributed").setLevel(logging.CRITICAL)
    handler = signal.getsignal(signal.SIGINT)
    if isinstance(getattr(handler, "__self__", None), CtrlC):
        try:
            handler(signal.SIGINT, frame)  # a fit's Ctrl-C handler remembers the stop (runtime.driver.CtrlC)
        except KeyboardInterrupt:
            pass
    raise Terminated(signum)


def stop_as_interrupt(tracker: bool = True) -> None:
    """Handle SIGTERM and SIGHUP as described in the module docstring (idempotent; nothing outside the main
    thread); with `tracker`, also start the resource tracker a fit's processes use (`_tracker_ignores_sighup`)."""
    if threading.current_thread() is not threading.main_thread():
        return
    if tracker:
        _tracker_ignores_sighup()
    for signum in SIGNALS:
        if signal.getsignal(signum) in (signal.SIG_DFL, None):
            signal.signal(signum, _stop)


def _tracker_ignores_sighup() -> None:
    """Start multiprocessing's resource tracker (if not running) with SIGHUP ignored, as it ignores SIGINT and
    SIGTERM itself: a SIGHUP to the process group killed it and each semaphore of the fit printed a traceback."""
    from multiprocessing import resource_tracker

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # an ignored signal stays ignored across fork + exec
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, before)


def received() -> int | None:
    """The number of the first SIGTERM/SIGHUP this process received (None: none)."""
    return _received[0] if _received else None


def exit_status(signum: int) -> int:
    """The shell's status of a process ended by `signum`: 128 + its number."""
    return 128 + int(signum)


def name(signum: int) -> str:
    """'SIGTERM', 'SIGHUP', ..."""
    return signal.Signals(signum).name
