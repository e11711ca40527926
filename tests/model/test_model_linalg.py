"""The dense/diagonal operator helpers and the two residual factors, each against plain numpy on the dense matrix.

Every helper takes an operator either as an (n, n) array or, when diagonal, as its (n,) diagonal; each is checked in
every combination against the same formula on `np.diag(d)`, so a diagonal operator applied on the wrong side (or
divided instead of multiplied) is seen. The jitter policy is checked on a matrix whose smallest pivot is tiny relative
to its scale: the threshold and the jitter are both relative to mean(diag A).
"""

import numpy as np
import pytest

from spatialfed.model.linalg import (
    DenseFactor,
    DiagFactor,
    JitterWarning,
    apply,
    cholesky_with_jitter,
    inner,
    matmul,
)


def spd(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    B = rng.normal(size=(n, n))
    return B @ B.T + n * np.eye(n)


def operands(seed: int = 1):
    rng = np.random.default_rng(seed)
    d1, d2 = rng.uniform(0.5, 2.0, 4), rng.uniform(0.5, 2.0, 4)
    M1, M2 = rng.normal(size=(4, 4)), rng.normal(size=(4, 4))
    return [(d1, np.diag(d1)), (M1, M1)], [(d2, np.diag(d2)), (M2, M2)]


def test_apply_scales_rows_of_a_matrix_and_entries_of_a_vector():
    rng = np.random.default_rng(2)
    d, M = rng.uniform(0.5, 2.0, 4), rng.normal(size=(4, 4))
    X, x = rng.normal(size=(4, 3)), rng.normal(size=4)
    np.testing.assert_allclose(apply(d, X), np.diag(d) @ X, rtol=1e-14)
    np.testing.assert_allclose(apply(d, x), np.diag(d) @ x, rtol=1e-14)
    assert apply(d, x).shape == (4,)
    np.testing.assert_allclose(apply(M, X), M @ X, rtol=1e-14)


def test_inner_and_matmul_of_diagonal_and_dense_operators_equal_the_dense_formulas():
    left, right = operands()
    for A, Ad in left:
        for C, Cd in right:
            assert inner(A, C) == pytest.approx(np.trace(Ad.T @ Cd), rel=1e-12)
            np.testing.assert_allclose(np.diag(matmul(A, C)) if A.ndim == C.ndim == 1 else matmul(A, C),
                                       Ad @ Cd, rtol=1e-12, atol=1e-14)
            assert matmul(A, C).ndim == (1 if A.ndim == C.ndim == 1 else 2)


def test_cholesky_with_jitter_is_exact_when_well_posed_and_empty_for_no_knots():
    A = spd(5)
    L, tau = cholesky_with_jitter(A, "K")
    assert tau == 0.0
    np.testing.assert_allclose(L @ L.T, A, rtol=1e-12)
    assert np.all(np.triu(L, 1) == 0)
    L0, tau0 = cholesky_with_jitter(np.zeros((0, 0)), "K")
    assert L0.shape == (0, 0) and tau0 == 0.0


def test_cholesky_with_jitter_judges_and_jitters_relative_to_the_mean_diagonal():
    # mean(diag A) = 1e8: the pivot 1e-6 is below 1e-7·√1e8 = 1e-3, so τ = 1e-10 adds 1e-2 (pivot 0.1)
    A = np.diag([2e8 - 1e-12, 1e-12])
    with pytest.warns(JitterWarning, match="K is numerically singular.*jitter 1e-10"):
        L, tau = cholesky_with_jitter(A, "K")
    assert tau == 1e-10
    np.testing.assert_allclose(L @ L.T, A + 1e-10 * 1e8 * np.eye(2), rtol=1e-12)


def test_dense_factor_whitens_solves_and_inverts_r_in_its_own_storage():
    R = spd(5)
    X = np.random.default_rng(3).normal(size=(5, 2))
    stored = np.asfortranarray(R.copy())
    f = DenseFactor(stored, "R")
    assert np.shares_memory(f.L, stored)  # factorised in place: no second n × n array
    np.testing.assert_allclose(f.L @ f.L.T, R, rtol=1e-12)
    np.testing.assert_allclose(f.unwhiten_t(f.whiten(X)), np.linalg.solve(R, X), rtol=1e-10)
    np.testing.assert_allclose(f.sqrt_t_times(X), f.L.T @ X, rtol=1e-14)
    assert f.logdet() == pytest.approx(np.linalg.slogdet(R)[1], rel=1e-12)
    np.testing.assert_allclose(f.inverse(), np.linalg.inv(R), rtol=1e-10, atol=1e-14)


def test_diag_factor_is_the_square_root_of_its_diagonal_and_refuses_a_zero_or_negative_entry():
    r = np.array([0.5, 2.0, 4.0])
    X = np.random.default_rng(4).normal(size=(3, 2))
    f = DiagFactor(r, "R")
    np.testing.assert_allclose(f.sqrt_t_times(X), np.sqrt(r)[:, None] * X, rtol=1e-14)
    np.testing.assert_allclose(f.whiten(X), X / np.sqrt(r)[:, None], rtol=1e-14)
    np.testing.assert_allclose(f.inverse(), 1.0 / r, rtol=1e-14)
    assert f.logdet() == pytest.approx(np.log(4.0), rel=1e-12)
    for bad in (np.array([1.0, 0.0]), np.array([1.0, -1.0]), np.array([1.0, np.nan])):
        with pytest.raises(np.linalg.LinAlgError, match="R has non-positive diagonal entries"):
            DiagFactor(bad, "R")
