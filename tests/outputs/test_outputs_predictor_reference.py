"""Every number `spatialfed predict` writes, per predictor, against a dense reference computed here with numpy.

A small store (3 sites × 25 points, covariates [1, c1]) and fixed parameters (δ, σ², β, γ; ν = 0.5, so the Matérn
covariance is σ² exp(−d/β) written out below without the library). The low-rank model's N×N covariance is
Q(L, L) + blockdiag_j R̃_j + δ⁻¹I with Q(a, b) = c(a, S*)K⁻¹c(S*, b) and R̃_j the residual of site j (full:
c − Q on the site's block; mpp: its diagonal; pp: 0). Its conditionals are the reference:

- lowrank: y(s₀) = x₀ᵀγ + b₀ᵀη + w̃(s₀), w̃(s₀) in its owner's residual block; μ, Σ of the fitted model are the exact
  posterior of η (so the federated predictor is the exact GP conditional given γ, δ, θ);
- independent / personal: kriging from the owner's (or the chosen site's) data alone under C_jj + δ⁻¹I (Eq. 3);
- ols: pooled least squares, s² = RSS/(N − p), sd = s√(1 + x₀ᵀ(XᵀX)⁻¹x₀).

sd is that of a new observation (latent variance + δ⁻¹), sd_latent the latent one. Both are checked to 1e-7.
"""

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from spatialfed.data.store import open_store, write_store
from spatialfed.model.params import Params
from spatialfed.outputs import prediction as pr

DELTA, SIGMA2, BETA = 4.0, 1.3, 0.25  # δ ≠ 1 so that δ and δ⁻¹ differ
GAMMA = np.array([0.5, -0.3])
J, N_J = 3, 25


def cov(a, b):
    """σ² exp(−d/β): the Matérn covariance at ν = 1/2, written out."""
    return SIGMA2 * np.exp(-cdist(a, b) / BETA)


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    rng = np.random.default_rng(31)
    parts = []
    for j in range(J):
        locs = rng.uniform(size=(N_J, 2))
        X = np.column_stack([np.ones(N_J), rng.standard_normal(N_J)])
        z = X @ GAMMA + np.sin(4 * locs[:, 0]) + 0.5 * rng.standard_normal(N_J) + 0.3 * j
        parts.append((locs, z, X))
    path = tmp_path_factory.mktemp("predref") / "s.zarr"
    write_store(path, parts, partition="random", crs=None, covariate_names=["intercept", "c1"])
    g = np.linspace(0.15, 0.85, 3)
    knots = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    # targets: new points, and three training locations (one per site: coincident points matter for mpp)
    locs0 = np.vstack([rng.uniform(size=(9, 2)), [parts[j][0][3 + j] for j in range(J)]])
    X0 = np.column_stack([np.ones(len(locs0)), rng.standard_normal(len(locs0))])
    return path, parts, knots, locs0, X0


def residual_block(a, b, knots, residual):
    """cov(w̃(a), w̃(b)) of two point sets in the same site's residual block."""
    Kinv = np.linalg.inv(cov(knots, knots))
    if residual == "full":
        return cov(a, b) - cov(a, knots) @ Kinv @ cov(knots, b)
    if residual == "mpp":
        same = cdist(a, b) == 0.0
        diag = SIGMA2 - np.einsum("ij,jk,ik->i", cov(a, knots), Kinv, cov(a, knots))
        return np.where(same, diag[:, None], 0.0)
    return np.zeros((len(a), len(b)))


def nearest_owner(parts, locs0):
    """The site holding each target's nearest observation (ties: the lowest index)."""
    return np.argmin([cdist(locs0, p[0]).min(axis=1) for p in parts], axis=0)


def lowrank_reference(parts, knots, locs0, X0, residual):
    """(μ, Σ, mean, sd_latent, sd) from the dense low-rank model covariance."""
    L = np.vstack([p[0] for p in parts])
    z, X = np.concatenate([p[1] for p in parts]), np.vstack([p[2] for p in parts])
    site = np.repeat(np.arange(J), N_J)
    K = cov(knots, knots)
    Q = lambda a, b: cov(a, knots) @ np.linalg.solve(K, cov(knots, b))  # noqa: E731
    C = Q(L, L) + np.eye(len(L)) / DELTA
    for j in range(J):
        idx = np.flatnonzero(site == j)
        C[np.ix_(idx, idx)] += residual_block(L[idx], L[idx], knots, residual)
    e = z - X @ GAMMA
    Ci_e = np.linalg.solve(C, e)
    mu = cov(knots, L) @ Ci_e
    Sigma = K - cov(knots, L) @ np.linalg.solve(C, cov(L, knots))
    owner = nearest_owner(parts, locs0)
    c0 = Q(locs0, L)
    prior = np.diag(Q(locs0, locs0)).copy()
    for i, j in enumerate(owner):
        idx = np.flatnonzero(site == j)
        c0[i, idx] += residual_block(locs0[i:i + 1], L[idx], knots, residual)[0]
        prior[i] += residual_block(locs0[i:i + 1], locs0[i:i + 1], knots, residual)[0, 0]
    mean = X0 @ GAMMA + c0 @ Ci_e
    var = prior - np.einsum("ij,ji->i", c0, np.linalg.solve(C, c0.T))
    return mu, Sigma, mean, np.sqrt(var), np.sqrt(var + 1.0 / DELTA)


