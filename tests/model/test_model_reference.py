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
