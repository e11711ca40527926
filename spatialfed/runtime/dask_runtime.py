"""Dask runtime: the sites run in Dask workers, each request a task pinned to the worker holding its partition.

Where the data live
    Site j's partition is read from the Zarr store *inside a task* on the Dask worker assigned to j (round-robin over
    the Dask workers; several partitions may share one process) and kept there (`runtime.site`), whose factorisation
    cache then serves every later task. The client and the scheduler only ever see the small quantities of SPEC §3:
    no observations, locations, residuals or n_j × n_j matrices.

How requests run
    ``client.submit(site.answer, spec_j, p, s_j, delay, workers=[address_j], key="theta-w3-t12-1a2b3c", pure=False)``;
    `distributed.as_completed(...).batches()` hands back everything finished since the last batch (`completed`).
    Keys start with the sub-step (the dashboard's task stream colours by it); all inside the span ``spatialfed-fit``.

Heterogeneity emulation
    A site with slowdown s_j that computed a task for c CPU seconds sleeps (s_j − 1)·c before returning (as if on a
    machine s_j times slower; sleeping costs wall time, not a core).

Worker loss (docs/recovery.md)
    Tasks are pinned (``allow_other_workers=False``), so a task whose Dask worker left would wait in the scheduler's
    no-worker state for ever. The runtime subscribes to the scheduler's event topic "all": its "remove-worker"
    event wakes a watchdog thread (which also polls every `poll_s` seconds) that cancels, with reason `LOST`, every
    in-flight task pinned to a worker no longer connected; `completed` reports them `lost`, the site moves to the
    live worker with the fewest partitions, which loads the partition from the store itself, and the driver sends
    the request again. A result fetched after its worker left (status "lost") is handled the same way; so is one
    whose worker dies while the result is being fetched (distributed's gather then resets the future to pending and
    waits for a recomputation that can never run on the dead worker: the future stays in the in-flight set until
    fetched, so the watchdog cancels it at once). A site whose worker was announced removed moves before its next
    task is sent; a worker that joins holding no site (a nanny's restarted process, a new job) takes a site from a
    worker holding several when that site's next task is sent. A site whose request kills every worker it is sent
    to is given up after Dask's allowed-failures + 1 deaths (`runtime.worker_loss`): its request ends as an error
    naming it, and ``on_worker_error`` stops the fit or drops the site.

Deadlines
    With no worker left, the runtime waits `worker_wait_s` (10 s: a LocalCluster's nanny restarts a killed worker
    process in about 1.5 s) for one to join, then raises ClusterLostError.
    When the connection to the scheduler closes, distributed's client cancels every future (reason
    "scheduler-connection-lost"): `completed` raises ClusterLostError at once; a silent scheduler is given up after
    `scheduler_wait_s` (10 s). `stop` skips every call to a scheduler that is gone, and bounds the others.
"""

from __future__ import annotations

import contextlib
import logging
from asyncio import CancelledError
from concurrent.futures import CancelledError as FutureCancelled
import threading
import time
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from spatialfed.errors import WorkerTaskError
from spatialfed.runtime import site
from spatialfed.runtime.driver import ClusterLostError
from spatialfed.runtime.cluster import ClusterHandle, quiet_reconnect_logs, worker_addresses, worker_threads
from spatialfed.runtime.heterogeneity import resolve_slowdowns
from spatialfed.runtime.interface import ACTIVATION, ALARM, ALARM_SITE, Event, Runtime
from spatialfed.runtime.worker_loss import WorkerDeaths, assign_partitions, least_loaded, step_name

SPAN_NAME = "spatialfed-fit"
#: cancellation reasons: the task's Dask worker left (the site moves) / the scheduler stopped answering
LOST, SCHEDULER_LOST = "spatialfed-worker-lost", "spatialfed-scheduler-lost"
#: default deadlines (seconds): for a live worker once every worker left; for the scheduler to answer
WORKER_WAIT_S, SCHEDULER_WAIT_S = 10.0, 10.0
#: while the server's alarm is set, completed() looks for answers this often (as_completed has no per-item timeout)
ALARM_POLL_S = 0.002
log = logging.getLogger("spatialfed.runtime.dask")


