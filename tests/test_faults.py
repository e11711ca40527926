"""Faults on a real Dask cluster (issue 15): a worker process killed mid-fit, every worker killed, the scheduler killed.

Every fit must end (finished, or one clear error) within a bounded time of the kill: 60 s when one worker dies, 30 s
when every worker or the scheduler dies. Finished fits match the undisturbed estimate (the same fit on the in-process
runtime); failed ones resume from their checkpoint to it. Kills are real: SIGKILL of the worker's process id
(``client.run(os.getpid)``) or of a scheduler/worker started as a subprocess (``dask scheduler``/``dask worker``).

The default run keeps one representative of each scenario (every worker killed: with a 2 s wait for a worker; the
default 10 s wait and the resume are ``slow``, as are the 20 async + 10 sync random kills). The CLI's side (a
`spatialfed fit` subprocess losing its cluster, then `--resume`) is tests/cli/test_cli_fit_lost_cluster.py.
"""

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from spatialfed import Checkpoint, Cluster
from spatialfed.api import FederatedGP
from spatialfed.data.simulate import simulate_store
from spatialfed.errors import SpatialFedError
from spatialfed.runtime.cluster import SINGLE_THREAD_ENV, local_cluster, worker_addresses
from spatialfed.runtime.driver import ClusterLostError

#: sync: every iteration aggregates all sites, so the estimate does not depend on the arrival order; async: the
#: "tuned" preset converges to the maximum likelihood estimate whatever the order (on the store below, measured on
#: the simulated runtime: balanced, straggler and graded compute all end within 6e-9 of the sync MLE, in 11, 416 and
#: 614 iterations; hence max_iter 2000), with tol tight enough that two runs agree to 1e-6 relative
SYNC = dict(mode="sync", strategies="tuned", knots=9, max_iter=40, tol=1e-9, progress=False)  # kills at theta steps
ASYNC = dict(mode="async", strategies="tuned", knots=9, max_iter=2000, tol=1e-9, progress=False)
ONE_WORKER_S, CLUSTER_S = 60.0, 30.0  # deadlines (kill -> the fit has ended)


def _vector(gp) -> np.ndarray:
    p = gp.params_
    return np.r_[p["delta"], p["sigma2"], p["beta"], p["gamma"], gp.loglik_]


def _same_estimate(gp, ref, rtol=1e-6):
    """The same estimate: every parameter and ℓ to `rtol`, and the fit converged (stopped by tol) as the
    undisturbed one did. (The store used before had δ → ∞ on a ridge and two maxima: no fit converged, sync stopped at
    max_iter, async ones on another trajectory, and one async kill trial in 20 ended at the other maximum,
    ℓ −270.11 against −268.97: the comparison tested the path, not the fault handling.)"""
    assert gp.converged_ and ref.converged_, (gp.stop_reason_, ref.stop_reason_)
    np.testing.assert_allclose(_vector(gp), _vector(ref), rtol=rtol)


def _deviation(gp, ref) -> float:
    """The largest relative difference `_same_estimate` checks."""
    a, b = _vector(gp), _vector(ref)
    return float(np.max(np.abs(a - b) / np.abs(b)))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """J = 3 sites of 60 points with a real nugget (noise sd 0.5, δ = 4): the likelihood has one well-identified
    maximum (sync converges in 12 iterations to δ = 2.88)."""
    path = tmp_path_factory.mktemp("faults") / "s.zarr"
    simulate_store(path, 3, 60, test_size=0, seed=3, noise_sd=0.5)
    return path


@pytest.fixture(scope="module")
def reference(store):
    """The undisturbed estimates, on the in-process runtime (no cluster to break), each fitted on first use: the
    default run needs sync's alone (async's ~600 iterations are for the slow random kills)."""

    class Undisturbed(dict):
        def __missing__(self, mode):
            settings = SYNC if mode == "sync" else ASYNC
            self[mode] = FederatedGP(**settings, cluster="simulated").fit(store)
            return self[mode]

    return Undisturbed()


# --- helpers: real processes, real kills --------------------------------------------------------------------------

