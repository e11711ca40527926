"""Synchronous fits from a poor start reach the maximiser of ℓ_LR (SPEC §2: profile Newton, step bound)."""

import numpy as np
import pytest
from test_algorithm_reference import TRUTH, LowRankReference, simulate, single_blas_thread  # noqa: F401 (autouse fixture)

from spatialfed.algorithm.config import FitConfig
from spatialfed.runtime.virtual import run_virtual


def poor_start(theta_hat):
    """The maximiser's δ with β × 5 and σ² ÷ 4 (γ from the data-driven OLS start)."""
    delta, sigma2, beta = theta_hat
    return {"delta": delta, "sigma2": sigma2 / 4, "beta": beta * 5}


def assert_at_maximiser(server, gamma_hat, theta_hat, ll_hat):
    phi = server.params
    fitted = np.array([phi.delta, phi.sigma2, phi.beta])
    assert server.loglik == pytest.approx(ll_hat, abs=1e-3)
    assert np.max(np.abs(fitted / theta_hat - 1)) < 1e-2
    assert np.max(np.abs(phi.gamma - gamma_hat)) < 1e-2 * np.max(np.abs(gamma_hat))


@pytest.mark.parametrize("residual", ["full", "mpp", "pp"])
def test_sync_from_poor_start_reaches_lowrank_maximiser(residual):
    models, knots, kernel = simulate(residual=residual)
    u_truth = np.log([TRUTH["delta"], TRUTH["sigma2"], TRUTH["beta"]])
    gamma_hat, theta_hat, ll_hat = LowRankReference(models, knots, kernel, residual).maximise(u_truth)
    server = run_virtual(models, knots, kernel, FitConfig(mode="sync", max_iter=15, tol=1e-6),
                         start=poor_start(theta_hat))
    assert server.converged and server.iterations <= 15
    assert_at_maximiser(server, gamma_hat, theta_hat, ll_hat)


def test_paper_block_hessian_also_reaches_the_maximiser_more_slowly():
    models, knots, kernel = simulate(residual="pp")
    u_truth = np.log([TRUTH["delta"], TRUTH["sigma2"], TRUTH["beta"]])
    gamma_hat, theta_hat, ll_hat = LowRankReference(models, knots, kernel, "pp").maximise(u_truth)
    profile = run_virtual(models, knots, kernel, FitConfig(mode="sync", tol=1e-6), start=poor_start(theta_hat))
    block = run_virtual(models, knots, kernel, FitConfig(mode="sync", hessian="block", tol=1e-6, max_iter=200),
                        start=poor_start(theta_hat))
    assert block.converged and block.iterations > profile.iterations
    assert_at_maximiser(block, gamma_hat, theta_hat, ll_hat)
