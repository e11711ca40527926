"""algorithm/likelihood.py: the statistics route to ℓ_LR, Σ, μ, γ̂ and the profile gradient/Hessian (SPEC §2b) against
the centralized reference; Taylor models of stale sites; the trust-region step."""

import numpy as np
import pytest
from conftest import grid_knots, simulate_parts
from support import third_order
from scipy import linalg

from spatialfed.algorithm.likelihood import (
    THIRD,
    NotPositiveDefinite,
    Profile,
    default_bounds,
    distance,
    maximise,
    profile_loglik,
    projected_gradient,
    sum_statistics,
    taylor_statistics,
    _lm_solve,
    trust_region_step,
    updated_radius,
)
from spatialfed.model import reference as ref
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.stats import SUMMED, site_statistics

KERNEL = Matern(1.5)
CASES = [("full", 9), ("mpp", 9), ("pp", 9), ("full", 0)]  # m = 0, full: the independence model (Eq. 3)
U = np.log([2.0, 1.2, 0.2])


@pytest.fixture(scope="module")
def parts():
    return simulate_parts(J=3, n=30, nu=1.5)


def setup(parts, residual, m):
    knots = grid_knots(3) if m else np.zeros((0, 2))
    return [LocalModel(*p, knots, KERNEL, residual) for p in parts], knots


def statistics_route(models, knots, u, derivatives=True):
    return profile_loglik(sum_statistics([site_statistics(lm, u) for lm in models]), knots, KERNEL, derivatives)


def dense_reference(parts, knots, residual, u):
    """(ℓ at the dense GLS γ̂, γ̂, μ, Σ) from the N×N covariance of reference.py."""
    delta, s2, beta = np.exp(u)
    z, X = np.concatenate([p[1] for p in parts]), np.vstack([p[2] for p in parts])
    if len(knots):
        C = ref.lowrank_covariance(parts, knots, KERNEL, residual, delta, s2, beta)
    else:
        C = linalg.block_diag(*[KERNEL.cross(p[0], p[0], s2, beta) + np.eye(len(p[0])) / delta for p in parts])
    Ci = np.linalg.inv(C)
    gamma = np.linalg.solve(X.T @ Ci @ X, X.T @ Ci @ z)
    if not len(knots):
        return ref.independent_loglik(parts, KERNEL, gamma, delta, s2, beta), gamma, None, None
    ll = ref.lowrank_loglik(parts, knots, KERNEL, residual, gamma, delta, s2, beta)
    locs = np.vstack([p[0] for p in parts])
    Cks = KERNEL.cross(knots, locs, s2, beta)
    mu = Cks @ Ci @ (z - X @ gamma)  # E[η | z] = K Bᵀ C⁻¹ (z − Xγ)
    Sigma = KERNEL.cross(knots, knots, s2, beta) - Cks @ Ci @ Cks.T
    return ll, gamma, mu, Sigma


@pytest.mark.parametrize("residual,m", CASES)
def test_statistics_route_equals_reference(parts, residual, m):
    models, knots = setup(parts, residual, m)
    pr = statistics_route(models, knots, U, derivatives=False)
    ll, gamma, mu, Sigma = dense_reference(parts, knots, residual, U)
    assert pr.loglik == pytest.approx(ll, rel=1e-8)
    np.testing.assert_allclose(pr.gamma, gamma, rtol=1e-8)
    assert pr.n_obs == sum(lm.n for lm in models)
    if m:
        np.testing.assert_allclose(pr.mu, mu, rtol=1e-8, atol=1e-8 * np.abs(mu).max())
        np.testing.assert_allclose(pr.Sigma, Sigma, rtol=1e-8, atol=1e-8 * np.abs(Sigma).max())


@pytest.mark.parametrize("residual,m", CASES)
def test_gradient_and_hessian_match_finite_differences(parts, residual, m):
    """The exact profile gradient against central differences of the dense reference ℓ(γ̂(u), u); the Hessian
    against central differences of that gradient."""
    models, knots = setup(parts, residual, m)
    pr = statistics_route(models, knots, U)
    h = 1e-4
    fd_grad, fd_hess = np.zeros(3), np.zeros((3, 3))
    for a in range(3):
        e = np.zeros(3)
        e[a] = h
        fd_grad[a] = (dense_reference(parts, knots, residual, U + e)[0]
                      - dense_reference(parts, knots, residual, U - e)[0]) / (2 * h)
        plus, minus = statistics_route(models, knots, U + e), statistics_route(models, knots, U - e)
        fd_hess[a] = (plus.grad - minus.grad) / (2 * h)
    np.testing.assert_allclose(pr.grad, fd_grad, rtol=1e-6, atol=1e-6 * np.abs(pr.grad).max())
    np.testing.assert_allclose(pr.hess, fd_hess, rtol=1e-6, atol=1e-6 * np.abs(pr.hess).max())
    np.testing.assert_allclose(pr.hess, pr.hess.T)


