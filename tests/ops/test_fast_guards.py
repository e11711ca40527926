"""Fast forms of the slow guards, so every default run (and CI) has them; the slow forms stay for depth.

- one Dask worker process SIGKILLed at a drawn point of a fit: the fit ends with the undisturbed estimate
  (slow form: tests/test_faults.py, 30 random kills);
- the in-process fit equals the Dask fit on a small problem (slow form: tests/runtime/test_runtime_auto.py, Meuse);
- the asynchronous fit equals the synchronous one on the shipped ozone data (slow form:
  tests/algorithm/test_algorithm_mpp_async.py, 60 knots);
- a directory the user cannot write to, by a real permission fault: the CLI run as `nobody` (uid 65534) writing
  into a root-owned 0755 directory is one error line and leaves nothing (tests/test_bad_input.py skips its
  chmod-based case as root).
"""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import grid_knots

from spatialfed import Emulation
from spatialfed.algorithm.config import FitConfig
from spatialfed.api import FederatedGP
from spatialfed.data.simulate import simulate_store
from spatialfed.data.store import load_worker, open_store
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern

SYNC = dict(mode="sync", knots=9, max_iter=40, tol=1e-9, progress=False)


@pytest.fixture(scope="module")
def guards_store(tmp_path_factory):
    """3 sites × 40 points with a real nugget: one well-identified maximum (as tests/test_faults.py's store)."""
    path = tmp_path_factory.mktemp("guards") / "s.zarr"
    simulate_store(path, 3, 40, test_size=0, seed=3, noise_sd=0.5)
    return path


@pytest.fixture(scope="module")
def cluster():
    from spatialfed.runtime.cluster import local_cluster

    with local_cluster(2) as handle:
        yield handle


def same_estimate(a, b, rtol):
    for name in ("delta", "sigma2", "beta"):
        assert a.params_[name] == pytest.approx(b.params_[name], rel=rtol), name
    np.testing.assert_allclose(a.params_["gamma"], b.params_["gamma"], rtol=rtol)
    assert a.loglik_ == pytest.approx(b.loglik_, rel=rtol)


def test_in_process_fit_equals_the_dask_fit(guards_store, cluster):
    local = FederatedGP(**SYNC, cluster="simulated").fit(guards_store)
    dask = FederatedGP(**SYNC, cluster=cluster.client).fit(guards_store)
    assert (local.runtime_used_, dask.runtime_used_) == ("simulated", "dask")
    assert local.converged_ and dask.converged_ and local.n_iter_ == dask.n_iter_
    same_estimate(local, dask, 1e-8)
    np.testing.assert_allclose(local.mu_, dask.mu_, rtol=1e-8, atol=1e-8 * np.abs(dask.mu_).max())
    np.testing.assert_allclose(local.Sigma_, dask.Sigma_, rtol=1e-8, atol=1e-8 * np.abs(dask.Sigma_).max())


def test_a_worker_killed_at_a_drawn_point_leaves_the_estimate_unchanged(guards_store, cluster):
    """SIGKILL of the process holding sites at event t drawn from a seeded generator, from the driver's own event
    hook (no timing race): its sites reload on the other worker (or the restarted one) and the synchronous fit ends
    at the in-process estimate."""
    from spatialfed.runtime.cluster import worker_addresses
    from spatialfed.runtime.dask_runtime import run_dask
    from spatialfed.runtime.virtual import run_virtual

    knots, kernel, cfg = grid_knots(3), Matern(0.5), FitConfig.of(mode="sync", max_iter=40, tol=1e-9)
    models = [LocalModel(*load_worker(guards_store, j), knots, kernel, "full") for j in range(3)]
    reference = run_virtual(models, knots, kernel, cfg)
    client = cluster.client
    victim = worker_addresses(client)[0]
    pid = client.run(os.getpid, workers=[victim])[victim]
    kill_at = int(np.random.default_rng(31).integers(2, 6))
    killed = []

    def kill(server, now):
        if server.t >= kill_at and not killed:
            os.kill(pid, signal.SIGKILL)
            killed.append(server.t)

    server, info = run_dask(client, str(guards_store), 3, knots, kernel, "full", cfg, on_event=kill)
    assert killed, "the fit ended before the kill"
    assert victim not in info.assignment
    assert server.done and server.n_obs == reference.n_obs
    for name in ("delta", "sigma2", "beta"):
        assert getattr(server.params, name) == pytest.approx(getattr(reference.params, name), rel=1e-7), name
    np.testing.assert_allclose(server.params.gamma, reference.params.gamma, rtol=1e-7)
    assert server.loglik == pytest.approx(reference.loglik, rel=1e-9)


