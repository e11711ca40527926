"""Shared fixtures: small deterministic simulated partitions and knot grids."""

import numpy as np
import pytest

from spatialfed.model.matern import Matern
from spatialfed.runtime.blas import limit_blas_threads


@pytest.fixture(autouse=True, scope="session")
def one_blas_thread():
    """Hold numpy's and scipy's OpenBLAS to one thread: the tests' matrices are small, and two thread pools
    spinning against each other on a 2-core machine made the suite several times slower."""
    with limit_blas_threads(1):
        yield


@pytest.fixture(autouse=True)
def warnings_said_afresh():
    """Each test sees spatialfed's warnings anew (errors.warn shows a text once per process)."""
    from spatialfed import errors

    errors.forget_warnings()
    yield


def grid_knots(side: int, lo: float = 0.1, hi: float = 0.9) -> np.ndarray:
    """A side×side regular grid of knots in [lo, hi]²."""
    g = np.linspace(lo, hi, side)
    return np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)


def simulate_parts(J=3, n=30, p=2, nu=1.5, sigma2=1.2, beta=0.2, delta=2.0, seed=2, gamma=None):
    """J partitions of an exactly simulated Matérn field with noise, covariates [1, N(0,1)...]."""
    rng = np.random.default_rng(seed)
    locs = rng.uniform(size=(J * n, 2))
    X = np.column_stack([np.ones(J * n), rng.standard_normal((J * n, p - 1))])
    gamma = np.linspace(1.0, 0.2, p) if gamma is None else np.asarray(gamma)
    C = Matern(nu).cross(locs, locs, sigma2, beta) + 1e-10 * np.eye(J * n)
    w = np.linalg.cholesky(C) @ rng.standard_normal(J * n)
    z = X @ gamma + w + rng.standard_normal(J * n) / np.sqrt(delta)
    return [(locs[j * n:(j + 1) * n], z[j * n:(j + 1) * n], X[j * n:(j + 1) * n]) for j in range(J)]


@pytest.fixture
def parts():
    return simulate_parts()


@pytest.fixture
def knots():
    return grid_knots(4)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A small simulated store: 3 workers × 60 points, no test group."""
    from spatialfed.data.simulate import simulate_store

    path = tmp_path_factory.mktemp("store") / "sim.zarr"
    simulate_store(path, 3, 60, test_size=0, seed=4)
    return path


@pytest.fixture(scope="session")
def slurm():
    """The local SLURM (tests/slurm.py): skips without one, fails without one when SPATIALFED_REQUIRE_SLURM=1."""
    import slurm as local_slurm

    why = local_slurm.why_not()
    if why is not None:
        if local_slurm.REQUIRED:
            pytest.fail(f"SLURM is required here (SPATIALFED_REQUIRE_SLURM=1) but {why}")
        pytest.skip(why)
    return local_slurm
