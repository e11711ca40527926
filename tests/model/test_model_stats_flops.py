"""stats_flops (the virtual clock's cost of a statistics answer) against the operations site_statistics performs.

The dominant operations are counted while site_statistics runs: every LAPACK Cholesky (potrf, n³/3) and inverse from
a factor (potri, 2n³/3), and every product site_statistics forms through the linalg helpers `apply`/`matmul`
(a×b by b×c: 2abc; a diagonal operator: ab). For the full residual these hold all the n³ terms; the count then
agrees with stats_flops to the few per cent of the n²·(m + k) terms left uncounted, while a wrong n³ coefficient
(e.g. the Cholesky's n³/3 written n³: +22 %) does not.
"""

import numpy as np
import pytest
from scipy.linalg import lapack

from spatialfed.model import stats as stats_mod
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.stats import VECCHIA_RATE_FACTOR, site_statistics, stats_flops


def product_flops(A, C) -> float:
    A, C = np.asarray(A), np.asarray(C)
    if A.ndim == 1 or C.ndim == 1:  # a diagonal operator scales rows or columns
        return float(np.size(C) if A.ndim == 1 else np.size(A))
    cols = C.shape[1] if C.ndim == 2 else 1
    return 2.0 * A.shape[0] * A.shape[1] * cols


@pytest.fixture()
def counted(monkeypatch):
    """A list that collects (what, flops) of every counted operation while the fixture is active."""
    ops = []
    potrf, potri = lapack.dpotrf, lapack.dpotri

    def dpotrf(a, *args, **kw):
        ops.append(("potrf", np.shape(a)[0] ** 3 / 3))
        return potrf(a, *args, **kw)

    def dpotri(c, *args, **kw):
        ops.append(("potri", 2 * np.shape(c)[0] ** 3 / 3))
        return potri(c, *args, **kw)

    monkeypatch.setattr(lapack, "dpotrf", dpotrf)
    monkeypatch.setattr(lapack, "dpotri", dpotri)
    for name in ("apply", "matmul"):
        helper = getattr(stats_mod, name)

        def wrapped(A, C, _helper=helper, _name=name):
            ops.append((_name, product_flops(A, C)))
            return _helper(A, C)

        monkeypatch.setattr(stats_mod, name, wrapped)
    return ops


def local_model(n, m_side, p, residual, seed=0):
    rng = np.random.default_rng(seed)
    g = (np.arange(m_side) + 0.5) / m_side
    knots = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    X = rng.standard_normal((n, p))
    return LocalModel(rng.uniform(size=(n, 2)), rng.standard_normal(n), X, knots, Matern(0.5), residual)


def test_full_residual_flops_match_the_counted_operations(counted):
    n, m_side, p = 500, 2, 1
    lm = local_model(n, m_side, p, "full")
    site_statistics(lm, np.log([4.0, 1.0, 0.1]))
    big = [k for k, f in counted if k.startswith("pot") and f >= n**3 / 3]  # (the m×m knot factor is not)
    assert big == ["potrf", "potri"]  # one factorisation and one inverse of R_j
    cubic = [f for k, f in counted if f >= n**3 / 3]  # potrf, potri and the one n×n by n×n product (PR_β)
    assert sum(cubic) == pytest.approx(3.0 * n**3)
    total = sum(f for _, f in counted)
    predicted = stats_flops(n, m_side**2, p, "full")
    assert predicted == pytest.approx(total, rel=0.08), (predicted, total)


def test_flops_grow_as_the_operations_do():
    """n³ for the full residual (R_j is dense), n for mpp and pp (diagonal R_j: products with n×k blocks)."""
    for residual, power in (("full", 3), ("mpp", 1), ("pp", 1)):
        ratio = stats_flops(20_000, 16, 3, residual) / stats_flops(10_000, 16, 3, residual)
        assert ratio == pytest.approx(2.0**power, rel=1e-2), residual
    # the leading coefficient of the full residual: potrf n³/3 + potri 2n³/3 + one n×n product 2n³
    assert stats_flops(10**6, 16, 3, "full") / 1e18 == pytest.approx(3.0, rel=1e-3)
    k = 16 + 3 + 1
    assert stats_flops(10**6, 16, 3, "mpp") == pytest.approx(1e6 * (14 * 16**2 + 28 * k * k), rel=1e-12)


@pytest.mark.parametrize("n, m, p", [(7, 3, 2), (50, 16, 1)])
def test_flops_are_the_sum_of_the_listed_operations(n, m, p):
    """Every term, at sizes where the lower-order ones matter: a×b by b×c costs 2abc."""
    k = m + p + 1
    product = lambda a, b, c: 2.0 * a * b * c  # noqa: E731
    grams = 14 * product(n, k, k)  # n×k by k×k Gram products
    full = (product(n, m, n)       # R_j = σ²(C − BKBᵀ) + εI: an n×m by m×n product
            + n**3 / 3 + 2 * n**3 / 3  # potrf, potri
            + product(n, n, n)     # PR_β
            + 7 * product(n, n, k)  # P, R_β against the n×k blocks
            + grams)
    diagonal = product(n, m, m) + 6 * product(n, m, m) + grams  # R_j's diagonal and the m×m blocks of the basis
    assert stats_flops(n, m, p, "full") == pytest.approx(full, rel=1e-12)
    for residual in ("mpp", "pp"):
        assert stats_flops(n, m, p, residual) == pytest.approx(diagonal, rel=1e-12)


@pytest.mark.parametrize("n, m, p, k", [(50, 7, 2, 5), (3, 4, 1, 15), (2, 4, 1, 15), (1, 3, 0, 15)])
def test_vecchia_flops_are_the_sum_of_the_listed_operations(n, m, p, k):
    """The Vecchia cost term by term, per point with c = the point and its neighbours (at most the n − 1 earlier
    points, at least one): a wrong coefficient, c off by one or the cap at small n misread changes the clock."""
    q = m + p + 1
    c = min(k, max(n - 1, 1)) + 1
    per_point = (4 * 2.0 * c * m * c          # four c×m by m×c products
                 + 3 * (2.0 / 3.0) * (c - 1) ** 3  # three LU factorisations of the k × k neighbour block
                 + 40.0 * c * c + 8.0 * c * m  # the solves' right-hand sides, the local kernel
                 + 20.0 * c * q               # 10 × c by c × q coefficients
                 + 10.0 * m * m + 19 * 2.0 * q * q)  # 19 rank-one q × q Gram terms
    want = VECCHIA_RATE_FACTOR * (12.0 * n * m * m + n * per_point)  # the whitened knot basis, then each point
    assert stats_flops(n, m, p, "vecchia", k) == pytest.approx(want, rel=1e-12)
