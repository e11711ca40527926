"""Stale-site models where the exact answer is known without a Taylor expansion (algorithm/stale.py, SPEC §2b).

- The control variate of a stale site whose fresh controls are exact copies of it is exact: with sites 1 and 2
  copies of site 0 (S_F = 2S_0 at every u, n_F = 2n_0), ρ = n_0/n_F = ½ and
  T_0(u) = ½ΣT_k(u) + Taylor[S_0 − ½S_F](u; u_0) = S_0(u) + 0, whatever the distance from u_0.
- The secant model's third-order term applies out to reach × the largest step to an earlier answer.
"""

import numpy as np
import pytest
from support import simulate

from spatialfed.algorithm import stale
from spatialfed.algorithm.likelihood import sum_statistics, taylor_statistics
from spatialfed.model.local import LocalModel
from spatialfed.model.stats import SUMMED, site_statistics

U1 = np.log([8.0, 0.8, 0.08])


@pytest.fixture(scope="module")
def site():
    models, _, _ = simulate(J=1, n=50, side=3, residual="full", seed=5)
    return models[0]


def test_control_variate_through_copies_of_the_stale_site_is_exact(site):
    lm = site
    copies = [lm, LocalModel(lm.locs, lm.z, lm.X, lm.knots, lm.kernel, lm.residual),
              LocalModel(lm.locs, lm.z, lm.X, lm.knots, lm.kernel, lm.residual)]
    u2 = U1 + np.array([-0.4, 0.3, 0.35])  # far: the plain Taylor model errs visibly here
    stats = {j: site_statistics(m, U1) for j, m in enumerate(copies)}
    rounds = {}
    for j in stats:
        stale.remember(rounds, stats, j, [])
    for j in (1, 2):
        stats[j] = site_statistics(copies[j], u2)
        stale.remember(rounds, stats, j, [])
    exact = sum_statistics([site_statistics(m, u2) for m in copies])
    cv = stale.site_models(stats, rounds, [0, 1, 2], 1.0, control_variates=True)(u2)
    plain = stale.site_models(stats, rounds, [0, 1, 2], 1.0, control_variates=False)(u2)
    scale = np.max(np.abs(exact["S"]))
    assert np.max(np.abs(plain["S"] - exact["S"])) > 1e-4 * scale  # the Taylor model alone is not exact
    for key in ("S", "dS", "d2S"):
        np.testing.assert_allclose(cv[key], exact[key], rtol=1e-9, atol=1e-9 * np.max(np.abs(exact[key])),
                                   err_msg=key)
    assert cv["n"] == exact["n"] and cv["d"] == pytest.approx(exact["d"], rel=1e-9)
    # a scale multiplies the whole model
    half = stale.site_models(stats, rounds, [0, 1, 2], 0.5)(u2)
    np.testing.assert_allclose(half["S"], 0.5 * cv["S"], rtol=1e-12)


def test_control_variate_leans_only_on_the_sites_that_moved_on(site):
    """Four copies answer at U1, two move on to u2: each stale copy's controls are the two that moved (ρ = ½), not
    the other stale copy, whose plain Taylor model at U1 would add no change while counting in ρ (ρ = ⅓: the
    model two thirds exact, one third Taylor). The sum of the four models is then exact at u2."""
    lm = site
    copies = [lm] + [LocalModel(lm.locs, lm.z, lm.X, lm.knots, lm.kernel, lm.residual) for _ in range(3)]
    u2 = U1 + np.array([-0.4, 0.3, 0.35])
    stats, rounds = {}, {}
    for j, m in enumerate(copies):
        stats[j] = site_statistics(m, U1)
        stale.remember(rounds, stats, j, [])
    for j in (1, 2):
        stats[j] = site_statistics(copies[j], u2)
        stale.remember(rounds, stats, j, [])
    exact = sum_statistics([site_statistics(m, u2) for m in copies])
    cv = stale.site_models(stats, rounds, [0, 1, 2, 3], 1.0)(u2)
    for key in ("S", "dS", "d2S"):
        np.testing.assert_allclose(cv[key], exact[key], rtol=1e-9, atol=1e-9 * np.max(np.abs(exact[key])),
                                   err_msg=key)