def task_key(step: str, j: int, t: int | None = None) -> str:
    """Readable, unique task key: '<step>-w<j>[-t<t>]-<6 hex>' (the dashboard groups tasks by the leading step)."""
    return f"{step}-w{j}{'' if t is None else f'-t{t}'}-{uuid.uuid4().hex[:6]}"


@dataclass
class DaskRunInfo:
    """What a Dask run reports besides the finished server."""

    fit_id: str
    assignment: list[str]
    sizes: list[int]
    dashboard_link: str | None
    wall_time_s: float
    n_tasks: int
    reassigned: int = 0  # sites moved because their Dask worker left the cluster


class DaskRuntime(Runtime):
    """`Runtime` on a Dask cluster through `client` (module docstring); `slowdowns` emulate slower sites.

    Deadlines (every wait ends): a lost Dask worker is noticed when the scheduler announces its removal (topic
    "all", action "remove-worker") or by the watchdog's poll every `poll_s` seconds; a site whose worker left waits
    at most `worker_wait_s` seconds for a live worker; a scheduler that does not answer for `scheduler_wait_s`
    seconds, or a closed connection to it, ends the fit; a finished task's result is fetched within `result_s`."""

    name = "dask"

    def __init__(self, client, slowdowns="balanced", *, addresses: list[str] | None = None, poll_s: float = 1.0,
                 worker_wait_s: float = WORKER_WAIT_S, scheduler_wait_s: float = SCHEDULER_WAIT_S,
                 result_s: float = 30.0):
        self.client = client
        self.slowdowns = slowdowns
        self.addresses = addresses
        self.poll_s = float(poll_s)
        self.worker_wait_s = float(worker_wait_s)
        self.scheduler_wait_s = float(scheduler_wait_s)
        self.result_s = float(result_s)
        self.specs: list[site.SiteSpec] = []
        self.assignment: list[str] = []
        self.sizes: list[int] = []
        self.n_tasks = 0
        self.reassigned = 0
        self.rebalanced = 0  # sites moved to a Dask worker that joined holding no site (e.g. a restarted one)
        self._spare: list[str] = []  # live Dask workers holding no site (the watchdog's last look)
        self.lost_workers: list[str] = []  # Dask workers that left during the run, in the order noticed
        self.deaths = WorkerDeaths()  # per site, the Dask workers that died running its request
        self._inflight: dict = {}  # key -> (future, j, request, Dask worker address), until its result is fetched
        self._per_address: Counter = Counter()  # in-flight tasks per Dask worker (`free` in O(1))
        self._threads: dict[str, int] = {}  # Dask worker address -> its threads (the last look at the workers)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._gone: set[str] = set()  # addresses the scheduler announced removed
        self._scheduler_lost: str | None = None  # why the scheduler is considered gone (set by the watchdog)
        self._guard: threading.Thread | None = None
        self._subscribed = False
        self._context = contextlib.ExitStack()
        self._ac = None
        self._alarm: float | None = None
        self._t0, self._clock_start = time.perf_counter(), 0.0

    # --- the Runtime interface -----------------------------------------------------------------------------
    def start(self, specs, clock_start: float = 0.0, on_loaded=None, skip=()) -> list[Event]:
        from distributed import as_completed, span

        self.specs = list(specs)
        J = len(self.specs)
        self._stop, self._wake, self._context, self._inflight = (threading.Event(), threading.Event(),
                                                                 contextlib.ExitStack(), {})
        self._per_address, self._gone, self._scheduler_lost = Counter(), set(), None
        self._s = resolve_slowdowns(self.slowdowns, J)
        self.assignment = assign_partitions(J, self.addresses or self._workers_now())
        self.sizes = [0] * J
        self._context.enter_context(span(SPAN_NAME))
        self._ac = as_completed()
        self._alarm = None
        try:
            self.client.subscribe_topic("all", self._on_scheduler_event)  # the scheduler's remove-worker events
            self._subscribed = True
        except Exception:  # pragma: no cover - the watchdog's poll still notices lost workers
            self._subscribed = False
        self._guard = threading.Thread(target=self._watchdog, args=(self._stop, self._wake),
                                       name="spatialfed-watchdog", daemon=True)
        self._guard.start()
        self._t0, self._clock_start = time.perf_counter(), float(clock_start)
        loaded: dict[int, Event] = {j: Event(j, None) for j in skip}  # dropped sites: never asked again
        for j in sorted(set(range(J)) - set(loaded)):
            self._submit(j, None, site.load, (self.specs[j],), task_key("load", j))
        while len(loaded) < J:
            for event in next(self.completed()):
                if event.lost:
                    self._submit(event.site, None, site.load, (self.specs[event.site],), task_key("load", event.site))
                else:
                    loaded[event.site] = event
                    if event.result is not None:
                        self.sizes[event.site] = int(event.result["n"])
                    if on_loaded is not None:
                        on_loaded(event)
        return [loaded[j] for j in range(J)]

    def submit(self, j: int, p, delay_s: float = 0.0) -> None:
        self._submit(j, p, site.answer, (self.specs[j], p, float(self._s[j]), float(delay_s)), task_key(p.step, j, p.t))

    def wake(self, j: int, at: float) -> None:
        self._submit(j, ACTIVATION, site.wake, (max(at - self.now(), 0.0),), task_key("activate", j))

    def alarm(self, at: float | None) -> None:
        self._alarm = None if at is None else float(at)

    def completed(self):
        ac = self._ac
        while True:
            if self._alarm is not None and not ac.has_ready() and not ac.is_empty():
                while not ac.has_ready() and self.now() < self._alarm:  # an answer or the alarm, whichever first
                    time.sleep(ALARM_POLL_S)
                if not ac.has_ready():
                    self._alarm = None
                    yield [Event(ALARM_SITE, ALARM)]
                    continue
            try:
                batch = ac.next_batch(block=True)
            except StopIteration:  # nothing outstanding
                return
            yield [event for event in map(self._take, batch) if event is not None]

    def now(self) -> float:
        return self._clock_start + time.perf_counter() - self._t0

    def call(self, name: str, calls: Mapping[int, tuple]) -> dict:
        """Site calls (runtime.site.SITE_CALLS) where the partitions live; a call lost with its Dask worker is sent
        again to the site's new worker, a failed one raises WorkerTaskError."""
        from distributed import as_completed

        ac, out = as_completed(), {}

        def send(j: int) -> None:
            self._submit(j, ("call", name), site.call, (self.specs[j], name, calls[j]), task_key(name, j), ac=ac)

        for j in calls:
            send(j)
        for batch in ac.batches():
            for fut in batch:
                event = self._take(fut)
                if event is None:
                    continue
                if event.lost:
                    send(event.site)
                elif event.error is not None:
                    raise WorkerTaskError(event.error)
                else:
                    out[event.site] = event.result
        return out

    def stop(self) -> None:
        """Cancel what is in flight, drop this run's partitions from every Dask worker, stop the watchdog; each
        step bounded in time and skipped when the scheduler is gone."""
        self._stop.set()
        self._wake.set()
        with self._lock:
            leftovers = [item[0] for item in self._inflight.values()]
            self._inflight.clear()
            self._per_address.clear()
        connected = self.client.status == "running" and self._scheduler_lost is None
        if connected:
            with contextlib.suppress(Exception):
                if leftovers:
                    self.client.cancel(leftovers, reason="spatialfed-stop")
            if self._subscribed:
                with contextlib.suppress(Exception):
                    self.client.unsubscribe_topic("all")
            if self.specs:
                with contextlib.suppress(Exception):  # a dead worker holds nothing any more
                    self.client.run(site.release, self.specs[0].run_id, on_error="return",
                                    callback_timeout=self.scheduler_wait_s)
        self._subscribed = False
        if self._guard is not None and self._guard.is_alive():
            self._guard.join(timeout=2 * self.poll_s)
        self._context.close()

    def free(self, j: int) -> bool:
        """Whether the Dask worker holding site j has a thread no task of this run occupies (sites share workers:
        a task sent to a busy one queues behind the others' tasks there)."""
        address = self.assignment[j]
        with self._lock:
            return self._per_address[address] < self._threads.get(address, 1)

    def describe(self) -> dict:
        return {"assignment": list(self.assignment), "n_tasks": self.n_tasks, "reassigned": self.reassigned,
                "rebalanced": self.rebalanced,
                "sizes": list(self.sizes), "lost_workers": list(self.lost_workers)}

    @property
    def dashboard_link(self) -> str | None:
        return ClusterHandle(self.client).dashboard_link

    # --- internals -----------------------------------------------------------------------------------------
    def _submit(self, j: int, request, fn, args: tuple, key: str, ac=None) -> None:
        if self.client.status != "running":
            raise ClusterLostError(self._scheduler_message())
        if self.assignment[j] in self._gone:  # announced removed since the site's last task: move it first
            self._reassign(j)
        elif self._spare and request is not ACTIVATION:
            self._rebalance(j)
        fut = self.client.submit(fn, *args, workers=[self.assignment[j]], allow_other_workers=False, key=key,
                                 pure=False)
        with self._lock:
            self._inflight[fut.key] = (fut, j, request, self.assignment[j])
            self._per_address[self.assignment[j]] += 1
        (self._ac if ac is None else ac).add(fut)
        self.n_tasks += 1

    def _take(self, fut) -> Event | None:
        """The Event of a completed future of this run (None for one already handled). The future stays in the
        in-flight set until its result is fetched: when its worker dies first, distributed's gather fails, resets the
        future to pending and waits for a recomputation that can never run (the task is pinned to the dead worker);
        the watchdog sees it there and cancels it, so the fetch ends at once instead of after `result_s`."""
        with self._lock:
            item = self._inflight.get(fut.key)
        if item is None:
            return None
        try:
            return self._event(fut, item[1], item[2], item[3])
        finally:
            with self._lock:
                if self._inflight.pop(fut.key, None) is not None:
                    self._per_address[item[3]] -= 1

    def _event(self, fut, j: int, request, address: str | None = None) -> Event:
        """The Event of a completed future that ran on `address`: lost (its Dask worker left: the site moves),
        error, or result. Raises ClusterLostError when the scheduler is gone (the client cancels every future when
        its connection drops) or no worker is left."""
        if fut.status == "cancelled":
            reason = getattr(getattr(getattr(fut, "_state", None), "exception", None), "reason", None)
            if reason in (SCHEDULER_LOST, "scheduler-connection-lost") or self.client.status != "running" \
                    or self._scheduler_lost is not None:
                raise ClusterLostError(self._scheduler_message())
            return self._lost(j, request, address, ran=fut.key in self.deaths.ran)
        if fut.status == "error":
            return Event(j, request, error=self._error(j, request, fut))
        if fut.status != "finished":  # "lost": it finished, but its worker left before the result was fetched
            return self._lost(j, request, address)
        try:
            return Event(j, request, self.deaths.answered(j, fut.result(timeout=self.result_s)))
        except (CancelledError, FutureCancelled, TimeoutError, OSError):
            # the result lived on a worker that left before it was fetched (the watchdog cancelled the fetch), or the
            # scheduler went while fetching it (CommClosedError is an OSError)
            if self.client.status != "running" or self._scheduler_lost is not None or \
                    not self._scheduler_alive():
                raise ClusterLostError(self._scheduler_message()) from None
            return self._lost(j, request, address)

    def _lost(self, j: int, request, address: str | None, ran: bool = False) -> Event:
        """Site j's request was lost with its worker: the site moves (asked again), or is given up (an error) once
        requests of it that `ran` there killed more workers than allowed."""
        dead = address or self.assignment[j]
        self._reassign(j, address)
        if request is ACTIVATION or not ran or not self.deaths.died(j, dead):
            return Event(j, request, lost=True)
        return Event(j, request, error=self.deaths.message(j, step_name(request), self.specs[j].store))

    def _scheduler_alive(self) -> bool:
        """Whether the scheduler still answers a short identity call (5 s at most)."""
        try:
            self.client.sync(self.client.scheduler.identity, callback_timeout=5)
            return True
        except Exception:
            return False

    def _scheduler_message(self) -> str:
        quiet_reconnect_logs()  # the client's reconnection attempts would log a CommClosedError traceback
        address = getattr(getattr(self.client, "scheduler", None), "address", None) or "(unknown address)"
        why = self._scheduler_lost or "the connection to it closed"
        with self._lock:
            n = len(self._inflight)
        return (f"lost the Dask scheduler at {address}: {why}; the fit stopped with {n} request(s) in flight "
                f"(check that the scheduler process is running and reachable)")

    def _error(self, j: int, request, future) -> str:
        step = step_name(request)
        try:
            exc = future.exception(timeout=self.result_s)
        except Exception as why:  # pragma: no cover - the scheduler left while the error was fetched
            exc = why
        return (f"federated worker {j} failed in sub-step '{step}' (Dask worker {self.assignment[j]}, task "
                f"{future.key}): {type(exc).__name__}: {exc}")

    def _workers_now(self, timeout: float | None = None) -> list[str]:
        """worker_addresses within `timeout` (default scheduler_wait_s), noting their threads; ClusterLostError if
        the scheduler is gone."""
        try:
            self._threads = worker_threads(self.client, timeout=self.scheduler_wait_s if timeout is None else timeout)
            return sorted(self._threads)
        except (OSError, TimeoutError) as exc:
            self._scheduler_lost = self._scheduler_lost or f"it did not answer within {self.scheduler_wait_s:g} s " \
                                                            f"({type(exc).__name__})"
            raise ClusterLostError(self._scheduler_message()) from None

    def _alive_workers(self) -> list[str]:
        """Addresses of the connected Dask workers, waiting up to worker_wait_s seconds for at least one."""
        alive = [a for a in self._workers_now() if a not in self._gone]
        if not alive:
            log.warning("every Dask worker left the cluster; waiting up to %g s for one to join", self.worker_wait_s)
            deadline = time.perf_counter() + self.worker_wait_s
            while not alive and time.perf_counter() < deadline and not self._stop.is_set():
                # not client.wait_for_workers: through a LocalCluster it counts the cluster's cached worker list,
                # which still holds the worker that just died
                self._stop.wait(min(0.25, max(deadline - time.perf_counter(), 0.0)))
                alive = [a for a in self._workers_now() if a not in self._gone]
            if not alive:
                lost = ", ".join(sorted(set(self.lost_workers) | self._gone)) or "all"
                raise ClusterLostError(f"every Dask worker left the cluster (lost: {lost}) and none joined within "
                                       f"{self.worker_wait_s:g} s")
        return alive

    def _reassign(self, j: int, address: str | None = None) -> None:
        """Move site j, whose task on `address` was lost, to the live Dask worker holding the fewest partitions (it
        reloads there); nothing when the site already left `address` (another of its tasks was lost first)."""
        old = self.assignment[j]
        if address is not None and address != old:
            if address not in self.lost_workers:
                self.lost_workers.append(address)
            if old not in self._gone:
                return
        if old not in self.lost_workers:
            self.lost_workers.append(old)
        alive = self._alive_workers()
        self.assignment[j] = least_loaded(self.assignment, alive)
        self.reassigned += 1
        log.warning("Dask worker %s is gone; federated worker %d moves to %s (its partition is reloaded there)",
                    old, j, self.assignment[j])

    def _rebalance(self, j: int) -> None:
        """Move site j to a Dask worker holding no site when its own holds several (after a lost worker's sites
        piled up on the survivors, a restarted or new process takes one back; it reloads the partition)."""
        if self.addresses is not None or sum(a == self.assignment[j] for a in self.assignment) < 2:
            return
        with self._lock:
            spare = [a for a in self._spare if a not in self._gone and a not in self.assignment]
            self._spare = spare[1:]
        if spare:
            log.info("Dask worker %s holds no site; federated worker %d moves there from %s", spare[0], j,
                     self.assignment[j])
            self.assignment[j] = spare[0]
            self.rebalanced += 1

    def _on_scheduler_event(self, event) -> None:
        """Handler of the scheduler's topic "all" (on the client's event loop): note removed workers, wake the
        watchdog."""
        msg = event[1] if isinstance(event, tuple) and len(event) == 2 else event
        if isinstance(msg, dict) and msg.get("action") == "remove-worker" and msg.get("worker"):
            self._gone.add(msg["worker"])
            self.deaths.removed(msg)
            self._wake.set()

    def _watchdog(self, stop: threading.Event, wake: threading.Event) -> None:
        """Cancel (reason LOST) the tasks pinned to Dask workers that left; `completed` then reports them lost.
        Woken by the scheduler's remove-worker event, else every poll_s seconds. A scheduler that does not answer
        for scheduler_wait_s seconds: every task is cancelled and `completed` raises ClusterLostError."""
        silent_since = None
        while not stop.is_set():
            wake.wait(self.poll_s)
            wake.clear()
            if stop.is_set():
                return
            with self._lock:
                items = list(self._inflight.values())
            if not items:
                continue
            try:
                alive = set(worker_addresses(self.client, timeout=max(self.poll_s, 1.0)))
                silent_since = None
            except Exception:
                if self.client.status != "running":
                    return  # the client noticed the closed connection: it cancels every future itself
                silent_since = silent_since or time.perf_counter()
                if time.perf_counter() - silent_since < self.scheduler_wait_s:
                    continue
                self._scheduler_lost = f"it did not answer for {self.scheduler_wait_s:g} s"
                self._cancel([item[0] for item in items], SCHEDULER_LOST)
                return
            with self._lock:
                self._spare = sorted(alive - self._gone - set(self.assignment))
            dead = {address for *_, address in items if address not in alive or address in self._gone}
            gone = [f for f, _, _, address in items if address in dead and not f.done()]
            if gone:
                self.deaths.note_running(items, dead, self._threads)
                self._cancel(gone, LOST)

    def _cancel(self, futures, reason: str) -> None:
        try:
            self.client.cancel(futures, reason=reason, msg="spatialfed: the Dask worker holding the task left")
        except Exception:  # pragma: no cover - a closing client cancels its futures itself
            pass


