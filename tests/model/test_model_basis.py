"""The knot basis (model/basis.py): the knots' checks name the knots, and a jittered ρ_K is the matrix factorised.

Found unguarded by the mutation run of model/basis.py (27 Nov, docs/contributing.md); the basis' values and derivatives
are checked through the statistics (test_model_stats.py) and the dense reference (test_model_reference.py).
"""

import warnings

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from spatialfed.model.basis import KnotBasis, check_knots
from spatialfed.model.linalg import JitterWarning
from spatialfed.model.matern import Matern


def test_check_knots_names_the_knots_and_a_point_that_is_duplicated():
    with pytest.raises(ValueError, match="^knots contains 1 non-finite"):
        check_knots([[0.0, 0.0], [0.5, np.nan]])
    with pytest.raises(ValueError, match=r"knots contain 2 duplicate point\(s\), e\.g\. \[1\.0, 1\.0\]"):
        check_knots([[0.0, 0.0], [1.0, 1.0], [0.5, 0.2], [1.0, 1.0], [1.0, 1.0]])
    assert check_knots(np.zeros((0, 2))).shape == (0, 2)


def test_a_jittered_knot_matrix_is_the_one_factorised_and_named_in_the_warning():
    g = np.linspace(0.1, 0.9, 3)
    knots = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    knots = np.vstack([knots, knots[:1] + 1e-9])  # a near-duplicate knot: ρ_K singular for a smooth kernel
    locs = np.random.default_rng(0).uniform(size=(20, 2))
    kernel, d_K = Matern(2.5), cdist(knots, knots)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kb = KnotBasis(kernel, d_K, locs, knots, 0.2)
    assert kb.jitter > 0
    messages = [str(w.message) for w in caught if issubclass(w.category, JitterWarning)]
    assert messages and all(m.startswith("the knot correlation matrix K is numerically singular") for m in messages)
    want = kernel.correlation(d_K, 0.2) + kb.jitter * np.eye(len(knots))
    np.testing.assert_allclose(kb.rK, want, rtol=0, atol=1e-15)
    np.testing.assert_allclose(kb.LK @ kb.LK.T, kb.rK, rtol=0, atol=1e-12)


@pytest.mark.parametrize("nu", [0.5, 1.5])
def test_residual_covariance_by_row_blocks_is_the_formula(nu):
    """More rows than one block (ROW_BLOCK = 512): σ²(ρ(a, b) − ρ(a, S*) ρ_K⁻¹ ρ(S*, b)) entry by entry, to rounding."""
    from scipy.spatial.distance import cdist

    from spatialfed.model.basis import ROW_BLOCK, residual_covariance

    rng = np.random.default_rng(5)
    a, b, knots = rng.uniform(size=(2 * ROW_BLOCK + 77, 2)), rng.uniform(size=(300, 2)), rng.uniform(size=(16, 2))
    kernel, beta, sigma2 = Matern(nu), 0.3, 1.7
    rho = lambda x, y: kernel.correlation(cdist(x, y), beta)  # noqa: E731
    expected = sigma2 * (rho(a, b) - rho(a, knots) @ np.linalg.solve(rho(knots, knots), rho(knots, b)))
    np.testing.assert_allclose(residual_covariance(kernel, knots, beta, sigma2, a, b), expected, rtol=0, atol=1e-10)
    np.testing.assert_allclose(residual_covariance(kernel, np.empty((0, 2)), beta, sigma2, a, b), sigma2 * rho(a, b),
                               rtol=0, atol=1e-14)
