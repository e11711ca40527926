"""The Dask runtime on a real LocalCluster of 2 worker *processes* (the privacy claim needs separate processes).

A 4-worker × 150-point store with m = 49 knots: the federated fits must reach the maximiser of the low-rank likelihood
found by a centralized scipy.optimize maximisation of `spatialfed.model.reference.lowrank_loglik`; nothing that leaves
a worker grows with n_j; the client never loads a partition.
"""

import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import linalg, optimize

from spatialfed import Cluster, Emulation
from spatialfed.algorithm.config import FitConfig
from spatialfed.api import FederatedGP
from spatialfed.data.geometry import jittered_unit_grid
from spatialfed.data.simulate import simulate_store
from spatialfed.data.store import load_worker
from spatialfed.errors import WorkerTaskError
from spatialfed.model.matern import Matern
from spatialfed.model.reference import lowrank_covariance, lowrank_loglik
from spatialfed.outputs.results import load_fit
from spatialfed.runtime import site
from spatialfed.runtime.blas import limit_blas_threads
from spatialfed.runtime.cluster import local_cluster, worker_addresses
from spatialfed.runtime.dask_runtime import run_dask
from spatialfed.runtime.site import registry_keys

J, N_PER, M, NU = 4, 150, 49, 0.5
KEY = re.compile(r"^(load|bounds|moments|variogram|mu_sigma|gamma|theta|value)-w\d+(-t\d+)?-[0-9a-f]{6}$")


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(2, security=False) as handle:  # plain TCP: test_fit_cli_on_a_running_scheduler joins it
        yield handle


@pytest.fixture(scope="module")
def dask_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("dask") / "s.zarr"
    simulate_store(path, J, N_PER, seed=1, test_size=0)
    return path


@pytest.fixture(scope="module")
def parts(dask_store):
    return [load_worker(dask_store, j) for j in range(J)]  # the test's own centralized view, never the fit's


def knots49():
    return jittered_unit_grid(M, seed=0)  # what FederatedGP(knots=49, seed=0) lays out on a unit-square store


def gls_gamma(parts, knots, kernel, u):
    """γ̂(δ, σ², β): the generalised least-squares γ maximising ℓ_LR at fixed covariance parameters."""
    C = lowrank_covariance(parts, knots, kernel, "full", *np.exp(u))
    X = np.vstack([p[2] for p in parts])
    z = np.concatenate([p[1] for p in parts])
    cf = linalg.cho_factor(C, lower=True)
    CiX = linalg.cho_solve(cf, X)
    return np.linalg.solve(X.T @ CiX, CiX.T @ z)


@pytest.fixture(scope="module")
def reference(parts):
    """Centralized maximiser of ℓ_LR (γ profiled by GLS, L-BFGS-B on u = log(δ, σ², β)) from the truth."""
    knots, kernel = knots49(), Matern(NU)

    def negll(u):
        return -lowrank_loglik(parts, knots, kernel, "full", gls_gamma(parts, knots, kernel, u), *np.exp(u))

    with limit_blas_threads(1):
        res = optimize.minimize(negll, np.log([0.25, 1.0, 0.1]), method="L-BFGS-B",
                                options={"ftol": 1e-15, "gtol": 1e-9})
        gamma = gls_gamma(parts, knots, kernel, res.x)
    delta, sigma2, beta = np.exp(res.x)
    return {"loglik": -res.fun, "gamma": gamma, "delta": delta, "sigma2": sigma2, "beta": beta}


def assert_at_maximiser(gp, reference):
    assert abs(gp.loglik_ - reference["loglik"]) < 1e-3
    for name in ("delta", "sigma2", "beta"):
        assert gp.params_[name] == pytest.approx(reference[name], rel=1e-2), name
    np.testing.assert_allclose(gp.params_["gamma"], reference["gamma"], rtol=1e-2)


def loglik_at(params, parts, knots):
    return lowrank_loglik(parts, knots, Matern(NU), "full", params["gamma"], params["delta"], params["sigma2"],
                          params["beta"])


@pytest.fixture(scope="module")
def sync_fit(cluster, dask_store):
    from distributed import get_task_stream

    with get_task_stream(cluster.client) as ts:
        gp = FederatedGP(mode="sync", strategies="tuned", knots=M, nu=NU, 
                         progress=False, cluster=cluster.client, emulation=Emulation(profile="straggler")).fit(dask_store)  # the block scheme: its task keys and spans are checked
    gp.task_stream_ = ts.data
    return gp


