"""Expansion (algorithm/expansion.py): the weighted sum of site Taylor models, re-expanded around one centre, is the
sum of the models evaluated one by one (likelihood.taylor_statistics), wherever u lies and whichever centre is taken."""

import numpy as np
import pytest
from support import simulate, third_order

from spatialfed.algorithm.expansion import Expansion
from spatialfed.algorithm.likelihood import sum_statistics, taylor_statistics
from spatialfed.model.stats import SUMMED, site_statistics

U1 = np.log([8.0, 0.8, 0.08])


@pytest.fixture(scope="module")
def terms():
    """(statistics, coefficient) of four sites at four points: two plain, one third order (within
    d3_radius = 0.06 of its u_j), one with a negative coefficient (a control variate's difference); and pp's
    scaling next to full's (two frames)."""
    full, _, _ = simulate(J=3, n=40, side=3, residual="full", seed=7)
    pp, _, _ = simulate(J=1, n=40, side=3, residual="pp", seed=8)
    points = [U1, U1 + [0.1, -0.05, 0.08], U1 + [-0.06, 0.04, 0.1], U1 + [0.02, 0.1, -0.04]]
    st = site_statistics(full[2], points[2])
    refined = third_order(full[2], st, 0.02)
    assert refined["d3_radius"] == pytest.approx(0.06)
    return [(site_statistics(full[0], points[0]), 1.0), (site_statistics(full[1], points[1]), 0.7), (refined, 1.0),
            (site_statistics(full[0], points[3]), -0.4), (site_statistics(pp[0], points[1]), 1.3)]


def one_by_one(terms, u, scale):
    parts = [taylor_statistics(st, u) for st, _ in terms]
    return sum_statistics([{**p, **{k: c * np.asarray(p[k]) for k in SUMMED}} for p, (_, c) in zip(parts, terms)],
                          scale=scale)


def assert_close(got, expected):
    assert set(got) == set(expected) - {"c"} | ({"c"} if "c" in got else set())
    for key in SUMMED:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-10, atol=1e-12 * np.max(np.abs(expected[key])),
                                   err_msg=key)


@pytest.mark.parametrize("offset", [[0.0, 0.0, 0.0], [0.03, -0.02, 0.01], [0.2, 0.15, -0.1]],
                         ids=["at_the_third_order_u", "within_its_radius", "beyond_it"])
def test_the_expansion_is_the_sum_of_the_models_evaluated_one_by_one(terms, offset):
    u = terms[2][0]["u"] + np.array(offset)
    assert_close(Expansion(terms, U1, scale=1.5)(u), one_by_one(terms, u, 1.5))


def test_the_centre_changes_nothing_but_rounding(terms):
    u = terms[2][0]["u"] + np.array([0.01, 0.02, -0.03])
    assert_close(Expansion(terms, U1 + [0.3, -0.2, 0.25])(u), Expansion(terms, terms[1][0]["u"])(u))


def test_one_frame_keeps_its_scaling_direction_and_two_drop_it(terms):
    u = U1 + 0.05
    assert np.array_equal(Expansion(terms[:4], U1)(u)["c"], terms[0][0]["c"])
    assert "c" not in Expansion(terms, U1)(u)
