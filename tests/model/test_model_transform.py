"""The log transform's back-transform and scores against scipy's lognormal and direct numerical integration."""

import numpy as np
import pytest
from scipy import integrate, stats

from spatialfed.errors import DataError
from spatialfed.model import transform as T
from spatialfed.outputs import metrics

M = np.array([4.8, 6.0, 7.3])
S = np.array([0.15, 0.6, 1.1])


def test_back_is_the_lognormal_mean_sd_median_and_quantiles():
    pred = T.back({"mean": M, "sd": S, "sd_latent": S / 2, "owner": np.arange(3)}, "log")
    dist = stats.lognorm(s=S, scale=np.exp(M))
    np.testing.assert_allclose(pred["mean"], dist.mean(), rtol=1e-12)
    np.testing.assert_allclose(pred["sd"], dist.std(), rtol=1e-12)
    np.testing.assert_allclose(pred["median"], dist.median(), rtol=1e-12)
    np.testing.assert_allclose(pred["q025"], dist.ppf(0.025), rtol=1e-9)
    np.testing.assert_allclose(pred["q975"], dist.ppf(0.975), rtol=1e-9)
    np.testing.assert_array_equal(pred["mean_log"], M)
    np.testing.assert_array_equal(pred["sd_latent"], S / 2)  # the latent sd stays on the fitted (log) scale
    plain = {"mean": M, "sd": S}
    assert T.back(plain, None) is plain and T.back(plain, "none") is plain


@pytest.mark.parametrize("z", [60.0, 400.0, 1500.0, 5000.0])
def test_crps_lognormal_equals_the_integral_of_the_squared_cdf_difference(z):
    for mu, sigma in zip(M, S):
        F = stats.lognorm(s=sigma, scale=np.exp(mu)).cdf
        below = integrate.quad(lambda x: F(x) ** 2, 0, z, limit=200)[0]
        above = integrate.quad(lambda x: (1 - F(x)) ** 2, z, np.inf, limit=200)[0]
        assert T.crps_lognormal(z, mu, sigma) == pytest.approx(below + above, rel=1e-6)


def test_log_density_is_scipys():
    z = np.array([100.0, 500.0, 2000.0])
    np.testing.assert_allclose(T.log_density(z, M, S), stats.lognorm(s=S, scale=np.exp(M)).logpdf(z), rtol=1e-12)


def test_forward_and_inverse_and_their_refusals():
    np.testing.assert_allclose(T.inverse(T.forward([1.0, 10.0], "log"), "log"), [1.0, 10.0])
    np.testing.assert_array_equal(T.forward([-1.0, 2.0], None), [-1.0, 2.0])
    with pytest.raises(DataError, match=r"^transform='log' needs positive values, but 2 of 4 of column 'zinc' are "
                                        r"≤ 0 \(smallest -3\); drop or correct them"):
        T.forward([5.0, 0.0, -3.0, 1.0], "log", what="column 'zinc'")
    with pytest.raises(DataError, match=r"^transform must be None or 'log'"):
        T.check_transform("sqrt")
    assert T.of_store(type("S", (), {"attrs": {"transform": "log"}})()) == "log"
    assert T.of_store(type("S", (), {"attrs": {}})()) == "none"


def test_prediction_scores_of_a_log_prediction_are_on_the_own_scale():
    rng = np.random.default_rng(3)
    m, s = rng.normal(6, 0.5, 4000), np.full(4000, 0.4)
    z = np.exp(rng.normal(m, s))  # draws from the predictive itself: coverage ≈ 0.95
    pred = T.back({"mean": m, "sd": s}, "log")
    got = metrics.prediction_scores(z, pred)
    assert got["rmse"] == pytest.approx(np.sqrt(np.mean((z - pred["mean"]) ** 2)))
    assert got["crps"] == pytest.approx(np.mean(T.crps_lognormal(z, m, s)))
    assert abs(got["coverage95"] - 0.95) < 3 * np.sqrt(0.95 * 0.05 / 4000)
    assert metrics.prediction_scores(z, {"mean": z + 1, "sd": np.ones_like(z)}) == \
        metrics.scores(z, z + 1, np.ones_like(z))  # a Gaussian prediction: the Gaussian scores
    with pytest.raises(ValueError, match="must be > 0"):
        metrics.prediction_scores(-z, pred)
