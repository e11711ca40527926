"""Dask runtime: the sites run in Dask workers, each request a task pinned to the worker holding its partition.

Where the data live
    Site j's partition is read from the Zarr store *inside a task* on the Dask worker assigned to j (round-robin over
    the Dask workers; several partitions may share one process) and kept there (`runtime.site`), whose factorisation
    cache then serves every later task. The client and the scheduler only ever see the small quantities of SPEC §3:
    no observations, locations, residuals or n_j × n_j matrices.

How requests run
    ``client.submit(site.answer, spec_j, p, s_j, delay, workers=[address_j], key="theta-w3-t12-1a2b3c", pure=False)``;
    `distributed.as_completed(...).batches()` hands back everything finished since the last batch (`completed`).
    Keys start with the sub-step, so the dashboard's task stream colours tasks by sub-step and its hover shows the
    site and iteration. Everything runs inside the span ``spatialfed-fit``.

Heterogeneity emulation
    A site with slowdown s_j that computed a task for c CPU seconds sleeps (s_j − 1)·c before returning, as if it ran on
    a machine s_j times slower — sleeping, not spinning, so emulated slowness costs wall time but no core.

Worker loss
    A watchdog thread checks every `poll_s` seconds that the Dask workers holding partitions are still connected;
    tasks pinned to a worker that left are cancelled and reported `lost`; the site moves to the live worker with the
    fewest partitions, which loads the partition from the store itself, and the driver sends the request again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from spatialfed.errors import WorkerTaskError
from spatialfed.runtime import site
from spatialfed.runtime.cluster import worker_addresses
from spatialfed.runtime.heterogeneity import resolve_slowdowns
from spatialfed.runtime.interface import ACTIVATION, Event, Runtime

SPAN_NAME = "spatialfed-fit"
log = logging.getLogger("spatialfed.runtime.dask")


def task_key(step: str, j: int, t: int | None = None) -> str:
    """Readable, unique task key: '<step>-w<j>[-t<t>]-<6 hex>' (the dashboard groups tasks by the leading step)."""
    return f"{step}-w{j}{'' if t is None else f'-t{t}'}-{uuid.uuid4().hex[:6]}"


def assign_partitions(n_workers: int, addresses: list[str]) -> list[str]:
    """Round-robin map site j -> Dask worker address (several partitions may share one process)."""
    if not addresses:
        raise RuntimeError("the Dask cluster has no workers; start at least one `dask worker`")
    addresses = sorted(addresses)
    return [addresses[j % len(addresses)] for j in range(int(n_workers))]


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
    """`Runtime` on a Dask cluster through `client` (module docstring); `slowdowns` emulate slower sites."""

    name = "dask"

    def __init__(self, client, slowdowns="balanced", *, addresses: list[str] | None = None, poll_s: float = 1.0,
                 worker_wait_s: float = 60.0):
        self.client = client
        self.slowdowns = slowdowns
        self.addresses = addresses
        self.poll_s = float(poll_s)
        self.worker_wait_s = float(worker_wait_s)
        self.specs: list[site.SiteSpec] = []
        self.assignment: list[str] = []
        self.sizes: list[int] = []
        self.n_tasks = 0
        self.reassigned = 0
        self._inflight: dict = {}  # key -> (future, j, request)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._guard: threading.Thread | None = None
        self._context = contextlib.ExitStack()
        self._ac = None
        self._t0 = time.perf_counter()
        self._clock_start = 0.0

    # --- the Runtime interface -----------------------------------------------------------------------------
    def start(self, specs, clock_start: float = 0.0) -> list[Event]:
        from distributed import as_completed, span

        self.specs = list(specs)
        J = len(self.specs)
        self._stop, self._context, self._inflight = threading.Event(), contextlib.ExitStack(), {}
        self._s = resolve_slowdowns(self.slowdowns, J)
        self.assignment = assign_partitions(J, self.addresses or worker_addresses(self.client))
        self.sizes = [0] * J
        self._context.enter_context(span(SPAN_NAME))
        self._ac = as_completed()
        self._guard = threading.Thread(target=self._watchdog, name="spatialfed-watchdog", daemon=True)
        self._guard.start()
        self._t0, self._clock_start = time.perf_counter(), float(clock_start)
        for j in range(J):
            self._submit(j, None, site.load, (self.specs[j],), task_key("load", j))
        loaded: dict[int, Event] = {}
        while len(loaded) < J:
            for event in next(self.completed()):
                if event.lost:
                    self._submit(event.site, None, site.load, (self.specs[event.site],), task_key("load", event.site))
                else:
                    loaded[event.site] = event
                    if event.result is not None:
                        self.sizes[event.site] = int(event.result["n"])
        return [loaded[j] for j in range(J)]

    def submit(self, j: int, p, delay_s: float = 0.0) -> None:
        self._submit(j, p, site.answer, (self.specs[j], p, float(self._s[j]), float(delay_s)), task_key(p.step, j, p.t))

    def wake(self, j: int, at: float) -> None:
        self._submit(j, ACTIVATION, site.wake, (max(at - self.now(), 0.0),), task_key("activate", j))

    def completed(self):
        for batch in self._ac.batches():
            events = []
            for fut in batch:
                with self._lock:
                    _, j, request = self._inflight.pop(fut.key)
                if fut.status == "cancelled":
                    self._reassign(j)
                    events.append(Event(j, request, lost=True))
                elif fut.status != "finished":
                    events.append(Event(j, request, error=self._error(j, request, fut)))
                else:
                    events.append(Event(j, request, fut.result()))
            yield events

    def now(self) -> float:
        return self._clock_start + time.perf_counter() - self._t0

    def call(self, name: str, calls: Mapping[int, tuple]) -> dict:
        from distributed import wait

        futs = {j: self.client.submit(site.call, self.specs[j], name, args, workers=[self.assignment[j]],
                                      allow_other_workers=False, key=task_key(name, j), pure=False)
                for j, args in calls.items()}
        wait(list(futs.values()))
        for j, fut in futs.items():
            if fut.status != "finished":
                raise WorkerTaskError(self._error(j, name, fut))
        return {j: fut.result() for j, fut in futs.items()}

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            leftovers = [f for f, _, _ in self._inflight.values()]
            self._inflight.clear()
        for fut in leftovers:
            fut.cancel()
        if self.specs:
            try:
                self.client.run(site.release, self.specs[0].run_id)  # every Dask worker drops this run's partitions
            except Exception:  # pragma: no cover - a dead worker holds nothing any more
                pass
        if self._guard is not None and self._guard.is_alive():
            self._guard.join(timeout=2 * self.poll_s)
        self._context.close()

    def describe(self) -> dict:
        return {"assignment": list(self.assignment), "n_tasks": self.n_tasks, "reassigned": self.reassigned,
                "sizes": list(self.sizes)}

    @property
    def dashboard_link(self) -> str | None:
        try:
            return self.client.dashboard_link
        except Exception:  # pragma: no cover - the scheduler may run without a dashboard
            return None

    # --- internals -----------------------------------------------------------------------------------------
    def _submit(self, j: int, request, fn, args: tuple, key: str) -> None:
        fut = self.client.submit(fn, *args, workers=[self.assignment[j]], allow_other_workers=False, key=key,
                                 pure=False)
        with self._lock:
            self._inflight[fut.key] = (fut, j, request)
        self._ac.add(fut)
        self.n_tasks += 1

    def _error(self, j: int, request, future) -> str:
        step = "load" if request is None else getattr(request, "step", request)
        exc = future.exception()
        return (f"federated worker {j} failed in sub-step '{step}' (Dask worker {self.assignment[j]}, task "
                f"{future.key}): {type(exc).__name__}: {exc}")

    def _alive_workers(self) -> list[str]:
        """Addresses of the connected Dask workers, waiting up to worker_wait_s seconds for at least one."""
        alive = worker_addresses(self.client)
        if not alive:
            try:
                self.client.wait_for_workers(1, timeout=self.worker_wait_s)
            except (OSError, TimeoutError) as exc:
                raise RuntimeError(f"every Dask worker left the cluster and none came back within "
                                   f"{self.worker_wait_s:g} s") from exc
            alive = worker_addresses(self.client)
        return alive

    def _reassign(self, j: int) -> None:
        """Move site j to the live Dask worker holding the fewest partitions (it reloads there)."""
        alive = self._alive_workers()
        load = {a: sum(1 for b in self.assignment if b == a) for a in alive}
        old, self.assignment[j] = self.assignment[j], min(sorted(alive), key=lambda a: load[a])
        self.reassigned += 1
        log.warning("Dask worker %s is gone; federated worker %d moves to %s (its partition is reloaded there)",
                    old, j, self.assignment[j])

    def _watchdog(self) -> None:
        """Cancel tasks pinned to Dask workers that left the cluster; `completed` then reports them lost."""
        while not self._stop.wait(self.poll_s):
            try:
                alive = set(worker_addresses(self.client))
            except Exception:  # pragma: no cover - scheduler briefly unreachable: try again next round
                continue
            with self._lock:
                items = list(self._inflight.values())
            for fut, j, _ in items:
                if self.assignment[j] not in alive and not fut.done():
                    fut.cancel()


def run_dask(client, store, n_workers: int, knots, nu, residual: str, config=None, slowdowns="balanced",
             start=None, *, on_event=None, on_result=None, addresses: list[str] | None = None, poll_s: float = 1.0,
             worker_wait_s: float = 60.0, server=None, on_worker_error: str = "stop", delays=None,
             activations=None, seed: int = 0, checkpointer=None):
    """Fit on a Dask cluster through `client`; returns the finished server and a DaskRunInfo.

    `store` must be a path every Dask worker can read; `nu` a Matérn smoothness or kernel. `server`: a server to
    drive (a new FederatedServer(J, knots, kernel, config, start) otherwise; a restored one continues its clock and
    re-sends the requests that were in flight). The rest: `runtime.driver.drive`."""
    import numpy as np

    from spatialfed.algorithm.server import FederatedServer
    from spatialfed.model.matern import Matern
    from spatialfed.runtime.driver import drive

    kernel = nu if isinstance(nu, Matern) else Matern(float(nu))
    knots = np.asarray(knots, dtype=float)
    if server is None:
        server = FederatedServer(int(n_workers), knots, kernel, config, start)  # validates config before any task
    elif getattr(server, "knots", None) is not None and not np.array_equal(np.asarray(server.knots, float), knots):
        raise ValueError("the restored server's knots differ from the given knots (resume with the checkpoint's "
                         "knots: mu, Sigma and the stored quantities are in that basis)")
    fit_id = uuid.uuid4().hex[:12]
    specs = site.site_specs(fit_id, store, n_workers, knots, kernel, residual)
    runtime = DaskRuntime(client, slowdowns, addresses=addresses, poll_s=poll_s, worker_wait_s=worker_wait_s)
    tic = time.perf_counter()
    drive(server, runtime, specs, delays=delays, activations=activations, seed=seed, on_event=on_event,
          on_result=on_result, on_worker_error=on_worker_error, checkpointer=checkpointer)
    d = runtime.describe()
    return server, DaskRunInfo(fit_id=fit_id, assignment=d["assignment"], sizes=d["sizes"],
                               dashboard_link=getattr(client, "dashboard_link", None),
                               wall_time_s=time.perf_counter() - tic, n_tasks=d["n_tasks"], reassigned=d["reassigned"])
