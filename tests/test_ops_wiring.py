"""Ops wiring: `FederatedGP(tls=...)` / `fit --tls`, and checkpoint/resume through run_dask, FederatedGP and the CLI."""

import numpy as np
import pytest

from spatialfed.data.simulate import simulate_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("wiring") / "sim.zarr"
    simulate_store(path, 3, 60, test_size=0, seed=4)
    return path


# --- TLS -------------------------------------------------------------------------------------------------------

def test_fit_with_tls_uses_tls(store):
    from spatialfed.api import FederatedGP

    gp = FederatedGP(mode="sync", knots=9, max_iter=3, tls=True, progress=False, n_dask_workers=2).fit(store)
    assert np.isfinite(gp.loglik_) and gp.n_iter_ == 3
    assert gp.scheduler_address_.startswith("tls://127.0.0.1:")
    assert "tls" in gp.get_params()


def test_tls_settings_are_checked(tmp_path):
    from spatialfed.api import FederatedGP
    from spatialfed.runtime.cluster import SchedulerUnreachableError, connect
    from spatialfed.runtime.security import TLSConfigError, tls_security

    with pytest.raises(ValueError, match="client="):
        FederatedGP(tls=True, client=object())._check_settings()
    with pytest.raises(ValueError, match="simulated"):
        FederatedGP(tls=True, runtime="simulated")._check_settings()
    with pytest.raises(SchedulerUnreachableError, match="tls://127.0.0.1:1"):
        connect("tcp://127.0.0.1:1", security=tls_security())
    with pytest.raises(TLSConfigError, match="ca.pem"):
        FederatedGP(tls=str(tmp_path / "none"))._security()


def test_jobqueue_cluster_passes_security(monkeypatch):
    import dask_jobqueue

    from spatialfed.runtime import cluster

    seen = {}

    class Fake:
        def __init__(self, **kw):
            seen.update(kw)
            raise RuntimeError("stop here")

    monkeypatch.setattr(dask_jobqueue, "SLURMCluster", Fake)
    sec = object()
    with pytest.raises(RuntimeError, match="stop here"):
        cluster.make_cluster(jobqueue={"kind": "slurm", "shared_temp_directory": "/shared/me"}, security=sec)
    assert seen["security"] is sec and seen["protocol"] == "tls://" and seen["shared_temp_directory"] == "/shared/me"


def test_cli_tls_flags():
    import argparse

    from spatialfed.fitcli import register_fit

    parser = argparse.ArgumentParser()
    register_fit(parser.add_subparsers())
    args = parser.parse_args(["fit", "s.zarr", "--out", "o", "--tls-dir", "/certs"])
    assert args.tls_dir == "/certs" and not args.tls
    assert parser.parse_args(["fit", "s.zarr", "--out", "o", "--tls"]).tls
