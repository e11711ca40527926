"""Dask runtime: drives the sans-IO FederatedServer with futures pinned to the Dask workers holding the partitions.

Where the data live
    Federated worker j's partition is read from the Zarr store *inside a task* on the Dask worker assigned to j
    (round-robin over the Dask workers; several partitions may share one process) and kept there in a per-process
    registry (`_REGISTRY`, keyed by fit id and j) as a `LocalModel`, whose factorisation cache then serves every later
    task. The client and the scheduler only ever see the small quantities of SPEC §3 (and the moments / variogram
    summaries of the φ₀ pass): no observations, locations, residuals or n_j × n_j matrices.

How the loop runs
    Each federated worker has at most one task in flight. `server.dispatch()` yields (j, p) decisions which become
    ``client.submit(evaluate_task, spec_j, p, s_j, workers=[address_j], key="theta-w3-t12-1a2b3c", pure=False)``;
    `distributed.as_completed` hands finished quantities to ``server.receive(qs, now)`` (those that finished together
    as one batch) and the new decisions are submitted at once. Keys start with the sub-step, so the dashboard's task
    stream colours tasks by sub-step and its hover shows the worker and iteration. Everything runs inside the span
    ``spatialfed-fit``.

Heterogeneity emulation
    A federated worker with slowdown s_j that computed a task for c CPU seconds sleeps (s_j − 1)·c before returning
    (`heterogeneity.extra_wait`), as if it ran on a machine s_j times slower. With the random models of
    `runtime.delays` (docs/delays.md) an idle worker first runs an activation task that sleeps until its next Poisson
    activation; only when that finishes does the client hand it its newest task (as the virtual clock does); each
    evaluation task also sleeps a drawn extra delay after computing.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.protocol import Augmented, Quantity, evaluate
from spatialfed.algorithm.server import FederatedServer
from spatialfed.errors import WorkerTaskError
from spatialfed.runtime.cluster import worker_addresses
from spatialfed.runtime.delays import Delay, PoissonActivations
from spatialfed.runtime.heterogeneity import extra_wait, resolve_slowdowns

SPAN_NAME = "spatialfed-fit"
#: marks an activation task in the client's book of tasks in flight (docs/delays.md)
ACTIVATION = "activation"
log = logging.getLogger("spatialfed.runtime.dask")

# --------------------------------------------------------------------------------------------------------------
# worker side: runs inside the Dask worker processes
# --------------------------------------------------------------------------------------------------------------

#: per-process registry of loaded partitions: "fit_id/w<j>" -> LocalModel (lives in the Dask worker process)
_REGISTRY: dict[str, object] = {}
_REGISTRY_LOCK = threading.Lock()


@dataclass(frozen=True)
class PartitionSpec:
    """How to build federated worker j's LocalModel where it runs: store path, index, knots, kernel, residual."""

    fit_id: str
    store: str
    worker: int
    knots: np.ndarray
    nu: float
    residual: str

    @property
    def key(self) -> str:
        return f"{self.fit_id}/w{self.worker}"


def _local_model(spec: PartitionSpec):
    """The LocalModel of spec.worker in this process, loading group workers/<j> from the store on first use."""
    with _REGISTRY_LOCK:
        lm = _REGISTRY.get(spec.key)
    if lm is None:
        from spatialfed.data.store import load_worker
        from spatialfed.model.local import LocalModel
        from spatialfed.model.matern import Matern

        locs, z, X = load_worker(spec.store, spec.worker)
        lm = LocalModel(locs, z, X, spec.knots, Matern(spec.nu), residual=spec.residual)
        with _REGISTRY_LOCK:
            lm = _REGISTRY.setdefault(spec.key, lm)
    return lm


def load_task(spec: PartitionSpec) -> dict:
    """Load federated worker j's partition into this Dask worker process; returns only n_j, p and where it lives."""
    lm = _local_model(spec)
    return {"worker": spec.worker, "n": int(lm.n), "p": int(lm.p), "host": socket.gethostname(), "pid": os.getpid()}


