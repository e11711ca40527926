"""Server block updates (SPEC §2): the Eq. (5) identity, closed forms minimise f, profile Hessian, Newton step."""

import numpy as np
import pytest

from spatialfed.model import blocks
from spatialfed.model import reference as ref
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params

RESIDUALS = ["full", "mpp", "pp"]
TRUE = dict(delta=2.0, sigma2=1.2, beta=0.2)


def federated_state(parts, knots, kernel, residual, gamma, delta, sigma2, beta):
    """Closed-form (μ, Σ) from the workers' mu_sigma quantities, and the models."""
    lms = [LocalModel(*pt, knots, kernel, residual) for pt in parts]
    m = knots.shape[0]
    par = Params(np.zeros(m), np.eye(m), gamma, delta, sigma2, beta)
    qs = [lm.mu_sigma(par) for lm in lms]
    K = blocks.knot_covariance(knots, kernel, sigma2, beta)
    mu, Sigma = blocks.update_mu_sigma(sum(q["A"] for q in qs), sum(q["b"] for q in qs), K)
    return lms, par.replace(mu=mu, Sigma=Sigma)


def total_f(lms, par, knots, kernel):
    return sum(lm.value(par) for lm in lms) + blocks.h_terms(par.mu, par.Sigma, knots, kernel, par.sigma2, par.beta)["f"]


@pytest.mark.parametrize("residual", RESIDUALS)
def test_min_f_equals_minus_lowrank_loglik(parts, knots, residual):
    kernel, gamma = Matern(1.5), np.array([1.0, 0.2])
    lms, par = federated_state(parts, knots, kernel, residual, gamma, **TRUE)
    n_obs = sum(len(p[1]) for p in parts)
    ll = ref.lowrank_loglik(parts, knots, kernel, residual, gamma, **TRUE)
    assert blocks.loglik_from_f(total_f(lms, par, knots, kernel), n_obs) == pytest.approx(ll, abs=1e-8)


@pytest.mark.parametrize("residual", RESIDUALS)
def test_closed_forms_minimise_f(parts, knots, residual):
    kernel, gamma = Matern(1.5), np.array([1.0, 0.2])
    lms, par = federated_state(parts, knots, kernel, residual, gamma, **TRUE)
    rng = np.random.default_rng(0)
    f0 = total_f(lms, par, knots, kernel)  # (μ, Σ) of Eq. (8) minimise f at fixed γ
    for _ in range(5):
        d = rng.standard_normal(par.mu.size) * 1e-3
        assert total_f(lms, par.replace(mu=par.mu + d), knots, kernel) > f0
        E = rng.standard_normal(par.Sigma.shape) * 1e-3
        assert total_f(lms, par.replace(Sigma=par.Sigma + E @ E.T), knots, kernel) > f0
        assert total_f(lms, par.replace(Sigma=par.Sigma - 1e-3 * E @ E.T), knots, kernel) > f0
    qg = [lm.gamma_step(par) for lm in lms]
    par = par.replace(gamma=blocks.update_gamma(sum(q["XtRX"] for q in qg), sum(q["XtRr"] for q in qg)))
    f1 = total_f(lms, par, knots, kernel)  # γ of Eq. (9) minimises f at fixed (μ, Σ)
    assert f1 <= f0
    for _ in range(5):
        assert total_f(lms, par.replace(gamma=par.gamma + rng.standard_normal(2) * 1e-3), knots, kernel) > f1


