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
        pairwise_distances(np.zeros((2, 3)), ok)
    with pytest.raises(ValueError, match="^b must be"):
        pairwise_distances(ok, np.zeros((2, 3)))
    for call, name in ((lambda: k.covariance(ok, 1.0, -1.0), "beta"), (lambda: k.covariance(ok, 0.0, 1.0), "sigma2"),
                       (lambda: k.beta_from_range(-1.0), "effective_range"), (lambda: k.range_from_beta(0.0), "beta")):
        with pytest.raises(ValueError, match=f"^{name} must be"):
            call()
    assert Matern(MAX_NU).nu == MAX_NU