def evaluate_task(spec: PartitionSpec, p: Augmented, slowdown: float = 1.0, delay_s: float = 0.0) -> Quantity:
    """L_j(p) (protocol.evaluate) on the partition held in this process, then the emulated slowdown wait.

    The wait is (s_j − 1)·c with c the task's CPU time (`time.thread_time`; BLAS is single-threaded on the workers),
    so a slowed worker emulates a machine s_j times slower even when the host's cores are shared and busy; `delay_s`
    (a drawn random delay, docs/delays.md) is slept after it."""
    lm = _local_model(spec)
    tic = time.thread_time()  # CPU seconds of this task: unlike wall time, not inflated by other processes' load
    q = evaluate(lm, p, spec.worker)
    wait = extra_wait(time.thread_time() - tic, slowdown) + delay_s
    if wait > 0:
        time.sleep(wait)
    return q


def activation_task(wait_s: float) -> float:
    """Sleep until the worker's next Poisson activation (VAFL §2.3), `wait_s` seconds away; returns the wait."""
    time.sleep(wait_s)
    return wait_s


def bounds_task(store: str, worker: int) -> tuple[float, float, float, float]:
    """(xmin, ymin, xmax, ymax) of federated worker j's locations, read where the task runs (4 numbers leave)."""
    from spatialfed.data.store import load_worker

    locs = load_worker(store, worker)[0]
    return (float(locs[:, 0].min()), float(locs[:, 1].min()), float(locs[:, 0].max()), float(locs[:, 1].max()))


def release_partitions(fit_id: str) -> int:
    """Drop this process's partitions of fit `fit_id` (run on every Dask worker at the end of a fit)."""
    prefix = f"{fit_id}/"
    with _REGISTRY_LOCK:
        keys = [k for k in _REGISTRY if k.startswith(prefix)]
        for k in keys:
            del _REGISTRY[k]
    return len(keys)


def registry_keys() -> list[str]:
    """Keys of the partitions held by this process (for tests and diagnostics)."""
    with _REGISTRY_LOCK:
        return sorted(_REGISTRY)


# --------------------------------------------------------------------------------------------------------------
# client side
# --------------------------------------------------------------------------------------------------------------


def task_key(p: Augmented, j: int) -> str:
    """Readable, unique task key: '<step>-w<j>-t<t>-<6 hex>' (the dashboard groups tasks by the leading step)."""
    return f"{p.step}-w{j}-t{p.t}-{uuid.uuid4().hex[:6]}"


def assign_partitions(n_workers: int, addresses: list[str]) -> list[str]:
    """Round-robin map federated worker j -> Dask worker address (several partitions may share one process)."""
    if not addresses:
        raise RuntimeError("the Dask cluster has no workers; start at least one `dask worker`")
    addresses = sorted(addresses)
    return [addresses[j % len(addresses)] for j in range(int(n_workers))]


def _alive_workers(client, wait_s: float) -> list[str]:
    """Addresses of the connected Dask workers, waiting up to wait_s seconds for at least one."""
    alive = worker_addresses(client)
    if not alive:
        try:
            client.wait_for_workers(1, timeout=wait_s)
        except (OSError, TimeoutError) as exc:
            raise RuntimeError(f"every Dask worker left the cluster and none came back within {wait_s:g} s") from exc
        alive = worker_addresses(client)
    return alive


def _task_error(j: int, step: str, address: str, future) -> WorkerTaskError:
    exc = future.exception()
    return WorkerTaskError(
        f"federated worker {j} failed in sub-step '{step}' (Dask worker {address}, task {future.key}): "
        f"{type(exc).__name__}: {exc}"
    )


@dataclass
class DaskRunInfo:
    """What a Dask run reports besides the finished server."""

    fit_id: str
    assignment: list[str]
    sizes: list[int]
    dashboard_link: str | None
    wall_time_s: float
    n_tasks: int
    reassigned: int = 0  # federated workers moved because their Dask worker left the cluster


