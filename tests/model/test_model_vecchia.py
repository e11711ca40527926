"""The Vecchia residual (SPEC §2c, issue 29): with every earlier point as neighbours it is the full residual; its
derivatives are those of its own statistics; its message and memory do not grow with n_j; kriging on the k nearest
points is the dense kriging when k covers the site."""

import numpy as np
import pytest
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist

from spatialfed.model import vecchia
from spatialfed.model.local import resolve_residual
from spatialfed.model.stats import PAIRS, message_size, site_statistics, stats_flops
from spatialfed.model.vecchia_order import VECCHIA_AUTO_N, coord_order, maxmin_order, ordered_neighbours, vecchia_plan
from support import one_site

KEYS = ("S", "dS", "d2S", "d", "dd", "d2d")


def make(n=70, m=9, residual="vecchia", nu=0.5, seed=0, **kw):
    return one_site(n, m, residual, nu, seed, **kw)


def rel(a, b) -> float:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.mark.parametrize("ordering", ["maxmin", "coord"])
@pytest.mark.parametrize("nu", [0.5, 1.5, 0.8])
def test_every_earlier_point_gives_the_full_statistics(ordering, nu):
    full, par = make(residual="full", nu=nu)
    vec, _ = make(nu=nu, vecchia_k=full.n - 1, vecchia_ordering=ordering)
    a, b = site_statistics(full, par), site_statistics(vec, par)
    for key in KEYS:
        assert rel(b[key], a[key]) < 1e-8, key
    np.testing.assert_array_equal(b["c"], a["c"])


def test_every_earlier_point_gives_the_full_block_quantities():
    """mu_sigma, gamma and value through the Vecchia whitened data equal the dense ones (k = n − 1)."""
    full, par = make(residual="full")
    vec, _ = make(vecchia_k=full.n - 1)
    for step in ("mu_sigma", "gamma", "value"):
        a, b = full.quantity(step, par), vec.quantity(step, par)
        for key in a:
            assert rel(b[key], a[key]) < 1e-8, (step, key)


@pytest.mark.parametrize("nu", [0.5, 2.5])
def test_derivatives_match_central_differences(nu):
    """∂S, ∂²S, ∂d, ∂²d of the Vecchia statistics (k = 5 ≪ n: not the full residual's) against central differences
    of its own S, d and ∂S, ∂d."""
    lm, par = make(n=60, nu=nu, vecchia_k=5)
    u, h = par.u, 1e-5
    st = site_statistics(lm, u)
    assert rel(site_statistics(make(n=60, nu=nu, residual="full")[0], u)["S"], st["S"]) > 1e-6  # an approximation
    for a in range(3):
        e = np.zeros(3)
        e[a] = h
        up, dn = site_statistics(lm, u + e), site_statistics(lm, u - e)
        assert rel((up["S"] - dn["S"]) / (2 * h), st["dS"][a]) < 1e-6, a
        assert abs((up["d"] - dn["d"]) / (2 * h) - st["dd"][a]) < 1e-6 * np.abs(st["dd"]).max(), a
        for b in range(3):
            p = PAIRS.index((min(a, b), max(a, b)))
            assert rel((up["dS"][b] - dn["dS"][b]) / (2 * h), st["d2S"][p]) < 1e-6, (a, b)
            assert abs((up["dd"][b] - dn["dd"][b]) / (2 * h) - st["d2d"][p]) < 1e-6 * np.abs(st["d2d"]).max()


def test_exact_scaling_direction_holds():
    """R(u + s·c) = e^{−s}R(u) for c = (1, −1, 0): the Vecchia S scales by e^{s} exactly, as the server assumes."""
    lm, par = make(vecchia_k=4)
    s = 0.3
    a, b = site_statistics(lm, par.u), site_statistics(lm, par.u + s * np.array([1.0, -1.0, 0.0]))
    assert rel(b["S"], np.exp(s) * a["S"]) < 1e-10