def test_sync_straggler_reaches_lowrank_maximiser(sync_fit, reference):
    np.testing.assert_allclose(sync_fit.knots_, knots49())
    assert sync_fit.converged_
    assert_at_maximiser(sync_fit, reference)
    assert all(row["max_staleness"] == 0 for row in sync_fit.trace_)


def test_async_straggler_tuned_reaches_lowrank_maximiser(cluster, dask_store, reference):
    gp = FederatedGP(mode="async", knots=M, nu=NU, strategies={"preset": "tuned", "agg_threshold": 2},
                     max_iter=200, progress=False, cluster=cluster.client, emulation=Emulation(profile="straggler")).fit(dask_store)
    assert gp.converged_ and max(row["max_staleness"] for row in gp.trace_) > 0
    assert_at_maximiser(gp, reference)


@pytest.mark.slow
def test_async_straggler_paper_preset_reaches_lowrank_maximiser(cluster, dask_store, reference):
    """The paper's strategy settings (moving average on) converge far more slowly: hence @slow."""
    gp = FederatedGP(mode="async", knots=M, nu=NU, strategies={"preset": "paper", "agg_threshold": 3}, max_iter=300,
                     tol=1e-7,
                     progress=False, cluster=cluster.client, emulation=Emulation(profile="straggler")).fit(dask_store)
    assert max(row["max_staleness"] for row in gp.trace_) > 0
    assert_at_maximiser(gp, reference)


def test_async_straggler_runs_stale_and_reports_the_loglik_of_its_params(cluster, dask_store, parts, tmp_path):
    gp = FederatedGP(mode="async", knots=M, nu=NU, strategies={"preset": "tuned", "agg_threshold": 2}, max_iter=12,
                     progress=False, cluster=cluster.client, emulation=Emulation(profile="straggler")).fit(dask_store)
    assert gp.n_iter_ == 12 and not gp.converged_
    assert max(row["max_staleness"] for row in gp.trace_) > 0  # the straggler is left behind
    gp.save(tmp_path / "out")
    fit = load_fit(tmp_path / "out")
    # not the maximiser (stopped early): the reported ℓ_LR must still be the one of the reported parameters
    assert fit.loglik == pytest.approx(loglik_at(fit.params, parts, fit.knots), rel=1e-9, abs=1e-7)


def test_fit_json_loglik_is_that_of_its_params(sync_fit, parts, tmp_path):
    sync_fit.save(tmp_path / "out")
    fit = load_fit(tmp_path / "out")
    assert fit.mode == "sync" and fit.n_workers == J and fit.n_obs == J * N_PER and len(fit.knots) == M
    assert fit.loglik == pytest.approx(loglik_at(fit.params, parts, fit.knots), rel=1e-9, abs=1e-7)
    assert fit.mu.shape == (M,) and fit.Sigma.shape == (M, M)


def test_task_keys_are_readable_and_tasks_run_in_the_span(sync_fit, cluster):
    keys = [d["key"] for d in sync_fit.task_stream_]
    assert keys and all(KEY.match(k) for k in keys), [k for k in keys if not KEY.match(k)][:5]
    assert {k.split("-")[0] for k in keys} >= {"load", "moments", "variogram", "mu_sigma", "gamma", "theta",
                                               "value"}
    assert any(re.match(r"^theta-w3-t\d+-", k) for k in keys)

    def spans(dask_scheduler):
        ext = dask_scheduler.extensions["spans"]
        return [sorted({tg.name for tg in sp.traverse_groups()}) for sp in ext.spans_search_by_tag["spatialfed-fit"]]

    groups = cluster.client.run_on_scheduler(spans)
    assert groups and all({"load", "theta", "mu_sigma"} <= set(g) for g in groups)


def test_partitions_are_spread_round_robin_and_stay_on_their_worker(sync_fit, cluster):
    addresses = cluster.worker_addresses()
    assert sync_fit.assignment_ == [addresses[j % 2] for j in range(J)]
    by_key = {}
    for d in sync_fit.task_stream_:
        j = int(d["key"].split("-")[1][1:])
        by_key.setdefault(j, set()).add(d["worker"])
    assert by_key == {j: {addresses[j % 2]} for j in range(J)}
    assert cluster.client.run(registry_keys) == {a: [] for a in addresses}  # released after the fit


