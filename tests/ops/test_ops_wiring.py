"""Ops wiring: `FederatedGP(cluster=Cluster(tls=...))` / `fit --tls`, and checkpoint/resume through run_dask, FederatedGP and the CLI."""

from spatialfed import Checkpoint, Cluster
import numpy as np
import pytest



# --- TLS -------------------------------------------------------------------------------------------------------

def test_fit_with_tls_uses_tls(store):
    from spatialfed.api import FederatedGP

    gp = FederatedGP(mode="sync", knots=9, max_iter=3, progress=False, cluster=Cluster(tls=True, n_workers=2)).fit(store)
    assert np.isfinite(gp.loglik_) and gp.n_iter_ == 3
    assert gp.scheduler_address_.startswith("tls://127.0.0.1:")
    assert gp.get_params()["cluster"].tls is True


def test_tls_settings_are_checked(tmp_path):
    from spatialfed.api import FederatedGP
    from spatialfed.runtime.cluster import SchedulerUnreachableError, connect
    from spatialfed.runtime.security import TLSConfigError, tls_security

    with pytest.raises(ValueError, match="existing client"):
        FederatedGP(cluster=Cluster(tls=True, client=object()))._check_settings()
    with pytest.raises(ValueError, match="simulated"):
        Cluster(tls=True, runtime="simulated")
    with pytest.raises(SchedulerUnreachableError, match="tls://127.0.0.1:1"):
        connect("tcp://127.0.0.1:1", security=tls_security())
    with pytest.raises(TLSConfigError, match="ca.pem"):
        FederatedGP(cluster=Cluster(tls=str(tmp_path / "none")))._security()


def test_cli_tls_flags():
    import argparse

    from spatialfed.cli.fit import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["fit", "s.zarr", "--out", "o", "--tls-dir", "/certs"])
    assert args.tls_dir == "/certs" and not args.tls
    assert parser.parse_args(["fit", "s.zarr", "--out", "o", "--tls"]).tls


# --- checkpoint and resume ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def running():
    """One running plain-TCP Dask cluster for the fits and resumes here whose check is not the embedded cluster's
    start (a LocalCluster start is ~2-3 s): a resume of a finished checkpoint, the refused resume's fit, the CLI's
    resume (--scheduler). The interrupted fits and the first API resume keep their embedded clusters."""
    from spatialfed.runtime.cluster import local_cluster

    with local_cluster(2, security=False) as handle:  # plain TCP: the CLI joins it with --scheduler
        yield handle.client.scheduler.address


def _interrupt_at(monkeypatch, t_stop):
    """Make the fit die (KeyboardInterrupt from the progress hook, between receive calls) once server.t >= t_stop."""
    from spatialfed.api.progress import Progress

    def event(self, server, now):
        if server.phase == "loop" and server.t >= t_stop:
            raise KeyboardInterrupt

    monkeypatch.setattr(Progress, "event", event)


def _vector(params):
    return np.r_[params["delta"], params["sigma2"], params["beta"], params["gamma"]]


@pytest.mark.parametrize("mode, rtol", [("sync", 1e-6), pytest.param("async", 1e-3, marks=pytest.mark.slow)])
def test_interrupted_fit_resumes_to_the_same_estimate(store, running, tmp_path, monkeypatch, mode, rtol):
    from spatialfed.algorithm.checkpoint import read_checkpoint
    from spatialfed.api import FederatedGP

    # async: the "tuned" preset converges to the maximum likelihood estimate, whatever the arrival order (the
    # paper preset keeps hovering around it at ~1e-3 with J = 3), so two async runs can be compared
    settings = dict(mode=mode, knots=9, max_iter=400, tol=1e-9, progress=False, cluster=Cluster(n_workers=2),
                    strategies="tuned" if mode == "async" else "paper")
    # sync's uninterrupted fit on the in-process runtime (a Dask cluster less): it takes the same steps whatever the
    # clock; async's stays on Dask (its simulated arrival order does not reach the estimate in 400 iterations)
    full = FederatedGP(**{**settings, **({"cluster": "simulated"} if mode == "sync" else {})}).fit(store)
    path = tmp_path / "ck" / "fit.ckpt"
    with monkeypatch.context() as m:
        _interrupt_at(m, 7)
        with pytest.raises(KeyboardInterrupt):
            FederatedGP(**settings, checkpoint=Checkpoint(path, every=3)).fit(store)
    snap = read_checkpoint(path)
    assert snap["phase"] == "loop" and snap["t"] >= 7 and snap["meta"]["params"]["mode"] == mode
    gp = FederatedGP.resume(path)
    assert gp.resumed_from_["t"] == snap["t"] and gp.checkpoint_writes_ >= 1
    assert gp.trace_[: len(snap["trace"])] == snap["trace"]  # the history carries on
    assert gp.trace_[-1]["time_s"] >= snap["time_s"]  # and so does the clock
    np.testing.assert_allclose(_vector(gp.params_), _vector(full.params_), rtol=rtol)
    np.testing.assert_allclose(gp.loglik_, full.loglik_, rtol=rtol)
    assert read_checkpoint(path)["phase"] == "done"  # the final state; resuming it returns the same result
    again = FederatedGP.resume(path, cluster=Cluster(address=running))  # on the running cluster: no third start
    np.testing.assert_array_equal(_vector(again.params_), _vector(gp.params_))


