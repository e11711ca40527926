"""Held-out scores: CRPS against its defining integral, RMSE/MAE/coverage by hand, input checks."""

import numpy as np
import pytest
from scipy import integrate, stats

from spatialfed.outputs import metrics


@pytest.mark.parametrize("mu, sd, y", [(0.0, 1.0, 0.3), (2.0, 0.5, -1.0), (-1.0, 3.0, 4.0)])
def test_crps_matches_its_integral(mu, sd, y):
    """CRPS(F, y) = ∫ (F(x) − 1{x ≥ y})² dx."""
    F = stats.norm(mu, sd).cdf
    lo, hi = min(mu - 12 * sd, y), max(mu + 12 * sd, y)
    left = integrate.quad(lambda x: F(x) ** 2, lo, y, limit=200)[0]
    right = integrate.quad(lambda x: (1 - F(x)) ** 2, y, hi, limit=200)[0]
    np.testing.assert_allclose(metrics.crps_gaussian([y], [mu], [sd])[0], left + right, rtol=1e-7)


def test_scores_by_hand():
    y, m, s = np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.5, 2.0, 2.0, 4.0]), np.array([0.2, 1.0, 0.4, 1.0])
    out = metrics.scores(y, m, s)
    assert out["n"] == 4
    np.testing.assert_allclose(out["rmse"], np.sqrt((0.25 + 0 + 1 + 0) / 4))
    np.testing.assert_allclose(out["mae"], 1.5 / 4)
    assert out["coverage95"] == 0.5  # |y − m| = 0.5 > 1.96·0.2 and 1 > 1.96·0.4 fall outside
    assert out["crps"] == pytest.approx(np.mean(metrics.crps_gaussian(y, m, s)))


def test_crps_of_a_point_forecast_tends_to_abs_error():
    assert metrics.crps_gaussian([1.0], [3.0], [1e-9])[0] == pytest.approx(2.0, abs=1e-6)


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="equal length"):
        metrics.scores([1.0, 2.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="sd must be > 0"):
        metrics.scores([1.0], [1.0], [0.0])
    with pytest.raises(ValueError, match="finite"):
        metrics.rmse([np.nan], [1.0])


def test_table_has_one_row_per_method():
    row = metrics.scores([1.0, 2.0], [1.1, 1.8], [0.5, 0.5])
    text = metrics.table({"low-rank": row, "OLS": row})
    assert text.count("\n") == 3 and "| low-rank | 2 |" in text