@pytest.mark.parametrize("residual,m", CASES)
def test_taylor_model_is_exact_at_its_point_and_second_order_nearby(parts, residual, m):
    models, knots = setup(parts, residual, m)
    st = sum_statistics([site_statistics(lm, U) for lm in models])
    same = taylor_statistics(st, U)
    for key in ("S", "dS", "d2S", "d", "dd", "d2d"):
        np.testing.assert_array_equal(same[key], st[key])
    direction = np.array([1.0, -0.7, 0.5])
    errors = []
    for h in (0.08, 0.04, 0.02):
        exact = sum_statistics([site_statistics(lm, U + h * direction) for lm in models])
        model = taylor_statistics(st, U + h * direction)
        errors.append(np.abs(exact["S"] - model["S"]).max() + np.abs(exact["dS"] - model["dS"]).max() * h)
        loglik_exact = profile_loglik(exact, knots, KERNEL, False).loglik
        assert profile_loglik(model, knots, KERNEL, False).loglik == pytest.approx(loglik_exact, rel=1e-3)
    ratios = np.array(errors[:-1]) / np.array(errors[1:])
    assert np.all((ratios > 6.0) & (ratios < 10.0)), ratios  # O(h³): halving h divides the error by ~8


@pytest.mark.parametrize("residual,m", CASES)
def test_third_order_model_is_exact_at_its_point_and_third_order_nearby(parts, residual, m):
    """Third derivatives from nearby answers (stale.secant, h = 1e-3) make the model's error O(h⁴)."""
    models, knots = setup(parts, residual, m)
    lm = models[0]
    st = site_statistics(lm, U)
    third_model = third_order(lm, st, 1e-3, reach=100.0)
    same = taylor_statistics(third_model, U)
    for key in ("S", "dS", "d2S", "d", "dd", "d2d"):
        np.testing.assert_array_equal(same[key], st[key])
    assert not set(same) & {"d3S", "d3d", "d3_radius"}  # a point evaluation is no model

    def error(exact, model):  # S and d: O(h⁴) for the third-order model (dS: O(h³))
        return sum(float(np.abs(exact[k] - model[k]).max() / np.abs(exact[k]).max()) for k in ("S", "d"))

    direction = np.array([1.0, -0.7, 0.5])
    second, third = [], []
    for h in (0.04, 0.02, 0.01):
        exact = site_statistics(lm, U + h * direction)
        second.append(error(exact, taylor_statistics(st, U + h * direction)))
        third.append(error(exact, taylor_statistics(third_model, U + h * direction)))
    ratios = np.array(third[:-1]) / np.array(third[1:])
    assert np.all(ratios > 12.0), ratios  # O(h⁴): halving h divides the error by ~16
    assert third[-1] < 0.1 * second[-1]
    # beyond its radius the model is the second-order one
    far = U + 0.2 * direction
    np.testing.assert_array_equal(taylor_statistics(third_order(lm, st, 1e-3, reach=10.0), far)["S"],
                                  taylor_statistics(st, far)["S"])


def test_sum_refuses_statistics_at_different_u(parts):
    models, _ = setup(parts, "pp", 9)
    with pytest.raises(ValueError, match="different u"):
        sum_statistics([site_statistics(models[0], U), site_statistics(models[1], U + 0.1)])


