"""Centralized references: Woodbury ℓ_LR = dense, exact/independence ℓ = scipy, local derivatives, KL (Prop. 4)."""

import numpy as np
import pytest
from scipy.stats import multivariate_normal as mvn

from spatialfed.model import reference as ref
from spatialfed.model.matern import Matern

PARAMS = dict(delta=2.0, sigma2=1.2, beta=0.2)


@pytest.mark.parametrize("residual", ["full", "mpp", "pp"])
def test_woodbury_equals_dense_lowrank(parts, knots, residual):
    k, gamma = Matern(1.5), np.array([1.0, 0.2])
    cov = ref.lowrank_covariance(parts, knots, k, residual, **PARAMS)
    z = np.concatenate([p[1] for p in parts])
    X = np.vstack([p[2] for p in parts])
    assert ref.lowrank_loglik(parts, knots, k, residual, gamma, **PARAMS) == pytest.approx(mvn(X @ gamma, cov).logpdf(z), abs=1e-9)


def test_exact_and_independent_equal_scipy(parts):
    k, gamma = Matern(0.5), np.array([1.0, 0.2])
    locs, z, X = (np.vstack([p[i] for p in parts]) if i != 1 else np.concatenate([p[1] for p in parts]) for i in range(3))
    C = k.cross(locs, locs, PARAMS["sigma2"], PARAMS["beta"]) + np.eye(len(z)) / PARAMS["delta"]
    assert ref.exact_loglik(locs, z, X, k, gamma, **PARAMS) == pytest.approx(mvn(X @ gamma, C).logpdf(z), abs=1e-9)
    expected = sum(
        mvn(Xj @ gamma, k.cross(lj, lj, PARAMS["sigma2"], PARAMS["beta"]) + np.eye(len(zj)) / PARAMS["delta"]).logpdf(zj)
        for lj, zj, Xj in parts
    )
    assert ref.independent_loglik(parts, k, gamma, **PARAMS) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5, 0.8])
def test_independent_local_derivatives(parts, nu):
    k, gamma = Matern(nu), np.array([1.0, 0.2])
    locs, z, X = parts[0]
    t = ref.independent_local_terms(locs, z, X, k, gamma, **PARAMS)
    assert t["f"] == pytest.approx(-ref.exact_loglik(locs, z, X, k, gamma, **PARAMS))
    u, e = np.log([PARAMS["delta"], PARAMS["sigma2"], PARAMS["beta"]]), 1e-5
    at = lambda uu: ref.independent_local_terms(locs, z, X, k, gamma, *np.exp(uu))  # noqa: E731
    g_fd = np.array([(at(u + e * d)["f"] - at(u - e * d)["f"]) / (2 * e) for d in np.eye(3)])
    H_fd = np.array([(at(u + e * d)["grad"] - at(u - e * d)["grad"]) / (2 * e) for d in np.eye(3)])
    assert np.max(np.abs(t["grad"] - g_fd)) / np.max(np.abs(g_fd)) < 1e-5
    assert np.max(np.abs(t["hess"] - H_fd)) / np.max(np.abs(H_fd)) < 1e-5


def test_kl_lowrank_below_independent_and_decreasing_in_m():
    rng = np.random.default_rng(5)
    loc_parts = [rng.uniform(size=(40, 2)) for _ in range(4)]
    k = Matern(2.5)
    beta = k.beta_from_range(0.3)
    kls = []
    for side in (3, 5, 8):
        g = (np.arange(side) + 0.5) / side
        knots = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
        kls.append(ref.kl_lowrank(loc_parts, knots, k, 1.0, beta, nugget=1e-2))
    kl_ind = ref.kl_independent(loc_parts, k, 1.0, beta, nugget=1e-2)
    assert all(kl < kl_ind for kl in kls)
    assert kls[0] > kls[1] > kls[2] >= 0
    # Proposition 4's bound: KL_N(P‖P1) ≤ KL_N(P‖P2) + m/N
    assert kls[-1] <= kl_ind + 64 / 160


def test_kl_normalised_is_the_gaussian_kl_per_point():
    """KL_N = [tr(Cq⁻¹C) − N + log det Cq − log det C] / (2N), against slogdet and an explicit inverse."""
    rng = np.random.default_rng(3)
    A, B = rng.standard_normal((2, 6, 6))
    C, Cq = A @ A.T + np.eye(6), B @ B.T + 2 * np.eye(6)
    expected = (np.trace(np.linalg.inv(Cq) @ C) - 6 + np.linalg.slogdet(Cq)[1] - np.linalg.slogdet(C)[1]) / 12
    assert ref._kl_normalised(C, Cq) == pytest.approx(expected, rel=1e-10)
    assert ref._kl_normalised(C, C) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(np.linalg.LinAlgError, match="^the approximating covariance is not positive definite$"):
        ref._kl_normalised(C, -Cq)
    with pytest.raises(np.linalg.LinAlgError, match="^the GP covariance is not positive definite$"):
        ref._kl_normalised(-C, Cq)


