"""The one loop that drives a sans-IO server over a `Runtime`, with the worker-loss policy and checkpointing.

    start the sites → hand every idle site its next request → for each batch of completed events:
        activations hand the site its newest request; a lost request is sent again (the runtime moved the site);
        a failed site stops the fit or is dropped (`on_worker_error`); results reach `server.receive` together;
        the server's alarm, when it rang with no answer, reaches `server.tick`; the runtime's timer is set to the
        server's `alarm` again
    → until `server.done`.

Every server call (receive, tick, next_task) is timed in CPU seconds and charged to the runtime (`Runtime.charge`):
on the virtual clock the server is one processor, and requests leave only once its decision is made. The server is
told what each call took on the fit's clock (`server.spent`), so that it can weigh its own work against the sites'.

With Poisson activations (docs/delays.md) an idle site is first woken at its next activation, and only then takes
the front of its buffer (the newest parameters), as VAFL's clients pull the server's state. Delays and activations
are drawn from ``numpy.random.default_rng(seed)`` in event order.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from spatialfed.algorithm.server_base import Phase
from spatialfed.errors import SpatialFedError, WorkerTaskError
from spatialfed.runtime.interface import ACTIVATION, ALARM, Runtime

log = logging.getLogger("spatialfed.runtime")
ON_WORKER_ERROR = ("stop", "drop")


class ClusterLostError(SpatialFedError, RuntimeError):
    """The cluster the fit ran on is gone (every worker, or the scheduler): the fit cannot go on. `drive` adds
    where its checkpoint is and how to continue from it; it also sets ``reason`` (the cause alone),
    ``checkpoint`` (the file that continues the fit, or None) and ``iteration`` (the checkpoint's t)."""

    reason: str | None = None
    checkpoint: Path | None = None
    iteration: int | None = None


#: default cadence: a checkpoint every DEFAULT_EVERY aggregations, but writing at most MAX_SHARE of the wall time
DEFAULT_EVERY, MAX_SHARE = 10, 0.05


class Checkpointer:
    """Writes the server's snapshot (algorithm.checkpoint) every `every` aggregations, when the fit is interrupted
    between two receive calls (the server is consistent there), and once at the end (docs/recovery.md).

    `every` None: every DEFAULT_EVERY (10) aggregations, further apart when a write costs more than MAX_SHARE (5 %)
    of the wall time since the previous one (a write grows like J·m²: 4 MB and ~0.1 s for J = 10, m = 100).
    `rescue`: with no `path`, a fit that loses its cluster still saves its state, in a new temporary directory
    (`rescue_dir`, default the system's), and the error names that file. The meta written also holds
    ``wall_time_s``: `wall_s` (the fit's real seconds before this run, from the checkpoint it resumes) plus the
    seconds since `drive` began this run, so that a resumed fit reports the whole fit's wall time."""

    def __init__(self, path, every: int | None = None, meta: dict | None = None, *, rescue: bool = True,
                 rescue_dir=None, wall_s: float = 0.0):
        self.path = None if path is None else Path(path)
        self.adaptive = every is None
        self.every = None if path is None else int(every or DEFAULT_EVERY)
        self.meta = meta
        self.rescue = bool(rescue)
        self.rescue_dir = rescue_dir
        self.last_t = 0
        self.writes = 0
        self.seconds = 0.0
        self._last_write = (time.perf_counter(), 0.0)  # (when the previous write ended, how long it took)
        self.wall_s, self.began = float(wall_s), time.perf_counter()

    def wall_time_s(self) -> float:
        """The whole fit's real seconds so far: those before this run and this run's since `drive` began it."""
        return self.wall_s + time.perf_counter() - self.began

    def on_event(self, server) -> None:
        if self.path is not None and server.phase == Phase.LOOP and server.t >= self.last_t + self.every:
            ended, took = self._last_write
            if self.adaptive and took > MAX_SHARE * (time.perf_counter() - ended):
                return  # the last write was costly: wait until it is under MAX_SHARE of the time since
            self.write(server)

    def write_rescue(self, server) -> None:
        """With no path: save `server` to DIR/checkpoint.zip in a new temporary directory (a lost cluster)."""
        if self.path is not None or not self.rescue or server is None:
            return
        import tempfile

        try:
            self.path = Path(tempfile.mkdtemp(prefix="spatialfed-rescue-", dir=self.rescue_dir)) / "checkpoint.zip"
        except OSError:
            return
        self.every = DEFAULT_EVERY
        self.write(server, failing=True)

    def write(self, server, failing: bool = False) -> None:
        if self.path is None or server is None:
            return
        from spatialfed.algorithm.checkpoint import write_checkpoint

        tic = time.perf_counter()
        try:
            meta = None if self.meta is None else {**self.meta, "wall_time_s": self.wall_time_s()}
            write_checkpoint(self.path, server, meta=meta)
        except Exception:
            if not failing:
                raise
            return  # do not hide the original failure
        took = time.perf_counter() - tic
        self.seconds += took
        self.writes += 1
        self.last_t = server.t
        self._last_write = (time.perf_counter(), took)


def drive(server, runtime: Runtime, specs=None, *, delays=None, activations=None, seed: int = 0,
          on_event: Callable | None = None, on_result: Callable | None = None, on_worker_error: str = "stop",
          checkpointer: Checkpointer | None = None):
    """Run `server` to completion on `runtime` over the sites `specs` (None: the runtime holds its sites already);
    returns the server.

    `on_event(server, now)` after each batch of arrivals; `on_result(j, p, result)` for every result as it arrives
    (load summaries with p None). A failed site raises WorkerTaskError naming it and the sub-step, or with
    ``on_worker_error="drop"`` is dropped (`server.drop_worker`, recorded in ``server.dropped``). Interrupted
    (Ctrl-C, a lost cluster, a failure), the checkpointer saves the last consistent state before the error goes on.
    """
    if on_worker_error not in ON_WORKER_ERROR:
        raise ValueError(f"on_worker_error must be one of {ON_WORKER_ERROR}, got {on_worker_error!r}")
    J = server.n_workers
    if specs is not None and len(specs) != J:
        raise ValueError(f"the server has {J} workers but the store has {len(specs)}")
    delays = None if delays is None else delays.resolve(J)
    activations = None if activations is None else activations.resolve(J)
    rng = np.random.default_rng(seed)
    waiting: set[int] = set()  # sites with a wake-up outstanding
    receiving = False  # inside server.receive: an interruption there may leave the server half-updated

    def charged(call, *args, **kwargs):  # the server's own compute, charged to the runtime's clock
        tic = time.process_time()
        try:
            return call(*args, **kwargs)
        finally:
            server.spent(runtime.charge(time.process_time() - tic))

    def take(j: int) -> None:
        p = charged(server.next_task, j, free=runtime.free(j))
        if p is not None:
            runtime.submit(j, p, 0.0 if delays is None else delays.sample(j, rng))

    def hand_out() -> None:
        for j in list(server.active):
            if server.busy(j):
                continue
            if activations is None:
                take(j)
            elif j not in waiting:
                waiting.add(j)
                runtime.wake(j, activations.next_activation(j, runtime.now(), rng))

    def failed(j: int, step: str, error: str) -> None:
        if on_worker_error == "stop":
            raise WorkerTaskError(error)
        log.warning("%s; continuing without federated worker %d (on_worker_error='drop')", error, j)
        server.drop_worker(j, step, error, runtime.now())

    ctrl_c = CtrlC()
    if checkpointer is not None:
        checkpointer.began = time.perf_counter()  # this run's wall time starts here
    try:
        if server.done:  # a finished checkpoint needs no site
            return server
        def loaded(event) -> None:  # as each partition lands (progress)
            if event.error is None and event.result is not None and on_result is not None:
                on_result(event.site, None, event.result)

        dropped = [j for j in range(J) if j not in server.active]  # before a resume: they stay out, unloaded
        for event in runtime.start(specs, clock_start=float(server.time_s), on_loaded=loaded, skip=dropped):
            if event.error is not None and event.site in server.active:
                failed(event.site, "load", event.error)
        server.clock(runtime.now())  # the first requests leave now, after the partitions loaded
        hand_out()
        for batch in runtime.completed():
            if ctrl_c.pressed:  # a Ctrl-C whose KeyboardInterrupt a finalizer swallowed
                raise KeyboardInterrupt
            arrived, rang = [], False
            for ev in batch:
                j = ev.site
                if ev.request == ALARM:
                    rang = True
                elif ev.request == ACTIVATION:
                    waiting.discard(j)
                    if not ev.lost and not server.busy(j) and j in server.active:
                        server.clock(runtime.now())
                        take(j)
                elif ev.lost:
                    runtime.submit(j, ev.request, 0.0 if delays is None else delays.sample(j, rng))
                elif ev.error is not None:
                    if j in server.active:
                        failed(j, ev.request.step, ev.error)
                else:
                    if on_result is not None:
                        on_result(j, ev.request, ev.result)
                    arrived.append(ev.result)
            if server.done:
                break
            if arrived or rang:
                now = runtime.now()
                receiving = True
                if arrived:
                    charged(server.receive, arrived, now)
                else:
                    charged(server.tick, now)
                receiving = False
                if checkpointer is not None:
                    checkpointer.on_event(server)
                if on_event is not None:
                    on_event(server, now)
                if server.done:
                    break
            hand_out()
            runtime.alarm(server.alarm)
        if not server.done:
            raise RuntimeError("the runtime ran out of work before the fit finished (no site has a task)")
    except (KeyboardInterrupt, SystemExit, SpatialFedError, OSError, TimeoutError, RuntimeError) as exc:
        if checkpointer is not None and not receiving:
            if isinstance(exc, ClusterLostError) and checkpointer.path is None:
                checkpointer.write_rescue(server)  # no checkpoint asked for: the state is saved anyway
            else:
                checkpointer.write(server, failing=True)
        elif checkpointer is not None and checkpointer.path is not None:
            log.warning("fit interrupted while the server was updating; %s keeps the checkpoint of iteration %d",
                        checkpointer.path, checkpointer.last_t)
        if isinstance(exc, (ClusterLostError, WorkerTaskError)) and exc.args:
            exc.reason = str(exc.args[0])
            kept = checkpointer is not None and checkpointer.path is not None and checkpointer.path.exists()
            exc.checkpoint = checkpointer.path if kept else None
            exc.iteration = checkpointer.last_t if kept else None
            exc.args = (f"{exc.args[0]}; {resume_hint(checkpointer)}", *exc.args[1:])
        raise
    finally:
        ctrl_c.restore()
        runtime.stop()
    if checkpointer is not None:
        checkpointer.write(server)  # the final state (a resume of it returns the same result)
    return server


class CtrlC:
    """Remembers a Ctrl-C during a fit. Python raises KeyboardInterrupt wherever the main thread is, and where that
    is a finalizer (a Dask Future's __del__) the exception is printed as "ignored" and lost: the fit ran on. The
    handler installed here (main thread only, and not where SIGINT is ignored) records the press and raises as
    before; drive() raises again at its next batch if the first was swallowed."""

    def __init__(self):
        self.pressed = False
        self._before = None
        if threading.current_thread() is threading.main_thread():
            before = signal.getsignal(signal.SIGINT)
            if callable(before):
                self._before = before
                signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum, frame):
        self.pressed = True
        self._before(signum, frame)

    def restore(self) -> None:
        if self._before is not None:
            signal.signal(signal.SIGINT, self._before)
            self._before = None


def resume_hint(checkpointer: Checkpointer | None) -> str:
    """How to continue an interrupted fit: from its checkpoint when one was written, else how to get one."""
    if checkpointer is None or checkpointer.path is None or not checkpointer.path.exists():
        return ("no checkpoint was written (give FederatedGP(checkpoint=PATH) to be able to continue after a failure; "
                "`spatialfed fit` always keeps one)")
    import shlex

    return (f"the checkpoint {checkpointer.path} (iteration {checkpointer.last_t}) continues the fit: "
            f"FederatedGP.resume('{checkpointer.path}') or "
            f"`spatialfed fit --resume {shlex.quote(str(checkpointer.path))}`")
