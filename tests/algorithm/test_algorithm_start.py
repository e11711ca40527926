"""φ₀ (start.py) from bounded-pair variograms: equal to the all-pairs rule for small workers, statistically
equivalent above the subsample size."""

import numpy as np
import pytest
from conftest import grid_knots, simulate_parts
from scipy.spatial.distance import cdist

from spatialfed.algorithm import start as starting
from spatialfed.algorithm.config import FitConfig
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.runtime.virtual import run_virtual


def all_pairs_phi0(parts, knots, kernel):
    """(δ₀, σ²₀, β₀, γ₀) by start.py's rule from the dense O(n_j²) variogram of every within-worker pair."""
    moments = [{"XtX": X.T @ X, "Xtz": X.T @ z, "ztz": z @ z, "n": len(z),
                "extent": float(np.hypot(*np.ptp(locs, axis=0)))} for locs, z, X in parts]
    gamma, s2, _ = starting.pooled_ols(moments)
    D = starting.domain_diameter(knots)
    edges = starting.variogram_edges(starting.variogram_cutoff(D, moments))
    sum_sq, count = np.zeros(edges.size - 1), np.zeros(edges.size - 1)
    for locs, z, X in parts:
        e = z - X @ gamma
        iu = np.triu_indices(len(z), k=1)
        idx = np.digitize(cdist(locs, locs)[iu], edges) - 1
        ok = idx < edges.size - 1
        sum_sq += np.bincount(idx[ok], weights=0.5 * (e[iu[0]] - e[iu[1]])[ok] ** 2, minlength=edges.size - 1)
        count += np.bincount(idx[ok], minlength=edges.size - 1)
    tau2, sigma2, beta = starting.fit_variogram(sum_sq, count, edges, kernel, s2, D)
    return 1.0 / tau2, sigma2, beta, gamma


def test_server_start_equals_the_all_pairs_rule_on_small_workers():
    """Workers below the subsample size: the server's φ₀ (trace row "init") is the O(n_j²) rule's, to rounding."""
    kernel, knots = Matern(0.5), grid_knots(4)
    parts = simulate_parts(J=3, n=150, p=2, nu=0.5, sigma2=1.0, beta=0.15, delta=4.0, seed=7)
    models = [LocalModel(*pt, knots, kernel, "pp") for pt in parts]
    server = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=1))
    row = server.trace[0]
    assert row["step"] == "init"
    delta, sigma2, beta, gamma = all_pairs_phi0(parts, knots, kernel)
    np.testing.assert_allclose([row["delta"], row["sigma2"], row["beta"]], [delta, sigma2, beta], rtol=1e-6)
    np.testing.assert_allclose(row["gamma"], gamma, rtol=1e-10)


def test_variogram_bins_span_the_sites_extent():
    """The bins end at ½ min(D, median site extent): area sites resolve the lags they hold, interleaved sites keep
    ½D; sites of one point (extent 0) do not count, and without any extent the bins span ½D."""
    area = [{"extent": e} for e in (0.2, 0.3, 0.25, 5.0)]
    assert starting.variogram_cutoff(1.4, area) == pytest.approx(0.5 * 0.275)
    assert starting.variogram_cutoff(1.4, [{"extent": 1.3}, {"extent": 1.5}, {"extent": 1.6}]) == pytest.approx(0.7)
    assert starting.variogram_cutoff(1.4, [{"extent": 0.0}, {"extent": 0.3}]) == pytest.approx(0.15)
    assert starting.variogram_cutoff(1.4, [{"extent": 0.0}]) == pytest.approx(0.7)
    np.testing.assert_allclose(starting.variogram_edges(0.3, 3), [0.0, 0.1, 0.2, 0.3])


@pytest.mark.parametrize("seed", range(3))
def test_start_resolves_a_small_nugget_on_area_sites(seed):
    """16 area sites of 200 points, τ² = 0.01 (δ = 100) under σ² = 1: bins over the sites' lags see the nugget, so
    δ₀ ≥ 25 (within 4× of the truth; ≈ 32–49 measured). Bins over the domain put every pair in the first few
    (δ₀ 14–22), and a floor of 0.05·s² caps δ₀ at 1/(0.05·s²) ≈ 17."""
    from spatialfed.data.simulate import simulate

    kernel, knots = Matern(0.5), grid_knots(8, 0.05, 0.95)
    sim = simulate(16, 200, beta=0.2, noise_sd=0.1, partition="area", seed=seed)
    models = [LocalModel(sim.locs[sim.labels == j], sim.z[sim.labels == j], sim.X[sim.labels == j], knots, kernel,
                         "full") for j in range(16)]
    server = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=1))
    row = server.trace[0]
    assert row["step"] == "init" and 25.0 <= row["delta"] <= 400.0, row["delta"]