def run_dask(
    client,
    store,
    n_workers: int,
    knots,
    nu: float,
    residual: str,
    config: FitConfig | None = None,
    slowdowns="balanced",
    start=None,
    *,
    on_event: Callable[[FederatedServer, float], None] | None = None,
    on_result: Callable[[int, Augmented, object], None] | None = None,
    addresses: list[str] | None = None,
    poll_s: float = 1.0,
    worker_wait_s: float = 60.0,
    server: FederatedServer | None = None,
    on_worker_error: str = "stop",
    delays: Delay | None = None,
    activations: PoissonActivations | None = None,
    seed: int = 0,
) -> tuple[FederatedServer, DaskRunInfo]:
    """Fit on a Dask cluster through `client`; returns the finished FederatedServer and run information.

    `store` must be a path every Dask worker can read (the workers open it themselves). `on_event(server, now)` is
    called after each received quantity (progress display); `on_result(j, p, result)` sees every task result as it
    arrives at the client (load summaries with p None; for audits of what leaves the workers). Raises
    WorkerTaskError naming the federated worker and the sub-step when a task fails — or, with
    ``on_worker_error="drop"``, continues without that worker (`FederatedServer.drop_worker`; recorded in
    ``server.dropped``); outstanding tasks are cancelled and the partitions released on every exit.

    Worker loss: a watchdog thread checks every `poll_s` seconds that the Dask workers holding partitions are still
    connected; tasks pinned to a worker that left are cancelled and resubmitted (same p) to the live worker with the
    fewest partitions, which loads the partition from the store itself. With no worker left it waits up to
    `worker_wait_s` seconds for one (e.g. a nanny restart) before giving up.

    Resume (docs/recovery.md): `server` is a `FederatedServer.restore(...)`d server to continue instead of a new one
    (`config` and `start` are then ignored); it must have `n_workers` workers and the same `knots`. Its clock carries
    on from the snapshot's `time_s`, so time budgets and trace times continue; the partitions are loaded again and
    the tasks that were in flight when the checkpoint was taken are re-sent first.

    Random delays (docs/delays.md), drawn from numpy.random.default_rng(seed): with `delays` (ExponentialDelay,
    PoissonDelay) every evaluation task sleeps a drawn delay after computing, on top of the slowdown wait; with
    `activations` (PoissonActivations) an idle federated worker first runs an `activation_task` sleeping until its
    next activation, and is handed the front of its buffer (the newest parameters) only when that finishes.
    """
    from distributed import as_completed, span

    from spatialfed.model.matern import Matern

    if on_worker_error not in ("stop", "drop"):
        raise ValueError(f"on_worker_error must be 'stop' or 'drop', got {on_worker_error!r}")
    J = int(n_workers)
    knots = np.asarray(knots, dtype=float)
    s = resolve_slowdowns(slowdowns, J)
    delays = None if delays is None else delays.resolve(J)
    activations = None if activations is None else activations.resolve(J)
    rng = np.random.default_rng(seed)
    if server is None:
        server = FederatedServer(J, knots, Matern(nu), config, start)  # validates config against J before any task
        offset = 0.0
    else:
        if server.n_workers != J:
            raise ValueError(f"the restored server has {server.n_workers} workers but the store has {J}")
        if not np.array_equal(np.asarray(server.knots, dtype=float), knots):
            raise ValueError("the restored server's knots differ from the given knots (resume with the checkpoint's "
                             "knots: mu, Sigma and the stored quantities are in that basis)")
        offset = float(server._last_now)
    if addresses is None:
        addresses = worker_addresses(client)
    assignment = assign_partitions(J, addresses)
    fit_id = uuid.uuid4().hex[:12]
    store = os.path.abspath(os.fspath(store))
    specs = [PartitionSpec(fit_id, store, j, knots, float(nu), residual) for j in range(J)]
    inflight: dict = {}  # key -> (future, j, p); p None for the load task
    lock = threading.Lock()
    stop = threading.Event()
    sizes = [0] * J
    loaded: set[int] = set()
    counts = {"tasks": 0, "reassigned": 0}
    ac = as_completed()
    t0 = time.perf_counter()

    waiting: set[int] = set()  # federated workers whose activation task is in flight

    def submit(j: int, p: Augmented | str | None) -> None:
        """Submit worker j's load task (p None), activation task (p ACTIVATION) or evaluation of p."""
        if p is None:  # load the partition where it will be served
            fn, args, key = load_task, (specs[j],), f"load-w{j}-{uuid.uuid4().hex[:6]}"
        elif p == ACTIVATION:
            waiting.add(j)
            fn, args = activation_task, (activations.next_activation(j, 0.0, rng),)
            key = f"activate-w{j}-{uuid.uuid4().hex[:6]}"
        else:
            delay = 0.0 if delays is None else delays.sample(j, rng)
            fn, args, key = evaluate_task, (specs[j], p, float(s[j]), delay), task_key(p, j)
        fut = client.submit(fn, *args, workers=[assignment[j]], allow_other_workers=False, key=key, pure=False)
        with lock:
            inflight[fut.key] = (fut, j, p)
        ac.add(fut)
        counts["tasks"] += 1

    def submit_ready() -> None:
        """Hand idle workers their next task — with activations, an activation task first."""
        for j in sorted(loaded):
            if activations is not None and j not in waiting and not server.busy(j):
                submit(j, ACTIVATION)
            elif activations is None and not server.busy(j):
                take(j)

    def take(j: int) -> None:
        """Worker j takes the front of its buffer, if any (server.next_task), and computes it."""
        p = server.next_task(j)
        if p is not None:
            submit(j, p)

    def reassign(j: int) -> None:
        """Move federated worker j to the live Dask worker holding the fewest partitions (it reloads there)."""
        alive = _alive_workers(client, wait_s=worker_wait_s)
        load = {a: sum(1 for b in assignment if b == a) for a in alive}
        old, assignment[j] = assignment[j], min(sorted(alive), key=lambda a: load[a])
        counts["reassigned"] += 1
        log.warning("Dask worker %s is gone; federated worker %d moves to %s (its partition is reloaded there)",
                    old, j, assignment[j])

    def watchdog() -> None:
        """Cancel tasks pinned to Dask workers that left the cluster; the loop then resubmits them elsewhere."""
        while not stop.wait(poll_s):
            try:
                alive = set(worker_addresses(client))
            except Exception:  # pragma: no cover - scheduler briefly unreachable: try again next round
                continue
            with lock:
                items = list(inflight.values())
            for fut, j, _ in items:
                if assignment[j] not in alive and not fut.done():
                    fut.cancel()

    guard = threading.Thread(target=watchdog, name="spatialfed-watchdog", daemon=True)
    try:
        with span(SPAN_NAME):
            guard.start()
            for j in range(J if not server.done else 0):  # a finished checkpoint needs no task
                submit(j, None)
            # the event loop: at most one task in flight per federated worker
            # quantities that finished together are delivered together (Algorithm 3's receiving thread fills ℚ
            # while the aggregation waits): as_completed.batches() yields everything completed since the last batch
            for batch in ac.batches():
                arrived = []
                for fut in batch:
                    with lock:
                        _, j, p = inflight.pop(fut.key)
                    if p == ACTIVATION:  # worker j activates: it takes its newest task now (or waits again)
                        waiting.discard(j)
                        if fut.status == "cancelled":
                            reassign(j)  # its Dask worker left; the next activation runs on the new one
                        elif not server.busy(j):
                            take(j)
                        continue
                    step = "load" if p is None else p.step
                    if fut.status == "cancelled":
                        reassign(j)
                        submit(j, p)
                        continue
                    if fut.status != "finished":
                        error = _task_error(j, step, assignment[j], fut)
                        if on_worker_error != "drop":
                            raise error
                        log.warning("%s; continuing without federated worker %d (on_worker_error='drop')", error, j)
                        server.drop_worker(j, step, str(error), offset + time.perf_counter() - t0)
                        loaded.discard(j)
                        if server.done:
                            break
                        continue
                    result = fut.result()
                    if on_result is not None:
                        on_result(j, p, result)
                    if p is None:
                        sizes[j] = int(result["n"])
                        loaded.add(j)
                    else:
                        arrived.append(result)
                if arrived:
                    now = offset + time.perf_counter() - t0
                    server.receive(arrived, now)
                    if on_event is not None:
                        on_event(server, now)
                    if server.done:
                        break
                submit_ready()
            if not server.done:  # pragma: no cover - defensive: the server always has work until done
                raise RuntimeError("the federated server stopped dispatching before the fit finished")
    finally:
        stop.set()
        with lock:
            leftovers = [f for f, _, _ in inflight.values()]
            inflight.clear()
        for fut in leftovers:
            fut.cancel()
        try:
            client.run(release_partitions, fit_id)
        except Exception:  # pragma: no cover - a dead worker holds nothing any more
            pass
        if guard.is_alive():
            guard.join(timeout=2 * poll_s)
    info = DaskRunInfo(fit_id=fit_id, assignment=assignment, sizes=sizes,
                       dashboard_link=getattr(client, "dashboard_link", None),
                       wall_time_s=time.perf_counter() - t0, n_tasks=counts["tasks"],
                       reassigned=counts["reassigned"])
    return server, info
