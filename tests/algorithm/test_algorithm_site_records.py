"""SiteRecords (algorithm/site_records.py): which answer models a site where, and the jackknife's reach of a held
site's data."""

import numpy as np
import pytest
from support import simulate

from spatialfed.algorithm.config import StatsPolicy
from spatialfed.algorithm.profile import distance, profile_loglik, sum_statistics, trust_region_step
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


def optimum(models, knots, kernel, u):
    """Newton on the exact profile ℓ of these sites' summed statistics, from u."""
    for _ in range(50):
        pr = profile_loglik(sum_statistics([site_statistics(lm, u) for lm in models]), knots, kernel)
        step = trust_region_step(u, pr.grad, pr.hess, 0.5, np.full(3, -20.0), np.full(3, 20.0))
        u = u + step.p
        if np.max(np.abs(step.p)) < 1e-9:
            return u
    raise AssertionError("no convergence")


def test_the_jackknife_reach_covers_where_the_held_site_moves_the_optimum(problem):
    """The premise of the hold's restart rule: the optimum of all sites lies within ι of the others' optimum u_s,
    ι = records.influence(u_s, ...) for the observations it stands in for (site 3's)."""
    models, knots, kernel = problem
    u_s = optimum(models[:3], knots, kernel, np.log([8.0, 0.8, 0.08]))
    u_all = optimum(models, knots, kernel, u_s)
    records = SiteRecords(StatsPolicy())
    for j, lm in enumerate(models[:3]):
        records.answered(j, site_statistics(lm, u_s), 0, [], epoch=True)

    def newton(at, u):
        pr = profile_loglik(at(u), knots, kernel)
        return trust_region_step(u, pr.grad, pr.hess, np.inf, np.full(3, -20.0), np.full(3, 20.0)).p

    n_obs = sum(lm.n for lm in models)
    way, reach = records.influence(u_s, [0, 1, 2], n_obs, 0, newton)
    assert way is not None and 0 < distance(u_all, u_s) <= reach
    assert records.influence(u_s, [], n_obs, 0, newton) == (None, np.inf)


def test_from_an_unsettled_point_the_optimum_lies_within_the_newton_step_and_the_reach(problem):
    """A hold can end while the others' surrogate is still moving (9 of 10 sites overshot log β by 0.5 and were
    coming back): from such a u the full optimum lies farther than the jackknife's reach ι alone, but within the
    surrogate's Newton step N plus ι, the bound the restart rule uses."""
    models, knots, kernel = problem
    u_s = optimum(models[:3], knots, kernel, np.log([8.0, 0.8, 0.08]))
    u_all = optimum(models, knots, kernel, u_s)
    u = u_s + np.array([0.0, 0.0, 0.4])
    records = SiteRecords(StatsPolicy())
    for j, lm in enumerate(models[:3]):
        records.answered(j, site_statistics(lm, u), 0, [], epoch=True)

    def newton(at, v):
        pr = profile_loglik(at(v), knots, kernel)
        return trust_region_step(v, pr.grad, pr.hess, np.inf, np.full(3, -20.0), np.full(3, 20.0)).p

    way, reach = records.influence(u, [0, 1, 2], sum(lm.n for lm in models), 0, newton)
    assert reach < distance(u_all, u) <= np.linalg.norm(way) + reach


def measured_rate(problem, d):
    """The rate SiteRecords.observed measures when site 0, modelled around the epoch point u1, answers d away."""
    models, knots, kernel = problem
    u1 = np.log([8.0, 0.8, 0.08])
    v = u1 + d * np.array([0.6, -0.48, 0.64])
    records = SiteRecords(StatsPolicy())
    for j, lm in enumerate(models):
        records.answered(j, site_statistics(lm, u1), 0, [], epoch=True)
    answer = site_statistics(models[0], v)
    records.validate(0, answer)
    records.answered(0, answer, 1, [])
    found = records.surrogate(v, [0, 1, 2, 3], sum(lm.n for lm in models), 1, 1.0)
    records.observed(lambda st: profile_loglik(st, knots, kernel, derivatives=False).loglik, found.at, 4, 1e-9)
    return records


def test_a_model_error_is_measured_as_a_third_order_rate(problem):
    """A site's second-order model from the epoch point errs by κ·n_j·d³ at distance d: the rate measured where it
    answers 0.1 away and 0.05 away is the same κ (a rate in d² or d⁴ would differ by 2×), and no rate is measured
    where the model is exact."""
    far, near = measured_rate(problem, 0.1), measured_rate(problem, 0.05)
    assert len(far.rates) == len(near.rates) == 1 and not far.pending
    assert 0 < far.rates[0] and 0.75 < far.rates[0] / near.rates[0] < 1.33
    assert measured_rate(problem, 0.0).rates == []


def test_the_error_slope_bounds_what_the_surrogate_can_tell_apart(problem):
    """error_slope(a, b) = 3κ Σ_j n_j d_j² |a − b|: None before any rate is measured, 0 for one point, linear in
    |a − b| for a fixed farther distance d_j from the model centres."""
    models, _, _ = problem
    u1 = np.log([8.0, 0.8, 0.08])
    records = SiteRecords(StatsPolicy())
    for j, lm in enumerate(models):
        records.answered(j, site_statistics(lm, u1), 0, [], epoch=True)
    e = np.array([0.0, 0.0, 1.0])
    assert records.error_slope(u1 + 0.1 * e, u1, [0, 1, 2, 3]) is None
    records.rates = [2e-3, 5e-3]
    a = u1 + 0.1 * e
    assert records.error_slope(a, a, [0, 1, 2, 3]) == 0.0
    n = sum(lm.n for lm in models)
    assert records.error_slope(a, u1 + 0.05 * e, [0, 1, 2, 3]) == pytest.approx(3 * 5e-3 * n * 0.1**2 * 0.05)
    assert records.error_slope(a, u1 - 0.1 * e, [0, 1, 2, 3]) == pytest.approx(3 * 5e-3 * n * 0.1**2 * 0.2)
