"""The Matérn family's kernel derivatives and site statistics (model/family.py, model/family_stats.py): the fixed-ν
isotropic member reproduces model/stats.py (full, mpp, pp and vecchia); ν's derivative matches the integral
representation of K_ν; every first and second u-derivative of the profile ℓ matches central differences of the
centralized (dense) ℓ, for vecchia of the same approximation."""

import numpy as np
import pytest
from scipy import integrate, special

from spatialfed.algorithm.likelihood import profile_loglik, sum_statistics
from spatialfed.model.family import MaternFamily
from spatialfed.model.family_stats import family_statistics
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.reference import profile_lowrank_loglik
from spatialfed.model.stats import site_statistics
from tests.conftest import grid_knots, simulate_parts


@pytest.mark.parametrize("residual", ["full", "mpp", "pp"])
def test_fixed_nu_member_equals_the_isotropic_statistics(parts, knots, residual):
    locs, z, X = parts[0]
    u = np.log([3.0, 1.2, 0.25])
    got = family_statistics(locs, z, X, knots, MaternFamily(1.5), residual, u)
    want = site_statistics(LocalModel(locs, z, X, knots, Matern(1.5), residual=residual), u)
    for key in ("S", "dS", "d2S", "d", "dd", "d2d"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-10 * (np.max(np.abs(want[key])) + locs.shape[0]))


@pytest.mark.parametrize("k", [3, 15])
@pytest.mark.parametrize("nu", [0.5, 1.5, 0.8])
def test_fixed_nu_member_equals_the_isotropic_vecchia_statistics(parts, knots, nu, k):
    """The family's Vecchia residual (model/vecchia.py on FamilyCorrelation) is the fixed-ν one of model/stats.py."""
    locs, z, X = parts[0]
    u = np.log([3.0, 1.2, 0.25])
    got = family_statistics(locs, z, X, knots, MaternFamily(nu), "vecchia", u, vecchia_k=k)
    want = site_statistics(LocalModel(locs, z, X, knots, Matern(nu), residual="vecchia", vecchia_k=k), u)
    for key in ("S", "dS", "d2S", "d", "dd", "d2d", "c"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-10 * np.max(np.abs(want[key])))


@pytest.mark.parametrize("name", ["nu", "nu+anisotropy", "chordal"])
def test_vecchia_on_every_earlier_point_is_the_full_residual_and_scales_along_c(parts, knots, name):
    """k = n_j − 1 conditions each point on all earlier ones: the Cholesky factorisation, so the family's full
    statistics; and S(u + sc) = e^{s}S(u) along the message's c."""
    family, kappa = FAMILIES[name]
    locs, z, X = parts[0]
    u = np.array([0.7, 0.1] + kappa)
    got = family_statistics(locs, z, X, knots, family, "vecchia", u, vecchia_k=len(z) - 1)
    want = family_statistics(locs, z, X, knots, family, "full", u)
    for key in ("S", "dS", "d2S", "d", "dd", "d2d", "c"):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-9, atol=1e-9 * np.max(np.abs(want[key])))
    small = family_statistics(locs, z, X, knots, family, "vecchia", u, vecchia_k=3)
    moved = family_statistics(locs, z, X, knots, family, "vecchia", u + 0.4 * small["c"], vecchia_k=3)
    np.testing.assert_allclose(moved["S"], np.exp(0.4) * small["S"], rtol=1e-10, atol=1e-12)
    assert abs(profile_lowrank_loglik(parts, knots, family, "vecchia", u, vecchia_k=3)[0]
               - profile_lowrank_loglik(parts, knots, family, "full", u)[0]) > 1e-3  # k = 3 approximates


def test_the_family_residuals_are_named_in_one_line(parts, knots):
    locs, z, X = parts[0]
    with pytest.raises(ValueError, match="full, mpp, pp and vecchia residuals"):
        family_statistics(locs, z, X, knots, MaternFamily(None), "auto", np.zeros(4))
    with pytest.raises(ValueError, match="vecchia_k .* must be an integer ≥ 1"):
        family_statistics(locs, z, X, knots, MaternFamily(None), "vecchia", np.zeros(4), vecchia_k=0)


def _dlogrho_dlognu(d, beta, nu):
    """∂ log ρ/∂ log ν from ∂K_ν/∂ν = ∫₀^∞ t sinh(νt) e^{−x cosh t} dt (quadrature, independent of the stencils)."""
    x = np.sqrt(2.0 * nu) * d / beta
    top = float(np.arccosh(max(700.0 / x, 1.0)))  # e^{−x cosh t} < e^{−700} beyond
    dk = integrate.quad(lambda t: t * np.sinh(nu * t) * np.exp(-x * np.cosh(t)), 0.0, top, epsabs=0, epsrel=1e-12,
                        limit=200)[0]
    k = special.kv(nu, x)
    dk_dx = -0.5 * (special.kv(nu - 1.0, x) + special.kv(nu + 1.0, x))
    dlog = -np.log(2.0) - special.digamma(nu) + np.log(x) + 0.5 + (dk + dk_dx * x / (2.0 * nu)) / k
    return nu * dlog


