"""SiteRecords (algorithm/site_records.py): which answer models a site where."""

import numpy as np
import pytest
from support import simulate

from spatialfed.algorithm.config import StatsPolicy
from spatialfed.algorithm.likelihood import distance, sum_statistics
from spatialfed.algorithm.site_records import SiteRecords
from spatialfed.model.stats import site_statistics


@pytest.fixture(scope="module")
def problem():
    return simulate(J=4, n=60, side=4, residual="full", seed=3)


def test_an_exploration_that_went_astray_leaves_the_epoch_answer_in_charge(problem):
    """Site 0 answered at the epoch's point u1 with the others, then explored 0.45 away: at u1 the surrogate still
    sums the exact statistics, since each site is modelled around its answer nearest to where it is evaluated."""
    models, _, _ = problem
    u1 = np.log([8.0, 0.8, 0.08])
    far = u1 + np.array([0.0, 0.3, -0.336])
    records = SiteRecords(StatsPolicy())
    for j, lm in enumerate(models):
        records.answered(j, site_statistics(lm, u1), 0, [], epoch=True)
    records.answered(0, site_statistics(models[0], far), 1, [])
    assert distance(far, u1) == pytest.approx(0.45, abs=1e-3)
    assert np.array_equal(records.nearest(u1, [0, 1, 2, 3])[0]["u"], u1)
    assert np.array_equal(records.nearest(far, [0, 1, 2, 3])[0]["u"], far)
    exact = sum_statistics([site_statistics(lm, u1) for lm in models])
    found = records.surrogate(u1, [0, 1, 2, 3], int(exact["n"]), 1, 1.0)
    np.testing.assert_allclose(found.at(u1)["S"], exact["S"], rtol=1e-10)


def test_spread_is_the_observation_weighted_mean_square_distance_of_the_models(problem):
    """Sites 0 and 1 answered at u1, sites 2 and 3 at u2 (0.2 away), site 0 with three times the observations: at the
    midpoint every model is 0.1 away; at u2 sites 0 and 1 are 0.2 away, with 4 of the 6 shares of observations."""
    models, _, _ = problem
    u1 = np.log([8.0, 0.8, 0.08])
    u2 = u1 + np.array([0.0, 0.12, 0.16])
    records = SiteRecords(StatsPolicy())
    for j, lm in enumerate(models):
        xi = site_statistics(lm, u1 if j < 2 else u2)
        records.answered(j, {**xi, "n": 3 * xi["n"]} if j == 0 else xi, 0, [])
    active = [0, 1, 2, 3]
    assert records.spread(0.5 * (u1 + u2), u1, active) == pytest.approx(0.01, rel=1e-12)
    assert records.spread(u2, u2, active) == pytest.approx(0.04 * 4 / 6, rel=1e-12)
