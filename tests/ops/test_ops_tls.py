"""TLS: a LocalCluster with encryption required, and a real federated fit through it."""

import numpy as np
import pytest
from conftest import grid_knots

from spatialfed.algorithm.config import FitConfig
from spatialfed.runtime.cluster import worker_addresses
from spatialfed.runtime.security import TLSConfigError, tls_security, write_tls_files


def test_security_requires_tls_for_every_role(tmp_path):
    sec = tls_security()
    assert sec.require_encryption
    for role in ("client", "scheduler", "worker"):
        cfg = sec.get_tls_config_for_role(role)
        assert cfg["ca_file"] and cfg["cert"] and cfg["key"]
    write_tls_files(tmp_path / "certs")
    assert oct((tmp_path / "certs" / "key.pem").stat().st_mode & 0o777) == "0o600"
    from_files = tls_security(tmp_path / "certs")
    assert from_files.require_encryption and from_files.tls_ca_file.endswith("ca.pem")
    with pytest.raises(TLSConfigError, match="ca.pem"):
        tls_security(tmp_path / "empty")
    with pytest.raises(TLSConfigError, match="already holds"):
        write_tls_files(tmp_path / "certs")
    # batch jobs get the certificate files on their worker command line
    from spatialfed.runtime.jobscript import job_script

    script = job_script("slurm", security=from_files, protocol="tls://")
    assert "tls://<insert-scheduler-address-here>:8786" in script
    assert f"--tls-ca-file {tmp_path / 'certs' / 'ca.pem'}" in script and "--tls-key" in script


def test_fit_over_tls(store):
    from distributed import Client, LocalCluster

    from spatialfed.runtime.dask_runtime import run_dask

    sec = tls_security()
    with LocalCluster(protocol="tls", host="127.0.0.1", security=sec, n_workers=2, threads_per_worker=1,
                      dashboard_address=None, silence_logs=40) as cluster, Client(cluster, security=sec) as client:
        assert cluster.scheduler_address.startswith("tls://127.0.0.1:")
        workers = worker_addresses(client)
        assert len(workers) == 2 and all(a.startswith("tls://") for a in workers)
        # a client without the certificates cannot connect
        with pytest.raises(Exception, match="(?i)tls|ssl"):
            Client(cluster.scheduler_address, timeout=2)
        server, info = run_dask(client, store, 3, grid_knots(4), 0.5, "full", FitConfig.of(mode="sync", max_iter=5))
    assert server.done and np.isfinite(server.loglik)
    assert server.iterations == 5 and info.sizes == [60, 60, 60]


def test_certificate_files_secure_a_cluster(tmp_path):
    from distributed import Client, LocalCluster

    sec = tls_security(write_tls_files(tmp_path / "certs"))
    with LocalCluster(protocol="tls", host="127.0.0.1", security=sec, n_workers=1, threads_per_worker=1,
                      processes=False, dashboard_address=None, silence_logs=40) as cluster, \
            Client(cluster, security=sec) as client:
        assert cluster.scheduler_address.startswith("tls://")
        assert client.submit(sum, [1, 2, 3]).result() == 6
