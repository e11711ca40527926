"""Files are data: a checkpoint never decides where a fit connects or what it submits, and plain TCP off this machine
is refused before any connection (docs/recovery.md "What a checkpoint may not decide", docs/hpc.md "Signals and
trust").

A forged checkpoint (written with the project's own writer, as anyone who can write the file could) names a rogue
scheduler whose address a listening socket of the test holds: `spatialfed fit --resume` runs on its own embedded
cluster, the listener sees no connection, and one warning line names the ignored address. A forged jobqueue entry
with a job-script prologue never reaches the batch system: a stand-in `sbatch` first on PATH records every call.
"""

import os
import socket
import stat
import threading

import pytest

from spatialfed.algorithm.checkpoint import read_checkpoint, write_checkpoint
from spatialfed.cli import main
from spatialfed.runtime.security import off_machine_plain


class Listener:
    """A TCP socket on 127.0.0.1 that records every connection made to it (the rogue scheduler's port)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def listener():
    rogue = Listener()
    yield rogue
    rogue.close()


@pytest.fixture(scope="module")
def checkpointed(store, tmp_path_factory):
    """A real fit's directory with its checkpoint kept (two iterations on the in-process runtime)."""
    out = tmp_path_factory.mktemp("trust") / "fit"
    assert main(["fit", str(store), "--out", str(out), "--knots", "9", "--max-iter", "2", "--checkpoint-every", "1",
                 "--quiet"]) == 0
    return out


def forge(checkpointed, tmp_path, **params):
    """A copy of the fit's checkpoint whose recorded estimator settings are changed to `params`."""
    snap = read_checkpoint(checkpointed / "checkpoint.zip")
    snap["meta"]["params"].update(params)
    out = tmp_path / "forged"
    out.mkdir()
    write_checkpoint(out / "checkpoint.zip", snap)
    return out


def test_a_forged_scheduler_address_is_never_contacted(checkpointed, tmp_path, listener, capsys):
    rogue = f"tcp://127.0.0.1:{listener.port}"
    forged = forge(checkpointed, tmp_path, scheduler=rogue)
    assert main(["fit", "--resume", str(forged), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert listener.connections == 0
    warning = [line for line in err.splitlines() if rogue in line]
    assert len(warning) == 1 and warning[0].startswith("spatialfed fit: warning: ") and "--scheduler" in warning[0]
    assert (forged / "fit.json").exists()


def test_a_forged_job_script_prologue_never_reaches_the_batch_system(checkpointed, tmp_path, monkeypatch, capsys):
    calls = tmp_path / "sbatch-calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(f"#!/bin/sh\ncat \"$@\" >> {calls}\necho 'Submitted batch job 1'\n")
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    jobqueue = {"kind": "slurm", "job_script_prologue": [f"echo INJECTED > {tmp_path / 'pwned'}"],
                "wait_for_workers": 1}
    forged = forge(checkpointed, tmp_path, jobqueue=jobqueue)
    assert main(["fit", "--resume", str(forged), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert not calls.exists() and not (tmp_path / "pwned").exists()
    assert "slurm jobs" in err and "--jobqueue" in err and "INJECTED" not in err


def test_plain_tcp_off_this_machine_is_refused_before_any_connection(store, tmp_path, listener, capsys):
    address = f"tcp://0.0.0.0:{listener.port}"  # 0.0.0.0 reaches this machine's listener if connected to
    assert main(["fit", str(store), "--out", str(tmp_path / "fit"), "--scheduler", address, "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert listener.connections == 0
    assert len(err.splitlines()) == 1 and address in err and "--insecure" in err and "tls://" in err, err
    assert not (tmp_path / "fit").exists()


def test_a_jobqueue_scheduler_listening_off_this_machine_without_tls_is_refused(store, tmp_path, capsys):
    assert main(["fit", str(store), "--out", str(tmp_path / "fit"), "--jobqueue", "slurm",
                 "--scheduler-host", "0.0.0.0", "--quiet"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "0.0.0.0" in err and "--tls" in err and "--insecure" in err, err


@pytest.mark.parametrize(("address", "host"), [
    ("tcp://127.0.0.1:8786", None), ("tcp://127.4.5.6:8786", None), ("tcp://[::1]:8786", None),
    ("localhost:8786", None), ("tcp://LOCALHOST:1", None), ("tls://10.1.2.3:8786", None), ("inproc://x/1/2", None),
    ("tcp://0.0.0.0:8786", "0.0.0.0"), ("10.1.2.3:8786", "10.1.2.3"), ("tcp://[2001:db8::1]:8786", "2001:db8::1"),
    ("tcp://login1.cluster:8786", "login1.cluster"), ("ws://10.1.2.3:8786", "10.1.2.3"),
])
def test_which_addresses_are_plain_and_off_this_machine(address, host):
    assert off_machine_plain(address) == host


def test_a_fit_directory_never_says_where_prediction_connects(store, tmp_path, listener):
    """model.zarr records the estimator's settings for FederatedGP.load; a scheduler written there (by hand) is not
    one: the loaded fit predicts in this process and the address is never contacted."""
    import json

    import numpy as np

    from spatialfed.api import FederatedGP

    gp = FederatedGP(knots=9, max_iter=3, cluster="simulated", progress=False).fit(store)
    fit = gp.save(tmp_path / "fit")
    meta_path = fit / "model.zarr" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    forged = {"address": f"tcp://127.0.0.1:{listener.port}", "tls": False,
              "jobqueue": {"kind": "slurm", "job_script_prologue": ["id"]}}
    meta["attributes"]["settings"]["estimator"].update(cluster=forged)
    meta_path.write_text(json.dumps(meta))
    back = FederatedGP.load(fit)
    assert back.cluster is None  # nothing of where to connect or what to submit
    meta["attributes"]["settings"]["estimator"].update(cluster=None, scheduler=forged["address"],
                                                        jobqueue=forged["jobqueue"])  # an earlier version's names
    meta_path.write_text(json.dumps(meta))
    assert FederatedGP.load(fit).cluster is None
    back = FederatedGP.load(fit)
    X, coords = np.zeros((3, 5)), np.random.default_rng(1).uniform(size=(3, 2))
    np.testing.assert_allclose(back.predict(X, coords=coords), gp.predict(X, coords=coords), rtol=0, atol=1e-12)
    assert listener.connections == 0