def test_secant_radius_is_reach_times_the_largest_step(site):
    st = site_statistics(site, U1)
    steps = ([-0.02, -0.05, -0.1], [-0.01, -0.02, -0.03])  # ‖Δu‖ (likelihood.distance) 0.1136 and 0.0374
    big = float(np.linalg.norm(steps[0]))
    earlier = [site_statistics(site, U1 + np.array(d)) for d in steps]
    for reach in (3.0, 2.0):
        model = stale.secant(st, earlier, reach=reach)
        assert model["d3_radius"] == pytest.approx(reach * big)
    model = stale.secant(st, earlier)
    assert model["d3_radius"] == pytest.approx(3 * big)  # the default reach is 3
    # between reach × the smallest step (0.11) and reach × the largest (0.34) the third-order term is used:
    # the model differs from the second-order one, and is the closer of the two to the exact statistics
    ahead = U1 + np.array([0.02, 0.08, 0.2])
    exact = site_statistics(site, ahead)
    second = taylor_statistics(st, ahead)["S"]
    third = taylor_statistics(model, ahead)["S"]
    assert np.max(np.abs(third - exact["S"])) < 0.5 * np.max(np.abs(second - exact["S"]))
    # beyond the radius: the second-order model
    beyond = U1 + np.array([0.0, 0.0, 3 * big + 0.01])
    np.testing.assert_array_equal(taylor_statistics(model, beyond)["S"], taylor_statistics(st, beyond)["S"])


# --- edges the mutation run found unguarded (docs/contributing.md) ---------------------------------------------------

def test_site_models_without_a_usable_control_fall_back_to_the_taylor_model(site):
    u2 = U1 + np.array([-0.2, 0.1, 0.1])
    stats = {0: site_statistics(site, U1), 1: site_statistics(site, U1)}
    plain = sum_statistics([taylor_statistics(stats[0], u2), taylor_statistics(stats[1], u2)])
    # no record of the round (rounds not kept), or a co-answering site that is not among the used ones
    np.testing.assert_allclose(stale.site_models(stats, {}, [0, 1], 1.0)(u2)["S"], plain["S"], rtol=1e-12)
    rounds = {}
    for j in stats:
        stale.remember(rounds, stats, j, [])
    stats[1] = site_statistics(site, u2)
    stale.remember(rounds, stats, 1, [U1])
    only = stale.site_models(stats, rounds, [0], 1.0)(u2)
    np.testing.assert_allclose(only["S"], taylor_statistics(stats[0], u2)["S"], rtol=1e-12)


def test_third_order_radius_is_three_times_the_largest_step(site):
    st = site_statistics(site, U1)
    earlier = [site_statistics(site, U1 + d) for d in ([0.0, 0.02, 0.0], [0.0, 0.01, -0.01])]
    assert stale.secant(st, earlier)["d3_radius"] == pytest.approx(0.06)



def _first_rows(model, rows, residual="full"):
    """A site holding only the first `rows` observations of `model` (sites of unequal n)."""
    return LocalModel(model.locs[:rows], model.z[:rows], model.X[:rows], model.knots, model.kernel, residual)


def _docstring_sum(models, stats, rounds, u, scale):
    """scale · Σ_j T_j(u) site by site, as site_models' docstring defines it: T_j = ρ_j Σ_{k∈F_j} T_k +
    Taylor[S_j − ρ_j S_{F_j}] (second order) for a stale j with fresher controls F_j (the others that answered at
    u_j and moved on, or whose model there is third order), its own model otherwise."""

    def direct(j):
        st = stats[j]
        entry = rounds.get(stale.u_key(st["u"]))
        others = [k for k in entry["sites"] if k != j] if entry else []
        others = [k for k in others if not np.array_equal(stats[k]["u"], st["u"]) or "d3S" in stats[k]]
        if not others:
            return taylor_statistics(st, u)
        rest = sum_statistics([site_statistics(models[k], st["u"]) for k in others])
        rho = st["n"] / rest["n"]
        diff = {**{key: v for key, v in st.items() if key not in ("d3S", "d3d", "d3_radius")},
                **{key: np.asarray(st[key]) - rho * np.asarray(rest[key]) for key in SUMMED}}
        fresh = sum_statistics([taylor_statistics(stats[k], u) for k in others])
        part = taylor_statistics(diff, u)
        return {**part, **{key: np.asarray(part[key]) + rho * np.asarray(fresh[key]) for key in SUMMED}}

    return sum_statistics([direct(j) for j in stats], scale=scale)


def _assert_statistics_close(got, expected):
    for key in SUMMED:
        np.testing.assert_allclose(got[key], expected[key], rtol=1e-10,
                                   atol=1e-12 * np.max(np.abs(expected[key])), err_msg=key)


def _records(models, points):
    """The server's records (stale.remember) and answer(j, u): site j's statistics at u, remembered, every point
    kept live."""
    stats, rounds = {}, {}

    def answer(j, u):
        stats[j] = site_statistics(models[j], u)
        stale.remember(rounds, stats, j, points)

    return stats, rounds, answer


def _answered(models, points, who):
    """The records after the sites in who[i] answered at points[i], round by round."""
    stats, rounds, answer = _records(models, points)
    for u, sites in zip(points, who):
        for j in sites:
            answer(j, u)
    return stats, rounds


