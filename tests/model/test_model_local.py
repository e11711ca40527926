"""Worker-side quantities (SPEC §3): every gradient, Hessian and G_j against central finite differences."""

import numpy as np
import pytest

from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params

NUS = [0.5, 1.5, 2.5, 0.8]
RESIDUALS = ["full", "mpp", "pp"]


def rel_err(a, b):
    return np.max(np.abs(np.asarray(a) - np.asarray(b))) / max(np.max(np.abs(b)), 1e-12)


@pytest.fixture(scope="module")
def setting():
    rng = np.random.default_rng(1)
    n, m = 40, 9
    locs = rng.uniform(size=(n, 2))
    g = np.linspace(0.1, 0.9, 3)
    knots = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    X = np.column_stack([np.ones(n), rng.standard_normal(n)])
    z = rng.standard_normal(n)
    A = rng.standard_normal((m, m))
    params = Params(rng.standard_normal(m) * 0.3, A @ A.T / m + 0.1 * np.eye(m), np.array([0.2, -0.1]), 2.0, 1.3, 0.3)
    return locs, z, X, knots, params


@pytest.mark.parametrize("nu", NUS)
@pytest.mark.parametrize("residual", RESIDUALS)
def test_theta_derivatives_match_finite_differences(setting, nu, residual):
    locs, z, X, knots, par = setting
    lm = LocalModel(locs, z, X, knots, Matern(nu), residual)
    q = lm.theta(par)
    assert q["f"] == pytest.approx(lm.value(par), rel=1e-12)
    h, u = 1e-5, par.u
    grad_fd, hess_fd = np.zeros(3), np.zeros((3, 3))
    for a in range(3):
        e = np.eye(3)[a] * h
        grad_fd[a] = (lm.value(par.with_u(u + e)) - lm.value(par.with_u(u - e))) / (2 * h)
        hess_fd[a] = (lm.theta(par.with_u(u + e))["grad"] - lm.theta(par.with_u(u - e))["grad"]) / (2 * h)
    assert rel_err(q["grad"], grad_fd) <= 1e-5
    assert rel_err(q["hess"], hess_fd) <= 1e-5
    mu_fd = np.zeros((3, lm.m))
    for k in range(lm.m):
        e = np.eye(lm.m)[k] * h
        mu_fd[:, k] = (lm.theta(par.replace(mu=par.mu + e))["grad"] - lm.theta(par.replace(mu=par.mu - e))["grad"]) / (2 * h)
    assert rel_err(q["d2_du_dmu"], mu_fd) <= 1e-5
    E = np.random.default_rng(3).standard_normal((lm.m, lm.m))
    E = E + E.T
    sig_fd = (lm.theta(par.replace(Sigma=par.Sigma + h * E))["grad"] - lm.theta(par.replace(Sigma=par.Sigma - h * E))["grad"]) / (2 * h)
    assert rel_err(np.einsum("akl,kl->a", q["d2_du_dSigma"], E), sig_fd) <= 1e-5


@pytest.mark.parametrize("residual", RESIDUALS)
def test_mu_sigma_and_gamma_quantities_are_gradients_of_f(setting, residual):
    """∂f/∂μ = A μ − b and ∂f/∂γ = XᵀR⁻¹Xγ − XᵀR⁻¹(z − Bμ): the sent quantities define the block optima."""
    locs, z, X, knots, par = setting
    lm = LocalModel(locs, z, X, knots, Matern(1.5), residual)
    h = 1e-6
    qa, qg = lm.mu_sigma(par), lm.gamma_step(par)
    g_mu = np.array([(lm.value(par.replace(mu=par.mu + h * e)) - lm.value(par.replace(mu=par.mu - h * e))) / (2 * h) for e in np.eye(lm.m)])
    np.testing.assert_allclose(g_mu, qa["A"] @ par.mu - qa["b"], rtol=1e-5, atol=1e-7)
    g_gam = np.array([(lm.value(par.replace(gamma=par.gamma + h * e)) - lm.value(par.replace(gamma=par.gamma - h * e))) / (2 * h) for e in np.eye(lm.p)])
    np.testing.assert_allclose(g_gam, qg["XtRX"] @ par.gamma - qg["XtRr"], rtol=1e-5, atol=1e-7)