@pytest.mark.parametrize("residual", RESIDUALS)
def test_profile_hessian_is_hessian_of_minus_lowrank_loglik(parts, knots, residual):
    kernel, gamma = Matern(1.5), np.array([1.0, 0.2])
    lms, par = federated_state(parts, knots, kernel, residual, gamma, **TRUE)
    h = blocks.h_terms(par.mu, par.Sigma, knots, kernel, par.sigma2, par.beta)
    tot = {k: sum(lm.theta(par)[k] for lm in lms) + h[k] for k in ("grad", "hess", "d2_du_dmu", "d2_du_dSigma")}
    H = blocks.profile_hessian(tot["hess"], tot["d2_du_dmu"], tot["d2_du_dSigma"], par.Sigma)

    def nll(u):
        return -ref.lowrank_loglik(parts, knots, kernel, residual, gamma, *np.exp(u))

    u, e = par.u, 1e-4
    I = np.eye(3) * e
    H_fd = np.array([[(nll(u + I[a] + I[b]) - nll(u + I[a] - I[b]) - nll(u - I[a] + I[b]) + nll(u - I[a] - I[b])) / (4 * e * e)
                      for b in range(3)] for a in range(3)])
    g_fd = np.array([(nll(u + I[a]) - nll(u - I[a])) / (2 * e) for a in range(3)])
    np.testing.assert_allclose(tot["grad"], g_fd, rtol=1e-6, atol=1e-7)
    assert np.max(np.abs(H - H_fd)) / np.max(np.abs(H_fd)) < 1e-5


