"""Stale-site models and pacing of the asynchronous statistics server (algorithm/stale.py, SPEC §2b)."""

import numpy as np
import pytest
from support import simulate

from spatialfed.algorithm import stale
from spatialfed.algorithm.profile import sum_statistics, taylor_statistics
from spatialfed.model.stats import site_statistics


@pytest.fixture(scope="module")
def sites():
    models, knots, kernel = simulate(J=4, n=60, side=4, residual="full", seed=3)
    return models


def rel(a, b):
    return float(np.max(np.abs(a["S"] - b["S"])) / np.max(np.abs(b["S"])))


def test_fresh_sites_sum_exactly(sites):
    u = np.log([8.0, 0.8, 0.08])
    stats = {j: site_statistics(lm, u) for j, lm in enumerate(sites)}
    rounds = {}
    for j in stats:
        stale.remember(rounds, stats, j, [])
    assert list(rounds) == [stale.u_key(u)] and rounds[stale.u_key(u)]["sites"] == [0, 1, 2, 3]
    at = stale.site_models(stats, rounds, [0, 1, 2, 3], 1.0)
    exact = sum_statistics(list(stats.values()))
    np.testing.assert_allclose(at(u)["S"], exact["S"], rtol=1e-12)
    assert at(u)["n"] == exact["n"]


def test_control_variate_beats_the_plain_taylor_model_of_a_stale_site(sites):
    """Site 3 answered at u1 with the others; they have since answered at u2. Its control variate leans on their
    fresh statistics and extrapolates only its difference from them."""
    u1, u2 = np.log([8.0, 0.8, 0.08]), np.log([8.0, 0.8, 0.08]) + np.array([-0.3, 0.1, 0.15])
    stats = {j: site_statistics(lm, u1) for j, lm in enumerate(sites)}
    rounds = {}
    for j in stats:
        stale.remember(rounds, stats, j, [])
    for j in (0, 1, 2):
        stats[j] = site_statistics(sites[j], u2)
        stale.remember(rounds, stats, j, [])
    assert stale.u_key(u1) in rounds  # site 3's statistics still refer to u1
    exact = sum_statistics([site_statistics(lm, u2) for lm in sites])
    cv = stale.site_models(stats, rounds, [0, 1, 2, 3], 1.0, control_variates=True)(u2)
    plain = stale.site_models(stats, rounds, [0, 1, 2, 3], 1.0, control_variates=False)(u2)
    assert cv["n"] == pytest.approx(exact["n"])
    assert rel(cv, exact) < 0.7 * rel(plain, exact)  # 7.4e-5 against 1.4e-4 here
    # the plain model is the Taylor model of site 3 plus the fresh others
    np.testing.assert_allclose(plain["S"], sum_statistics([stats[0], stats[1], stats[2],
                                                           taylor_statistics(stats[3], u2)])["S"], rtol=1e-12)


def test_sums_are_forgotten_when_nothing_refers_to_them(sites):
    u1, u2 = np.log([8.0, 0.8, 0.08]), np.log([4.0, 0.8, 0.08])
    stats = {0: site_statistics(sites[0], u1)}
    rounds = {}
    stale.remember(rounds, stats, 0, [u1, u2])
    stats[0] = site_statistics(sites[0], u2)
    stale.remember(rounds, stats, 0, [u1])  # a task at u1 is still in flight: keep its sum
    assert set(rounds) == {stale.u_key(u1), stale.u_key(u2)}
    stale.remember(rounds, stats, 0, [])
    assert set(rounds) == {stale.u_key(u2)}


@pytest.mark.parametrize("times, slow", [
    ([1.0, 1.0, 1.0, 1.0], []),
    ([1.0, 1.1, 0.9, 20.0], [3]),
    ([1.0, 1.5, 2.0, 6.5, 20.0], [3, 4]),
    ([1.0, 1.0], []),  # too few sites to tell
])
def test_slow_sites_by_round_trip_times(times, slow):
    active = list(range(len(times)))
    durations = {"variogram": dict(enumerate(times))}
    assert stale.slow_sites(durations, active, {j: 100 for j in active}, 3.0, 0.5, "stats") == slow


def test_slow_sites_use_statistics_times_once_every_site_has_one():
    durations = {"variogram": {0: 1.0, 1: 1.0, 2: 10.0}, "stats": {0: 1.0, 1: 1.0, 2: 1.0}}
    assert stale.slow_sites(durations, [0, 1, 2], {0: 5, 1: 5, 2: 5}, 3.0, 0.5, "stats") == []
    del durations["stats"][2]
    assert stale.slow_sites(durations, [0, 1, 2], {0: 5, 1: 5, 2: 5}, 3.0, 0.5, "stats") == [2]


def test_before_statistics_a_slow_site_is_slow_in_the_costliest_kind_and_late_in_every_other():
    """The initialisation's tasks are tiny: one late answer is as likely a network delay as a slow site."""
    n_j = dict.fromkeys(range(4), 5)
    durations = {"moments": {0: 1.0, 1: 1.1, 2: 1.0, 3: 0.9}, "variogram": {0: 8.0, 1: 2.0, 2: 2.0, 3: 2.2}}
    assert stale.slow_sites(durations, [0, 1, 2, 3], n_j, 3.0, 0.5, "stats") == []  # 0 was early in moments
    durations["moments"][0] = 1.2
    assert stale.slow_sites(durations, [0, 1, 2, 3], n_j, 3.0, 0.5, "stats") == [0]
    durations["moments"] = {0: 30.0, 1: 1.0, 2: 1.0, 3: 1.0}  # the costlier kind decides: 0 is not slow there
    durations["variogram"] = {0: 2.5, 1: 2.0, 2: 2.0, 3: 2.2}
    assert stale.slow_sites(durations, [0, 1, 2, 3], n_j, 3.0, 0.5, "stats") == []
    durations["moments"] = dict.fromkeys(range(4), 0.0)  # too fast to be timed: no evidence either way
    durations["variogram"][0] = 9.0
    assert stale.slow_sites(durations, [0, 1, 2, 3], n_j, 3.0, 0.5, "stats") == [0]


def test_no_site_is_slow_when_the_others_hold_too_little_data():
    durations = {"variogram": {0: 1.0, 1: 1.0, 2: 10.0}}
    assert stale.slow_sites(durations, [0, 1, 2], {0: 10, 1: 10, 2: 100}, 3.0, 0.5, "stats") == []
