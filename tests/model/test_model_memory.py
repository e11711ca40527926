"""Memory bounds of a worker's LocalModel (issue 14): nothing n_j × n_j outlives a fit request, at most one
factorisation is kept (for prediction), and the blockwise full-residual computations equal the unblocked ones."""

import tracemalloc

import numpy as np
import pytest

import spatialfed.model.dense as dense
from spatialfed.model.dense import column_blocks, fill_upper
from spatialfed.model.stats import site_statistics
from support import one_site

RESIDUALS = ["full", "mpp", "pp"]


def make(n=240, m=9, residual="full", nu=0.5, seed=0):
    return one_site(n, m, residual, nu, seed)


def n_by_n(lm):
    return [a for a in lm.cached_arrays() if a.size >= lm.n * lm.n]


@pytest.mark.parametrize("residual", RESIDUALS)
def test_fit_requests_keep_no_n_by_n_array(residual):
    lm, par = make(residual=residual)
    for step in ("mu_sigma", "gamma", "theta", "value"):
        lm.quantity(step, par)
        assert n_by_n(lm) == []
    site_statistics(lm, par.with_u(par.u + 0.05))
    assert n_by_n(lm) == []
    # what stays is O(n_j (m + p)): the whitened [B, X, z] of the latest θ
    assert lm.cached_nbytes() <= 8 * lm.n * (lm.m + lm.p + 1)


def test_prediction_keeps_at_most_one_factorisation():
    lm, par = make()
    locs0 = np.random.default_rng(1).uniform(size=(5, 2))
    lm.residual_kriging(locs0, par)
    assert len(n_by_n(lm)) == 1
    lm.residual_kriging(locs0, par.with_u(par.u + 0.1))  # another θ replaces it
    assert len(n_by_n(lm)) == 1
    lm.theta(par)  # a fit request at another θ drops it
    assert n_by_n(lm) == []


@pytest.mark.parametrize("request_", ["theta", "stats"])
def test_full_theta_peak_is_three_n_by_n_arrays(monkeypatch, request_):
    """tracemalloc peak of one theta (or statistics) request, blocks of 32 columns: R⁻¹, W_b and R⁻¹W_b, with
    the O(n_j (m + p)) and block temporaries under half an n_j × n_j array more."""
    lm, par = make(n=900)
    monkeypatch.setattr(dense, "BLOCK_BYTES", 8 * lm.n * 32)
    run = (lambda: lm.theta(par)) if request_ == "theta" else (lambda: site_statistics(lm, par))
    run()  # warm caches of imports
    lm.clear_cache()
    tracemalloc.start()
    try:
        run()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= 3.5 * 8 * lm.n**2, peak / (8 * lm.n**2)


@pytest.mark.parametrize("nu", [0.5, 1.5, 0.8])
def test_blockwise_equals_one_block(monkeypatch, nu):
    """Many small column blocks give the same theta quantities and statistics as one block (rtol 1e-10)."""
    lm, par = make(n=150, nu=nu)
    one = (lm.theta(par), site_statistics(lm, par))
    monkeypatch.setattr(dense, "BLOCK_BYTES", 1)  # 16 columns per block
    assert len(list(column_blocks(lm.n))) == 10
    lm.clear_cache()
    many = (lm.theta(par), site_statistics(lm, par))
    for a, b in zip(one, many):
        for key in a:
            np.testing.assert_allclose(np.asarray(b[key], float), np.asarray(a[key], float), rtol=1e-10,
                                       atol=1e-12 * max(1.0, float(np.max(np.abs(a[key])))))


def test_fill_upper_symmetrises_in_place(monkeypatch):
    monkeypatch.setattr(dense, "BLOCK_BYTES", 1)
    A = np.asfortranarray(np.random.default_rng(2).standard_normal((50, 50)))
    lower = np.tril(A)
    out = fill_upper(A)
    assert out is A
    np.testing.assert_array_equal(A, lower + np.tril(lower, -1).T)


# --- edges the mutation run of model/dense.py (27 Nov) found unguarded (docs/contributing.md) -----------------------

def test_column_blocks_are_the_byte_budget_over_the_height():
    """Each block is block_bytes / (8 · height) columns (at least 16), height defaulting to n."""
    def widths(*args, **kw):
        return [c.stop - c.start for c in column_blocks(*args, **kw)]

    assert widths(100, 8 * 20 * 50, height=50) == [20] * 5
    assert widths(100, 8 * 20 * 100) == [20] * 5  # height = n
    assert widths(100, 8 * 20, height=1) == [20] * 5
    assert widths(100, 8, height=50) == [16] * 6 + [4]  # never fewer than 16 columns
    assert widths(40) == [40]  # BLOCK_BYTES by default


def test_the_full_residual_is_factorised_and_inverted_in_its_own_storage():
    """R_j is built in Fortran order so that potrf and potri work in place: one n_j × n_j array, not three."""
    from spatialfed.model.linalg import DenseFactor

    lm, par = make(n=60)
    kb = lm.factorise(par, whiten=False).kb
    R = dense.dense_residual(lm, kb, par.sigma2, 1.0 / par.delta)
    assert R.flags.f_contiguous
    want = np.linalg.inv(np.tril(R) + np.tril(R, -1).T)
    factor = DenseFactor(R, "R")
    assert np.shares_memory(factor.L, R)
    inv = dense.inverse_in_place(factor)
    assert factor.L is None and np.shares_memory(inv, R)
    np.testing.assert_allclose(inv, want, rtol=1e-9, atol=1e-12)
