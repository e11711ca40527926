"""Secure aggregation through the real runtime (embedded Dask LocalCluster): the secure sync fit reaches the plain
sync fit's estimate on the demo store and on Meuse, and a site whose worker is SIGKILLed mid-round is re-keyed on a
live worker and the fit ends on the same estimate (docs/secure-aggregation.md)."""

import os
import signal

import numpy as np
import pytest

from spatialfed.algorithm.secure_server import SecureStatsServer
from spatialfed.api import FederatedGP
from spatialfed.cli import main
from spatialfed.data import datasets
from spatialfed.data.simulate import simulate_store
from spatialfed.demo import simulate_networks
from spatialfed.runtime.cluster import local_cluster, worker_addresses
from tests.test_faults import _pid, _when

SYNC = dict(mode="sync", knots=25, max_iter=60, tol=1e-8, progress=False)


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(2) as handle:
        yield handle


@pytest.fixture(scope="module")
def demo_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("demo") / "demo.zarr"
    simulate_networks(path, seed=0)
    return path


@pytest.fixture(scope="module")
def meuse_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("meuse") / "meuse.zarr"
    assert main(["ingest", str(datasets.data_file("meuse", "meuse.csv")), str(path), "--x", "x", "--y", "y",
                 "--value", "zinc", "--crs", "EPSG:28992", "--workers", "4", "--test-fraction", "0", "--transform",
                 "log"]) == 0
    return path


def _pair(store, client, **extra):
    plain = FederatedGP(**SYNC, **extra, cluster=client).fit(store)
    secure = FederatedGP(**SYNC, **extra, cluster=client, privacy="secure_aggregation").fit(store)
    return plain, secure


@pytest.mark.parametrize("name", ["demo", pytest.param("meuse", marks=pytest.mark.slow)])
def test_secure_sync_fit_reaches_the_plain_estimate(name, cluster, demo_store, meuse_store):
    store = demo_store if name == "demo" else meuse_store
    plain, secure = _pair(store, cluster.client)
    assert plain.converged_ and secure.converged_
    assert abs(secure.loglik_ - plain.loglik_) <= 1e-9
    assert np.allclose([secure.params_[k] for k in ("delta", "sigma2", "beta")],
                       [plain.params_[k] for k in ("delta", "sigma2", "beta")], rtol=1e-6)
    assert secure.config_.secure_aggregation and not plain.config_.secure_aggregation


def test_async_and_too_few_sites_are_refused_with_one_line(demo_store, tmp_path, capsys):
    with pytest.raises(ValueError, match="mode='sync'"):
        FederatedGP(**{**SYNC, "mode": "async"}, cluster="simulated", privacy="secure_aggregation").fit(demo_store)
    two = tmp_path / "two.zarr"
    simulate_store(two, 2, 30, test_size=0, seed=1)
    with pytest.raises(ValueError, match="at least 3 sites"):
        FederatedGP(**SYNC, cluster="simulated", privacy="secure_aggregation").fit(two)
    assert main(["fit", str(demo_store), "--out", str(tmp_path / "fit"), "--mode", "async", "--secure-aggregation",
                 "--runtime", "simulated", "--quiet"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--mode sync" in err[0], err


class Watch:
    """Wraps SecureStatsServer.receive to tell the kill thread when a masked loop round is half answered."""

    def __init__(self):
        self.armed = False

    def __call__(self, server, qs, now):
        self.server, r = server, server._round
        if server.phase == "loop" and server.epochs >= 1 and r is not None and 0 < len(r.answers) < len(r.tasks):
            self.armed = True


@pytest.mark.slow  # the fast form: tests/algorithm/test_secure_server.py (a site dropped mid-round)
def test_a_site_killed_mid_round_is_rekeyed_and_the_fit_matches(demo_store, monkeypatch):
    """SIGKILL the worker process holding sites while a masked round is half answered: its sites reload on the live
    worker with new keys, the round is redone with fresh masks, and the estimate is the undisturbed one."""
    watch, receive = Watch(), SecureStatsServer.receive

    def watched(self, qs, now):
        receive(self, qs, now)
        watch(self, qs, now)

    monkeypatch.setattr(SecureStatsServer, "receive", watched)
    with local_cluster(2) as handle:
        reference = FederatedGP(**SYNC, cluster=handle.client, privacy="secure_aggregation").fit(demo_store)
        victim = worker_addresses(handle.client)[0]
        pid = _pid(handle.client, victim)
        thread, killed = _when(lambda: watch.armed, lambda: os.kill(pid, signal.SIGKILL))
        gp = FederatedGP(**SYNC, cluster=handle.client, privacy="secure_aggregation").fit(demo_store)
        thread.join(timeout=1)
    assert killed, "the kill never happened"
    assert victim not in gp.assignment_
    assert watch.server.redone >= 2  # the keys' round and the round the kill broke (its sites' new keys)
    assert abs(gp.loglik_ - reference.loglik_) <= 1e-9
