"""The estimator's covariance options (api/covariance.py): ``nu="estimate"`` and ``anisotropy=True`` fitted through
FederatedGP on the runtime, sync and async, reach the centralized optimum of the same model; a fitted anisotropy
predicts as the centralized kriging of the anisotropic covariance; save/load keeps what the fit reported."""

import numpy as np
import pytest
from scipy import optimize
from scipy.spatial.distance import cdist

from spatialfed import FederatedGP
from spatialfed.api.covariance import major_axis
from spatialfed.data.store import load_worker, open_store
from spatialfed.model.family import MaternFamily
from spatialfed.model.matern import Matern
from spatialfed.model.reference import lowrank_kriging, profile_lowrank_loglik
from tests.conftest import grid_knots, simulate_parts

KNOTS = grid_knots(3)


def _fit(parts, mode="sync", residual="auto", **covariance):
    locs = np.vstack([p[0] for p in parts])
    z = np.concatenate([p[1] for p in parts])
    X = np.vstack([p[2][:, 1:] for p in parts])  # the intercept is the estimator's own
    groups = np.repeat(np.arange(len(parts)), [len(p[1]) for p in parts])
    gp = FederatedGP(mode=mode, residual=residual, knots=KNOTS, cluster="simulated", progress=False, tol=1e-7,
                     max_iter=200, **covariance)
    return gp.fit(X, z, coords=locs, groups=groups)


def _store_parts(gp):
    path = gp.store_
    return [load_worker(path, j) for j in range(open_store(path).n_workers)]


def _centralized_optimum(parts, family, u0, residual="full"):
    f = lambda u: -profile_lowrank_loglik(parts, KNOTS, family, residual, u)[0]  # noqa: E731
    res = optimize.minimize(f, u0, method="Nelder-Mead", options={"xatol": 1e-9, "fatol": 1e-12, "maxiter": 20000})
    return -res.fun, res.x


@pytest.mark.parametrize("covariance, family, residual", [
    pytest.param({"anisotropy": True}, MaternFamily(0.5, True), "full", id="anisotropy"),
    pytest.param({"nu": "estimate"}, MaternFamily(None), "full", id="nu", marks=pytest.mark.slow),
    pytest.param({"anisotropy": True}, MaternFamily(0.5, True), "vecchia", id="anisotropy-vecchia"),
])
def test_an_estimated_family_reaches_the_centralized_optimum_sync_and_async(covariance, family, residual):
    """vecchia: the optimum of the dense ℓ of the same approximation (15 neighbours of 40 points a site)."""
    parts = simulate_parts(J=3, n=40, nu=1.5, beta=0.2, seed=3)
    fits = {mode: _fit(parts, mode, residual, **covariance) for mode in ("sync", "async")}
    store_parts = _store_parts(fits["sync"])
    u = np.log([fits["sync"].params_[k] for k in ("delta", "sigma2", "beta")])
    kappa = np.concatenate([u, [] if family.nu is not None else [np.log(fits["sync"].params_["nu"])]])
    if family.anisotropy:  # the estimator reports the major axis: (β, r, φ) as fitted is one of its two spellings
        vp = fits["sync"].variogram_params_
        kappa = np.concatenate([kappa, [np.log(vp["anisotropy_ratio"]), np.radians(vp["angle_deg"])]])
    best, u_best = _centralized_optimum(store_parts, family, kappa, residual)
    for mode, gp in fits.items():
        assert abs(gp.loglik_ - best) <= 1e-6, (mode, gp.loglik_, best)
        assert gp.converged_ and gp.stop_reason_ == "tol"
    assert fits["sync"].params_["beta"] == pytest.approx(fits["async"].params_["beta"], rel=1e-4)


def test_nu_estimated_reports_its_interval_and_predicts_with_nu_hat():
    parts = simulate_parts(J=3, n=40, nu=1.5, beta=0.2, seed=3)
    gp = _fit(parts, nu="estimate")
    vp = gp.variogram_params_
    assert vp["nu"] == gp.params_["nu"] and 0.2 <= vp["nu"] <= 4.0
    lo, hi = vp["nu_95_wald"]  # the profile-likelihood nu_95: tests/api/test_api_nu_profile.py
    assert 0.2 <= lo < vp["nu"] < hi <= 4.0
    assert vp["nu_se_log"] > 0
    assert vp["practical_range"] == pytest.approx(vp["range"] * Matern(vp["nu"]).effective_range_factor())
    assert gp.result_.nu == vp["nu"]  # what save writes, and what prediction krige with