def test_trust_region_step_stays_in_radius_and_box():
    g, H = np.array([3.0, -1.0, 2.0]), -np.diag([1.0, 2.0, 0.5])
    lo, hi = default_bounds(1.0, 1.0)
    u = np.zeros(3)
    full = trust_region_step(u, g, H, 100.0, lo, hi)
    np.testing.assert_allclose(full.p, [3.0, -0.5, 4.0])  # the Newton step when it fits
    assert full.predicted == pytest.approx(0.5 * g @ full.p)
    small = trust_region_step(u, g, H, 0.5, lo, hi)
    assert np.linalg.norm(small.p) == pytest.approx(0.5, rel=1e-6) and small.predicted > 0
    # indefinite H: |eigenvalues| (SPEC §2 mod(H)) keeps the step an ascent step
    assert g @ trust_region_step(u, g, np.diag([1.0, -2.0, 0.5]), 0.3, lo, hi).p > 0
    # a bound: β pushed past its upper end stops on it and is reported; the others still move
    u_edge = hi - np.array([5.0, 5.0, 0.1])
    step = trust_region_step(u_edge, g, H, 100.0, lo, hi)
    assert u_edge[2] + step.p[2] == pytest.approx(hi[2]) and step.at_bound == ("beta",)
    np.testing.assert_allclose(step.p[:2], [3.0, -0.5])
    pg = projected_gradient(hi, g, lo, hi)
    np.testing.assert_array_equal(pg, [0.0, -1.0, 0.0])



# --- edges the mutation run of trust_region_step / _lm_solve found unguarded (docs/contributing.md) -----------------

B_COUPLED = np.array([[2.0, 0.9, -0.5], [0.9, 2.0, 0.9], [-0.5, 0.9, 2.0]])  # −H, positive definite, coupled


def test_trust_region_step_fixes_on_its_bound_only_an_entry_whose_gradient_pushes_out():
    """The active set of trust_region_step: an entry on its bound is fixed (p = 0) when its gradient points out of
    the box, and moves freely otherwise; here the coupling of −H would carry the fixed entries inward."""
    lo, hi = -np.ones(3), np.ones(3)
    u = np.array([-1.0, 1.0, 0.0])  # log δ on its lower bound, log σ² on its upper one
    # both pushing out: fixed, log β alone takes its Newton step g/B
    step = trust_region_step(u, [-0.1, 0.5, 0.8], -B_COUPLED, 10.0, lo, hi)
    np.testing.assert_allclose(step.p, [0.0, 0.0, 0.4], atol=1e-15)
    assert step.at_bound == ("delta", "sigma2")
    # zero or inward gradients on the bounds: free, the full Newton step (inward for both here)
    for g in ([0.0, 0.0, 1.0], [0.25, -0.25, 0.5]):
        step = trust_region_step(u, g, -B_COUPLED, 10.0, lo, hi)
        expected = np.linalg.solve(B_COUPLED, g)
        assert expected[0] > 0 > expected[1]
        np.testing.assert_allclose(step.p, expected, rtol=1e-12)
    # log β clipped on its bound in a later pass: the entries fixed at the start stay fixed
    step = trust_region_step(u, [-0.1, 0.5, 5.0], -B_COUPLED, 10.0, lo, hi)
    np.testing.assert_allclose(step.p, [0.0, 0.0, 1.0], atol=1e-15)
    # from inside: the Newton step leaves the box in log δ and log β (clipped, fixed), then log σ² re-solved
    # leaves it too; the entries clipped in the first pass stay on their bounds
    box = 0.3 * np.ones(3)
    g = np.array([-2.5, -1.2, 0.1])
    assert np.all(np.linalg.solve(B_COUPLED, g)[[0, 2]] < -0.3)
    np.testing.assert_allclose(trust_region_step(np.zeros(3), g, -B_COUPLED, 10.0, -box, box).p, -box, rtol=1e-12)


def test_trust_region_step_floors_the_hessian_at_the_floor_given():
    """mod(−H) with its eigenvalues raised to floor·max|λ| (Eq. 10): the floor given is the one used."""
    g, H = np.array([0.0, 1.0, 0.0]), -np.diag([1.0, 1e-4, 1.0])
    lo, hi = -10 * np.ones(3), 10 * np.ones(3)
    np.testing.assert_allclose(trust_region_step(np.zeros(3), g, H, 5.0, lo, hi, floor=0.5).p, [0, 2.0, 0])
    np.testing.assert_allclose(trust_region_step(np.zeros(3), g, H, 5.0, lo, hi).p[1], 5.0, rtol=1e-6)


