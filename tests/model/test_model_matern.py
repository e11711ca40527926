"""Matérn kernel (SPEC §1): closed forms, general ν, log-scale derivatives, ranges, bad input."""

import numpy as np
import pytest
from scipy import special

from spatialfed.model.matern import Matern, pairwise_distances

NUS = [0.5, 1.5, 2.5, 0.8]


def bessel_form(nu, d, beta):
    x = np.sqrt(2 * nu) * d / beta
    return 2 ** (1 - nu) / special.gamma(nu) * x**nu * special.kv(nu, x)


@pytest.mark.parametrize("nu", NUS)
def test_correlation_matches_bessel_definition(nu):
    d = np.linspace(0.01, 1.0, 25)
    np.testing.assert_allclose(Matern(nu).correlation(d, 0.2), bessel_form(nu, d, 0.2), rtol=1e-12)
    assert Matern(nu).correlation(np.array([0.0]), 0.2)[0] == 1.0


@pytest.mark.parametrize("nu", NUS)
def test_log_beta_derivatives_against_finite_differences(nu):
    k, beta, h = Matern(nu), 0.3, 1e-4
    d = np.linspace(0.0, 1.5, 31)
    rho, d1, d2 = k.correlation_derivatives(d, beta)
    up, dn = k.correlation(d, beta * np.exp(h)), k.correlation(d, beta * np.exp(-h))
    np.testing.assert_allclose((up - dn) / (2 * h), d1, rtol=1e-6, atol=1e-8)
    d1u, d1d = k.correlation_derivatives(d, beta * np.exp(h))[1], k.correlation_derivatives(d, beta * np.exp(-h))[1]
    np.testing.assert_allclose((d1u - d1d) / (2 * h), d2, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("nu, factor", [(0.5, 2.996), (1.5, 2.739), (2.5, 2.647)])
def test_effective_range_factors_of_spec(nu, factor):
    k = Matern(nu)
    assert k.effective_range_factor() == pytest.approx(factor, abs=1e-3)
    assert k.range_from_beta(k.beta_from_range(0.3)) == pytest.approx(0.3)
    assert k.correlation(np.array([0.3]), k.beta_from_range(0.3))[0] == pytest.approx(0.05)


def test_cross_covariance_shape_and_scale():
    a, b = np.random.default_rng(0).uniform(size=(5, 2)), np.random.default_rng(1).uniform(size=(3, 2))
    C = Matern(1.5).cross(a, b, 2.0, 0.1)
    assert C.shape == (5, 3)
    np.testing.assert_allclose(C, 2.0 * Matern(1.5).correlation(pairwise_distances(a, b), 0.1))


@pytest.mark.parametrize("nu", [0.0, -1.0, np.nan])
def test_bad_smoothness(nu):
    with pytest.raises(ValueError, match="nu"):
        Matern(nu)


def test_bad_parameters_and_points():
    k = Matern(0.5)
    with pytest.raises(ValueError, match="beta"):
        k.correlation(np.ones(3), 0.0)
    with pytest.raises(ValueError, match="sigma2"):
        k.covariance(np.ones(3), -1.0, 0.1)
    with pytest.raises(ValueError, match="shape"):
        k.cross(np.ones((3, 3)), np.ones((2, 2)), 1.0, 0.1)
    with pytest.raises(ValueError, match="non-finite"):
        k.cross(np.array([[0.0, np.nan]]), np.ones((2, 2)), 1.0, 0.1)


def test_bad_arguments_are_named_and_the_largest_smoothness_is_accepted():
    """Each refusal names the argument (mutation run of 27 Nov); ν = MAX_NU itself is allowed."""
    from spatialfed.model.matern import MAX_NU

    k = Matern(1.5)
    ok = np.zeros((2, 2))
    with pytest.raises(ValueError, match="^a must be"):
        pairwise_distances(np.zeros((2, 4)), ok)
    with pytest.raises(ValueError, match="^b must be"):
        pairwise_distances(ok, np.zeros((2, 3)))
    for call, name in ((lambda: k.covariance(ok, 1.0, -1.0), "beta"), (lambda: k.covariance(ok, 0.0, 1.0), "sigma2"),
                       (lambda: k.beta_from_range(-1.0), "effective_range"), (lambda: k.range_from_beta(0.0), "beta")):
        with pytest.raises(ValueError, match=f"^{name} must be"):
            call()
    assert Matern(MAX_NU).nu == MAX_NU


@pytest.mark.parametrize("nu", [0.8, 3.7, 40.0])
def test_general_smoothness_keeps_its_limits_where_the_bessel_product_leaves_double_range(nu):
    """x^ν K_ν(x) is 0·∞ near 0 for a large ν (x^ν underflows, K_ν overflows: below x ≈ 7e-7 at ν = 40) and ∞·0 far
    out: there ρ is its limit 1 with ρ̇ = ρ̈ = 0, and far out all three are 0 (they were 0 at both ends)."""
    k = Matern(nu)
    d = np.array([0.0, 1e-300, 1e-100, 1e-30, 1e-9, 1e-3, 1.0, 1e3, 1e300])
    with np.errstate(all="ignore"):
        rho, d1, d2 = k.correlation_derivatives(d, 1.0)
        alone = k.correlation(d, 1.0)
    near, far = d <= 1e-9, d >= 1e3
    np.testing.assert_allclose(rho[near], 1.0, rtol=1e-12)
    np.testing.assert_allclose(np.r_[d1[near], d2[near]], 0.0, atol=1e-12)
    assert np.all(rho[far] == 0.0) and np.all(d1[far] == 0.0) and np.all(d2[far] == 0.0)
    assert np.all(np.diff(rho) <= 1e-12) and np.all(np.isfinite(np.r_[rho, d1, d2]))  # non-increasing
    np.testing.assert_array_equal(alone, rho)
