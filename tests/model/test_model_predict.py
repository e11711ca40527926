"""Federated kriging (issue 5): equals the centralized low-rank formula, approaches exact GP kriging, calibrated."""

import numpy as np
import pytest

from conftest import grid_knots, simulate_parts
from spatialfed.model import blocks
from spatialfed.model import reference as ref
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params
from spatialfed.model.predict import assign_owners, federated_predict

TRUE = dict(delta=2.0, sigma2=1.2, beta=0.2)
GAMMA = np.array([1.0, 0.2])


def fitted_state(parts, knots, kernel, residual):
    """Models and the closed-form (μ, Σ) at the known parameters."""
    lms = [LocalModel(*p, knots, kernel, residual) for p in parts]
    m = len(knots)
    par = Params(np.zeros(m), np.eye(m), GAMMA, **TRUE)
    qs = [lm.mu_sigma(par) for lm in lms]
    K = blocks.knot_covariance(knots, kernel, TRUE["sigma2"], TRUE["beta"])
    mu, Sigma = blocks.update_mu_sigma(sum(q["A"] for q in qs), sum(q["b"] for q in qs), K)
    return lms, par.replace(mu=mu, Sigma=Sigma)


@pytest.fixture(scope="module")
def data():
    parts = simulate_parts(J=3, n=40, nu=1.5, seed=7, **TRUE)
    rng = np.random.default_rng(0)
    locs0 = np.vstack([rng.uniform(size=(30, 2)), parts[1][0][:3]])  # includes observed sites
    X0 = np.column_stack([np.ones(len(locs0)), rng.standard_normal(len(locs0))])
    return parts, locs0, X0


@pytest.mark.parametrize("residual", ["full", "mpp", "pp"])
def test_federated_equals_centralized_lowrank_kriging(data, residual):
    parts, locs0, X0 = data
    knots, kernel = grid_knots(4), Matern(1.5)
    lms, par = fitted_state(parts, knots, kernel, residual)
    pred = federated_predict(lms, locs0, X0, par, knots, kernel, residual)
    owners = assign_owners([lm.nearest_distance(locs0) for lm in lms])
    mean, var = ref.lowrank_kriging(parts, owners, locs0, X0, knots, kernel, residual, GAMMA, **TRUE)
    np.testing.assert_allclose(pred["mean"], mean, atol=1e-8)
    np.testing.assert_allclose(pred["sd_latent"] ** 2, var, atol=1e-8)


def test_many_knots_match_exact_gp_kriging(data):
    parts, locs0, X0 = data
    kernel = Matern(1.5)
    knots = grid_knots(12, 0.02, 0.98)  # m = 144 ≥ n_j = 40
    lms, par = fitted_state(parts, knots, kernel, "full")
    pred = federated_predict(lms, locs0, X0, par, knots, kernel, "full")
    locs = np.vstack([p[0] for p in parts])
    z, X = np.concatenate([p[1] for p in parts]), np.vstack([p[2] for p in parts])
    C = kernel.cross(locs, locs, TRUE["sigma2"], TRUE["beta"]) + np.eye(len(z)) / TRUE["delta"]
    exact = X0 @ GAMMA + kernel.cross(locs0, locs, TRUE["sigma2"], TRUE["beta"]) @ np.linalg.solve(C, z - X @ GAMMA)
    # truth for the hold-out points: the simulated latent field is not kept, so compare against exact kriging itself
    rmse_lr = np.sqrt(np.mean((pred["mean"] - exact) ** 2))
    assert rmse_lr < 0.02
    sd_noise = 1 / np.sqrt(TRUE["delta"])
    at_sites = pred["sd"][-3:]
    assert np.all(pred["sd"] > 0)
    assert np.all(at_sites < 1.2 * sd_noise) and np.all(at_sites >= sd_noise)


def test_rmse_ratio_and_interval_coverage_on_holdout():
    """Hold-out points from the same simulated field: RMSE(low-rank) ≤ 1.05·RMSE(exact), 95% coverage 0.90–0.99."""
    kernel = Matern(1.5)
    parts_all = simulate_parts(J=4, n=100, nu=1.5, seed=11, **TRUE)
    test = [p for p in parts_all[3:]][0]
    parts = parts_all[:3]
    knots = grid_knots(11, 0.02, 0.98)  # m = 121 ≥ n_j = 100
    lms, par = fitted_state(parts, knots, kernel, "full")
    pred = federated_predict(lms, test[0], test[2], par, knots, kernel, "full")
    locs = np.vstack([p[0] for p in parts])
    z, X = np.concatenate([p[1] for p in parts]), np.vstack([p[2] for p in parts])
    C = kernel.cross(locs, locs, TRUE["sigma2"], TRUE["beta"]) + np.eye(len(z)) / TRUE["delta"]
    exact = test[2] @ GAMMA + kernel.cross(test[0], locs, TRUE["sigma2"], TRUE["beta"]) @ np.linalg.solve(C, z - X @ GAMMA)
    rmse = lambda m: np.sqrt(np.mean((m - test[1]) ** 2))  # noqa: E731
    assert rmse(pred["mean"]) <= 1.05 * rmse(exact)
    cover = np.mean(np.abs(test[1] - pred["mean"]) <= 1.96 * pred["sd"])
    assert 0.90 <= cover <= 0.99