def test_async_equals_sync_on_the_ozone_data(tmp_path):
    """Ozone on 15 July 1987 (8 sites of 6-34 stations, one per state), 16 knots, the statistics scheme: the
    asynchronous fit with a straggler stops by tol at the synchronous maximum (measured: ℓ equal to 1e-15, the
    parameters to 1e-7)."""
    from spatialfed.data.datasets import ozone_store

    info, _ = ozone_store(tmp_path / "oz.zarr", "870715")
    settings = dict(knots=16, residual="full", strategies="stats", cluster="simulated", progress=False, max_iter=300)
    sync = FederatedGP(mode="sync", **settings).fit(info.path)
    asyn = FederatedGP(mode="async", **settings, emulation=Emulation(profile="straggler")).fit(info.path)
    assert (sync.stop_reason_, asyn.stop_reason_) == ("tol", "tol")
    same_estimate(asyn, sync, 1e-5)


# --- a real permission fault --------------------------------------------------------------------------------------

CHILD = textwrap.dedent("""
    import os, sys
    from spatialfed.cli import main
    warm, argv = sys.argv[1], sys.argv[2:]
    # everything the command imports is imported while this process can still read the interpreter's files
    assert main([a.replace("{OUT}", warm) for a in argv]) == 0
    if os.geteuid() == 0:
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
        except OSError as exc:
            print(f"cannot drop privileges: {exc}", file=sys.stderr)
            sys.exit(77)
    sys.exit(main([a.replace("{OUT}", os.environ["GUARD_OUT"]) for a in argv]))
""")


@pytest.fixture()
def shared_dir():
    """A directory every user can traverse and read (tmp_path's parents are private to root): the store and a
    root-owned 0755 directory (writable only by root) inside it."""
    base = Path(tempfile.mkdtemp(prefix="spatialfed-guard-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("command", [
    pytest.param(["simulate", "{OUT}", "--workers", "2", "--n-per-worker", "20", "--quiet"], id="simulate"),
    pytest.param(["fit", "{STORE}", "--out", "{OUT}", "--runtime", "simulated", "--knots", "9", "--max-iter", "2",
                  "--quiet"], id="fit"),
])
def test_an_unwritable_directory_is_one_error_line(shared_dir, command):
    guards_store = shared_dir / "s.zarr"
    simulate_store(guards_store, 2, 20, test_size=0, seed=1)
    assert open_store(guards_store).n_workers == 2
    locked = shared_dir / "locked"
    locked.mkdir()
    if os.geteuid() != 0:
        locked.chmod(0o555)  # not root: the mode is a real fault for this user
    argv = [a.replace("{STORE}", str(guards_store)) for a in command]
    env = {**os.environ, "GUARD_OUT": str(locked / "out"), "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(shared_dir / "warm"), *argv], capture_output=True,
                          text=True, timeout=300, env=env, cwd=shared_dir)
    if done.returncode == 77:
        pytest.skip(done.stderr.strip())
    assert done.returncode == 1, (done.returncode, done.stderr)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "permission denied" in lines[0] and "locked" in lines[0], lines[0]
    assert "choose a directory you can write to" in lines[0]
    assert list(locked.iterdir()) == []  # nothing left behind, not even a staged temporary
