"""The batch-job path on a real SLURM (the local one of .ci/slurm-up; `slurm` fixture, conftest.py).

dask-jobqueue's SLURMCluster submits the Dask workers with sbatch; they connect back to the scheduler on 127.0.0.1.
Workers retire before their walltime and the adaptive cluster submits their replacements (runtime.walltime).
"""

import subprocess

import numpy as np
import pytest

from spatialfed import Cluster, Emulation
from spatialfed.runtime.walltime import lifetime


def job_settings(tmp_path, **extra):
    return {"kind": "slurm", "jobs": 1, "cores": 1, "memory": "1GB", "walltime": "00:05:00",
            "shared_temp_directory": str(tmp_path), "log_directory": str(tmp_path),  # not the checkout
            "wait_for_workers": 120, **extra}


def test_a_tls_fit_runs_in_slurm_batch_jobs_and_cancels_them(slurm, store, tmp_path):
    """A TLS fit whose Dask worker is a batch job: the estimate of the in-process fit, the submitted script starts
    the worker with TLS (certificate files in the given shared_temp_directory) and a lifetime short of the walltime,
    and no job is left when the fit returns."""
    from spatialfed.api import FederatedGP

    before = slurm.last_job_id()
    gp = FederatedGP(mode="sync", knots=9, max_iter=3, progress=False, cluster=Cluster(tls=True, jobqueue=job_settings(tmp_path))).fit(store)
    ref = FederatedGP(mode="sync", knots=9, max_iter=3, progress=False, cluster="simulated").fit(store)
    assert gp.scheduler_address_.startswith("tls://127.0.0.1:")
    assert gp.loglik_ == pytest.approx(ref.loglik_, rel=1e-10)
    np.testing.assert_allclose(gp.params_["gamma"], ref.params_["gamma"], rtol=1e-8)
    assert all(a.startswith("tls://127.0.0.1:") for a in gp.assignment_)  # the workers listen on loopback only
    ran = slurm.jobs(after=before, name="dask-worker")
    assert ran and not [j for j in ran if j.state in ("PENDING", "RUNNING")], ran  # closed with the fit
    script = subprocess.run(["scontrol", "write", "batch_script", str(ran[0].id), "-"], capture_output=True,
                            text=True, check=True).stdout
    seconds, stagger = lifetime("00:05:00")
    assert f"--lifetime {seconds:g}s --lifetime-stagger {stagger:g}s" in script
    assert "tls://127.0.0.1:" in script and f"--tls-key {tmp_path}/" in script  # its shared_temp_directory


@pytest.mark.slow
def test_a_worker_retires_before_its_walltime_and_a_new_job_replaces_it(slurm, tmp_path):
    """walltime 20 s: the worker leaves at 10 ± 5 s on its own (its job ends before the walltime, not TIMEOUT) and
    the cluster submits a job whose worker joins in its place."""
    import time

    import dask
    import distributed  # noqa: F401 - its defaults loaded first: the context below must restore, not drop, them

    from spatialfed.runtime.cluster import jobqueue_cluster

    before = slurm.last_job_id()
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1s"}):  # replace at once (default 15 s)
        with jobqueue_cluster("slurm", **{k: v for k, v in job_settings(tmp_path, walltime="00:00:20").items()
                                          if k != "kind"}) as handle:
            first = set(handle.worker_addresses())
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and not (set(handle.worker_addresses()) - first):
                time.sleep(0.5)
            joined = set(handle.worker_addresses()) - first
            assert first and joined, "no replacement worker joined within 90 s"
            ran = slurm.jobs(after=before, name="dask-worker")
            gone = ran[0]  # it retired and its job ended (or was cancelled) before SLURM had to end it
            assert gone.state in ("COMPLETED", "COMPLETING", "CANCELLED") and gone.end is not None, ran
            assert (gone.end - gone.start).total_seconds() < 20, ran
            assert slurm.generations(ran) >= 2, ran


@pytest.mark.slow
def test_a_fit_of_several_walltimes_finishes_by_itself_on_the_uninterrupted_estimate(slurm, tmp_path):
    """20 s jobs (workers retire at 10 ± 5 s) under a synchronous fit of about a minute: the cluster replaces the
    jobs, the sites move to the new workers, and the fit ends where the uninterrupted in-process fit does."""
    from spatialfed.api import FederatedGP
    from spatialfed.data.simulate import simulate_store

    store = tmp_path / "s.zarr"
    simulate_store(store, 4, 900, test_size=0, seed=1)
    settings = dict(mode="sync", tol=1e-8, progress=False)
    before = slurm.last_job_id()
    gp = FederatedGP(**settings, cluster=Cluster(jobqueue={**job_settings(tmp_path, walltime="00:00:20"), "jobs": 2}), emulation=Emulation(slowdown=[10] * 4)).fit(store)
    ref = FederatedGP(**settings, cluster="simulated").fit(store)
    ran = slurm.jobs(after=before, name="dask-worker")
    assert slurm.generations(ran) >= 2, ran
    assert gp.converged_ and gp.n_iter_ == ref.n_iter_
    assert abs(gp.loglik_ - ref.loglik_) <= 1e-9


@pytest.mark.slow
def test_a_queue_that_gives_no_replacement_within_the_queue_wait_stops_the_fit_with_its_checkpoint(slurm, tmp_path):
    """The first job starts; every later one sleeps in its prologue before starting a worker (a queue that gives
    nothing more): once the first worker has retired, the fit waits --queue-wait seconds, then stops with one line
    naming the checkpoint, and leaves no job behind."""
    import os
    import sys
    from pathlib import Path

    import spatialfed
    from spatialfed.data.simulate import simulate_store

    simulate_store(tmp_path / "s.zarr", 4, 900, test_size=0, seed=1)
    flag = tmp_path / "first"
    (tmp_path / "once.yaml").write_text(
        f'job_script_prologue: ["if [ -e {flag} ]; then sleep 3600; fi; touch {flag}"]\n')
    before = slurm.last_job_id()
    env = {**os.environ, "PYTHONPATH": str(Path(spatialfed.__file__).parents[1])}  # this checkout's spatialfed
    done = subprocess.run([sys.executable, "-m", "spatialfed", "fit", "s.zarr", "--out", "f", "--mode",
                           "sync", "--slowdown", "30,30,30,30", "--jobqueue", "slurm", "--walltime", "00:00:20",
                           "--queue-wait", "20", "--jobqueue-config", "once.yaml", "--quiet"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "every Dask worker left the cluster" in last and "none joined within 20 s" in last, done.stderr
    assert "spatialfed fit --resume f" in last and (tmp_path / "f" / "checkpoint.zip").exists()
    ran = slurm.jobs(after=before, name="dask-worker")
    assert len(ran) >= 2 and not [j for j in ran if j.state in ("PENDING", "RUNNING")], ran