def test_message_size_and_kept_memory_do_not_grow_with_n():
    small, par = make(n=40, vecchia_k=6)
    large, _ = make(n=400, vecchia_k=6)
    assert message_size(site_statistics(small, par)) == message_size(site_statistics(large, par))
    for lm in (small, large):
        lm.quantity("mu_sigma", par)
        assert all(arr.size < lm.n * 20 for arr in lm.cached_arrays())  # O(n_j(k + m + p)): no n_j × n_j array
        lm.clear_cache()
        assert lm.cached_nbytes() == lm.vecchia_plan.nbytes  # the neighbours stay (locations only)


@pytest.mark.parametrize("ordering", ["maxmin", "coord"])
def test_neighbours_are_the_nearest_earlier_points(ordering):
    rng = np.random.default_rng(3)
    locs = rng.uniform(size=(3000, 2))
    plan = vecchia_plan(locs, 7, ordering)
    assert np.array_equal(np.sort(plan.order), np.arange(3000))
    pos = np.empty(3000, dtype=int)
    pos[plan.order] = np.arange(3000)
    for i in (0, 1, 5, 100, 1500, 2999):  # brute force at a few positions (the search blocks at 1024 positions)
        earlier = plan.order[:i]
        d = cdist(locs[plan.order[i]][None], locs[earlier])[0]
        want = earlier[np.argsort(d)[: min(7, i)]]
        got = plan.nbrs[i][plan.nbrs[i] >= 0]
        assert set(got) == set(want), i
        assert np.all(pos[got] < i)


def test_blocked_search_equals_one_block():
    rng = np.random.default_rng(4)
    locs_o = rng.uniform(size=(2500, 2))[maxmin_order(rng.uniform(size=(2500, 2)))]
    np.testing.assert_array_equal(np.sort(ordered_neighbours(locs_o, 9, block=200), 1),
                                  np.sort(ordered_neighbours(locs_o, 9, block=10**6), 1))


def test_maxmin_starts_coarse():
    """The first points of the max-min ordering are spread out: the 16th is farther from the first 15 than a typical
    nearest-neighbour distance of the whole set."""
    locs = np.random.default_rng(5).uniform(size=(4000, 2))
    order = maxmin_order(locs)
    assert cdist(locs[order[15]][None], locs[order[:15]]).min() > 0.08  # typical spacing 1/√4000 ≈ 0.016


def test_kriging_on_every_point_is_the_dense_kriging():
    full, par = make(residual="full")
    vec, _ = make(vecchia_k=full.n)
    locs0 = np.random.default_rng(9).uniform(size=(11, 2))
    a, b = full.residual_kriging(locs0, par), vec.residual_kriging(locs0, par)
    for key in a:
        assert rel(b[key], a[key]) < 1e-8, key


def test_prediction_conditions_on_predict_factor_times_k_neighbours():
    from spatialfed.model import vecchia
    from spatialfed.model.vecchia_order import PREDICT_FACTOR

    vec, par = make(vecchia_k=5)
    locs0 = np.random.default_rng(9).uniform(size=(11, 2))
    got = vec.residual_kriging(locs0, par)
    for k, same in ((PREDICT_FACTOR * 5, True), (5, False)):
        want = vecchia.kriging(vec, locs0, par, k, vec._tree)
        assert all(rel(got[key], want[key]) < 1e-12 for key in got) is same, k


def test_block_theta_is_refused_in_one_line():
    lm, par = make(vecchia_k=5)
    with pytest.raises(ValueError, match="strategies='stats'"):
        lm.theta(par)


def test_auto_is_full_for_small_sites_and_vecchia_above():
    assert resolve_residual("auto", VECCHIA_AUTO_N) == "full"
    assert resolve_residual("auto", VECCHIA_AUTO_N + 1) == "vecchia"
    assert resolve_residual("mpp", 10**6) == "mpp"
    with pytest.raises(ValueError, match="residual must be one of"):
        resolve_residual("vechia", 10)


