"""site_statistics (SPEC §2b): S_j, d_j and their u-derivatives against finite differences; message size."""

import numpy as np
import pytest
from conftest import grid_knots, simulate_parts

from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.stats import PAIRS, message_size, pair_index, site_statistics, stats_flops

CASES = [("full", 9), ("mpp", 9), ("pp", 9), ("full", 0)]  # m = 0 with full residual: the independence model
U = np.log([2.0, 1.2, 0.2])


def model(residual, m, n=40, nu=1.5, seed=2):
    locs, z, X = simulate_parts(J=1, n=n, nu=nu, seed=seed)[0]
    knots = grid_knots(3) if m else np.zeros((0, 2))
    return LocalModel(locs, z, X, knots, Matern(nu), residual)


@pytest.mark.parametrize("residual,m", CASES)
def test_derivatives_match_finite_differences(residual, m):
    lm = model(residual, m)
    st = site_statistics(lm, U)
    k = m + lm.p + 1
    assert st["S"].shape == (k, k) and st["dS"].shape == (3, k, k) and st["d2S"].shape == (len(PAIRS), k, k)
    h = 1e-5
    for a in range(3):
        e = np.zeros(3)
        e[a] = h
        plus, minus = site_statistics(lm, U + e), site_statistics(lm, U - e)
        scale = max(1.0, np.abs(st["dS"][a]).max())
        assert np.abs((plus["S"] - minus["S"]) / (2 * h) - st["dS"][a]).max() < 1e-7 * scale
        assert abs((plus["d"] - minus["d"]) / (2 * h) - st["dd"][a]) < 1e-7 * max(1.0, abs(st["dd"][a]))
        for b in range(3):
            ref = st["d2S"][pair_index(a, b)]
            fd = (plus["dS"][b] - minus["dS"][b]) / (2 * h)
            assert np.abs(fd - ref).max() < 1e-7 * max(1.0, np.abs(ref).max()), (a, b)
            fd_d = (plus["dd"][b] - minus["dd"][b]) / (2 * h)
            assert abs(fd_d - st["d2d"][pair_index(a, b)]) < 1e-7 * max(1.0, abs(st["d2d"][pair_index(a, b)]))


@pytest.mark.parametrize("residual,m", CASES)
def test_statistics_are_the_gram_matrix_under_R_inverse(residual, m):
    """S_j = W_jᵀR_j⁻¹W_j and d_j = log det R_j against the dense residual covariance (reference.py)."""
    from spatialfed.model.reference import residual_covariance

    lm = model(residual, m)
    delta, sigma2, beta = np.exp(U)
    if m:
        R = residual_covariance(lm.locs, lm.knots, lm.kernel, sigma2, beta, delta, residual)
        B = lm.kernel.cross(lm.locs, lm.knots, sigma2, beta) @ np.linalg.inv(
            lm.kernel.cross(lm.knots, lm.knots, sigma2, beta))
    else:
        R = lm.kernel.cross(lm.locs, lm.locs, sigma2, beta) + np.eye(lm.n) / delta
        B = np.zeros((lm.n, 0))
    W = np.hstack([B, lm.X, lm.z[:, None]])
    st = site_statistics(lm, U)
    np.testing.assert_allclose(st["S"], W.T @ np.linalg.solve(R, W), rtol=1e-8, atol=1e-8 * np.abs(st["S"]).max())
    assert st["d"] == pytest.approx(np.linalg.slogdet(R)[1], rel=1e-10)
    assert st["n"] == lm.n


@pytest.mark.parametrize("residual", ["full", "mpp", "pp"])
def test_message_size_does_not_grow_with_n(residual):
    small, large = (site_statistics(model(residual, 9, n=n), U) for n in (20, 80))
    k = 9 + 2 + 1
    assert message_size(small) == message_size(large) == 10 * k * k + 11
    assert stats_flops(80, 9, 2, residual) > stats_flops(20, 9, 2, residual)


@pytest.mark.parametrize("residual,m", CASES)
def test_statistics_scale_exactly_along_the_direction_they_report(residual, m):
    """S(u + s·c) = e^s·S(u) along the returned c: (1, −1, 0) where R = σ²W̃ + δ⁻¹I scales with σ² and 1/δ together,
    (1, 0, 0) for pp, whose R = δ⁻¹I does not depend on σ² (likelihood.exact_scaling moves the statistics along it)."""
    lm = model(residual, m)
    st = site_statistics(lm, U)
    want = [1.0, 0.0, 0.0] if residual == "pp" else [1.0, -1.0, 0.0]
    assert st["c"].tolist() == want
    s = 0.7
    moved = site_statistics(lm, U + s * st["c"])
    np.testing.assert_allclose(moved["S"], np.exp(s) * st["S"], rtol=1e-9, atol=1e-12 * np.abs(st["S"]).max())