def test_lm_solve_returns_zero_without_room_or_gradient():
    """No radius left (the fixed entries used it all) or a zero gradient: the step is 0 of the gradient's shape."""
    for g, radius in (([1.0, -2.0], 0.0), ([0.0, 0.0], 1.0)):
        p = _lm_solve(B_COUPLED[:2, :2], np.array(g), radius)
        assert p.shape == (2,) and p.dtype == float
        np.testing.assert_array_equal(p, [0.0, 0.0])
    step = trust_region_step(np.zeros(3), np.zeros(3), -B_COUPLED, 1.0, -np.ones(3), np.ones(3))
    np.testing.assert_array_equal(step.p, np.zeros(3))
    assert step.predicted == 0.0

@pytest.mark.parametrize("residual,m", CASES)
def test_taylor_model_is_exact_along_the_scaling_direction(parts, residual, m):
    """S_j(u + s·c) = e^{s}S_j(u) (R_j scales by e^{−s}): the model takes this out before expanding."""
    models, knots = setup(parts, residual, m)
    st = sum_statistics([site_statistics(lm, U) for lm in models])
    for s in (0.5, -1.0):
        at = U + s * st["c"]
        exact = sum_statistics([site_statistics(lm, at) for lm in models])
        model = taylor_statistics(st, at)
        for key in ("S", "dS", "d2S"):
            np.testing.assert_allclose(model[key], exact[key], rtol=1e-9, atol=1e-9 * np.abs(exact[key]).max())
        assert model["d"] == pytest.approx(exact["d"], rel=1e-10)


def test_default_bounds_are_the_documented_box():
    """1/δ and σ² in [1e-6, 1e4]·s², β in [1e-4, 1e2]·D (s² = 4, D = 10: every factor is told apart)."""
    from spatialfed.algorithm.likelihood import default_bounds

    lo, hi = default_bounds(4.0, 10.0)
    np.testing.assert_allclose(1 / np.exp(hi[0]), 1e-6 * 4, rtol=1e-12)
    np.testing.assert_allclose(1 / np.exp(lo[0]), 1e4 * 4, rtol=1e-12)
    np.testing.assert_allclose(np.exp([lo[1], hi[1]]), [1e-6 * 4, 1e4 * 4], rtol=1e-12)
    np.testing.assert_allclose(np.exp([lo[2], hi[2]]), [1e-4 * 10, 1e2 * 10], rtol=1e-12)


def test_projected_gradient_zeroes_only_the_components_pushing_out_at_an_active_bound():
    from spatialfed.algorithm.likelihood import at_bound, projected_gradient

    lower, upper = np.array([-1.0, -1.0, -1.0]), np.array([1.0, 1.0, 1.0])
    u = np.array([-1.0, 0.0, 1.0])  # on the lower bound, inside, on the upper bound
    np.testing.assert_array_equal(projected_gradient(u, [-2.0, 3.0, 5.0], lower, upper), [0.0, 3.0, 0.0])
    np.testing.assert_array_equal(projected_gradient(u, [0.5, -3.0, -0.5], lower, upper), [0.5, -3.0, -0.5])
    np.testing.assert_array_equal(projected_gradient(u, [-0.5, 0.0, 0.5], lower, upper), [0.0, 0.0, 0.0])
    inside = np.array([-1.0 + 1e-9, 0.0, 1.0 - 1e-9])  # beyond atol = 1e-10 from both bounds: free
    np.testing.assert_array_equal(projected_gradient(inside, [-2.0, 3.0, 5.0], lower, upper), [-2.0, 3.0, 5.0])
    assert at_bound(u, lower, upper) == ("delta", "beta") and at_bound(inside, lower, upper) == ()


# --- the statistics functions and the optimiser loop: edges the mutation run of 27 Nov found unguarded -------------

def test_distance_is_euclidean_in_u():
    assert distance([1, 2, 3], [1, 2, 3]) == 0.0
    assert distance([0.0, 3.0, 0.0], [0.0, -1.0, 3.0]) == 5.0


def test_taylor_model_moves_the_derivatives_of_d_and_reads_a_missing_radius_as_unbounded(parts):
    """dd at u is dd_j + d2d_j·Δ: the model recovers most of the change of the exact dd (its error is O(Δ²)); a
    third-order model without "d3_radius" is used at any distance."""
    models, _ = setup(parts, "mpp", 9)
    lm = models[0]
    st = site_statistics(lm, U)
    at = U + 0.02 * np.array([1.0, -0.7, 0.5])
    exact, model = site_statistics(lm, at), taylor_statistics(st, at)
    change = np.abs(exact["dd"] - st["dd"]).max()
    assert change > 0 and np.abs(model["dd"] - exact["dd"]).max() < 0.05 * change
    third_model = third_order(lm, st, 1e-3, reach=1000.0)  # d3_radius = 1000·1e-3
    unbounded = {key: value for key, value in third_model.items() if key != "d3_radius"}
    far = U + 0.2 * np.array([1.0, -0.7, 0.5])
    np.testing.assert_array_equal(taylor_statistics(unbounded, far)["S"], taylor_statistics(third_model, far)["S"])


