"""Synchronous fits from a poor start reach the maximiser of ℓ_LR (SPEC §2: profile Newton, step bound)."""

import numpy as np
import pytest
from support import TRUTH, LowRankReference, assert_at_maximiser, poor_start, simulate

from spatialfed.algorithm.config import FitConfig
from spatialfed.runtime.virtual import run_virtual


@pytest.mark.parametrize("residual", ["full", "mpp", "pp"])
def test_sync_from_poor_start_reaches_lowrank_maximiser(residual):
    models, knots, kernel = simulate(residual=residual)
    u_truth = np.log([TRUTH["delta"], TRUTH["sigma2"], TRUTH["beta"]])
    gamma_hat, theta_hat, ll_hat = LowRankReference(models, knots, kernel, residual).maximise(u_truth)
    server = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=15, tol=1e-6),
                         start=poor_start(theta_hat))
    assert server.converged and server.iterations <= 15
    assert_at_maximiser(server, gamma_hat, theta_hat, ll_hat)


def test_paper_block_hessian_also_reaches_the_maximiser_more_slowly():
    models, knots, kernel = simulate(residual="pp")
    u_truth = np.log([TRUTH["delta"], TRUTH["sigma2"], TRUTH["beta"]])
    gamma_hat, theta_hat, ll_hat = LowRankReference(models, knots, kernel, "pp").maximise(u_truth)
    profile = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", tol=1e-6), start=poor_start(theta_hat))
    block = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", hessian="block", tol=1e-6, max_iter=200),
                        start=poor_start(theta_hat))
    assert block.converged and block.iterations > profile.iterations
    assert_at_maximiser(block, gamma_hat, theta_hat, ll_hat)


@pytest.fixture(scope="module")
def with_intercept():
    """X = [1, N(0, 1)], intercept 1.4: the intercept and the knot process Bμ both carry the mean."""
    models, knots, kernel = simulate(residual="pp", intercept=True, gamma=[1.4, 2.0])
    u_truth = np.log([TRUTH["delta"], TRUTH["sigma2"], TRUTH["beta"]])
    return (models, knots, kernel), LowRankReference(models, knots, kernel, "pp").maximise(u_truth)


def test_joint_mean_step_with_an_intercept_reaches_the_maximiser(with_intercept):
    (models, knots, kernel), (gamma_hat, theta_hat, ll_hat) = with_intercept
    joint = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=15, tol=1e-6))
    assert joint.config.block.mean_step == "joint" and joint.converged and joint.iterations <= 15
    assert_at_maximiser(joint, gamma_hat, theta_hat, ll_hat)
    block = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", mean_step="block", max_iter=15, tol=1e-6))
    assert not block.converged and block.loglik < ll_hat - 1e-2  # the γ–μ coordinate descent crawls


def test_gamma_substep_is_a_no_op_after_the_joint_step(with_intercept):
    """Under mean_step="joint" γ given the jointly updated μ (Eq. 9) is γ itself: the synchronous gamma rows repeat."""
    (models, knots, kernel), _ = with_intercept
    server = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=5))
    rows = [row for row in server.trace if row["step"] in ("mu_sigma", "gamma")]
    assert [row["step"] for row in rows] == ["mu_sigma", "gamma"] * (len(rows) // 2)
    for mean, gamma in zip(rows[::2], rows[1::2]):
        np.testing.assert_allclose(gamma["gamma"], mean["gamma"], rtol=1e-9)


def test_async_joint_mean_step_with_an_intercept_reaches_the_maximiser(with_intercept):
    (models, knots, kernel), (gamma_hat, theta_hat, ll_hat) = with_intercept
    server = run_virtual(models, knots, kernel, FitConfig.of(mode="async", agg_threshold=2, max_iter=300, tol=1e-6),
                         slowdowns="straggler")
    assert_at_maximiser(server, gamma_hat, theta_hat, ll_hat)
