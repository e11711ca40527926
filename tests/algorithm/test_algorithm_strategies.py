"""Strategies of Section 4: staleness weights (Eq. 18), gradient correction (Eq. 15), moving average (Eq. 19)."""

import numpy as np
import pytest
from support import simulate

from spatialfed.algorithm import strategies as st
from spatialfed.model.params import Params


def test_staleness_weights_follow_eq_18():
    t, t_js, g = 3, [3, 2, 0], 0.5
    raw = (np.array([0.0, 1.0, 3.0]) + 1 + np.sqrt(3)) ** -2.0
    np.testing.assert_allclose(st.staleness_weights(t, t_js, g, a=2.0, T_c=3), raw / raw.sum())
    big_gradient = st.staleness_weights(t, t_js, grad_norm=10.0, a=1.0, T_c=3)  # max{√t, ‖g‖} = 10 flattens
    np.testing.assert_allclose(big_gradient, (np.array([11.0, 12.0, 14.0]) ** -1) / np.sum(np.array([11.0, 12.0, 14.0]) ** -1))
    w = st.staleness_weights(t, t_js, g, a=1.0, T_c=3)
    assert w[0] > w[1] > w[2] and w.sum() == pytest.approx(1.0)


def test_staleness_weights_switch_to_uniform_once_all_recent():
    np.testing.assert_allclose(st.staleness_weights(9, [9, 5, 4], 0.1, a=1.0, T_c=3), np.full(3, 1 / 3))
    assert not np.allclose(st.staleness_weights(9, [9, 5, 3], 0.1, a=1.0, T_c=3), 1 / 3)  # one t_j ≤ T_c


def test_aggregate_with_uniform_weights_is_the_sum():
    xis = [{"A": np.eye(2) * k, "b": np.array([k, -k])} for k in (1.0, 2.0, 4.0)]
    agg = st.aggregate(xis, st.uniform_weights(3))
    np.testing.assert_allclose(agg["A"], 7 * np.eye(2))
    np.testing.assert_allclose(agg["b"], [7, -7])


def _params(rng, m, p, scale=1.0):
    S = rng.standard_normal((m, m))
    return Params(mu=rng.standard_normal(m), Sigma=S @ S.T / m + np.eye(m), gamma=rng.standard_normal(p),
                  delta=2.0 * np.exp(0.1 * scale * rng.standard_normal()), sigma2=1.0, beta=0.2)


def test_corrected_gradient_matches_direct_sum():
    rng = np.random.default_rng(1)
    m = 4
    at, rec = _params(rng, m, 2), _params(rng, m, 2)
    xi = {"grad": rng.standard_normal(3), "hess": rng.standard_normal((3, 3)),
          "d2_du_dmu": rng.standard_normal((3, m)), "d2_du_dSigma": rng.standard_normal((3, m, m))}
    direct = xi["grad"] + xi["hess"] @ (rec.u - at.u)
    for a in range(3):
        direct[a] += sum(xi["d2_du_dmu"][a, i] * (rec.mu[i] - at.mu[i]) for i in range(m))
        direct[a] += sum(xi["d2_du_dSigma"][a, i, k] * (rec.Sigma[i, k] - at.Sigma[i, k])
                         for i in range(m) for k in range(m))
    np.testing.assert_allclose(st.corrected_gradient(xi, at, rec), direct, rtol=1e-12)


def test_corrected_gradient_is_first_order_accurate_on_a_real_worker():
    """‖g_j(rec) − g_j^corr‖ = O(ε²) while ‖g_j(rec) − g_j(at)‖ = O(ε): the correction removes the linear error."""
    models, knots, kernel = simulate(J=1, n=80, side=4, residual="full")
    lm = models[0]
    rng = np.random.default_rng(3)
    base = Params(mu=0.3 * rng.standard_normal(lm.m), Sigma=0.5 * np.eye(lm.m), gamma=np.array([1.0, 2.0, -1.0]),
                  delta=3.0, sigma2=1.2, beta=0.15)
    du, dmu, dS = rng.standard_normal(3), rng.standard_normal(lm.m), rng.standard_normal((lm.m, lm.m))
    dS = 0.05 * (dS + dS.T)
    xi = lm.quantity("theta", base)
    errors = []
    for eps in (0.02, 0.01):
        rec = base.with_u(base.u + eps * du).replace(mu=base.mu + eps * dmu, Sigma=base.Sigma + eps * dS)
        g_rec = lm.quantity("theta", rec)["grad"]
        errors.append((np.linalg.norm(g_rec - st.corrected_gradient(xi, base, rec)), np.linalg.norm(g_rec - xi["grad"])))
    (corr_big, raw_big), (corr_small, raw_small) = errors
    assert corr_small < 0.05 * raw_small
    assert corr_big / corr_small == pytest.approx(4.0, rel=0.15)
    assert raw_big / raw_small == pytest.approx(2.0, rel=0.15)


def test_moving_average_weights_and_values():
    w = st.moving_average_weights(3, 0.7)
    np.testing.assert_allclose(w, 0.7 ** np.arange(4) / np.sum(0.7 ** np.arange(4)))
    np.testing.assert_allclose(w[1:] / w[:-1], 0.7)
    np.testing.assert_allclose(st.moving_average_weights(0, 0.7), [1.0])
    newest_first = [np.array([4.0, 1.0]), np.array([2.0, 1.0]), np.array([0.0, 1.0])]
    expected = (np.array([4.0, 1.0]) + 0.7 * np.array([2.0, 1.0]) + 0.49 * np.array([0.0, 1.0])) / (1 + 0.7 + 0.49)
    np.testing.assert_allclose(st.moving_average(newest_first, 0.7), expected)


def test_staleness_step_size_scales_with_mean_staleness():
    assert st.staleness_step_size(1.0, st.uniform_weights(4), [0, 0, 0, 0]) == 1.0
    assert st.staleness_step_size(1.0, st.uniform_weights(4), [0, 0, 2, 6]) == pytest.approx(1 / 3)
    assert st.staleness_step_size(0.5, np.array([0.5, 0.5]), [1, 3]) == pytest.approx(0.5 / 3)