def _pid(client, address) -> int:
    return client.run(os.getpid, workers=[address])[address]


def _when(condition, action, timeout_s=600.0):
    """A thread running `action()` once `condition()` holds (checked every 20 ms); returns (thread, times) where
    times[0] is the perf_counter time of the action."""
    times = []

    def watch():
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if condition():
                action()
                times.append(time.perf_counter())
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, times


def _checkpointed(path):
    return lambda: os.path.exists(path)


def _wait_for(handle, n, excluding=(), timeout_s=120.0) -> list[str]:
    """The addresses of `n` connected workers none of which is in `excluding` (a nanny restarts a killed process
    under a new address), polling the scheduler; fails the test after `timeout_s`. On a loaded machine a nanny can
    give up restarting its process (its start times out; LocalCluster then runs one worker short): after 30 s the
    cluster is scaled back to `n` workers."""
    deadline = time.perf_counter() + timeout_s
    scale_at = time.perf_counter() + 30.0
    while time.perf_counter() < deadline:
        alive = [a for a in worker_addresses(handle.client, timeout=10) if a not in excluding]
        if len(alive) >= n:
            return alive
        if handle.cluster is not None and time.perf_counter() > scale_at:
            print(f"the nanny did not restart its worker within 30 s: scaling the cluster back to {n} workers")
            handle.cluster.scale(n)
            scale_at = deadline
        time.sleep(0.1)
    pytest.fail(f"{n} Dask workers did not come back within {timeout_s:g} s")


class SubprocessCluster:
    """`dask scheduler` and `dask worker --no-nanny` as separate processes on 127.0.0.1 (each one can be killed,
    and a killed worker is not restarted: the situation of batch jobs that died)."""

    def __init__(self, tmp_path, n_workers=2):
        self.file = tmp_path / "scheduler.json"
        self.file.unlink(missing_ok=True)
        env = {**os.environ, **SINGLE_THREAD_ENV}
        dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
        self.scheduler = subprocess.Popen(dask + ["--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                                  "--scheduler-file", str(self.file)], env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.workers = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                                          str(self.file), "--no-nanny", "--nthreads", "1", "--host", "127.0.0.1",
                                          "--no-dashboard"], env=env, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL) for _ in range(n_workers)]
        from distributed import Client

        deadline = time.perf_counter() + 120
        while not self.file.exists() and time.perf_counter() < deadline:
            time.sleep(0.1)
        self.client = Client(scheduler_file=str(self.file), timeout=30)
        self.client.wait_for_workers(n_workers, timeout=120)
        self.address = self.client.scheduler.address

    def kill_workers(self):
        for w in self.workers:
            os.kill(w.pid, signal.SIGKILL)

    def kill_scheduler(self):
        os.kill(self.scheduler.pid, signal.SIGKILL)

    def close(self):
        self.client.close(timeout=5)
        for p in [*self.workers, self.scheduler]:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=30)


@pytest.fixture
def subprocess_cluster(tmp_path):
    cluster = SubprocessCluster(tmp_path)
    try:
        yield cluster
    finally:
        cluster.close()


def _fit_with_kill(settings, store, kill, when, checkpoint, **cluster):
    """Fit with `kill()` run when `when()` holds; returns (estimator or the exception, kill time, end time)."""
    thread, killed = _when(when, kill)
    try:
        result = FederatedGP(**settings, checkpoint=Checkpoint(checkpoint, every=1), **cluster).fit(store)
    except SpatialFedError as exc:
        result = exc
    end = time.perf_counter()
    thread.join(timeout=1)
    return result, (killed[0] if killed else None), end


# --- the default run: one representative of each scenario ---------------------------------------------------------