def test_prediction_input_errors(data):
    parts, locs0, X0 = data
    knots, kernel = grid_knots(4), Matern(1.5)
    lms, par = fitted_state(parts, knots, kernel, "full")
    with pytest.raises(ValueError, match="covariates"):
        federated_predict(lms, locs0, X0[:, :1], par, knots, kernel, "full")
    with pytest.raises(ValueError, match="non-finite"):
        federated_predict(lms, locs0, np.full_like(X0, np.nan), par, knots, kernel, "full")


@pytest.mark.parametrize("residual", ["full", "mpp"])
def test_kriging_in_row_blocks_equals_one_block(data, residual, monkeypatch):
    """A worker kriges n₀ locations in row blocks of ≈ KRIGING_BYTES (memory bounded for any n₀): blocks of 16 rows
    (the smallest) give the one-block answers of residual_kriging and independent_kriging."""
    from spatialfed.model import kriging

    parts, locs0, X0 = data
    knots, kernel = grid_knots(4), Matern(1.5)
    lms, par = fitted_state(parts, knots, kernel, residual)
    lm = lms[1]
    whole = lm.residual_kriging(locs0, par), lm.independent_kriging(locs0, X0, par)
    monkeypatch.setattr(kriging, "KRIGING_BYTES", 1)  # 16 rows per block: 33 locations → 3 blocks
    lm.clear_cache()
    blocked = lm.residual_kriging(locs0, par), lm.independent_kriging(locs0, X0, par)
    for one, many in zip(whole, blocked):
        for key in one:
            np.testing.assert_allclose(many[key], one[key], rtol=1e-12, atol=1e-12, err_msg=key)


def test_nearest_distance_is_the_brute_force_minimum(data):
    from scipy.spatial.distance import cdist

    parts, locs0, _ = data
    lm = LocalModel(*parts[0], grid_knots(3), Matern(1.5), "full")
    np.testing.assert_allclose(lm.nearest_distance(locs0), cdist(locs0, parts[0][0]).min(axis=1), rtol=1e-12)
    assert lm.nearest_distance(parts[0][0][:5]).max() == 0.0  # an observed site is its own nearest observation


def test_independent_kriging_names_a_singular_covariance_of_its_data(data):
    """Three observations at one location with a vanishing nugget (δ = e⁴⁰·δ): C_jj + δ⁻¹I has three equal rows
    to rounding, and the error names that matrix and the site's size."""
    parts, locs0, X0 = data
    lms, par = fitted_state(parts, grid_knots(4), Matern(1.5), "full")
    locs, z, X = (np.array(a) for a in parts[0])
    locs[3:5] = locs[2]
    lm = LocalModel(locs, z, X, grid_knots(4), Matern(1.5), "full")
    tiny = par.with_u(par.u + np.array([40.0, 0.0, 0.0]))
    with pytest.raises(np.linalg.LinAlgError, match=rf"^C_jj \+ δ⁻¹I of worker data \(n={lm.n}\) is not positive"):
        lm.independent_kriging(locs0, X0, tiny)


def test_independent_kriging_names_its_bad_input(data):
    """FGPR's personal kriging refuses malformed locations and non-finite covariates, naming which (mutation run of
    model/kriging.py, 27 Nov)."""
    parts, locs0, X0 = data
    lms, par = fitted_state(parts, grid_knots(4), Matern(1.5), "full")
    with pytest.raises(ValueError, match="^prediction locations must be an array of shape"):
        lms[0].independent_kriging(np.ones((3, 3)), X0[:3], par)
    with pytest.raises(ValueError, match="^prediction locations contains 1 non-finite"):
        lms[0].independent_kriging(np.where(np.arange(66).reshape(33, 2) == 5, np.nan, locs0), X0, par)
    with pytest.raises(ValueError, match="^prediction covariates contains 1 non-finite"):
        lms[0].independent_kriging(locs0, np.where(np.arange(66).reshape(33, 2) == 5, np.nan, X0), par)