def independent_reference(parts, locs0, X0, owner):
    """(mean, sd_latent, sd) of kriging each target from its owner's data alone under C_jj + δ⁻¹I."""
    mean, var = X0 @ GAMMA, np.full(len(locs0), SIGMA2)
    for i, j in enumerate(owner):
        locs, z, X = parts[j]
        C = cov(locs, locs) + np.eye(len(z)) / DELTA
        c0 = cov(locs0[i:i + 1], locs)[0]
        mean[i] += c0 @ np.linalg.solve(C, z - X @ GAMMA)
        var[i] -= c0 @ np.linalg.solve(C, c0)
    return mean, np.sqrt(var), np.sqrt(var + 1.0 / DELTA)


def model_for(knots, residual, mu, Sigma, method="lowrank"):
    params = Params(mu, Sigma, GAMMA.copy(), DELTA, SIGMA2, BETA)
    return pr.FittedModel(params, knots, 0.5, residual, method, ["intercept", "c1"])


def predicted(path, model, locs0, X0, predictor, worker=None):
    with pr.open_workers(open_store(path), model, "simulated") as workers:
        return pr.predict_at(workers, model, locs0, X0, predictor, worker, chunk=5)  # batches of 5 as well


def check(got, mean, sd_latent, sd):
    np.testing.assert_allclose(got["mean"], mean, rtol=1e-7, atol=1e-9, err_msg="mean")
    np.testing.assert_allclose(got["sd_latent"], sd_latent, rtol=1e-7, atol=1e-7, err_msg="sd_latent")
    np.testing.assert_allclose(got["sd"], sd, rtol=1e-7, atol=1e-9, err_msg="sd")


@pytest.mark.parametrize("residual, predictor", [("full", "lowrank"), ("mpp", "lowrank"), ("pp", "lowrank"),
                                                  ("mpp", "seamless"), ("pp", "seamless")])
def test_lowrank_predictor_is_the_dense_gp_conditional(problem, residual, predictor):
    """The seamless predictor of an mpp or pp fit is the owner predictor (nothing to blend: see prediction.py)."""
    path, parts, knots, locs0, X0 = problem
    mu, Sigma, mean, sd_latent, sd = lowrank_reference(parts, knots, locs0, X0, residual)
    got = predicted(path, model_for(knots, residual, mu, Sigma), locs0, X0, predictor)
    np.testing.assert_array_equal(got["owner"], nearest_owner(parts, locs0))
    check(got, mean, sd_latent, sd)


def test_independent_predictor_is_kriging_from_the_owner_alone(problem):
    path, parts, knots, locs0, X0 = problem
    owner = nearest_owner(parts, locs0)
    model = model_for(knots, "full", np.zeros(len(knots)), np.zeros((len(knots), len(knots))), "independent")
    got = predicted(path, model, locs0, X0, "independent")
    np.testing.assert_array_equal(got["owner"], owner)
    check(got, *independent_reference(parts, locs0, X0, owner))


@pytest.mark.parametrize("worker", [0, 2])
def test_personal_predictor_is_kriging_from_the_chosen_site(problem, worker):
    path, parts, knots, locs0, X0 = problem
    model = model_for(knots, "full", np.zeros(len(knots)), np.zeros((len(knots), len(knots))), "independent")
    got = predicted(path, model, locs0, X0, "personal", worker)
    assert (got["owner"] == worker).all()
    check(got, *independent_reference(parts, locs0, X0, np.full(len(locs0), worker)))


def test_ols_predictor_is_pooled_least_squares(problem):
    path, parts, knots, locs0, X0 = problem
    z, X = np.concatenate([p[1] for p in parts]), np.vstack([p[2] for p in parts])
    g, rss = np.linalg.lstsq(X, z, rcond=None)[:2]
    s2 = float(rss[0]) / (len(z) - X.shape[1])  # residual degrees of freedom N − p
    lev = np.array([x @ np.linalg.solve(X.T @ X, x) for x in X0])
    model = model_for(knots, "full", np.zeros(len(knots)), np.zeros((len(knots), len(knots))), "independent")
    got = predicted(path, model, locs0, X0, "ols")
    check(got, X0 @ g, np.sqrt(s2 * lev), np.sqrt(s2 * (1 + lev)))
    assert (got["owner"] == -1).all()


def test_ols_prediction_asks_a_runtime_for_the_moments(problem):
    path, parts, knots, locs0, X0 = problem
    model = model_for(knots, "full", np.zeros(len(knots)), np.zeros((len(knots), len(knots))), "independent")
    with pr.open_workers(open_store(path), model, "simulated") as workers:
        got = pr.ols_prediction(workers, X0)
    z, X = np.concatenate([p[1] for p in parts]), np.vstack([p[2] for p in parts])
    np.testing.assert_allclose(got["mean"], X0 @ np.linalg.lstsq(X, z, rcond=None)[0], rtol=1e-10)


def test_ols_sd_divides_by_one_residual_degree_of_freedom():
    """N − p = 1 (three points, two covariates over two sites): s² is the residual sum of squares itself."""
    X = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 3.0]])
    z = np.array([0.0, 2.0, 3.0])
    moments = lambda rows: {"XtX": X[rows].T @ X[rows], "Xtz": X[rows].T @ z[rows],  # noqa: E731
                            "ztz": z[rows] @ z[rows], "n": len(rows)}
    g, rss = np.linalg.lstsq(X, z, rcond=None)[:2]
    x0 = np.array([[1.0, 2.0]])
    lev = x0[0] @ np.linalg.solve(X.T @ X, x0[0])
    got = pr.ols_prediction({0: moments([0, 1]), 1: moments([2])}, x0)
    np.testing.assert_allclose(got["mean"], x0 @ g)
    np.testing.assert_allclose(got["sd"], np.sqrt(rss[0] * (1 + lev)))
    np.testing.assert_allclose(got["sd_latent"], np.sqrt(rss[0] * lev))
