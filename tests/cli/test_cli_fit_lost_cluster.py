"""`spatialfed fit` losing its cluster (issue 15): a real `python -m spatialfed fit` subprocess on a Dask cluster of
separate processes (`dask scheduler`, `dask worker --no-nanny`) whose workers, or scheduler, are SIGKILLed mid-fit.

No `--checkpoint-every` is given: every CLI fit keeps OUT/checkpoint.zip (every 10 aggregations and when it is
interrupted). The fit must end within 30 s of the kill with exit status 1, no traceback and one error line (after
the runtime's warnings as it noticed each loss) naming the exact `spatialfed fit --resume OUT` command; that command
(with `--scheduler` of a fresh cluster) then reaches the undisturbed estimate (sync: to 1e-6 relative, the arrival
order does not matter).
"""

import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from spatialfed.api import FederatedGP
from spatialfed.data.simulate import simulate_store
from test_faults import CLUSTER_S, SubprocessCluster

#: sync, long enough (tol never reached) that the kill lands mid-fit, after the first periodic checkpoint (t = 10):
#: the paper preset's block steps keep moving at 1e-12 (the stats preset's Newton steps reach it before t = 10)
FLAGS = ["--mode", "sync", "--preset", "paper", "--knots", "9", "--max-iter", "40", "--tol", "1e-12", "--quiet"]


def _spatialfed(*args):
    return subprocess.Popen([sys.executable, "-m", "spatialfed", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _vector(params: dict, loglik: float) -> np.ndarray:
    return np.r_[params["delta"], params["sigma2"], params["beta"], params["gamma"], loglik]


def _cluster(path):
    path.mkdir()
    return SubprocessCluster(path)


@pytest.mark.slow  # two clusters of subprocesses, two CLI processes and a 10 s wait for a worker: ~30-40 s
@pytest.mark.parametrize("victim", ["workers", "scheduler"])
def test_a_cli_fit_that_loses_its_cluster_says_how_to_resume_and_resumes(victim, tmp_path):
    store = tmp_path / "s.zarr"
    simulate_store(store, 3, 40, test_size=0, seed=11)
    reference = FederatedGP(mode="sync", strategies="paper", knots=9, max_iter=40, tol=1e-12, progress=False,
                            cluster="simulated").fit(store)
    out = tmp_path / "run 1"  # a space: the command in the message must be quoted to be runnable as printed
    ck = out / "checkpoint.zip"
    first = _cluster(tmp_path / "first")
    try:
        proc = _spatialfed("fit", store, "--out", out, "--scheduler", first.address, *FLAGS)
        deadline = time.perf_counter() + 120
        while not ck.exists() and proc.poll() is None and time.perf_counter() < deadline:
            time.sleep(0.01)
        assert ck.exists(), f"no periodic checkpoint appeared: {proc.communicate()}"
        first.kill_workers() if victim == "workers" else first.kill_scheduler()
        killed = time.perf_counter()
        stdout, stderr = proc.communicate(timeout=120)
        took = time.perf_counter() - killed
    finally:
        first.close()
    print(f"CLI fit, {victim} killed: kill -> exit {took:.1f} s; stderr: {stderr.strip()}")
    assert proc.returncode == 1 and took < CLUSTER_S
    lines = stderr.strip().splitlines()  # before the error: the runtime's warnings as it noticed each loss
    errors = [line for line in lines if line.startswith("spatialfed fit: error: ")]
    assert errors == lines[-1:] and "Traceback" not in stderr, stderr
    cause = "every Dask worker left the cluster" if victim == "workers" else "lost the Dask scheduler"
    command = f"spatialfed fit --resume '{out}'"
    assert cause in errors[0] and f"`{command}`" in errors[0] and "--scheduler ADDRESS" in errors[0], errors[0]
    assert not (out / "fit.json").exists()

    second = _cluster(tmp_path / "second")
    try:  # the printed command, on a fresh cluster
        resumed = subprocess.run([sys.executable, "-m", "spatialfed", "fit", "--resume", str(out), "--scheduler",
                                  second.address, "--quiet"], capture_output=True, text=True, timeout=300)
    finally:
        second.close()
    assert resumed.returncode == 0, resumed.stderr
    fit = json.loads((out / "fit.json").read_text())
    assert fit["iterations"] == reference.n_iter_
    np.testing.assert_allclose(_vector(fit["params"], fit["loglik"]), _vector(reference.params_, reference.loglik_),
                               rtol=1e-6)
