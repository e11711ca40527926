"""Site-blocked CV of a statistics fit (api/blocked_cv.py, model/blocked.py): each site's points predicted from the
other sites' statistics equal the dense centralized low-rank kriging on the other sites' pooled data (their GLS γ,
no residual shared with the held-out points), fixed ν and anisotropic; fit.json keeps the score and load restores
it; fits whose server must not see single sites' statistics record None."""

import json

import numpy as np
import pytest
from scipy import stats

from spatialfed import FederatedGP
from spatialfed.api import blocked_cv, units
from spatialfed.data.store import load_worker, open_store
from spatialfed.model.blocked import held_out_prediction
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.reference import lowrank_kriging, profile_lowrank_loglik
from spatialfed.outputs.metrics import crps_gaussian
from tests.conftest import grid_knots, simulate_parts

KNOTS = grid_knots(3)
PARTS = simulate_parts(J=3, n=40, nu=1.5, beta=0.2, seed=3)


def _fit(**settings):
    locs = np.vstack([p[0] for p in PARTS])
    z = np.concatenate([p[1] for p in PARTS])
    X = np.vstack([p[2][:, 1:] for p in PARTS])  # the intercept is the estimator's own
    groups = np.repeat(np.arange(len(PARTS)), [len(p[1]) for p in PARTS])
    settings = {"mode": "sync", "knots": KNOTS, "cluster": "simulated", "progress": False, **settings}
    return FederatedGP(**settings).fit(X, z, coords=locs, groups=groups)


def _fit_with_server(**settings):
    """The fit and its finished server (kept by wrapping site_blocked_scores)."""
    seen = {}
    real = blocked_cv.site_blocked_scores

    def keep(server, runtime, specs=None):
        seen["server"] = server
        return real(server, runtime, specs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(blocked_cv, "site_blocked_scores", keep)
        gp = _fit(**settings)
    return gp, seen["server"]


@pytest.fixture(scope="module")
def fixed_nu_fit():
    return _fit_with_server()


@pytest.mark.parametrize("anisotropy", [False, True], ids=["fixed-nu", "anisotropy"])
def test_the_federated_score_equals_the_dense_centralized_conditional(anisotropy, fixed_nu_fit):
    gp, server = _fit_with_server(anisotropy=True) if anisotropy else fixed_nu_fit
    u, calls = blocked_cv.conditionals(server)
    assert np.allclose(np.exp(u[:3]), [gp.params_[k] for k in ("delta", "sigma2", "beta")], rtol=1e-12)
    kernel = server.kernel
    assert isinstance(kernel, Matern) != anisotropy
    delta, sigma2 = float(np.exp(u[0])), float(np.exp(u[1]))
    theta = float(np.exp(u[2])) if isinstance(kernel, Matern) else u[2:]
    parts = [load_worker(gp.store_, j) for j in range(open_store(gp.store_).n_workers)]
    ys, means, variances = [], [], []
    for j, (locs, z, X) in enumerate(parts):
        others = [p for i, p in enumerate(parts) if i != j]
        gamma = profile_lowrank_loglik(others, KNOTS, kernel, "full", u)[1]  # the others' GLS γ at û
        mean, latent = lowrank_kriging(others, np.full(len(z), -1), locs, X, KNOTS, kernel, "full", gamma, delta,
                                       sigma2, theta)
        fed_mean, fed_var = held_out_prediction(LocalModel(locs, z, X, KNOTS, kernel, "full"), *calls[j])
        assert np.max(np.abs(calls[j][2] - gamma)) < 1e-8
        assert np.max(np.abs(fed_mean - mean)) < 1e-8
        assert np.max(np.abs(fed_var - (latent + 1.0 / delta))) < 1e-8
        ys.append(z)
        means.append(mean)
        variances.append(latent + 1.0 / delta)
    y, mean, sd = np.concatenate(ys), np.concatenate(means), np.sqrt(np.concatenate(variances))
    cv = gp.site_blocked_cv_
    assert cv["n"] == len(y) == 120 and [s["site"] for s in cv["per_site"]] == [0, 1, 2]
    assert cv["rmse"] == pytest.approx(np.sqrt(np.mean((y - mean) ** 2)), rel=1e-8)
    assert cv["crps"] == pytest.approx(np.mean(crps_gaussian(y, mean, sd)), rel=1e-8)
    assert cv["mlpd"] == pytest.approx(np.mean(stats.norm.logpdf(y, mean, sd)), rel=1e-8)
    assert cv["per_site"][0]["rmse"] == pytest.approx(np.sqrt(np.mean((ys[0] - means[0]) ** 2)), rel=1e-8)


def test_fit_json_keeps_the_score_and_load_restores_it(fixed_nu_fit, tmp_path):
    gp, _ = fixed_nu_fit
    out = gp.save(tmp_path / "fit")
    assert json.loads((out / "fit.json").read_text())["site_blocked_cv"] == gp.site_blocked_cv_  # floats round-trip
    assert FederatedGP.load(out).site_blocked_cv_ == gp.site_blocked_cv_
    line = units.describe_cv(gp.site_blocked_cv_)
    assert line.startswith("site-blocked CV (3 sites") and f"RMSE {gp.site_blocked_cv_['rmse']:.4g}" in line
    assert "site-blocked CV (each of 3 sites" in (out / "report.html").read_text()


@pytest.mark.parametrize("settings", [{"privacy": "secure_aggregation"}, {"strategies": "tuned", "max_iter": 3}],
                         ids=["secure-aggregation", "block-preset"])
def test_fits_whose_server_must_not_see_single_sites_record_none(settings, tmp_path):
    gp = _fit(**settings)
    assert gp.site_blocked_cv_ is None and gp.result_.extra["site_blocked_cv"] is None
    assert units.describe_cv(gp.site_blocked_cv_) is None
    assert "site_blocked_cv" not in gp.result_.to_json()