def test_profile_loglik_without_derivatives_and_with_a_quadratic_form_below_one(parts):
    """Q̂ in (0, 1] (a large nugget variance: R⁻¹ ≈ δ small) is a valid profile, equal to the dense reference; without
    derivatives grad and hess are None."""
    models, knots = setup(parts, "full", 9)
    u = np.log([1e-3, 1e-3, 0.2])
    pr = statistics_route(models, knots, u, derivatives=False)
    assert pr.grad is None and pr.hess is None
    assert pr.loglik == pytest.approx(dense_reference(parts, knots, "full", u)[0], rel=1e-8)


def test_profile_loglik_names_the_matrix_that_is_not_positive_definite(parts):
    models, knots = setup(parts, "mpp", 9)
    st = sum_statistics([site_statistics(lm, U) for lm in models])
    m = int(st["m"])
    bad = {**st, "S": st["S"].copy()}
    bad["S"][0, 0] = np.inf  # a non-finite statistic in M's block: refused, not a loglik of −inf
    with pytest.raises(NotPositiveDefinite, match=r"^M = K⁻¹ \+ Σ_j B_jᵀR_j⁻¹B_j is not positive definite at this u$"):
        profile_loglik(bad, knots, KERNEL)
    bad = {**st, "S": st["S"].copy()}
    bad["S"][m, m] = -1.0  # M fine, the covariates' block not
    with pytest.raises(NotPositiveDefinite, match=r"^the \(μ, γ\) normal matrix \(collinear covariates\?\) is not "):
        profile_loglik(bad, knots, KERNEL)


A_QUAD = np.array([[2.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 0.5]])
TOP = np.array([0.3, -0.2, 0.1])
BOX = (-5 * np.ones(3), 5 * np.ones(3))


def quadratic(u, curvature=1.0, loglik=None, top=TOP):
    """ℓ(u) = −½(u − top)ᵀA(u − top) with its gradient, and a Hessian `curvature` times the true one."""
    u = np.asarray(u, dtype=float)
    r = u - top
    value = -0.5 * r @ A_QUAD @ r if loglik is None else loglik
    return Profile(u=u, loglik=float(value), grad=-A_QUAD @ r, hess=-curvature * A_QUAD, mu=np.zeros(0),
                   Sigma=np.zeros((0, 0)), gamma=np.zeros(0), n_obs=1)


def test_maximise_reaches_the_top_within_its_move_and_its_tolerance():
    base = quadratic(np.zeros(3))
    top, _ = maximise(quadratic, base, 10.0, *BOX, steps=10, floor=1e-8, tol=1e-9)
    np.testing.assert_allclose(top.u, TOP, rtol=1e-12, atol=1e-15)  # Newton on a quadratic: one step
    near, step = maximise(quadratic, base, 0.1, *BOX, steps=10, floor=1e-8, tol=1e-9)
    assert distance(near.u, base.u) == pytest.approx(0.1) and near.loglik > base.loglik
    np.testing.assert_allclose(step.p, near.u)
    # a Hessian 4× too curved: each step covers a quarter of the rest; 0.075, 0.056, 0.042 ≤ tol = 0.05 stops
    calls = []
    steep = lambda u: calls.append(u) or quadratic(u, curvature=4.0)
    got, _ = maximise(steep, quadratic(np.zeros(3), curvature=4.0), 10.0, *BOX, steps=10, floor=1e-8, tol=0.05)
    assert len(calls) == 3
    np.testing.assert_allclose(got.u, TOP * (1 - 0.75**3), rtol=1e-12)
    calls.clear()
    maximise(steep, quadratic(np.zeros(3), curvature=4.0), 10.0, *BOX, steps=2, floor=1e-8, tol=0.05)
    assert len(calls) == 2