def test_h_derivatives_against_finite_differences(knots):
    kernel, rng = Matern(2.5), np.random.default_rng(4)
    m = knots.shape[0]
    A = rng.standard_normal((m, m))
    mu, Sigma, s2, beta = rng.standard_normal(m), A @ A.T / m + 0.1 * np.eye(m), 1.3, 0.25
    h = blocks.h_terms(mu, Sigma, knots, kernel, s2, beta)
    e = 1e-5

    def at(u, **kw):
        return blocks.h_terms(kw.get("mu", mu), kw.get("Sigma", Sigma), knots, kernel, np.exp(u[1]), np.exp(u[2]))

    u = np.log([1.0, s2, beta])
    I = np.eye(3) * e
    g_fd = np.array([(at(u + I[a])["f"] - at(u - I[a])["f"]) / (2 * e) for a in range(3)])
    H_fd = np.array([(at(u + I[a])["grad"] - at(u - I[a])["grad"]) / (2 * e) for a in range(3)])
    np.testing.assert_allclose(h["grad"], g_fd, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(h["hess"], H_fd, rtol=1e-5, atol=1e-7)
    mu_fd = np.array([(at(u, mu=mu + e * d)["grad"] - at(u, mu=mu - e * d)["grad"]) / (2 * e) for d in np.eye(m)]).T
    np.testing.assert_allclose(h["d2_du_dmu"], mu_fd, rtol=1e-5, atol=1e-7)


def test_modified_hessian_and_step_bound():
    H = np.diag([4.0, -2.0, 1e-14])
    Hm = blocks.modified_hessian(H, floor=1e-6)
    np.testing.assert_allclose(np.linalg.eigvalsh(Hm), [4e-6, 2.0, 4.0])
    u1 = blocks.newton_step(np.zeros(3), np.array([100.0, 0.0, 0.0]), np.eye(3), alpha=1.0, bound=1.0)
    np.testing.assert_allclose(u1, [-1.0, 0.0, 0.0])
    u2 = blocks.newton_step(np.zeros(3), np.array([0.2, -0.1, 0.0]), np.eye(3), alpha=0.5)
    np.testing.assert_allclose(u2, [-0.1, 0.05, 0.0])


def test_bad_server_inputs():
    with pytest.raises(ValueError, match="duplicate"):
        blocks.knot_covariance(np.array([[0.0, 0.0], [0.0, 0.0]]), Matern(0.5), 1.0, 0.1)
    with pytest.raises(ValueError, match="non-finite"):
        blocks.update_gamma(np.eye(2), np.array([np.nan, 1.0]))
    with pytest.raises(np.linalg.LinAlgError, match="collinear"):
        blocks.update_gamma(np.ones((2, 2)), np.ones(2))


# --- edges the mutation run of model/blocks.py (27 Nov) found unguarded (docs/contributing.md) ----------------------

def test_bad_server_inputs_are_named():
    nan2 = np.array([np.nan, 1.0])
    cases = [
        ("gradient", lambda: blocks.newton_step(np.zeros(2), nan2, np.eye(2))),
        ("aggregated XᵀR⁻¹X", lambda: blocks.update_gamma(np.diag(nan2), np.ones(2))),
        ("aggregated XᵀR⁻¹r", lambda: blocks.update_gamma(np.eye(2), nan2)),
        ("aggregated A", lambda: blocks.update_mu_sigma(np.diag(nan2), np.ones(2), np.eye(2))),
        ("aggregated b", lambda: blocks.update_mu_sigma(np.eye(2), nan2, np.eye(2))),
    ]
    for name, call in cases:
        with pytest.raises(ValueError, match=f"^{name} contains 1 non-finite"):
            call()
    with pytest.raises(np.linalg.LinAlgError, match="^K is not positive definite"):
        blocks.update_mu_sigma(np.eye(2), np.ones(2), -np.eye(2))
    with pytest.raises(np.linalg.LinAlgError, match="^Σ_j A_j \\+ K⁻¹ is not positive definite"):
        blocks.update_mu_sigma(-10.0 * np.eye(2), np.ones(2), np.eye(2))
    with np.errstate(divide="ignore"), pytest.raises(np.linalg.LinAlgError, match="^K is not positive definite"):
        blocks.KnotCovariance(np.array([[0.0, 0.0], [1.0, 0.0]]), Matern(0.5), 0.0, 0.3)  # σ² = 0: K = 0


def test_a_jittered_knot_covariance_is_the_matrix_its_log_determinant_is_of():
    import warnings

    from scipy.spatial.distance import cdist

    from spatialfed.model.linalg import JitterWarning, cholesky_with_jitter

    g = np.linspace(0.1, 0.9, 3)
    knots = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    knots = np.vstack([knots, knots[:1] + 1e-9])  # a near-duplicate knot: ρ_K singular for a smooth kernel
    kernel, sigma2 = Matern(2.5), 1.7
    rK = kernel.correlation(cdist(knots, knots), 0.2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kc = blocks.KnotCovariance(knots, kernel, sigma2, 0.2)
        _, tau = cholesky_with_jitter(rK, "K")
    messages = [str(w.message) for w in caught if issubclass(w.category, JitterWarning)]
    assert tau > 0 and messages[0].startswith("the knot correlation matrix K is numerically singular")
    jittered = rK + tau * np.eye(len(knots))
    np.testing.assert_allclose(kc.K, sigma2 * jittered, rtol=1e-14, atol=0)
    L = np.linalg.cholesky(jittered)
    assert kc.logdet == pytest.approx(len(knots) * np.log(sigma2) + 2 * np.sum(np.log(np.diag(L))), rel=1e-10)


def test_modified_hessian_floors_relative_to_the_largest_eigenvalue_even_below_one():
    Hm = blocks.modified_hessian(np.diag([1e-3, 1e-12]), floor=1e-6)
    np.testing.assert_allclose(np.linalg.eigvalsh(Hm), [1e-9, 1e-3], rtol=1e-9)


def test_newton_step_defaults_and_the_floor_it_passes_on():
    np.testing.assert_allclose(blocks.newton_step(np.zeros(3), np.array([0.2, -0.1, 0.0]), np.eye(3)),
                               [-0.2, 0.1, 0.0])  # α = 1, inside the bound
    np.testing.assert_allclose(blocks.newton_step(np.zeros(3), np.array([5.0, 0.0, 0.0]), np.eye(3)),
                               [-1.0, 0.0, 0.0])  # bound = 1
    H, g = np.diag([1.0, 1e-10]), np.array([0.0, 1e-10])
    np.testing.assert_allclose(blocks.newton_step(np.zeros(2), g, H), [0.0, -1e-2], rtol=1e-9)  # floor 1e-8
    np.testing.assert_allclose(blocks.newton_step(np.zeros(2), 100 * g, H, floor=1e-4), [0.0, -1e-4], rtol=1e-9)


def test_a_non_finite_hessian_names_an_overflow_not_missing_data():
    """The Hessian is computed, not read: a non-finite entry is an overflow (absurd values, huge privacy noise)."""
    from spatialfed.model.blocks import modified_hessian

    H = np.eye(3)
    H[0, 1] = np.inf
    with pytest.raises(ValueError, match=r"^the log-likelihood's Hessian has 1 non-finite entries \(an overflow: "
                                         r".*lower the privacy noise"):
        modified_hessian(H)