def test_worker_addresses_ignore_the_clients_periodic_worker_less_refresh(cluster, monkeypatch):
    """The Client refreshes its scheduler_info cache every few seconds without per-worker entries; a read that
    loses that race saw an empty cluster (a CI failure: 'the Dask cluster has no workers'). Emulate losing it."""
    from distributed import Client

    periodic = Client._update_scheduler_info
    monkeypatch.setattr(Client, "_update_scheduler_info", lambda self, n_workers=0: periodic(self))
    assert cluster.client.scheduler_info(n_workers=-1)["workers"] == {}  # the cache a racing read used to see
    assert len(worker_addresses(cluster.client)) == 2
    assert cluster.worker_addresses() == worker_addresses(cluster.client)


def _small_store(path, n):
    simulate_store(path, 2, n, seed=3, test_size=0)
    return path


def test_no_worker_result_grows_with_n(cluster, tmp_path):
    knots = jittered_unit_grid(16, seed=0)
    cfg = FitConfig.of(mode="sync", max_iter=2)
    sizes = {}
    for n in (50, 200):
        dask_store = _small_store(tmp_path / f"n{n}.zarr", n)
        seen = {}

        def record(j, p, result):
            step = "load" if p is None else p.step
            seen[step] = max(seen.get(step, 0), len(pickle.dumps(result)))
            arrays = result.xi.values() if p is not None else result.values()
            assert all(np.size(a) < n for a in arrays if np.ndim(a) > 0 and np.shape(a)[0] == n), step

        server, _ = run_dask(cluster.client, dask_store, 2, knots, NU, "full", cfg, on_result=record)
        assert server.done
        sizes[n] = seen
    assert set(sizes[50]) == {"load", "moments", "variogram", "mu_sigma", "gamma", "theta", "value"}
    for step, nbytes in sizes[50].items():
        assert sizes[200][step] <= nbytes + 16, (step, nbytes, sizes[200][step])  # + a few bytes of int width


def test_client_never_holds_raw_data(cluster, dask_store, monkeypatch):
    import spatialfed.data.store as store_mod

    def forbidden(*args, **kwargs):
        raise AssertionError("the client process tried to read a partition")

    monkeypatch.setattr(store_mod, "load_worker", forbidden)
    monkeypatch.setattr(store_mod, "_load", forbidden)
    held = {}

    def peek(server, now):
        if not held and server.phase == "loop":  # every worker has answered the φ₀ passes: all partitions loaded
            held.update(cluster.client.run(registry_keys))

    results = []
    server, info = run_dask(cluster.client, dask_store, J, knots49(), NU, "full", FitConfig.of(mode="sync", max_iter=2),
                            on_event=peek, on_result=lambda j, p, r: results.append(r))
    assert server.done and site._REGISTRY == {}
    # during the fit the partitions lived in the worker processes, two per process
    assert sorted(len(v) for v in held.values()) == [2, 2]
    pids = cluster.client.run(os.getpid)
    assert os.getpid() not in pids.values()
    # only small summaries arrived: nothing with a dimension of n_j = 150
    for r in results:
        values = r.values() if isinstance(r, dict) else r.xi.values()
        assert all(N_PER not in np.shape(v) for v in values)


def test_failing_worker_task_names_worker_and_step(cluster, tmp_path):
    dask_store = _small_store(tmp_path / "bad.zarr", 30)
    chunks = [p for p in (Path(dask_store) / "workers" / "1" / "z").rglob("*") if p.is_file() and p.name != "zarr.json"]
    assert chunks
    for c in chunks:
        c.write_bytes(b"\x00garbage")  # metadata intact (open_store passes), data unreadable where it is loaded
    gp = FederatedGP(mode="sync", knots=16, progress=False, cluster=cluster.client)
    with pytest.raises(WorkerTaskError, match=r"federated worker 1 failed in sub-step 'load'"):
        gp.fit(dask_store)
    assert cluster.client.run(registry_keys) == {a: [] for a in cluster.worker_addresses()}


def test_fit_cli_on_a_running_scheduler(cluster, dask_store, parts, tmp_path, capsys):
    from spatialfed.cli import main

    out = tmp_path / "cli"
    rc = main(["fit", str(dask_store), "--out", str(out), "--mode", "sync", "--knots", "49",
               "--scheduler", cluster.client.scheduler.address])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/status", err)  # printed at fit start
    assert "max staleness" in err and "converged after" in err
    fit = load_fit(out)
    assert fit.method == "lowrank" and fit.residual == "full" and fit.converged
    assert fit.loglik == pytest.approx(loglik_at(fit.params, parts, fit.knots), rel=1e-9)
    assert (out / "trace.csv").exists() and (out / "model.zarr").is_dir()