def test_bad_k_and_ordering_are_refused():
    with pytest.raises(ValueError, match="vecchia_k"):
        make(vecchia_k=0)
    with pytest.raises(ValueError, match="vecchia_ordering"):
        make(vecchia_ordering="hilbert")


def test_a_singular_residual_names_the_cause():
    lm, par = make(n=30, vecchia_k=5)
    lm.locs[3] = lm.locs[2]  # a duplicate location with a vanishing nugget: a zero conditional variance
    with pytest.raises(np.linalg.LinAlgError, match="duplicate locations"):
        site_statistics(lm, par.u + np.array([40.0, 0.0, 0.0]))


def test_batches_do_not_change_the_statistics(monkeypatch):
    lm, par = make(n=120, vecchia_k=6)
    one = site_statistics(lm, par)
    monkeypatch.setattr(vecchia, "BATCH_BYTES", 1)  # 16 points per batch
    many = site_statistics(lm, par)
    for key in KEYS:
        assert rel(many[key], one[key]) < 1e-11, key


def test_the_virtual_clock_charges_the_vecchia_cost():
    """stats_flops of the Vecchia residual: linear in n_j, about (k+1)² per point in its local products, charged with
    the site's own k; it crosses the full residual's between 500 and 2,000 points (measured: near 1,000)."""
    from spatialfed.algorithm.protocol import Augmented
    from spatialfed.runtime.virtual import FlopCost

    assert stats_flops(20_000, 100, 1, "vecchia", 15) == pytest.approx(2 * stats_flops(10_000, 100, 1, "vecchia", 15))
    assert stats_flops(10_000, 100, 1, "vecchia", 30) > 2 * stats_flops(10_000, 100, 1, "vecchia", 10)
    assert stats_flops(500, 100, 1, "vecchia", 15) > stats_flops(500, 100, 1, "full")
    assert stats_flops(2_000, 100, 1, "vecchia", 15) < stats_flops(2_000, 100, 1, "full")
    assert stats_flops(5_000, 100, 1, "vecchia", 15) < 0.05 * stats_flops(5_000, 100, 1, "full")
    lm5, par = make(n=200, vecchia_k=5)
    lm30, _ = make(n=200, vecchia_k=30)
    p = Augmented(par, 0, "stats")
    assert FlopCost().seconds(lm30, p, 0.0) > 3 * FlopCost().seconds(lm5, p, 0.0)


# --- edges the mutation run of model/vecchia.py (27 Nov) found unguarded (docs/contributing.md) ---------------------

def test_row_chunks_and_batches_do_not_change_the_basis_the_whitened_data_or_the_kriging(monkeypatch):
    """KnotFactors in row chunks (with and without derivatives), the whitened data (log det R and L⁻¹[B X z]) and the
    kriging in batches of 16 points give what one chunk and one batch give."""
    lm, par = make(n=70, vecchia_k=5)
    locs0 = np.random.default_rng(3).uniform(size=(40, 2))

    def answers():
        lm.clear_cache()
        kfs = [vecchia.KnotFactors(lm.kernel, lm.d_K, lm.locs, lm.knots, par.beta, derivatives=d) for d in (0, 1)]
        return ([kf.F for kf in kfs] + [kfs[1].FH, kfs[1].Fd], {"f": lm.value(par), **lm.mu_sigma(par)},
                lm.residual_kriging(locs0, par))

    one = answers()
    monkeypatch.setattr(vecchia, "ROW_CHUNK", 16)
    monkeypatch.setattr(vecchia, "BATCH_BYTES", 1)  # 16 points per batch
    many = answers()
    for a, b in zip(one[0], many[0]):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-14)
    for part in (1, 2):
        for key in one[part]:
            assert rel(many[part][key], one[part][key]) < 1e-11, key