def run_dask(client, store, n_workers: int, knots, nu, residual: str, config=None, slowdowns="balanced",
             start=None, *, on_event=None, on_result=None, addresses: list[str] | None = None, poll_s: float = 1.0,
             worker_wait_s: float = WORKER_WAIT_S, scheduler_wait_s: float = SCHEDULER_WAIT_S, server=None,
             on_worker_error: str = "stop", delays=None, activations=None, seed: int = 0, checkpointer=None):
    """Fit on a Dask cluster through `client`; returns the finished server and a DaskRunInfo.

    `store` must be a path every Dask worker can read; `nu` a Matérn smoothness or kernel. `server`: a server to
    drive (a new FederatedServer(J, knots, kernel, config, start) otherwise; a restored one continues its clock and
    re-sends the requests that were in flight). The rest: `runtime.driver.drive`."""
    import numpy as np

    from spatialfed.algorithm.make_server import server_for
    from spatialfed.model.matern import Matern
    from spatialfed.runtime.driver import drive

    kernel = nu if isinstance(nu, Matern) else Matern(float(nu))
    knots = np.asarray(knots, dtype=float)
    if server is None:
        server = server_for(int(n_workers), knots, kernel, config, start)  # validates config before any task
    elif getattr(server, "knots", None) is not None and not np.array_equal(np.asarray(server.knots, float), knots):
        raise ValueError("the restored server's knots differ from the given knots (resume with the checkpoint's "
                         "knots: mu, Sigma and the stored quantities are in that basis)")
    fit_id = uuid.uuid4().hex[:12]
    specs = site.site_specs(fit_id, store, n_workers, knots, kernel, residual)
    runtime = DaskRuntime(client, slowdowns, addresses=addresses, poll_s=poll_s, worker_wait_s=worker_wait_s,
                          scheduler_wait_s=scheduler_wait_s)
    tic = time.perf_counter()
    drive(server, runtime, specs, delays=delays, activations=activations, seed=seed, on_event=on_event,
          on_result=on_result, on_worker_error=on_worker_error, checkpointer=checkpointer)
    d = runtime.describe()
    return server, DaskRunInfo(fit_id=fit_id, assignment=d["assignment"], sizes=d["sizes"],
                               dashboard_link=getattr(client, "dashboard_link", None),
                               wall_time_s=time.perf_counter() - tic, n_tasks=d["n_tasks"], reassigned=d["reassigned"])