def test_slowdown_emulation_waits_s_minus_one_times_the_cpu_time(dask_store):
    """evaluate_task run here (not on the cluster): c CPU seconds of compute, then (s − 1)·c of sleep."""
    import time

    from spatialfed.algorithm.protocol import Augmented
    from spatialfed.model.params import Params

    spec = site.SiteSpec("slowdown-test", str(dask_store), 0, knots49(), Matern(NU), "full")
    phi = Params(np.zeros(M), 0.1 * np.eye(M), np.zeros(5), 0.25, 1.0, 0.1)
    try:
        site.answer(spec, Augmented(phi, 0, "theta"), 1.0)  # load and factorise once
        with limit_blas_threads(1):
            tic, cpu = time.perf_counter(), time.thread_time()
            q = site.answer(spec, Augmented(phi.replace(delta=0.3), 1, "theta"), 4.0)
            wall, cpu = time.perf_counter() - tic, time.thread_time() - cpu
        assert q.step == "theta" and q.t == 1 and q.worker == 0
        assert wall >= 3.5 * cpu > 0  # ≥ c + 3c of sleep, c the CPU time (margin for timer granularity)
    finally:
        site.release("slowdown-test")
    assert site._REGISTRY == {}


def test_lost_dask_worker_is_replaced_and_the_fit_completes(cluster, dask_store, reference):
    """Kill the process serving federated workers 0 and 2 mid-fit: their tasks move to a live worker (last test:
    the nanny restarts the killed process under a new address)."""
    import signal

    victim = cluster.worker_addresses()[0]
    victim_pid = cluster.client.run(os.getpid, workers=[victim])[victim]
    killed = []

    def kill_once(server, now):
        if not killed and server.phase == "loop":
            killed.append(now)
            os.kill(victim_pid, signal.SIGKILL)  # a worker process of this test's own LocalCluster

    server, info = run_dask(cluster.client, dask_store, J, knots49(), NU, "full", FitConfig.of(mode="sync"),
                            slowdowns="straggler", on_event=kill_once, poll_s=0.2)
    assert killed and server.done and info.reassigned >= 1
    assert victim not in info.assignment
    assert abs(server.loglik - reference["loglik"]) < 1e-3


def test_embedded_cluster_is_started_and_closed(tmp_path, capsys):
    dask_store = _small_store(tmp_path / "emb.zarr", 40)
    gp = FederatedGP(mode="sync", knots=9, max_iter=2, cluster=Cluster(n_workers=1)).fit(dask_store)
    err = capsys.readouterr().err
    assert re.search(r"2 federated workers on 1 Dask worker\(s\); dashboard: http://127\.0\.0\.1:\d+/status", err)
    assert gp.loglik_ is not None and len(set(gp.assignment_)) == 1  # both partitions share the one process
    import socket

    for address in gp.assignment_:  # the embedded cluster is shut down after the fit
        host, port = address.split("://", 1)[1].rsplit(":", 1)
        with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=1):
            pass


def test_a_site_is_free_only_while_its_worker_has_an_idle_thread(cluster, dask_store):
    """DaskRuntime.free: 4 sites on 2 one-thread workers (0, 2 on one; 1, 3 on the other). While site 0's task
    sleeps, sites 0 and 2 are not free (a task would queue behind it) and 1, 3 are; once it answered, all are."""
    from spatialfed.algorithm.protocol import STATS_STEP, Augmented
    from spatialfed.model.params import Params
    from spatialfed.runtime.dask_runtime import DaskRuntime

    runtime = DaskRuntime(cluster.client)
    try:
        loaded = runtime.start(site.site_specs("free-test", dask_store, J, knots49(), Matern(NU), "full"))
        p = loaded[0].result["p"]
        assert runtime.assignment[0] == runtime.assignment[2] != runtime.assignment[1] == runtime.assignment[3]
        assert all(runtime.free(j) for j in range(J))
        runtime.submit(0, Augmented(Params(np.zeros(M), np.eye(M), np.zeros(p), 4.0, 1.0, 0.1), 0, STATS_STEP),
                       delay_s=1.0)
        assert [runtime.free(j) for j in range(J)] == [False, True, False, True]
        events = next(runtime.completed())
        assert [e.site for e in events] == [0] and events[0].error is None
        assert all(runtime.free(j) for j in range(J))
    finally:
        runtime.stop()
