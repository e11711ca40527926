"""Stale-site models and pacing of the asynchronous statistics server (algorithm/stale.py, SPEC §2b)."""

import numpy as np
import pytest
from support import simulate

from spatialfed.algorithm import stale
from spatialfed.algorithm.likelihood import sum_statistics, taylor_statistics
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


def third_derivative_errors(model, lm, u, directions, h=1e-4):
    """∂_v ∂²S and ∂_v ∂²(log det R) along each v from the model's tensors, against central differences of
    site_statistics (with its exact scaling along c taken out, as in the model)."""
    from spatialfed.algorithm.likelihood import TRIPLES, _PAIR, exact_scaling, scaled_frame

    index = {t: i for i, t in enumerate(TRIPLES)}
    full = [[[index[tuple(sorted((a, b, c)))] for c in range(3)] for b in range(3)] for a in range(3)]
    T, Td = np.asarray(model["d3S"])[full], np.asarray(model["d3d"])[full]
    w = exact_scaling(model)
    for v in map(np.asarray, directions):
        plus, minus = site_statistics(lm, u + h * v), site_statistics(lm, u - h * v)
        Hp = np.exp(-w @ (h * v)) * scaled_frame(plus, w)[2]
        Hm = np.exp(w @ (h * v)) * scaled_frame(minus, w)[2]
        fd = (Hp - Hm) / (2 * h)
        np.testing.assert_allclose(np.einsum("abcij,c->abij", T, v), fd, rtol=1e-3, atol=1e-3 * np.abs(fd).max())
        dd = (np.asarray(plus["d2d"])[_PAIR] - np.asarray(minus["d2d"])[_PAIR]) / (2 * h)
        np.testing.assert_allclose(Td @ v, dd, rtol=1e-3, atol=1e-3 * np.abs(dd).max())


def test_secant_third_derivatives_from_answers_anywhere_near(sites):
    """Two earlier answers in any two directions that span u with c give the whole tensor."""
    u = np.log([8.0, 0.8, 0.08])
    lm = sites[1]
    earlier = [site_statistics(lm, u + 1e-4 * np.array(v)) for v in ([0.3, -0.2, 1.0], [0.1, 0.9, -0.4])]
    secant = stale.secant(site_statistics(lm, u), earlier)
    third_derivative_errors(secant, lm, u, [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.3, -0.5, 0.8]])


def test_secant_from_one_answer_is_exact_along_its_direction(sites):
    """With one earlier answer (and c) the minimum-norm tensor is right along that direction: third order along the
    path the fit took."""
    u = np.log([8.0, 0.8, 0.08])
    lm = sites[2]
    v = np.array([0.2, -0.3, 1.0])
    secant = stale.secant(site_statistics(lm, u), [site_statistics(lm, u + 1e-4 * v)])
    third_derivative_errors(secant, lm, u, [v])


def test_secant_model_continues_the_path_more_accurately_than_second_order(sites):
    """Earlier answers 0.1 and 0.03 behind u_j (in log β) along the fit's path; half a step on, the third-order model
    errs at least 4× less in S and ∂²S than the second-order one (here 5.7× and 6.9×)."""
    u = np.log([8.0, 0.8, 0.08])
    lm = sites[0]
    st = site_statistics(lm, u)
    secant = stale.secant(st, [site_statistics(lm, u + d) for d in ([-0.02, -0.05, -0.1], [-0.01, -0.02, -0.03])])
    ahead = u + np.array([0.005, 0.02, 0.04])
    exact = site_statistics(lm, ahead)
    for key in ("S", "d2S"):
        second = np.max(np.abs(taylor_statistics(st, ahead)[key] - exact[key]))
        third = np.max(np.abs(taylor_statistics(secant, ahead)[key] - exact[key]))
        assert third < second / 4
