"""The paper's simulation setting (SPEC §7): sizes, truth, determinism, and the field's covariance at large N."""

import numpy as np
import pytest
import zarr
from scipy.spatial import cKDTree

from spatialfed.data.simulate import GAMMA, simulate, simulate_store
from spatialfed.data.store import load_test, load_worker
from spatialfed.errors import DataError
from spatialfed.model.matern import Matern


def test_setting_matches_spec():
    sim = simulate(4, 300, seed=0, test_size=50)
    assert sim.locs.shape == (1200, 2) and sim.X.shape == (1200, 5) and sim.z.shape == (1200,)
    assert sim.locs.min() >= 0 and sim.locs.max() <= 1 and sim.method == "exact"
    assert sim.truth == {"gamma": list(GAMMA), "delta": 0.25, "sigma2": 1.0, "beta": 0.1, "nu": 0.5}
    assert sim.covariate_names == ["x1", "x2", "x3", "x4", "x5"]
    assert [len(p[1]) for p in sim.parts()] == [300] * 4 and len(sim.test[1]) == 50
    gamma_hat = np.linalg.lstsq(sim.X, sim.z, rcond=None)[0]
    assert np.max(np.abs(gamma_hat - GAMMA)) < 0.3  # residual sd √5, n = 1200
    assert abs(np.var(sim.z - sim.X @ np.array(GAMMA)) - 5.0) < 1.0  # σ² + noise_sd²


def test_deterministic_and_seed_dependent():
    a, b, c = (simulate(2, 100, seed=s, partition="neighbor") for s in (7, 7, 8))
    np.testing.assert_array_equal(a.z, b.z)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert not np.array_equal(a.z, c.z)


def test_unequal_sizes_and_partitions():
    for scheme in ("random", "area", "neighbor"):
        sim = simulate(sizes=[50, 150, 300], partition=scheme, seed=1)
        assert [len(p[1]) for p in sim.parts()] == [50, 150, 300]


def test_large_n_field_has_the_target_variogram():
    """Above 20,000 points the circulant sampler is used; its empirical variogram matches the Matérn target."""
    sim = simulate(sizes=[12000, 9000], beta=0.1, noise_sd=1e-3, seed=0)
    assert sim.method == "circulant"
    resid = sim.z - sim.X @ np.array(GAMMA)
    pairs = cKDTree(sim.locs).query_pairs(0.04, output_type="ndarray")
    lag = np.linalg.norm(sim.locs[pairs[:, 0]] - sim.locs[pairs[:, 1]], axis=1)
    semivar = 0.5 * (resid[pairs[:, 0]] - resid[pairs[:, 1]]) ** 2
    for lo, hi in [(0.0, 0.01), (0.01, 0.02), (0.02, 0.04)]:
        inside = (lag >= lo) & (lag < hi)
        target = 1.0 - Matern(0.5).correlation(lag[inside], 0.1).mean()
        assert semivar[inside].mean() == pytest.approx(target, rel=0.1)


def test_simulate_store_writes_truth_and_test(tmp_path):
    info = simulate_store(tmp_path / "s.zarr", 3, 100, test_size=20, seed=2, partition="area", nu=1.5, beta=0.11)
    assert info.truth["nu"] == 1.5 and info.truth["beta"] == 0.11 and info.has_test and info.sizes == [100] * 3
    assert info.crs is None and info.partition == "area"
    assert load_worker(tmp_path / "s.zarr", 2)[2].shape == (100, 5) and len(load_test(tmp_path / "s.zarr")[1]) == 20
    assert zarr.open_group(tmp_path / "s.zarr", mode="r").attrs["simulation"] == {"method": "exact", "seed": 2}
    with pytest.raises(DataError, match="already exists"):
        simulate_store(tmp_path / "s.zarr", 3, 100)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_workers=3), "give n_workers and n_per_worker"),
        (dict(n_workers=3, n_per_worker=0), "n_per_worker must be a positive integer"),
        (dict(n_workers=0, n_per_worker=10), "positive integer"),
        (dict(n_workers=2, n_per_worker=10, partition="column:agency"), "no grouping column"),
        (dict(n_workers=2, n_per_worker=10, beta=-1), "beta must be"),
        (dict(n_workers=2, n_per_worker=10, test_size=-1), "test_size"),
        (dict(n_workers=2, n_per_worker=10, method="fast"), "method must be one of"),
        (dict(sizes=[10, 10], n_workers=3), "one size per worker"),
    ],
)
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        simulate(**kwargs)


@pytest.mark.slow
def test_exact_sampling_at_20000_points():
    sim = simulate(4, 5000, seed=0, method="exact", test_size=0)
    assert sim.method == "exact" and len(sim.z) == 20000