@pytest.mark.parametrize("nu", [0.3, 0.5, 1.5, 2.7, 3.9])
def test_nu_derivative_matches_the_integral_representation(nu):
    d = np.array([[0.02, 0.1, 0.3, 0.8]])
    beta = 0.3
    rho, d1, _ = MaternFamily(None).derivatives(np.zeros((1, 2)), np.column_stack([d[0], 0 * d[0]]),
                                                np.log([beta, nu]))
    want = np.array([_dlogrho_dlognu(di, beta, nu) for di in d[0]]) * rho[0]
    np.testing.assert_allclose(d1[1][0], want, rtol=1e-9)


FAMILIES = {
    "nu": (MaternFamily(None), [np.log(0.25), np.log(1.3)]),
    "anisotropy": (MaternFamily(1.5, True), [np.log(0.25), np.log(1.8), 0.6]),
    "nu+anisotropy": (MaternFamily(None, True), [np.log(0.25), np.log(1.3), np.log(1.8), 0.6]),
    "chordal": (MaternFamily(None, distance="chordal"), [np.log(30.0), np.log(0.9)]),  # β in km over 1°×1°
}


#: fourth-order central differences: f' ≈ Σ_i w_i f(u + i h)/h over i = −2..2
STENCIL = ((-2, 1 / 12), (-1, -8 / 12), (1, 8 / 12), (2, -1 / 12))


def _fd(f, u, h=1e-3):
    """Gradient and Hessian of f by the fourth-order stencil in each direction (the Hessian's entries by the
    stencil applied twice): truncation ~h⁴ f⁽⁵⁾, rounding ~ε|f|/h², both far below 1e-6 relative here."""
    q = u.size
    g, H = np.zeros(q), np.zeros((q, q))
    E = np.eye(q) * h
    for a in range(q):
        g[a] = sum(w * f(u + i * E[a]) for i, w in STENCIL) / h
        for b in range(a, q):
            H[a, b] = H[b, a] = sum(wi * wj * f(u + i * E[a] + j * E[b]) for i, wi in STENCIL
                                    for j, wj in STENCIL) / (h * h)
    return g, H


@pytest.mark.parametrize("name, residual", [
    pytest.param(name, residual, marks=[pytest.mark.slow] if (name, residual) == ("nu+anisotropy", "vecchia") else [])
    for residual in ("full", "mpp", "vecchia") for name in FAMILIES])
def test_profile_derivatives_match_central_differences_of_the_exact_loglik(name, residual):
    """For vecchia the exact ℓ is the dense one of the same approximation (reference.vecchia_covariance), k = 4."""
    family, kappa = FAMILIES[name]
    parts = simulate_parts(J=3, n=25, seed=5)
    knots = grid_knots(3)
    u = np.array([0.7, 0.1] + kappa)
    pr = profile_loglik(sum_statistics([family_statistics(*p, knots, family, residual, u, vecchia_k=4)
                                        for p in parts]), knots, family)
    exact = lambda v: profile_lowrank_loglik(parts, knots, family, residual, v, vecchia_k=4)[0]  # noqa: E731
    assert pr.loglik == pytest.approx(exact(u), rel=1e-12)
    g, H = _fd(exact, u)
    assert np.max(np.abs(g - pr.grad)) <= 1e-6 * np.max(np.abs(pr.grad))
    assert np.max(np.abs(H - pr.hess)) <= 1e-6 * np.max(np.abs(pr.hess))


def test_anisotropy_is_identified_up_to_the_swap_of_axes():
    """(r, φ) and (1/r, φ + 90°) give the same correlation up to the range: ρ(β; r, φ) = ρ(β/r; 1/r, φ + π/2)."""
    rng = np.random.default_rng(0)
    a, b = rng.uniform(size=(7, 2)), rng.uniform(size=(5, 2))
    fam = MaternFamily(0.5, True)
    one = fam.correlation(a, b, [np.log(0.3), np.log(3.0), 0.4])
    other = fam.correlation(a, b, [np.log(0.1), -np.log(3.0), 0.4 + np.pi / 2])
    np.testing.assert_allclose(one, other, rtol=1e-12)


def test_chordal_distance_is_the_chord_of_the_earths_sphere():
    fam = MaternFamily(0.5, distance="chordal")
    rho = fam.correlation(np.array([[0.0, 0.0]]), np.array([[180.0, 0.0], [0.0, 90.0]]), [np.log(1000.0)])
    np.testing.assert_allclose(rho[0], np.exp(-np.array([2.0, np.sqrt(2.0)]) * 6371.0088 / 1000.0), rtol=1e-12)
    with pytest.raises(ValueError, match="anisotropy needs planar coordinates"):
        MaternFamily(0.5, True, "chordal")