def test_a_singular_residual_is_named_on_the_whitened_route_too():
    lm, par = make(n=30, vecchia_k=5)
    lm.locs[3] = lm.locs[2]
    with pytest.raises(np.linalg.LinAlgError, match="duplicate locations"):
        lm.value(par.with_u(par.u + np.array([40.0, 0.0, 0.0])))


@pytest.mark.parametrize("route", ["statistics", "whitened"])
def test_an_exactly_singular_neighbour_set_is_named_like_a_zero_conditional_variance(route):
    """Three points at one location: a later point conditioned on two of them has an exactly singular R_NN (the
    solve fails before any conditional variance exists), named as the zero conditional variance is."""
    lm, par = make(n=30, vecchia_k=5)
    lm.locs[3:5] = lm.locs[2]
    u = par.u + np.array([40.0, 0.0, 0.0])
    with pytest.raises(np.linalg.LinAlgError, match="singular or non-positive conditional variance.*duplicate"):
        site_statistics(lm, u) if route == "statistics" else lm.value(par.with_u(u))


# --- edges the mutation run of the rewritten `kriging` (27 Nov) found unguarded (docs/contributing.md) -------------

def test_kriging_on_one_neighbour_is_the_dense_kriging_from_the_nearest_point():
    from spatialfed.model.local import LocalModel

    vec, par = make(n=40, vecchia_k=5)
    for s0 in np.array([[0.3, 0.4], [0.71, 0.12]]):
        i = int(np.argmin(np.hypot(*(vec.locs - s0).T)))
        alone = LocalModel(vec.locs[[i]], vec.z[[i]], vec.X[[i]], vec.knots, vec.kernel, "full")
        want, got = alone.residual_kriging(s0[None], par), vecchia.kriging(vec, s0[None], par, 1, cKDTree(vec.locs))
        for key in want:
            assert rel(got[key], want[key]) < 1e-10, key


def test_kriging_of_the_independence_model_on_every_point_is_the_dense_kriging():
    full, par = make(n=40, m=0, residual="full")
    vec, _ = make(n=40, m=0, vecchia_k=5)
    locs0 = np.random.default_rng(9).uniform(size=(7, 2))
    want, got = full.residual_kriging(locs0, par), vecchia.kriging(vec, locs0, par, 40, cKDTree(vec.locs))
    assert got["BRk"].shape == (7, 0)
    for key in ("mean", "kRk"):
        assert rel(got[key], want[key]) < 1e-8, key


def test_the_vecchia_routes_name_the_knot_matrix_they_jitter():
    import warnings

    from spatialfed.model.linalg import JitterWarning
    from spatialfed.model.local import LocalModel
    from spatialfed.model.matern import Matern
    from spatialfed.model.params import Params

    lm, par = make(n=40, vecchia_k=5)
    close = np.vstack([lm.knots, lm.knots[:1] + 1e-9])  # a near-duplicate knot: K singular for a smooth kernel
    m = close.shape[0]
    vec = LocalModel(lm.locs, lm.z, lm.X, close, Matern(2.5), "vecchia", vecchia_k=5)
    p2 = Params(np.zeros(m), np.eye(m), par.gamma, par.delta, par.sigma2, par.beta)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        site_statistics(vec, p2)
        vecchia.kriging(vec, np.array([[0.3, 0.4]]), p2, 5, cKDTree(vec.locs))
    jitter = [str(w.message) for w in caught if issubclass(w.category, JitterWarning)]
    assert len(jitter) >= 2
    assert all(msg.startswith("the knot correlation matrix K is numerically singular") for msg in jitter), jitter


# --- edges the mutation run of model/vecchia_order.py (27 Nov) found unguarded (docs/contributing.md) ---------------

def brute_neighbours(locs_o, k):
    """(n, k) positions of the ≤ k nearest earlier positions, nearest first, −1 padded: by brute force."""
    n = len(locs_o)
    out = np.full((n, k), -1)
    for i in range(1, n):
        d = cdist(locs_o[i][None], locs_o[:i])[0]
        near = np.argsort(d)[:k]
        out[i, : len(near)] = near
    return out


