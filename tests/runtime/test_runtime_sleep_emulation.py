"""Emulated slowness on real Dask sleeps (issue 13): a site with slowdown s that computed a task for c CPU seconds
(its thread's CPU time) waits until the task took s·c without burning a core (runtime/site.answer,
heterogeneity.extra_wait), so a task of a site with slowdown 5 spends about 1/5 of its wall time on the CPU.

A LocalCluster of 2 worker processes (plain TCP), 2 sites × 400 points, full residual, m = 49; the requests are the
statistics of SPEC §2b (tens of ms of CPU each), each at a new u so that every task factorises R_j afresh.
"""

import time

import numpy as np
import pytest

from spatialfed.algorithm.protocol import STATS_STEP, Augmented
from spatialfed.data.geometry import jittered_unit_grid
from spatialfed.data.simulate import simulate_store
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params
from spatialfed.runtime import site
from spatialfed.runtime.cluster import local_cluster
from spatialfed.runtime.dask_runtime import DaskRuntime

J, N, M, SLOW = 2, 400, 49, 5.0
ROUNDS = 4


@pytest.fixture(scope="module")
def sleep_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("sleep") / "s.zarr"
    simulate_store(path, J, N, seed=3, test_size=0)
    return path


@pytest.fixture(scope="module")
def client():
    with local_cluster(J, security=False) as handle:
        yield handle.client


def stats_request(k: int, p: int) -> Augmented:
    """A statistics request at a u that moves with k (no cached factorisation of R_j serves it)."""
    f = 1.0 + 0.01 * (k + 1)
    return Augmented(Params(np.zeros(M), np.eye(M), np.zeros(p), 4.0 * f, 1.0, 0.1 * f), k, STATS_STEP)


def test_a_task_slowed_five_times_spends_a_fifth_of_its_wall_time_on_the_cpu(client, sleep_store):
    """site.answer with slowdown 5 on a Dask worker: its wall time ≥ 5 × the task thread's CPU time c (c of compute,
    then 4c of sleep) and c ≤ 0.22 × the wall time; a spinning wait would put the CPU time near the wall time."""

    def timed(spec, p, slowdown):  # runs on the worker (a local function: cloudpickle sends it by value)
        import time as clock

        from spatialfed.runtime import site as worker_site

        wall, cpu = clock.perf_counter(), clock.thread_time()
        worker_site.answer(spec, p, slowdown)
        return clock.thread_time() - cpu, clock.perf_counter() - wall

    spec = site.site_specs("sleep-task", sleep_store, J, jittered_unit_grid(M, seed=0), Matern(0.5), "full")[0]
    p = site.load(spec)["p"]  # only to read p (its own partition registry entry is released below)
    site.release("sleep-task")
    try:
        client.submit(timed, spec, stats_request(-1, p), 1.0, pure=False).result()  # load, imports
        runs = [client.submit(timed, spec, stats_request(k, p), SLOW, pure=False).result() for k in range(3)]
    finally:
        client.run(site.release, "sleep-task")
    cpu, wall = np.median([r[0] for r in runs]), np.median([r[1] for r in runs])
    assert cpu > 0.005  # the timers resolve the task
    assert wall >= SLOW * cpu * 0.98  # ≥ c + (s − 1)·c (2 % for timer granularity)
    assert 0.04 <= cpu / wall <= 0.22  # about 1/s: the sleep burns no CPU (under load the compute's wall grows)


def test_dask_runtime_slowed_site_costs_wall_time_not_cpu(client, sleep_store):
    """Through DaskRuntime with slowdowns (5, 1), both sites answering the same requests at the same time: the slowed
    site's worker process uses no more CPU than the full-speed one's (a spin would use ~5×), its CPU is under 0.35 of
    its wall time (process CPU: the task's thread plus the worker's own threads), and its wall time holds at least a
    part of the emulated (5 − 1)·c of sleep."""
    specs = site.site_specs("sleep-runtime", sleep_store, J, jittered_unit_grid(M, seed=0), Matern(0.5), "full")
    runtime = DaskRuntime(client, [SLOW, 1.0])
    try:
        loaded = runtime.start(specs)
        p = loaded[0].result["p"]
        for j in range(J):  # warm: imports and the first factorisation are not part of the measurement
            runtime.submit(j, stats_request(-1, p))
        pending = J
        while pending:
            pending -= len(next(runtime.completed()))
        where = list(runtime.assignment)
        assert len(set(where)) == J  # one site per process: each process's CPU is its site's
        cpu0 = client.run(time.process_time)
        wall = np.zeros(J)
        for k in range(ROUNDS):
            sent = time.perf_counter()
            for j in range(J):
                runtime.submit(j, stats_request(k, p))
            pending = set(range(J))
            while pending:
                for event in next(runtime.completed()):
                    assert event.error is None and event.result.step == STATS_STEP
                    wall[event.site] += time.perf_counter() - sent
                    pending.discard(event.site)
        cpu1 = client.run(time.process_time)
    finally:
        runtime.stop()
    cpu = np.array([cpu1[where[j]] - cpu0[where[j]] for j in range(J)])
    assert np.all(cpu > 0.005 * ROUNDS)  # ≥ 5 ms per request of 400 points, fast machines too: the timers resolve it
    assert cpu[0] <= 1.5 * cpu[1] + 0.05
    assert cpu[0] <= 0.35 * wall[0]
    # the emulated (SLOW − 1)·c of sleep is in the slowed site's wall time (process CPU ≤ ~2× the tasks' thread CPU
    # c); against its own CPU, not the other site's wall time, which a loaded machine inflates as well
    assert wall[0] >= 0.3 * (SLOW - 1) * cpu[0] and wall[0] > wall[1]
