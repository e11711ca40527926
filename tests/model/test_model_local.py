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


# --- edges the mutation run of model/local.py (27 Nov) found unguarded (docs/contributing.md) -----------------------

def test_moments_are_the_ols_sums_and_the_bounding_box_diagonal(setting):
    _, z, X, knots, _ = setting
    locs = np.column_stack([np.linspace(1.0, 4.0, len(z)), np.linspace(2.0, 6.0, len(z))[::-1]])  # a 3 × 4 box
    mo = LocalModel(locs, z, X, knots, Matern(1.5)).moments()
    assert mo["extent"] == pytest.approx(5.0, rel=1e-12)
    np.testing.assert_allclose(mo["XtX"], X.T @ X)
    np.testing.assert_allclose(mo["Xtz"], X.T @ z)
    assert mo["ztz"] == pytest.approx(z @ z) and mo["n"] == len(z)


def test_quantities_are_sent_under_the_names_the_server_reads(setting):
    """`quantity` answers "value" as {"f": f_j}; mu_sigma carries W_j = B_jᵀR_j⁻¹X_j as "BtRX" (server.py)."""
    locs, z, X, knots, par = setting
    lm = LocalModel(locs, z, X, knots, Matern(1.5), "mpp")
    assert lm.quantity("value", par) == {"f": lm.value(par)}
    q = lm.quantity("mu_sigma", par)
    assert set(q) == {"A", "b", "BtRX"}
    h = 1e-6  # ∂b/∂γ = −BᵀR⁻¹X
    db = np.column_stack([(lm.mu_sigma(par.replace(gamma=par.gamma + h * e))["b"]
                           - lm.mu_sigma(par.replace(gamma=par.gamma - h * e))["b"]) / (2 * h) for e in np.eye(lm.p)])
    np.testing.assert_allclose(q["BtRX"], -db, rtol=1e-6, atol=1e-8)


def test_variogram_subsample_is_the_seeded_one_and_two_points_are_enough(setting):
    locs, z, X, knots, _ = setting
    from spatialfed.model.variogram import binned_semivariogram

    lm = LocalModel(locs, z, X, knots, Matern(1.5))
    gamma, edges = np.array([0.1, 0.2]), np.linspace(0.0, 1.5, 6)
    idx = LocalModel.variogram_subsample(lm.n, 12, 7)
    assert len(idx) == 12 and np.all(np.diff(idx) > 0)
    sum_sq, count = binned_semivariogram(locs[idx], (z - X @ gamma)[idx], edges)
    got = lm.variogram(gamma, edges, max_points=12, seed=7)
    np.testing.assert_allclose(got["sum_sq"], sum_sq)
    np.testing.assert_array_equal(got["count"], count)
    assert len(LocalModel.variogram_subsample(lm.n, 2, 0)) == 2  # one pair is a valid subsample


@pytest.mark.parametrize("residual,factor", [("full", "L"), ("mpp", "r")])
def test_cached_arrays_list_every_cache_at_once(setting, residual, factor):
    """With the whitened data, the Vecchia plan and the prediction factorisation all kept, each is listed."""
    locs, z, X, knots, par = setting
    lm = LocalModel(locs, z, X, knots, Matern(1.5), residual)
    lm.value(par)
    lm.residual_kriging(locs[:3] + 0.01, par)
    lm.vecchia_plan
    ids = {id(a) for a in lm.cached_arrays()}
    for kept in (lm._white.Bh, lm._white.zh, lm._plan.order, lm._plan.nbrs, getattr(lm._kriging.factor, factor),
                 lm._kriging.Bh):
        assert id(kept) in ids


def test_a_singular_full_residual_is_named_as_r_j_of_the_worker_data(setting):
    """Three points at one location with a vanishing nugget (δ = e⁸⁰·δ): R_j = σ²W̃ + δ⁻¹I has three equal rows to
    rounding, and the error names R_j and the site's size."""
    locs, z, X, knots, par = setting
    locs = locs.copy()
    locs[3:5] = locs[2]
    tiny = par.with_u(par.u + np.array([80.0, 0.0, 0.0]))
    for nu in (0.5, 1.5):
        with pytest.raises(np.linalg.LinAlgError, match=r"^R_j of worker data \(n=40\) is not positive definite"):
            LocalModel(locs, z, X, knots, Matern(nu)).value(tiny)


def test_malformed_locations_are_named(setting):
    locs, z, X, knots, par = setting
    with pytest.raises(ValueError, match="^locs must be"):
        LocalModel(locs[:, :1], z, X, knots, Matern(1.5))
    lm = LocalModel(locs, z, X, knots, Matern(1.5))
    for ask in (lm.nearest_distance, lambda at: lm.residual_kriging(at, par)):
        with pytest.raises(ValueError, match="^prediction locations must be"):
            ask(np.zeros((3, 3)))


def test_a_column_of_observations_and_a_vector_covariate_are_read_by_shape(setting):
    """z as an n × 1 column is the vector z; a 1-D X is one covariate column; "auto" is `full` on a small site."""
    locs, z, X, knots, par = setting
    col, flat = (LocalModel(locs, zz, X, knots, Matern(1.5), "mpp") for zz in (z[:, None], z))
    assert col.z.shape == (len(z),)
    assert col.value(par) == pytest.approx(flat.value(par), rel=1e-12)
    one = par.replace(gamma=par.gamma[1:])
    vec, mat = (LocalModel(locs, z, xx, knots, Matern(1.5), "mpp") for xx in (X[:, 1], X[:, 1:]))
    assert vec.X.shape == (len(z), 1) and vec.value(one) == pytest.approx(mat.value(one), rel=1e-12)
    assert LocalModel(locs, z, X, knots, Matern(1.5), "auto").residual == "full"
    with pytest.raises(ValueError, match="^X contains 1 non-finite"):
        LocalModel(locs, z, np.where(np.arange(X.size).reshape(X.shape) == 5, np.inf, X), knots, Matern(1.5))


@pytest.mark.parametrize("residual,pilot_residual", [("mpp", "mpp"), ("vecchia", "full")])
def test_pilot_is_the_seeded_subsample_with_the_same_model_kept_per_size(setting, residual, pilot_residual):
    """pilot(points): itself up to `points` observations, else the rows of variogram_subsample(n, points, seed 0) with
    the same knots, kernel and Vecchia settings; mpp/pp kept, a full or Vecchia residual "auto" (full when small)."""
    locs, z, X, knots, _ = setting
    kernel = Matern(1.5)
    lm = LocalModel(locs, z, X, knots, kernel, residual, vecchia_k=5, vecchia_ordering="coord")
    assert lm.pilot(lm.n) is lm and lm.pilot(lm.n + 1) is lm
    small = lm.pilot(10)
    idx = LocalModel.variogram_subsample(lm.n, 10, LocalModel.VARIOGRAM_SEED)
    np.testing.assert_array_equal(small.locs, locs[idx])
    np.testing.assert_array_equal(small.z, z[idx])
    np.testing.assert_array_equal(small.X, X[idx])
    np.testing.assert_array_equal(small.knots, knots)
    assert small.kernel is kernel and small.residual == pilot_residual
    assert (small.vecchia_k, small.vecchia_ordering) == (5, "coord")
    assert lm.pilot(10) is small
    assert lm.pilot(12).n == 12 and lm.pilot(12) is not small