def test_maxmin_levels_are_the_points_nearest_the_centres_of_cells_without_an_earlier_point():
    """Level l of the ordering (on 2^l × 2^l cells of the bounding square, scaled to [0, 1)) is, as a set, the point
    nearest the centre of each cell that holds no point of an earlier level; within a level the order is seeded."""
    rng = np.random.default_rng(11)
    locs = np.column_stack([rng.uniform(3.0, 5.0, 60), rng.uniform(-7.0, -6.0, 60)])  # x-span ≈ 2, y-span ≈ 1
    order = maxmin_order(locs)
    lo = locs.min(axis=0)
    x = (locs - lo) / np.max(locs.max(axis=0) - lo) * (1.0 - 1e-12)  # the larger span (x's, about 2)
    taken, start = np.zeros(60, dtype=bool), 0
    for level in range(8):
        g = 2**level
        cells = np.floor(x * g).astype(int)
        cid = cells[:, 0] * g + cells[:, 1]
        want = set()
        for c in set(cid[~taken]) - set(cid[taken]):
            members = np.flatnonzero((cid == c) & ~taken)
            centre = (cells[members[0]] + 0.5) / g
            want.add(int(members[np.argmin(np.sum((x[members] - centre) ** 2, axis=1))]))
        got = set(order[start : start + len(want)].tolist())
        assert got == want, level
        taken[list(want)] = True
        start += len(want)
    assert start == 60 and np.array_equal(np.sort(order), np.arange(60))


def test_orderings_by_name_with_the_default_seed_and_coord_by_x_then_y():
    rng = np.random.default_rng(12)
    locs = np.column_stack([rng.integers(0, 4, 30).astype(float), rng.uniform(size=30)])  # ties in x
    order = coord_order(locs)
    assert np.all(np.diff(locs[order, 0]) >= 0)
    same_x = np.diff(locs[order, 0]) == 0
    assert np.all(np.diff(locs[order, 1])[same_x] > 0)
    mm = maxmin_order(locs, 0)
    assert np.array_equal(maxmin_order(locs), mm) and np.array_equal(maxmin_order(locs), mm)
    assert not np.array_equal(maxmin_order(locs, 1), mm)
    assert np.array_equal(vecchia_plan(locs, 3).order, mm)
    assert np.array_equal(vecchia_plan(locs, 3, "maxmin").order, mm)
    assert np.array_equal(vecchia_plan(locs, 3, "coord").order, order)


def test_k_is_capped_at_the_earlier_points_and_missing_neighbours_are_minus_one():
    from spatialfed.model.vecchia_order import check_k

    rng = np.random.default_rng(13)
    assert vecchia_plan(rng.uniform(size=(5, 2)), 15).k == 4
    assert vecchia_plan(rng.uniform(size=(2, 2)), 15).k == 1
    plan = vecchia_plan(rng.uniform(size=(12, 2)), 4)
    assert [int(np.sum(row >= 0)) for row in plan.nbrs] == [0, 1, 2, 3] + [4] * 8
    assert set(plan.nbrs[plan.nbrs < 0].tolist()) == {-1}
    assert check_k(1) == 1 and check_k(4.0) == 4
    for bad in (True, 2.5, 0):
        with pytest.raises(ValueError, match="vecchia_k"):
            check_k(bad)


@pytest.mark.parametrize("block", [1, 2, 3, 7, 1024])
def test_ordered_neighbours_are_the_brute_force_ones_for_any_block(block):
    """Blocks of up to `block` positions are searched exactly; beyond, among the 3k + 1 nearest of the block, which
    here (n = 40, k = 3) covers every block."""
    locs_o = np.random.default_rng(14).uniform(size=(40, 2))
    np.testing.assert_array_equal(ordered_neighbours(locs_o, 3, block=block), brute_neighbours(locs_o, 3))