def test_a_killed_worker_process_is_replaced_and_the_fit_matches(store, reference, tmp_path):
    """SIGKILL the process holding sites mid-fit (embedded LocalCluster, TLS): its sites reload on a live worker and
    the fit ends with the undisturbed estimate."""
    with local_cluster(2) as handle:
        victim = worker_addresses(handle.client)[0]
        pid = _pid(handle.client, victim)
        ck = tmp_path / "ck.json"
        gp, killed, end = _fit_with_kill(SYNC, store, lambda: os.kill(pid, signal.SIGKILL), _checkpointed(ck), ck,
                                         cluster=handle.client)
    assert killed is not None and not isinstance(gp, Exception), gp
    print(f"one worker killed: kill -> end {end - killed:.1f} s")
    assert end - killed < ONE_WORKER_S
    assert victim not in gp.assignment_
    _same_estimate(gp, reference["sync"])


def test_every_worker_killed_ends_after_the_wait_for_a_worker(store, subprocess_cluster):
    """The mechanism with a short wait (the default is 10 s, in the slow test below): every worker SIGKILLed from the
    driver's own event hook mid-fit (t = 3); the runtime notices at once and raises ClusterLostError `worker_wait_s`
    later."""
    from conftest import grid_knots

    from spatialfed.algorithm.config import FitConfig
    from spatialfed.runtime.dask_runtime import run_dask

    killed = []

    def kill_at_t3(server, now):
        if server.t >= 3 and not killed:
            subprocess_cluster.kill_workers()
            killed.append(time.perf_counter())

    with pytest.raises(ClusterLostError, match=r"every Dask worker left the cluster .* none joined within 2 s") as err:
        run_dask(subprocess_cluster.client, store, 3, grid_knots(3), 0.5, "full", FitConfig.of(mode="sync", max_iter=40),
                 on_event=kill_at_t3, worker_wait_s=2.0)
    took = time.perf_counter() - killed[0]
    print(f"every worker killed, worker_wait_s = 2: kill -> error {took:.1f} s")
    assert 2.0 <= took < 2.0 + 8.0 and "\n" not in str(err.value)


# slow: the fit waits its 10 s for a worker to join, and the resume starts a cluster: 20-36 s in all. Its kill -> error
# was 20 s alone but 50 s in 2 of 3 full-suite runs: a result fetched from a worker that died meanwhile waited for its
# 30 s timeout before the 20 s wait (fixed: the watchdog cancels it); now 10 s, loaded machine included
@pytest.mark.slow
def test_every_worker_killed_is_one_clear_error_and_the_checkpoint_resumes(store, reference, subprocess_cluster,
                                                                          tmp_path):
    ck = tmp_path / "ck.json"
    err, killed, end = _fit_with_kill(SYNC, store, subprocess_cluster.kill_workers, _checkpointed(ck), ck,
                                      cluster=subprocess_cluster.address)
    print(f"every worker killed: kill -> error {end - killed:.1f} s")
    assert isinstance(err, ClusterLostError), err
    assert end - killed < CLUSTER_S
    msg = str(err)
    assert "\n" not in msg and "every Dask worker left the cluster" in msg
    assert f"FederatedGP.resume('{ck}')" in msg and "--resume" in msg
    gp = FederatedGP.resume(ck, cluster=Cluster(n_workers=2))  # continue on an embedded cluster
    assert gp.resumed_from_["t"] >= 1
    _same_estimate(gp, reference["sync"])


def _theta_step_reached(client, t: int):
    """A condition: the scheduler holds a theta task of iteration >= t (keys 'theta-w<j>-t<t>-<hex>')."""

    def reached():
        keys = client.run_on_scheduler(lambda dask_scheduler: [str(k) for k in dask_scheduler.tasks])
        return any(k.startswith("theta-") and int(k.split("-")[2][1:]) >= t for k in keys)

    return reached