def test_nugget_floor_follows_the_first_bin():
    """Exact semivariograms, first bin's midpoint 1/30: a nugget of 2 % of the sill under a range of 0.3 (γ̂₁ =
    0.125) is recovered, where a floor of 0.05·s² would hold it at 0.051; a nugget of 10⁻⁴ under β = 0.1 (γ̂₁ =
    0.28) is below what the bins resolve, and the start keeps it at 0.05·γ̂₁ instead of near 0."""
    kernel = Matern(0.5)
    edges = starting.variogram_edges(1.0)
    h = 0.5 * (edges[:-1] + edges[1:])
    count = np.full(h.size, 100.0)
    for tau2, beta, floor_binds in ((0.02, 0.3, False), (1e-4, 0.1, True)):
        gamma_hat = tau2 + 1.0 * (1 - kernel.correlation(h, beta))
        fitted_tau2, _, _ = starting.fit_variogram(count * gamma_hat, count, edges, kernel, s2=tau2 + 1.0)
        expected = 0.05 * gamma_hat[0] if floor_binds else tau2
        assert fitted_tau2 == pytest.approx(expected, rel=1e-3)


@pytest.mark.parametrize("nu", [0.5, 1.5])
def test_a_range_beyond_the_bins_takes_the_sill_from_the_variance(nu):
    """Bins on (0, 0.2] of an exact semivariogram with β = 0.5 (its effective range far past the last bin): only
    σ²/β^(2ν) shows in them, so the start keeps that and takes the sill from s² (here the true sill, 1.1): σ² =
    s² − τ², and β recovered from the kept ratio (Zhang 2004: σ²/β^(2ν) is what in-fill data identify)."""
    kernel = Matern(nu)
    edges = starting.variogram_edges(0.2)
    h = 0.5 * (edges[:-1] + edges[1:])
    count = np.full(h.size, 100.0)
    tau2, sigma2, beta = 0.1, 1.0, 0.5
    gamma_hat = tau2 + sigma2 * (1 - kernel.correlation(h, beta))
    fitted_tau2, fitted_sigma2, fitted_beta = starting.fit_variogram(count * gamma_hat, count, edges, kernel,
                                                                  s2=tau2 + sigma2, diameter=2.0)
    assert fitted_sigma2 == pytest.approx(tau2 + sigma2 - fitted_tau2, rel=1e-12)
    np.testing.assert_allclose([fitted_tau2, fitted_sigma2, fitted_beta], [tau2, sigma2, beta], rtol=0.1)
    # a variance 1.5 × the sill (a trend left in the residuals): σ² follows it, and σ²/β^(2ν) stays the field's
    _, s_big, b_big = starting.fit_variogram(count * gamma_hat, count, edges, kernel, s2=1.5 * (tau2 + sigma2),
                                         diameter=2.0)
    assert s_big > 1.4 and s_big / b_big ** (2 * nu) == pytest.approx(sigma2 / beta ** (2 * nu), rel=0.05)


@pytest.mark.parametrize("seed", range(4))
def test_subsampled_start_is_statistically_equivalent(seed):
    """Half of each worker's points (a quarter of its pairs): log δ₀, log σ²₀, log β₀ within 0.35 of the all-pairs
    start. The all-pairs start itself scatters by ≈ 0.3 in log δ and log β around the truth across simulated data
    sets (n_j = 1200, J = 2, measured over 6 data sets); the subsample moved it by ≤ 0.34 (≤ 0.1 on this one)."""
    kernel, knots = Matern(0.5), grid_knots(5, 0.0, 1.0)
    parts = simulate_parts(J=2, n=1200, p=2, nu=0.5, sigma2=1.0, beta=0.1, delta=4.0, seed=1)
    models = [LocalModel(*pt, knots, kernel, "pp") for pt in parts]
    moments = [lm.moments() for lm in models]
    gamma, s2, _ = starting.pooled_ols(moments)
    D = starting.domain_diameter(knots)
    edges = starting.variogram_edges(starting.variogram_cutoff(D, moments))
    xs = [lm.variogram(gamma, edges, max_points=600, seed=seed) for lm in models]
    count = sum(x["count"] for x in xs)
    assert count.sum() <= 2 * 600 * 599 / 2
    tau2, sigma2, beta = starting.fit_variogram(sum(x["sum_sq"] for x in xs), count, edges, kernel, s2, D)
    delta_ref, sigma2_ref, beta_ref, _ = all_pairs_phi0(parts, knots, kernel)
    deviation = np.log([1.0 / tau2, sigma2, beta]) - np.log([delta_ref, sigma2_ref, beta_ref])
    assert np.all(np.abs(deviation) <= 0.35), deviation


def test_moments_that_overflow_name_the_values_not_an_exact_fit():
    """One value of 1e308 makes Σzᵀz infinite: the message names the overflow, not "the covariates explain z"."""
    moments = [{"XtX": np.eye(1) * 40, "Xtz": np.array([1e308 + 3.0]), "ztz": np.inf, "n": 40},
               {"XtX": np.eye(1) * 40, "Xtz": np.array([2.0]), "ztz": 41.0, "n": 40}]
    with pytest.raises(ValueError, match=r"moments .* overflow float64: some value of z or of a covariate is near the "
                                         r"float64 limit"):
        starting.pooled_ols(moments)