def test_whitened_data_are_kept_per_theta(setting):
    """mu_sigma, gamma and value at one (δ, θ) share one factorisation's whitened data; a new θ replaces them."""
    locs, z, X, knots, par = setting
    lm = LocalModel(locs, z, X, knots, Matern(0.5), "full")
    lm.mu_sigma(par)
    cached = lm._white
    lm.gamma_step(par)
    lm.value(par)
    assert lm._white is cached
    lm.theta(par.with_u(par.u + 0.1))
    assert lm._white is not cached and lm._white.key == par.with_u(par.u + 0.1).theta_key


def test_returned_sizes_do_not_grow_with_n(setting):
    _, _, _, knots, par = setting
    sizes = []
    for n in (30, 120):
        rng = np.random.default_rng(n)
        lm = LocalModel(rng.uniform(size=(n, 2)), rng.standard_normal(n), np.ones((n, 2)) * [1, 0] + [0, 1] * rng.standard_normal((n, 1)), knots, Matern(0.5))
        sizes.append(sum(np.asarray(v).nbytes for s in ("mu_sigma", "gamma", "theta") for v in lm.quantity(s, par).values()))
    assert sizes[0] == sizes[1]


def test_bad_inputs_name_the_cause(setting):
    locs, z, X, knots, par = setting
    k = Matern(0.5)
    with pytest.raises(ValueError, match="z contains"):
        LocalModel(locs, np.where(np.arange(len(z)) == 3, np.nan, z), X, knots, k)
    with pytest.raises(ValueError, match="same number of rows"):
        LocalModel(locs, z[:-1], X, knots, k)
    with pytest.raises(ValueError, match="duplicate"):
        LocalModel(locs, z, X, np.vstack([knots, knots[:1]]), k)
    with pytest.raises(ValueError, match="residual"):
        LocalModel(locs, z, X, knots, k, "banded")
    with pytest.raises(ValueError, match="empty"):
        LocalModel(np.zeros((0, 2)), np.zeros(0), np.zeros((0, 2)), knots, k)
    with pytest.raises(ValueError, match="delta"):
        par.replace(delta=-1.0)
    lm = LocalModel(locs, z, X, knots, k)
    with pytest.raises(ValueError, match="knots"):
        lm.quantity("theta", Params(np.zeros(4), np.eye(4), par.gamma, 1.0, 1.0, 0.1))
    with pytest.raises(ValueError, match="sub-step"):
        lm.quantity("lambda", par)


def test_near_duplicate_knots_use_documented_jitter(setting):
    from spatialfed.model.linalg import JitterWarning

    locs, z, X, knots, par = setting
    close = np.vstack([knots, knots[:1] + 1e-9])
    m = close.shape[0]
    p2 = Params(np.zeros(m), np.eye(m), par.gamma, par.delta, par.sigma2, par.beta)
    with pytest.warns(JitterWarning, match="jitter"):
        LocalModel(locs, z, X, close, Matern(2.5), "full").mu_sigma(p2)
    # well-separated knots are never jittered
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LocalModel(locs, z, X, knots, Matern(2.5), "full").mu_sigma(par)


def test_no_knots_full_residual_is_the_independence_model(parts):
    """m = 0 with the full residual gives f_j = −ℓ_j − (n_j/2) log 2π with ℓ_j of Eq. (3), and its derivatives."""
    from spatialfed.model import reference as ref

    kernel, gamma = Matern(1.5), np.array([1.0, 0.2])
    locs, z, X = parts[0]
    lm = LocalModel(locs, z, X, np.zeros((0, 2)), kernel, "full")
    q = lm.theta(Params(np.zeros(0), np.zeros((0, 0)), gamma, 2.0, 1.2, 0.2))
    t = ref.independent_local_terms(locs, z, X, kernel, gamma, 2.0, 1.2, 0.2)
    assert q["f"] + 0.5 * len(z) * np.log(2 * np.pi) == pytest.approx(t["f"], rel=1e-12)
    np.testing.assert_allclose(q["grad"], t["grad"], atol=1e-10)
    np.testing.assert_allclose(q["hess"], t["hess"], atol=1e-10)
