"""Checkpoint and resume of the federated server: snapshot → file → restore continues the fit exactly."""

import os
import pickle

import numpy as np
import pytest
from conftest import grid_knots, simulate_parts

from spatialfed import atomic
from spatialfed.algorithm import checkpoint
from spatialfed.algorithm.checkpoint import (
    CheckpointError,
    read_checkpoint,
    write_checkpoint,
)
from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.protocol import evaluate
from spatialfed.algorithm.server import _SNAPSHOT_STATE, FederatedServer
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern

J = 3
SPEED = np.array([1.0, 1.0, 1 / 3])  # worker 2 finishes a third as often: stale quantities, real asynchrony


def setup():
    parts = simulate_parts(J=J, n=40, nu=0.5, seed=3)
    knots, kernel = grid_knots(3), Matern(0.5)
    models = [LocalModel(*p, knots, kernel, "full") for p in parts]
    server = FederatedServer(J, knots, kernel, FitConfig(mode="async", agg_threshold=2, max_iter=8))
    return models, server


def drive(server, models, inflight, i=0, stop=None):
    """Deterministic asynchronous run: at event i one busy worker finishes, drawn by a generator seeded with i
    (weights SPEED), so the event order depends only on i and which workers are busy. Returns the event count."""
    while not server.done and (stop is None or i < stop):
        for j, p in server.dispatch():
            inflight[j] = p
        busy = sorted(inflight)
        w = SPEED[busy]
        j = int(np.random.default_rng([11, i]).choice(busy, p=w / w.sum()))
        p = inflight.pop(j)
        server.receive(evaluate(models[j], p, j), now=0.01 * i)
        i += 1
    return i


@pytest.fixture(scope="module")
def uninterrupted():
    models, server = setup()
    n_events = drive(server, models, {})
    return server, n_events


def assert_same_fit(a, b):
    assert a.done and b.done
    for name in ("mu", "Sigma", "gamma"):
        np.testing.assert_allclose(getattr(b.params, name), getattr(a.params, name), rtol=0, atol=1e-8)
    for name in ("delta", "sigma2", "beta"):
        assert abs(getattr(b.params, name) - getattr(a.params, name)) <= 1e-8
    assert abs(b.loglik - a.loglik) <= 1e-8
    assert (b.iterations, b.converged, b.stop_reason) == (a.iterations, a.converged, a.stop_reason)
    assert [(r["iter"], r["step"], r["time_s"]) for r in b.trace] == [(r["iter"], r["step"], r["time_s"])
                                                                      for r in a.trace]


@pytest.mark.parametrize("k", [1, 4, 17, 30])
def test_resume_from_checkpoint_matches_uninterrupted_run(uninterrupted, tmp_path, k):
    reference, n_events = uninterrupted
    assert k < n_events
    models, server = setup()
    inflight = {}
    i = drive(server, models, inflight, stop=k)
    path = write_checkpoint(tmp_path / "fit.ckpt", server, meta={"store": "sim.zarr", "residual": "full"})
    snap = read_checkpoint(path)
    assert snap["meta"] == {"store": "sim.zarr", "residual": "full"}
    assert snap["resend"].keys() == inflight.keys()  # every task in flight is recorded to be re-sent ...
    for j, p in inflight.items():
        front = snap["buffers"][j][0]  # ... at the front of its worker's buffer
        assert (front.t, front.step) == (p.t, p.step)
        assert (front.params is None) == (p.params is None)
        if p.params is not None:
            np.testing.assert_array_equal(front.params.u, p.params.u)
            np.testing.assert_array_equal(front.params.mu, p.params.mu)
    if k >= 17:
        assert snap["phase"] == "loop" and snap["t"] >= 1 and snap["history"]["theta"]
    del server  # the process "dies": in-flight results are lost with it
    fresh_models = setup()[0]  # new LocalModels: no factorisation cache carried over
    resumed = FederatedServer.restore(snap)
    assert not any(resumed.busy(j) for j in range(J))
    assert drive(resumed, fresh_models, {}, i=i) == n_events
    assert_same_fit(reference, resumed)


def test_snapshot_is_a_deep_copy_and_restores_twice():
    models, server = setup()
    drive(server, models, {}, stop=20)
    snap = server.snapshot()
    a, b = FederatedServer.restore(snap), FederatedServer.restore(snap)
    drive(a, models, {}, i=20)
    assert a.done and not b.done  # b is untouched by a's progress
    assert snap["t"] == b.t and snap["phase"] == "loop"
    assert snap["config"]["agg_threshold"] == 2 and snap["time_s"] == pytest.approx(0.19)


def test_snapshot_covers_every_attribute():
    """A new server attribute must be added to the snapshot (or to this list with a reason)."""
    models, server = setup()
    drive(server, models, {}, stop=20)
    handled = set(_SNAPSHOT_STATE.values()) | {"config", "_P", "_in_flight", "_obsolete", "_history"}
    assert set(vars(server)) <= handled, set(vars(server)) - handled


def test_restore_rejects_foreign_snapshots():
    with pytest.raises(ValueError, match="format"):
        FederatedServer.restore({"format": 99})
    _, server = setup()
    snap = server.snapshot()
    del snap["Q"]
    with pytest.raises(ValueError, match="missing"):
        FederatedServer.restore(snap)


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    models, server = setup()
    inflight = {}
    i = drive(server, models, inflight, stop=10)
    path = write_checkpoint(tmp_path / "fit.ckpt", server)
    before = path.read_bytes()
    drive(server, models, inflight, i=i, stop=15)

    def dies_halfway(obj, fh, protocol=None):
        fh.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.pickle, "dump", dies_halfway)
    with pytest.raises(OSError, match="disk full"):
        write_checkpoint(path, server)
    with pytest.raises(OSError, match="disk full"):
        write_checkpoint(tmp_path / "new.ckpt", server)
    assert path.read_bytes() == before  # the previous checkpoint is intact
    assert sorted(os.listdir(tmp_path)) == ["fit.ckpt"]  # no partial new file, no temp files left
    monkeypatch.undo()

    def replace_fails(src, dst):
        raise OSError("rename failed")

    monkeypatch.setattr(atomic.os, "replace", replace_fails)
    with pytest.raises(OSError, match="rename failed"):
        write_checkpoint(path, server)
    assert path.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["fit.ckpt"]


def test_read_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint"):
        read_checkpoint(tmp_path / "missing.ckpt")
    (tmp_path / "trunc.ckpt").write_bytes(b"\x80\x05garbage")
    with pytest.raises(CheckpointError, match="not a readable"):
        read_checkpoint(tmp_path / "trunc.ckpt")
    (tmp_path / "other.ckpt").write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(CheckpointError, match="not a spatialfed checkpoint"):
        read_checkpoint(tmp_path / "other.ckpt")