def test_kl_default_nugget_is_the_latent_case(knots):
    rng = np.random.default_rng(4)
    loc_parts = [rng.uniform(size=(8, 2)) for _ in range(3)]
    k = Matern(0.5)
    assert ref.kl_independent(loc_parts, k, 1.0, 0.2) == ref.kl_independent(loc_parts, k, 1.0, 0.2, nugget=0.0)
    assert ref.kl_lowrank(loc_parts, knots, k, 1.0, 0.2) == ref.kl_lowrank(loc_parts, knots, k, 1.0, 0.2, nugget=0.0)


def test_local_terms_gls_pieces(parts):
    k, gamma = Matern(1.5), np.array([1.0, 0.2])
    locs, z, X = parts[0]
    t = ref.independent_local_terms(locs, z, X, k, gamma, **PARAMS)
    Ginv = k.cross(locs, locs, PARAMS["sigma2"], PARAMS["beta"]) + np.eye(len(z)) / PARAMS["delta"]
    np.testing.assert_allclose(t["XtGX"], X.T @ np.linalg.solve(Ginv, X), rtol=1e-9)
    np.testing.assert_allclose(t["XtGz"], X.T @ np.linalg.solve(Ginv, z), rtol=1e-9)


def test_singular_covariances_are_named(parts, knots):
    """Each reference names the matrix whose Cholesky factorisation failed (δ = ∞ with a low-rank or a numerically rank-one covariance)."""
    k, gamma = Matern(1.5), np.array([1.0, 0.2])
    locs, z, X = parts[0]
    singular, long = dict(PARAMS, delta=np.inf), dict(PARAMS, delta=np.inf, beta=1e6)
    with pytest.raises(np.linalg.LinAlgError, match="^K is not positive definite$"):
        ref.lowrank_loglik(parts, knots, k, "full", gamma, **dict(PARAMS, beta=1e6))
    # a repeated knot: K is singular, and rounding lets either K or the Woodbury inner matrix fail first
    with pytest.raises(np.linalg.LinAlgError, match="^(K|K \\+ Cᵀ R⁻¹ C) is not positive definite$"):
        ref.lowrank_loglik(parts, np.vstack([knots, knots[:1]]), k, "full", gamma, **PARAMS)
    with pytest.raises(np.linalg.LinAlgError, match="^R_j is not positive definite$"):
        ref.lowrank_loglik(parts, knots, k, "pp", gamma, **singular)
    with pytest.raises(np.linalg.LinAlgError, match="^C \\+ δ⁻¹I is not positive definite$"):
        ref.exact_loglik(locs, z, X, k, gamma, **long)
    with pytest.raises(np.linalg.LinAlgError, match="^C_jj \\+ δ⁻¹I is not positive definite$"):
        ref.independent_local_terms(locs, z, X, k, gamma, **long)
    with pytest.raises(np.linalg.LinAlgError, match="^K is not positive definite;"):
        ref.kl_lowrank([locs], knots, k, 1.0, 1e6, nugget=0.1)
    with pytest.raises(np.linalg.LinAlgError, match="^the low-rank covariance is not positive definite$"):
        ref.lowrank_kriging(parts, [0], locs[:1], X[:1], knots, k, "pp", gamma, **singular)


def test_lowrank_kriging_one_target_owned_by_a_later_worker(parts, knots):
    """s₀ shares w̃ with worker 1 only: Cov(y₀, z_1) = C(s₀, s_1), Cov(y₀, z_j) = C₀*K⁻¹C*j elsewhere, Var y₀ = σ²."""
    k, gamma = Matern(1.5), np.array([1.0, 0.2])
    s2, b = PARAMS["sigma2"], PARAMS["beta"]
    locs0, X0 = np.array([[0.37, 0.61]]), np.array([[1.0, -0.5]])
    mean, var = ref.lowrank_kriging(parts, [1], locs0, X0, knots, k, "full", gamma, **PARAMS)
    Kinv = np.linalg.inv(k.cross(knots, knots, s2, b))
    cross = np.hstack([
        k.cross(locs0, p[0], s2, b) if j == 1 else k.cross(locs0, knots, s2, b) @ Kinv @ k.cross(knots, p[0], s2, b)
        for j, p in enumerate(parts)
    ])
    cov = ref.lowrank_covariance(parts, knots, k, "full", PARAMS["delta"], s2, b)
    z, X = np.concatenate([p[1] for p in parts]), np.vstack([p[2] for p in parts])
    np.testing.assert_allclose(mean, X0 @ gamma + cross @ np.linalg.solve(cov, z - X @ gamma), rtol=1e-8)
    np.testing.assert_allclose(var, s2 - cross @ np.linalg.solve(cov, cross.T)[:, 0], rtol=1e-8)