def test_maximise_keeps_a_step_only_if_the_loglik_does_not_decrease():
    base = quadratic(np.zeros(3))
    trials = []
    refuse = lambda u: trials.append(distance(u, base.u)) or None  # not positive definite anywhere
    got, step = maximise(refuse, base, 0.1, *BOX, steps=3, floor=1e-8, tol=1e-9)
    assert got is base and not np.any(step.p) and step.predicted == 0.0
    np.testing.assert_allclose(trials, [0.1, 0.025, 0.00625])  # each refusal shrinks the radius to ¼ of the step
    lower = lambda u: quadratic(u, loglik=base.loglik - 1e-9)
    assert maximise(lower, base, 0.1, *BOX, steps=3, floor=1e-8, tol=1e-9)[0] is base
    equal = lambda u: quadratic(u, loglik=base.loglik)  # a flat step is kept
    assert distance(maximise(equal, base, 0.1, *BOX, steps=1, floor=1e-8, tol=1e-9)[0].u, base.u) > 0


def test_updated_radius_shrinks_below_a_quarter_and_grows_above_three_quarters_at_the_radius():
    assert updated_radius(1.0, 0.1, 0.8, 4.0) == pytest.approx(0.2)  # ¼ of the step taken
    assert updated_radius(1.0, -1.0, 1e-8, 4.0) == 1e-6
    assert updated_radius(1.0, 0.25, 1.0, 4.0) == 1.0
    assert updated_radius(1.0, 0.75, 1.0, 4.0) == 1.0
    assert updated_radius(1.0, 0.9, 0.99, 4.0) == 2.0  # the step reached the radius
    assert updated_radius(1.0, 0.9, 0.98, 4.0) == 1.0  # it stopped inside
    assert updated_radius(3.0, 0.9, 3.0, 4.0) == 4.0  # capped
    assert updated_radius(2.0, 0.9, 1.9, 8.0) == 2.0  # 1.9 < 0.99·2


def test_maximise_uses_the_floor_given_and_returns_the_last_kept_step():
    base = quadratic(np.zeros(3))
    floored = trust_region_step(base.u, base.grad, base.hess, 10.0, *BOX, floor=0.5)
    got, step = maximise(quadratic, base, 10.0, *BOX, steps=1, floor=0.5, tol=1e-9)
    np.testing.assert_allclose(got.u, floored.p, rtol=1e-12)
    assert np.abs(got.u - TOP).max() > 0.01  # the floor changed the step
    # a kept step, then a refused one: the step returned is the kept one
    answers = iter([quadratic, lambda u: None])
    got, step = maximise(lambda u: next(answers)(u), base, 10.0, *BOX, steps=2, floor=1e-8, tol=1e-9)
    np.testing.assert_allclose(step.p, got.u)
    np.testing.assert_allclose(got.u, TOP, rtol=1e-12, atol=1e-15)
    # the top beyond a corner of the box: the second step is zero (every entry fixed) and is returned
    corner = (-np.ones(3), 0.05 * np.ones(3))
    got, step = maximise(lambda u: quadratic(u, top=np.ones(3)), quadratic(np.zeros(3), top=np.ones(3)), 10.0,
                         *corner, steps=5, floor=1e-8, tol=1e-9)
    np.testing.assert_allclose(got.u, corner[1])
    assert not np.any(step.p) and step.at_bound == ("delta", "sigma2", "beta")
    # at the top already: no step kept, a zero step
    at_top = quadratic(np.array(TOP))
    got, step = maximise(quadratic, at_top, 1.0, *BOX, steps=3, floor=1e-8, tol=1e-9)
    assert got is at_top and not np.any(step.p)


def test_third_order_model_moves_every_derivative_to_third_order(parts):
    """The third-order model's dS, dd (errors O(h³)) and d2d (O(h²)) against the exact ones: each far closer than the
    second-order model's (O(h²), O(h²), O(h))."""
    models, _ = setup(parts, "full", 9)
    lm = models[0]
    st = site_statistics(lm, U)
    third_model = third_order(lm, st, 1e-3, reach=100.0)
    at = U + 0.01 * np.array([1.0, -0.7, 0.5])
    exact, second, third = site_statistics(lm, at), taylor_statistics(st, at), taylor_statistics(third_model, at)
    for key in ("dS", "dd", "d2d"):
        err2, err3 = (float(np.abs(np.asarray(got[key]) - exact[key]).max()) for got in (second, third))
        assert err3 < 0.2 * err2, (key, err3, err2)


