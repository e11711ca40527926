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


def held_out(problem, shift=(0.0, 0.0, 0.0), answered=(0, 1, 2)):
    """Sites 0–2 answer at their optimum u_s moved by `shift`; site 3 is held out. Returns u, the optimum of all
    four and records.influence(u, answered, ...) with a Newton step on the surrogate."""
    models, knots, kernel = problem
    u_s = optimum(models[:3], knots, kernel, np.log([8.0, 0.8, 0.08]))
    u_all, u = optimum(models, knots, kernel, u_s), u_s + np.asarray(shift)
    records = SiteRecords(StatsPolicy())
    for j, lm in enumerate(models[:3]):
        records.answered(j, site_statistics(lm, u), 0, [], epoch=True)

    def newton(at, v):
        pr = profile_loglik(at(v), knots, kernel)
        return trust_region_step(v, pr.grad, pr.hess, np.inf, np.full(3, -20.0), np.full(3, 20.0)).p

    return u, u_all, records.influence(u, list(answered), sum(lm.n for lm in models), 0, newton)


def test_the_jackknife_reach_covers_where_the_held_site_moves_the_optimum(problem):
    """The premise of the hold's restart rule: the optimum of all sites lies within ι of the others' optimum u_s,
    ι = records.influence(u_s, ...) for the observations it stands in for (site 3's)."""
    u_s, u_all, (way, reach) = held_out(problem)
    assert way is not None and 0 < distance(u_all, u_s) <= reach
    assert held_out(problem, answered=())[2] == (None, np.inf)


def test_from_an_unsettled_point_the_optimum_lies_within_the_newton_step_and_the_reach(problem):
    """A hold can end while the others' surrogate is still moving (9 of 10 sites overshot log β by 0.5 and were
    coming back): from such a u the full optimum lies farther than the jackknife's reach ι alone, but within the
    surrogate's Newton step N plus ι, the bound the restart rule uses."""
    u, u_all, (way, reach) = held_out(problem, shift=(0.0, 0.0, 0.4))
    assert reach < distance(u_all, u) <= np.linalg.norm(way) + reach