def test_a_killed_scheduler_is_one_clear_error_and_the_rescued_state_resumes(store, reference, subprocess_cluster,
                                                                             tmp_path, monkeypatch):
    """No checkpoint= given: the lost cluster's fit still saves its state (a temporary directory) and names it."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the rescue directory goes
    thread, killed = _when(_theta_step_reached(subprocess_cluster.client, 3), subprocess_cluster.kill_scheduler)
    try:
        FederatedGP(**SYNC, cluster=subprocess_cluster.address).fit(store)
        err = None
    except SpatialFedError as exc:
        err = exc
    end = time.perf_counter()
    thread.join(timeout=1)
    print(f"scheduler killed: kill -> error {end - killed[0]:.1f} s")
    assert isinstance(err, ClusterLostError), err
    assert end - killed[0] < CLUSTER_S
    msg = str(err)
    assert "\n" not in msg and f"lost the Dask scheduler at {subprocess_cluster.address}" in msg
    assert "CommClosedError" not in msg
    rescued = list(tmp_path.glob("spatialfed-rescue-*/checkpoint.zip"))
    assert len(rescued) == 1 and err.checkpoint == rescued[0] and err.iteration >= 2
    assert f"FederatedGP.resume('{rescued[0]}')" in msg and f"spatialfed fit --resume {rescued[0]}" in msg
    gp = FederatedGP.resume(rescued[0], cluster=Cluster(n_workers=2))
    assert gp.resumed_from_["t"] == err.iteration
    _same_estimate(gp, reference["sync"])


# --- slow: kills at random points ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def nanny_cluster():
    """Two worker processes whose nanny restarts a killed one. On a loaded machine the restart can take longer than
    distributed's lost-worker-timeout (15 s), after which LocalCluster closes the nanny for good: give it 120 s."""
    import dask

    with dask.config.set({"distributed.deploy.lost-worker-timeout": "120s"}), local_cluster(2) as handle:
        yield handle


@pytest.fixture(scope="module")
def durations(store, nanny_cluster):
    """Wall seconds of an undisturbed Dask fit per mode, measured on first use (the kill is drawn within it)."""
    out = {}

    def duration(mode):
        if mode not in out:
            tic = time.perf_counter()
            FederatedGP(**(ASYNC if mode == "async" else SYNC), cluster=nanny_cluster.client).fit(store)
            out[mode] = time.perf_counter() - tic
        return out[mode]

    return duration


@pytest.mark.slow
@pytest.mark.parametrize("mode, trial", [("async", i) for i in range(20)] + [("sync", i) for i in range(10)])
def test_a_worker_killed_at_a_random_point(mode, trial, store, reference, nanny_cluster, durations, tmp_path):
    client = nanny_cluster.client
    rng = np.random.default_rng(1000 * (mode == "async") + trial)
    alive = _wait_for(nanny_cluster, 2)
    victim = alive[int(rng.integers(len(alive)))]
    pid = _pid(client, victim)
    delay = float(rng.uniform(0.05, 0.7)) * durations(mode)
    start = time.perf_counter()
    ck = tmp_path / "ck.json"
    result, killed, end = _fit_with_kill(ASYNC if mode == "async" else SYNC, store,
                                         lambda: os.kill(pid, signal.SIGKILL),
                                         lambda: time.perf_counter() - start >= delay, ck, cluster=client)
    outcome = "finished" if not isinstance(result, Exception) else f"failed ({type(result).__name__})"
    took = float("nan") if killed is None else end - killed
    # what the kill cost: the time from the kill to the end beyond the undisturbed fit's remaining work (a long fit
    # goes on for minutes after its lost site is recovered; on an idle machine these fits last well under 60 s)
    cost = took - max(durations(mode) - delay, 0.0)
    print(f"{mode} trial {trial}: kill at {delay:.1f} s, kill -> end {took:.1f} s (cost {cost:.1f} s), {outcome}",
          "" if not isinstance(result, Exception) else result)
    if killed is not None:
        assert cost < ONE_WORKER_S
    if isinstance(result, Exception):
        assert isinstance(result, ClusterLostError) and "\n" not in str(result)
        _wait_for(nanny_cluster, 1, excluding=(victim,))
        result = FederatedGP.resume(ck, cluster=client)
    print(f"{mode} trial {trial}: {result.n_iter_} iterations ({result.stop_reason_}), largest relative deviation "
          f"from the undisturbed estimate {_deviation(result, reference[mode]):.1e}")
    _same_estimate(result, reference[mode])
    if killed is not None:
        _wait_for(nanny_cluster, 2, excluding=(victim,))  # the nanny's restarted process is back for the next trial