def test_site_models_sum_the_per_site_models_of_the_docstring():
    """site_models groups the terms around one u_j before expanding them; the result is the docstring's sum
    Σ_j T_j(u) site by site (T_j = ρ_j Σ_{k∈F_j} T_k + Taylor[S_j − ρ_j S_{F_j}] for a stale j with fresher
    controls F_j, its own model otherwise), here with sites of unequal n answering at four points, one of them
    with a third-order (secant) model."""
    models, _, _ = simulate(J=5, n=40, side=3, residual="full", seed=7)
    models[4] = _first_rows(models[4], 25)
    points = [U1, U1 + [0.1, -0.05, 0.08], U1 + [-0.06, 0.04, 0.1], U1 + [0.02, 0.1, -0.04]]
    stats, rounds, answer = _records(models, points)
    for j in range(5):
        answer(j, points[0])
    for j, k in ((0, 1), (1, 1), (2, 2), (3, 3)):  # sites 0-3 fresher, site 4 stale at points[0]
        answer(j, points[k])
    earlier = [site_statistics(models[3], points[0]), site_statistics(models[3], points[2])]
    stats[3] = stale.secant(stats[3], earlier)
    u = U1 + np.array([0.05, 0.03, 0.06])
    _assert_statistics_close(stale.site_models(stats, rounds, list(range(5)), 1.5)(u),
                             _docstring_sum(models, stats, rounds, u, 1.5))


def test_site_models_of_stale_sites_at_two_rounds_one_third_order_are_the_docstring_sum():
    """Two stale sites leaning on fresher ones, at two rounds: site 5 at the first (its controls 0-4 moved on),
    site 3 at the second (0, 1, 2, 4 moved on). Site 3's own model is third order (secant): its control variate
    still expands S_3 − ρ S_F to second order only, in site 3's frame (c), although site 4 (pp) scales along
    another c and the rounds' sums have none. Each stale site's terms count."""
    models, _, _ = simulate(J=6, n=30, side=3, residual="full", seed=11)
    models[5] = _first_rows(models[5], 18)
    models[4] = _first_rows(models[4], len(models[4].z), "pp")
    points = [U1, U1 + [0.08, -0.06, 0.05], U1 + [-0.05, 0.07, 0.09]]
    stats, rounds = _answered(models, points, [range(6), range(5), (0, 1, 2, 4)])
    earlier = [site_statistics(models[3], points[0]), site_statistics(models[3], points[2])]
    stats[3] = stale.secant(stats[3], earlier)
    u = points[1] + np.array([0.04, -0.03, 0.06])
    _assert_statistics_close(stale.site_models(stats, rounds, list(range(6)), 0.7)(u),
                             _docstring_sum(models, stats, rounds, u, 0.7))


def test_site_models_of_sites_stale_at_one_round_are_the_docstring_sum():
    """Sites 3 and 4 stale at the first round, 0-2 moved on: each leans on 0-2 only. Then site 4's model at that
    round made third order (secant): it carries more than its Taylor model there, so site 3 leans on it too."""
    models, _, _ = simulate(J=5, n=30, side=3, residual="full", seed=13)
    models[4] = _first_rows(models[4], 20)
    points = [U1, U1 + [0.09, -0.05, 0.07], U1 + [-0.04, 0.06, 0.08]]
    stats, rounds = _answered(models, points, [range(5), range(3)])
    u = points[1] + np.array([0.03, -0.02, 0.05])
    _assert_statistics_close(stale.site_models(stats, rounds, list(range(5)), 1.0)(u),
                             _docstring_sum(models, stats, rounds, u, 1.0))
    earlier = [site_statistics(models[4], points[1]), site_statistics(models[4], points[2])]
    stats[4] = stale.secant(stats[4], earlier)
    _assert_statistics_close(stale.site_models(stats, rounds, list(range(5)), 1.0)(u),
                             _docstring_sum(models, stats, rounds, u, 1.0))


def test_site_models_expand_statistics_with_different_scalings_apart(site):
    """Terms at one u are summed only when they share the scaling direction c: a full-residual site (c = (1, −1,
    0)), a pp site (c = (1, 0, 0)) and statistics without c (the plain expansion) each keep their own model."""
    lm = site
    pp = LocalModel(lm.locs, lm.z, lm.X, lm.knots, lm.kernel, "pp")
    stats = {0: site_statistics(lm, U1), 1: site_statistics(pp, U1), 2: dict(site_statistics(lm, U1))}
    del stats[2]["c"]
    u = U1 + np.array([-0.2, 0.15, 0.1])
    expected = sum_statistics([taylor_statistics(stats[j], u) for j in stats], scale=2.0)
    _assert_statistics_close(stale.site_models(stats, {}, [0, 1, 2], 2.0)(u), expected)