def test_the_metric_makes_the_anisotropic_matern_isotropic():
    """MaternFamily.metric A: ρ_aniso(s, s') = ρ_ν(‖A(s − s')‖ / β), the identity prediction relies on."""
    family = MaternFamily(1.5, True)
    kappa = np.array([np.log(0.2), np.log(3.0), np.radians(30.0)])
    rng = np.random.default_rng(0)
    a, b = rng.uniform(size=(20, 2)), rng.uniform(size=(15, 2))
    A = family.metric(kappa)
    np.testing.assert_allclose(family.correlation(a, b, kappa),
                               Matern(1.5).correlation(cdist(a @ A.T, b @ A.T), 0.2), rtol=1e-12, atol=1e-14)


def test_major_axis_reads_either_spelling_of_one_model():
    assert major_axis(0.2, 3.0, np.radians(30.0)) == pytest.approx((0.2, 3.0, 30.0))
    assert major_axis(0.2 / 3.0, 1.0 / 3.0, np.radians(-60.0)) == pytest.approx((0.2, 3.0, 30.0))


def test_a_fitted_anisotropy_predicts_as_the_centralized_kriging(tmp_path):
    """The sites' locations, the knots and the targets mapped by A: the mean and latent variance of the dense
    low-rank kriging of the anisotropic covariance (model/reference.py), to rounding; after save/load the same."""
    from spatialfed.api.predicting import fitted_model
    from spatialfed.outputs.prediction import open_workers, predict_at

    parts = simulate_parts(J=3, n=40, nu=0.5, beta=0.2, seed=5)
    gp = _fit(parts, anisotropy=True)
    model = fitted_model(gp)
    rng = np.random.default_rng(1)
    locs0 = rng.uniform(size=(25, 2))
    X0 = np.column_stack([np.ones(25), rng.standard_normal(25)])
    with open_workers(open_store(gp.store_), model, "simulated") as workers:
        pred = predict_at(workers, model, locs0, X0, "lowrank")
    p = gp.params_
    family = MaternFamily(0.5, True)
    kappa = [np.log(gp.variogram_params_["range_major"]), np.log(p["anisotropy_ratio"]), np.radians(p["angle_deg"])]
    mean, var = lowrank_kriging(_store_parts(gp), pred["owner"], locs0, X0, gp.knots_, family, gp.residual_,
                                p["gamma"], p["delta"], p["sigma2"], kappa)
    np.testing.assert_allclose(pred["mean"], mean, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(pred["sd_latent"] ** 2, var, rtol=1e-6, atol=1e-9)
    gp.save(tmp_path / "fit")
    again = FederatedGP.load(tmp_path / "fit")
    assert {k: again.variogram_params_[k] for k in ("angle_deg", "anisotropy_ratio", "metric")} == {
        k: gp.variogram_params_[k] for k in ("angle_deg", "anisotropy_ratio", "metric")}
    np.testing.assert_allclose(again.predict(X0[:, 1:], coords=locs0), gp.predict(X0[:, 1:], coords=locs0),
                               rtol=1e-12)


@pytest.mark.parametrize("settings, says", [
    ({"nu": "estmate"}, "nu (Matérn smoothness) must be a number > 0 or 'estimate'"),
    ({"nu": -1.0}, "must be a number > 0 or 'estimate'"),
    ({"anisotropy": "yes"}, "anisotropy must be True or False"),
    ({"nu": "estimate", "method": "fgpr"}, "method='fgpr' has a fixed isotropic Matérn"),
    ({"anisotropy": True, "strategies": "tuned"}, "fitted by the statistics scheme"),
])
def test_settings_the_fit_cannot_take_are_one_line(settings, says):
    parts = simulate_parts(J=3, n=20, seed=3)
    with pytest.raises(ValueError, match=None) as err:
        _fit(parts, **settings)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_nu_on_its_bound_is_reported_in_words():
    """Few points of a smooth-looking field: ν̂ = 4 is on the box's bound, reported in boundary_ and in words."""
    from spatialfed.api.units import on_bound

    parts = simulate_parts(J=3, n=60, nu=0.5, beta=0.2, seed=3)
    gp = _fit(parts, nu="estimate")
    assert gp.params_["nu"] == pytest.approx(4.0) and gp.boundary_ == {"nu": "upper"}
    assert gp.variogram_params_["nu_95_wald"] is None  # no Wald interval on a bound
    assert on_bound(gp.boundary_) == ["smoothness ν on its upper bound 4 (the data cannot tell a smoother field; "
                                      "ν = 4 is the constrained estimate)"]
