"""LocalModel.variogram: binned semivariogram sums over a bounded number of pairs (start.py step 2)."""

import tracemalloc

import numpy as np
import pytest
from conftest import grid_knots, simulate_parts
from scipy.spatial.distance import cdist

from spatialfed.algorithm import start as starting
from spatialfed.model.local import LocalModel
from spatialfed.model.variogram import binned_semivariogram
from spatialfed.model.matern import Matern


def dense_variogram(locs, e, edges):
    """The O(n²) estimator this replaces: every pair i < k, np.digitize into [edges[k], edges[k+1])."""
    iu = np.triu_indices(len(e), k=1)
    d = cdist(locs, locs)[iu]
    sq = 0.5 * (e[iu[0]] - e[iu[1]]) ** 2
    idx = np.digitize(d, edges) - 1
    ok = (idx >= 0) & (idx < edges.size - 1)
    nb = edges.size - 1
    return np.bincount(idx[ok], weights=sq[ok], minlength=nb), np.bincount(idx[ok], minlength=nb).astype(float)


@pytest.mark.parametrize("residual", ["full", "mpp", "pp"])
def test_small_worker_uses_every_pair_exactly(residual):
    """n_j ≤ max_points: the same sums and counts as the dense all-pairs estimator (summation order aside)."""
    locs, z, X = simulate_parts(J=1, n=300, p=2, seed=5)[0]
    knots = grid_knots(3)
    lm = LocalModel(locs, z, X, knots, Matern(1.5), residual)
    gamma = np.array([0.9, 0.3])
    edges = starting.variogram_edges(starting.domain_diameter(knots))
    got = lm.variogram(gamma, edges)
    sum_sq, count = dense_variogram(locs, z - X @ gamma, edges)
    np.testing.assert_array_equal(got["count"], count)
    np.testing.assert_allclose(got["sum_sq"], sum_sq, rtol=1e-12)
    assert set(got) == {"sum_sq", "count"} and got["sum_sq"].shape == (edges.size - 1,)


def test_blocks_and_bin_edges_match_the_dense_estimator():
    """Row blocks of any size, distances exactly on an edge (a grid) and pairs beyond the last edge are dropped."""
    g = np.arange(7.0)
    locs = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)  # integer distances: many on the edges
    e = np.random.default_rng(0).standard_normal(len(locs))
    edges = np.linspace(0.0, 4.0, 9)
    ref = dense_variogram(locs, e, edges)
    for block in (1, 5, 48, 1000):
        sum_sq, count = binned_semivariogram(locs, e, edges, block=block)
        np.testing.assert_array_equal(count, ref[1])
        np.testing.assert_allclose(sum_sq, ref[0], rtol=1e-12)
    assert binned_semivariogram(locs[:1], e[:1], edges)[1].sum() == 0  # one point: no pair


def test_pairs_and_memory_stay_bounded_as_n_grows():
    """Above max_points the pass uses at most max_points·(max_points−1)/2 pairs and its peak memory does not grow
    with n_j (the dense estimator needs 8·n_j² bytes: 2 GB at n_j = 16,000)."""
    knots = np.array([[0.0, 0.0], [1.0, 1.0]])
    edges = starting.variogram_edges(starting.domain_diameter(knots))  # (0, 0.707]: most pairs in [0,1]² are in range
    cap = 400
    peaks, pairs = [], []
    for n in (1_000, 4_000, 16_000):
        rng = np.random.default_rng(n)
        lm = LocalModel(rng.uniform(size=(n, 2)), rng.standard_normal(n), np.ones((n, 1)), knots, Matern(0.5), "pp")
        tracemalloc.start()
        try:
            got = lm.variogram([0.0], edges, max_points=cap)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        pairs.append(got["count"].sum())
    assert all(0.5 * cap * (cap - 1) / 2 < k <= cap * (cap - 1) / 2 for k in pairs), pairs  # ≈ 76 % within 0.707
    assert max(peaks) < 8e6, peaks  # O(block · max_points), measured ≈ 4 MB at every n
    assert peaks[-1] < 1.5 * peaks[0], peaks


def test_subsample_is_seeded_and_uniform():
    idx = LocalModel.variogram_subsample(10_000, 500, seed=3)
    np.testing.assert_array_equal(idx, LocalModel.variogram_subsample(10_000, 500, seed=3))
    assert not np.array_equal(idx, LocalModel.variogram_subsample(10_000, 500, seed=4))
    assert idx.size == np.unique(idx).size == 500 and np.all(np.diff(idx) > 0) and 0 <= idx[0] and idx[-1] < 10_000
    assert LocalModel.variogram_subsample(500, 500, seed=0) is None
    assert LocalModel.variogram_subsample(10_000, None, seed=0) is None
    with pytest.raises(ValueError, match="at least 2 points"):
        LocalModel.variogram_subsample(10, 1, seed=0)


def test_subsampled_semivariogram_tracks_the_all_pairs_one():
    """With half the points (a quarter of the pairs) each short-lag bin's mean ½(e_i − e_k)², the semivariogram
    estimate, stays within 15 % of the all-pairs value (measured ≤ 9 % over 3 data sets × 5 subsample seeds)."""
    kernel, knots = Matern(0.5), grid_knots(5, 0.0, 1.0)
    edges = starting.variogram_edges(starting.domain_diameter(knots))
    parts = simulate_parts(J=2, n=1000, p=2, nu=0.5, sigma2=1.0, beta=0.1, delta=4.0, seed=1)
    models = [LocalModel(*pt, knots, kernel, "pp") for pt in parts]
    gamma = starting.pooled_ols([lm.moments() for lm in models])[0]

    def pooled(cap, seed=0):
        xs = [lm.variogram(gamma, edges, max_points=cap, seed=seed) for lm in models]
        return sum(x["sum_sq"] for x in xs), sum(x["count"] for x in xs)

    full_sq, full_n = pooled(None)
    for seed in range(3):
        sq, n = pooled(500, seed)
        assert n.sum() <= 2 * 500 * 499 / 2
        short = slice(0, 8)  # bins of h < 0.3, where the fit's information is (β = 0.1)
        np.testing.assert_allclose((sq / n)[short], (full_sq / full_n)[short], rtol=0.15)


def test_pairs_closer_than_the_first_edge_are_dropped_for_any_row_block():
    """Edges from 0.1: a pair nearer than edges[0] is in no bin (like one beyond edges[-1]); one-row blocks give the
    all-pairs sums (mutation run of model/variogram.py, 27 Nov)."""
    locs = np.array([[0.0, 0.0], [0.05, 0.0], [0.5, 0.0], [0.5, 0.3], [2.0, 2.0]])
    e = np.array([1.0, -1.0, 2.0, 0.5, 3.0])
    edges = np.array([0.1, 0.4, 0.8])
    d = cdist(locs, locs)
    i, k = np.triu_indices(5, 1)
    want_sum, want_count = np.zeros(2), np.zeros(2)
    for a, b in zip(i, k):
        bin_ = np.searchsorted(edges, d[a, b], side="right") - 1
        if 0 <= bin_ < 2:
            want_sum[bin_] += 0.5 * (e[a] - e[b]) ** 2
            want_count[bin_] += 1
    for block in (1, 2, 256):
        got_sum, got_count = binned_semivariogram(locs, e, edges, block=block)
        np.testing.assert_allclose(got_sum, want_sum, rtol=1e-14)
        np.testing.assert_array_equal(got_count, want_count)
