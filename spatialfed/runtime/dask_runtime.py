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
    `distributed.as_completed` hands each finished quantity to ``server.receive(q, now)`` and the new decisions are
    submitted at once. Keys start with the sub-step, so the dashboard's task stream colours tasks by sub-step and
    its hover shows the worker and iteration. Everything runs inside the span ``spatialfed-fit``.

Heterogeneity emulation
    A federated worker with slowdown s_j that computed a task in c seconds sleeps (s_j − 1)·c before returning
    (`heterogeneity.extra_wait`), as if it ran on a machine s_j times slower.
"""

from __future__ import annotations

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
from spatialfed.runtime.heterogeneity import extra_wait, resolve_slowdowns

SPAN_NAME = "spatialfed-fit"

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


def evaluate_task(spec: PartitionSpec, p: Augmented, slowdown: float = 1.0) -> Quantity:
    """L_j(p) (protocol.evaluate) on the partition held in this process, then the emulated slowdown wait."""
    lm = _local_model(spec)
    tic = time.perf_counter()
    q = evaluate(lm, p, spec.worker)
    wait = extra_wait(time.perf_counter() - tic, slowdown)
    if wait > 0:
        time.sleep(wait)
    return q


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
) -> tuple[FederatedServer, DaskRunInfo]:
    """Fit on a Dask cluster through `client`; returns the finished FederatedServer and run information.

    `store` must be a path every Dask worker can read (the workers open it themselves). `on_event(server, now)` is
    called after each received quantity (progress display); `on_result(j, p, result)` sees every task result as it
    arrives at the client (load summaries with p None; for audits of what leaves the workers). Raises WorkerTaskError naming the federated worker and
    the sub-step when a task fails; outstanding tasks are cancelled and the partitions released on every exit.
    """
    from distributed import as_completed, span

    from spatialfed.model.matern import Matern

    J = int(n_workers)
    knots = np.asarray(knots, dtype=float)
    s = resolve_slowdowns(slowdowns, J)
    server = FederatedServer(J, knots, Matern(nu), config, start)  # validates config against J before any task
    if addresses is None:
        addresses = list(client.scheduler_info(n_workers=-1)["workers"])
    assignment = assign_partitions(J, addresses)
    fit_id = uuid.uuid4().hex[:12]
    store = os.path.abspath(os.fspath(store))
    specs = [PartitionSpec(fit_id, store, j, knots, float(nu), residual) for j in range(J)]
    inflight: dict = {}
    n_tasks = 0
    t0 = time.perf_counter()
    try:
        with span(SPAN_NAME):
            # 1. each partition is loaded where it will be served, and stays there
            loads = {}
            for j in range(J):
                fut = client.submit(load_task, specs[j], workers=[assignment[j]], allow_other_workers=False,
                                    key=f"load-w{j}-{uuid.uuid4().hex[:6]}", pure=False)
                loads[fut.key] = (fut, j)
            n_tasks += J
            sizes = [0] * J
            for fut in as_completed([f for f, _ in loads.values()]):
                j = loads[fut.key][1]
                if fut.status != "finished":
                    raise _task_error(j, "load", assignment[j], fut)
                summary = fut.result()
                if on_result is not None:
                    on_result(j, None, summary)
                sizes[j] = int(summary["n"])
            # 2. the event loop: one task in flight per federated worker
            ac = as_completed()

            def submit_ready():
                nonlocal n_tasks
                for j, p in server.dispatch():
                    fut = client.submit(evaluate_task, specs[j], p, float(s[j]), workers=[assignment[j]],
                                        allow_other_workers=False, key=task_key(p, j), pure=False)
                    inflight[fut.key] = (fut, j, p)
                    ac.add(fut)
                    n_tasks += 1

            submit_ready()
            for fut in ac:
                _, j, p = inflight.pop(fut.key)
                if fut.status != "finished":
                    raise _task_error(j, p.step, assignment[j], fut)
                q = fut.result()
                if on_result is not None:
                    on_result(j, p, q)
                now = time.perf_counter() - t0
                server.receive(q, now)
                if on_event is not None:
                    on_event(server, now)
                if server.done:
                    break
                submit_ready()
            if not server.done:  # pragma: no cover - defensive: the server always has work until done
                raise RuntimeError("the federated server stopped dispatching before the fit finished")
    finally:
        for fut, _, _ in inflight.values():
            fut.cancel()
        try:
            client.run(release_partitions, fit_id)
        except Exception:  # pragma: no cover - a dead worker holds nothing any more
            pass
    info = DaskRunInfo(fit_id=fit_id, assignment=assignment, sizes=sizes,
                       dashboard_link=getattr(client, "dashboard_link", None),
                       wall_time_s=time.perf_counter() - t0, n_tasks=n_tasks)
    return server, info