def test_taylor_model_without_a_scaling_direction_is_the_plain_expansion(parts):
    """Statistics without "c" (a sum over sites of different scalings) are expanded plainly: second order."""
    models, _ = setup(parts, "mpp", 9)
    st = site_statistics(models[0], U)
    plain = {key: value for key, value in st.items() if key != "c"}
    at = U + 0.02 * np.array([1.0, -0.7, 0.5])
    exact, model = site_statistics(models[0], at), taylor_statistics(plain, at)
    np.testing.assert_allclose(model["S"], exact["S"], rtol=1e-3, atol=1e-3 * np.abs(exact["S"]).max())


def test_sum_keeps_the_scaling_direction_only_when_every_site_shares_it(parts):
    models, _ = setup(parts, "mpp", 9)
    a, b = site_statistics(models[0], U), site_statistics(models[1], U)
    np.testing.assert_array_equal(sum_statistics([a, b])["c"], a["c"])
    assert "c" not in sum_statistics([a, {key: value for key, value in b.items() if key != "c"}])
    assert "c" not in sum_statistics([a, {**b, "c": np.array([1.0, 0.0, 0.0])}])


def test_only_an_interior_newton_step_counts_toward_the_predicted_stop():
    from spatialfed.algorithm.likelihood import newton_length, trust_region_step

    lower, upper = np.full(3, -10.0), np.full(3, 10.0)
    hess, grad = -np.diag([1.0, 2.0, 4.0]), np.array([0.01, -0.02, 0.04])
    newton = trust_region_step(np.zeros(3), grad, hess, 1.0, lower, upper)
    assert newton_length(newton, hess, 1.0, 1e-12) == pytest.approx(0.01)  # −H⁻¹g
    cut = trust_region_step(np.zeros(3), grad, hess, 0.005, lower, upper)
    assert newton_length(cut, hess, 0.005, 1e-12) is None  # shortened by the radius: not Newton's step
    boxed = trust_region_step(np.zeros(3), grad, hess, 1.0, lower, np.array([10.0, 10.0, 0.001]))
    assert newton_length(boxed, hess, 1.0, 1e-12) is None  # on a bound
    assert newton_length(newton, np.diag([1.0, -2.0, -4.0]), 1.0, 1e-12) is None  # −H indefinite


@pytest.mark.parametrize("jump", [False, True])
def test_the_predicted_next_newton_step_matches_the_one_taken(jump):
    """ℓ(u) = −Σ (e^{u−a} − (u − a)) (third derivatives ≠ 0): newton_settled's bound on the next step Newton takes
    holds and is within a factor 2 of it — from consecutive Newton points, or from a point reached otherwise (`jump`,
    as the asynchronous surrogate's) — so it declares the fit settled only where that step is within tol."""
    from spatialfed.algorithm.likelihood import RESOLVED, newton_settled, trust_region_step

    a = np.array([0.3, -0.2, 0.5])
    lower, upper = np.full(3, -10.0), np.full(3, 10.0)

    def at(u):
        e = np.exp(u - a)
        return Profile(u=u, loglik=float(-np.sum(e - (u - a))), grad=1.0 - e, hess=-np.diag(e), mu=np.zeros(1),
                       Sigma=np.eye(1), gamma=np.zeros(1), n_obs=1)

    def newton(pr):
        return trust_region_step(pr.u, pr.grad, pr.hess, 10.0, lower, upper)

    points = [at(a + np.array([0.4, -0.3, 0.2]))] + ([at(a + np.array([0.05, 0.08, -0.06]))] if jump else [])
    checked = 0
    while len(points) < 5:
        if len(points) == 1:
            points.append(at(points[0].u + newton(points[0]).p))
        before, base = points[-2], points[-1]
        step = newton(base)
        following = float(np.max(np.abs(newton(at(base.u + step.p)).p)))  # the step the skipped round would take
        if 2.0 * following >= RESOLVED:
            assert newton_settled(before, base, step, 0.0, 2.0 * following, np.inf)
            assert not newton_settled(before, base, step, 0.0, 0.5 * following, np.inf)
            checked += 1
        # below √ε only a round can show a step: tol 1e-12 is never claimed from the bound
        assert not newton_settled(before, base, step, 0.0, 0.5 * RESOLVED, np.inf)
        points.append(at(base.u + step.p))
    assert checked >= 2