def test_resume_refuses_model_changes(store, running, tmp_path):
    from spatialfed.api import FederatedGP

    path = tmp_path / "fit.ckpt"
    FederatedGP(mode="sync", knots=9, max_iter=2, progress=False, checkpoint=Checkpoint(path, every=1),
                cluster=Cluster(address=running)).fit(store)
    with pytest.raises(ValueError, match="knots"):
        FederatedGP.resume(path, knots=16)
    with pytest.raises(ValueError, match="the path of the file to write"):
        Checkpoint(None, every=2)


def test_cli_checkpoint_and_resume(store, running, tmp_path, monkeypatch, capsys):
    import json

    from spatialfed.cli import main

    out = tmp_path / "out"
    with monkeypatch.context() as m:
        _interrupt_at(m, 4)
        assert main(["fit", str(store), "--out", str(out), "--mode", "sync", "--knots", "9", "--max-iter", "10",
                     "--dask-workers", "2", "--checkpoint-every", "2", "--preset", "tuned", "--quiet"]) == 130  # Ctrl-C: no traceback
    assert f"`spatialfed fit --resume {out}`" in capsys.readouterr().err
    assert (out / "checkpoint.zip").exists() and not (out / "fit.json").exists()
    # the interrupted fit ran on an embedded cluster; the resume joins the running one (a checkpoint never says where)
    assert main(["fit", "--resume", str(out), "--quiet", "--scheduler", running]) == 0
    fit = json.loads((out / "fit.json").read_text())
    assert fit["iterations"] == 10


def test_no_failure_checkpoint_of_a_half_updated_server(tmp_path):
    """Interrupted inside server.receive, the driver keeps the last periodic checkpoint instead of saving a state
    that may be half-updated; interrupted between two receive calls, it saves the state it has."""
    from conftest import grid_knots, simulate_parts

    from spatialfed.algorithm.checkpoint import read_checkpoint
    from spatialfed.algorithm.config import FitConfig
    from spatialfed.algorithm.server import FederatedServer
    from spatialfed.model.local import LocalModel
    from spatialfed.model.matern import Matern
    from spatialfed.runtime.driver import Checkpointer, drive
    from spatialfed.runtime.virtual import VirtualRuntime

    knots, kernel = grid_knots(3), Matern(1.5)
    models = [LocalModel(*part, knots, kernel) for part in simulate_parts()]

    class Interrupted(FederatedServer):
        def receive(self, qs, now):
            super().receive(qs, now)
            if self.phase == "loop" and self.t >= 5:
                raise KeyboardInterrupt  # after the update began: the state may be half-updated

    ck = Checkpointer(tmp_path / "c.ckpt", 2, {})
    server = Interrupted(3, knots, kernel, FitConfig.of(mode="sync", max_iter=50))
    with pytest.raises(KeyboardInterrupt):
        drive(server, VirtualRuntime(models), checkpointer=ck)
    assert ck.writes >= 1 and ck.last_t < server.t and read_checkpoint(tmp_path / "c.ckpt")["t"] == ck.last_t

    def stop_between(srv, now):  # between receive calls: the server is consistent and is saved
        if srv.phase == "loop" and srv.t >= 3:
            raise KeyboardInterrupt

    ck = Checkpointer(tmp_path / "d.ckpt", 100, {})
    server = FederatedServer(3, knots, kernel, FitConfig.of(mode="sync", max_iter=50))
    with pytest.raises(KeyboardInterrupt):
        drive(server, VirtualRuntime(models), on_event=stop_between, checkpointer=ck)
    assert ck.writes == 1 and read_checkpoint(tmp_path / "d.ckpt")["t"] == server.t


def test_cli_fit_with_tls_dir(store, tmp_path):
    import json

    from spatialfed.cli import main
    from spatialfed.runtime.security import write_tls_files

    certs = write_tls_files(tmp_path / "certs")
    out = tmp_path / "tls_out"
    main(["fit", str(store), "--out", str(out), "--mode", "sync", "--knots", "9", "--max-iter", "2",
          "--dask-workers", "2", "--tls-dir", str(certs), "--quiet"])
    assert json.loads((out / "fit.json").read_text())["iterations"] == 2


def test_run_dask_checks_the_restored_server(store):
    from conftest import grid_knots

    from spatialfed.algorithm.server import FederatedServer
    from spatialfed.model.matern import Matern
    from spatialfed.runtime.dask_runtime import run_dask

    server = FederatedServer(3, grid_knots(3), Matern(0.5))
    with pytest.raises(ValueError, match="workers"):
        run_dask(None, store, 2, grid_knots(3), 0.5, "full", server=server)
    with pytest.raises(ValueError, match="knots"):
        run_dask(None, store, 3, grid_knots(4), 0.5, "full", server=server)
