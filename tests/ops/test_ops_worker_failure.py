"""Continuing without a worker whose computation fails: the server drops it from aggregates, thresholds and N."""

import numpy as np
import pytest

from conftest import grid_knots, simulate_parts
from spatialfed import Cluster
from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.protocol import evaluate
from spatialfed.algorithm.server import FederatedServer
from spatialfed.errors import SpatialFedError
from spatialfed.model import reference as ref
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern


def run_with_failure(mode: str, fail_worker: int, fail_at_event: int):
    """Drive a fit in-process; worker `fail_worker`'s task number `fail_at_event` fails instead of answering."""
    parts = simulate_parts(J=4, n=40, nu=0.5, seed=8)
    knots, kernel = grid_knots(3), Matern(0.5)
    models = [LocalModel(*p, knots, kernel, "full") for p in parts]
    cfg = FitConfig.of(mode=mode, agg_threshold=None if mode == "sync" else 2, max_iter=40)
    if mode == "async":
        cfg = FitConfig.tuned(agg_threshold=2, max_iter=200)
    server = FederatedServer(4, knots, kernel, cfg)
    pending, seen = [], 0
    while not server.done:
        pending += server.dispatch()
        j, p = pending.pop(0)
        if j == fail_worker and j in server.active:
            seen += 1
            if seen == fail_at_event:
                server.drop_worker(j, p.step, "LinAlgError: R_j is not positive definite", now=float(seen))
                continue
        server.receive(evaluate(models[j], p, j), now=float(seen))
    return server, parts, knots, kernel


@pytest.mark.parametrize("mode, event", [("sync", 1), ("sync", 6), ("async", 9)])
def test_fit_completes_without_the_failed_worker(mode, event):
    server, parts, knots, kernel = run_with_failure(mode, fail_worker=2, fail_at_event=event)
    assert server.done and server.active == [0, 1, 3]
    assert server.dropped[0]["worker"] == 2 and "positive definite" in server.dropped[0]["cause"]
    remaining = [parts[j] for j in server.active]
    assert server.n_obs == sum(len(z) for _, z, _ in remaining)
    p = server.params
    # the reported loglik is ℓ_LR of the remaining workers' data at the reported parameters
    assert server.loglik == pytest.approx(
        ref.lowrank_loglik(remaining, knots, kernel, "full", p.gamma, p.delta, p.sigma2, p.beta), abs=1e-6)
    assert np.isfinite(server.loglik)


def test_the_last_worker_cannot_be_dropped():
    knots, kernel = grid_knots(3), Matern(0.5)
    server = FederatedServer(1, knots, kernel, FitConfig.of(mode="sync"))
    with pytest.raises(SpatialFedError, match="no other worker"):
        server.drop_worker(0, "theta", "boom", now=0.0)


def test_dask_fit_drops_a_worker_whose_partition_fails_and_records_it(tmp_path):
    """On the Dask runtime, on_worker_error='drop' continues without the worker and fit.json records it."""
    import json

    from spatialfed.api import FederatedGP
    from spatialfed.data.simulate import simulate_store

    store = tmp_path / "bad.zarr"
    simulate_store(store, 3, 40, test_size=0, seed=6)
    chunks = [p for p in (store / "workers" / "1" / "z").rglob("*") if p.is_file() and p.name != "zarr.json"]
    for c in chunks:
        c.write_bytes(b"\x00garbage")  # worker 1's data cannot be read where it is loaded
    gp = FederatedGP(mode="sync", knots=9, max_iter=5, progress=False, cluster=Cluster(n_workers=2, on_worker_error="drop")).fit(store)
    assert [d["worker"] for d in gp.dropped_workers_] == [1] and gp.dropped_workers_[0]["step"] == "load"
    assert gp.n_obs_ == 80 and np.isfinite(gp.loglik_)
    doc = json.loads((gp.save(tmp_path / "fit") / "fit.json").read_text())
    assert doc["dropped_workers"][0]["worker"] == 1 and "federated worker 1" in doc["dropped_workers"][0]["cause"]
