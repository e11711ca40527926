"""φ₀ from summaries the workers can send (SPEC §4 "Start φ₀ from data the workers can summarise").

Rule, in order:
1. γ₀ = OLS from the pooled moments Σ_j X_jᵀX_j, Σ_j X_jᵀz_j; residual variance s² = (Σ zᵀz − γ₀ᵀ Σ Xᵀz) / (N − p).
2. Empirical semivariogram of the OLS residuals, pooled over workers from pairs *within* each worker, in
   `N_BINS` equal distance bins on (0, ½ min(D, E)]: D the diameter of the knots' bounding box (the knots span the
   domain; with no knots, m = 0, the largest diameter of the workers' own bounding boxes), E the median diameter of
   the workers' bounding boxes. Pairs lie within a worker, so lags beyond its extent hold none: bins sized to the
   domain would put every pair of small area sites in the first few bins, and the nugget and the short-range
   slope, which most sites can show, would not be resolved.
   A worker with more than `LocalModel.VARIOGRAM_MAX_POINTS` (2,000) points bins the pairs of a seeded uniform
   subsample of that many points (LocalModel.variogram): every pair is kept with the same probability, so each bin's
   mean stays unbiased, and the pass costs O(n_j) + O(2,000²) whatever n_j is. Only binned sums and counts are sent.
3. Weighted least squares (Cressie 1985) of the Matérn semivariogram
   γ(h) = τ² + σ²(1 − ρ(h; β)) over (τ², σ², β): minimise Σ_k N_k (γ̂_k / γ(h_k) − 1)², h_k the bin midpoints,
   N_k the pair counts, in log-parameters from several starting ranges.
4. σ² is clipped into [0.05·s², 2·s²] and τ² into [0.05·γ̂₁, 2·s²], γ̂₁ the semivariance of the leading bins
   (pooled until they hold MIN_PAIRS pairs), so neither the spatial variance nor the noise starts at a degenerate boundary: γ̂₁ = τ² + σ²(1 − ρ(h₁))
   bounds the nugget from above, and how far below it the nugget lies only bins inside the range can tell (with
   the first bin beyond the range, γ̂₁ is the sill and the floor 0.05·s², as for σ²). δ₀ = 1/τ², and β is kept
   within [D/1000, 10·D]. Where the fitted effective range lies past the last bin, the bins show no sill and only
   σ²/β^(2ν) is identified (Zhang 2004): σ² becomes s² − τ² (clipped as above) and β keeps that ratio.
5. μ₀ = 0 and Σ₀ = K(σ², β): the prior of the knot process; Algorithm 1's synchronous pass then sets them.
"""

from __future__ import annotations

import numpy as np
from scipy import optimize

from spatialfed.model import blocks
from spatialfed.model.matern import norm
from spatialfed.model.params import Params

N_BINS = 15
#: the start's σ² lies in CLIP·s², its nugget τ² in [CLIP[0]·γ̂₁, CLIP[1]·s²] (step 4)
CLIP = (0.05, 2.0)
#: γ̂₁ pools the leading bins until they hold this many pairs: a bin mean's relative standard error is ≈ √(2/N_k)
MIN_PAIRS = 32


def pooled_ols(moments: list[dict]) -> tuple[np.ndarray, float, int]:
    """(γ₀, s², N): OLS from Σ_j X_jᵀX_j, Σ_j X_jᵀz_j and the residual variance (step 1)."""
    XtX = sum(mo["XtX"] for mo in moments)
    Xtz = sum(mo["Xtz"] for mo in moments)
    ztz = sum(mo["ztz"] for mo in moments)
    N = int(sum(mo["n"] for mo in moments))
    p = XtX.shape[0]
    if N <= p + 3:
        raise ValueError(f"the fit estimates {p + 3} parameters (γ: {p}, δ, σ², β) from only N={N} observations; it "
                         "needs more observations than parameters: add data or drop covariates")
    if not (np.isfinite(ztz) and np.all(np.isfinite(Xtz)) and np.all(np.isfinite(XtX))):
        raise ValueError("the sites' moments Σzᵀz, ΣXᵀz, ΣXᵀX overflow float64: some value of z or of a covariate "
                         "is near the float64 limit (e.g. 1e308, a missing-value code?); check the data and remove "
                         "or rescale those values")
    try:
        gamma = np.linalg.solve(XtX, Xtz)
    except np.linalg.LinAlgError:
        raise ValueError("the covariates are linearly dependent (ΣXᵀX is singular: e.g. a constant covariate beside "
                         "the intercept, or one a multiple of another); drop the redundant covariate") from None
    s2 = float(ztz - gamma @ Xtz) / (N - p)
    if not s2 > 0:
        raise ValueError("the pooled OLS residual variance Σzᵀz − γ₀ᵀΣXᵀz is not positive: the covariates explain z "
                         "exactly (nothing spatial to fit) or, with privacy noise on, the noisy moments are "
                         "inconsistent (lower the noise multiplier or raise the clip; docs/privacy.md)")
    return gamma, s2, N


def domain_diameter(knots: np.ndarray) -> float:
    """Diameter D of the knots' bounding box."""
    knots = np.asarray(knots, dtype=float)
    return float(norm(knots.max(axis=0) - knots.min(axis=0)))


def study_diameter(knots: np.ndarray, moments: list[dict]) -> float:
    """D of step 2: the knots' bounding-box diameter, or without knots the largest worker extent (moments)."""
    return domain_diameter(knots) if len(knots) else max(float(mo["extent"]) for mo in moments)


def variogram_cutoff(diameter: float, moments: list[dict]) -> float:
    """½ min(D, E), E the workers' median bounding-box diameter: the largest lag of step 2's bins."""
    extents = [float(mo["extent"]) for mo in moments if float(mo["extent"]) > 0]
    return 0.5 * min(diameter, float(np.median(extents))) if extents else 0.5 * diameter


def variogram_edges(cutoff: float, n_bins: int = N_BINS) -> np.ndarray:
    """Equal distance bins on (0, cutoff] (step 2)."""
    return np.linspace(0.0, cutoff, n_bins + 1)


def shortest_lag_semivariance(sum_sq: np.ndarray, count: np.ndarray) -> float:
    """γ̂₁: the semivariance of the leading bins, pooled until they hold MIN_PAIRS pairs (step 4)."""
    enough = np.cumsum(count) >= MIN_PAIRS
    k = int(np.argmax(enough)) + 1 if enough.any() else len(count)
    return float(np.sum(sum_sq[:k]) / max(np.sum(count[:k]), 1.0))


def fit_variogram(sum_sq: np.ndarray, count: np.ndarray, edges: np.ndarray, kernel, s2: float,
                  diameter: float | None = None):
    """(τ², σ², β) by Cressie's weighted least squares on the pooled semivariogram (steps 3–4); β's bounds follow
    the study diameter D (default 2·edges[-1]), the starting ranges the bins' span."""
    span = 2.0 * edges[-1]
    D = span if diameter is None else float(diameter)
    lo, hi = CLIP[0] * s2, CLIP[1] * s2
    ok = count > 0
    if np.count_nonzero(ok) < 3:
        return 0.5 * s2, 0.5 * s2, 0.25 * D / kernel.effective_range_factor()
    h = 0.5 * (edges[:-1] + edges[1:])[ok]
    gamma_hat = sum_sq[ok] / count[ok]
    n_k = count[ok]
    floor = min(max(CLIP[0] * shortest_lag_semivariance(sum_sq, count), 1e-6 * s2), hi)  # 1e-6·s²: default_bounds
    log_bounds = [(np.log(floor), np.log(hi)), (np.log(lo), np.log(hi)),
                  (np.log(D / 1000), np.log(10 * D))]

    def loss(v):
        tau2, sigma2, beta = np.exp(v)
        model = tau2 + sigma2 * (1.0 - kernel.correlation(h, beta))
        return float(np.sum(n_k * (gamma_hat / model - 1.0) ** 2))

    fits = [
        optimize.minimize(loss, np.log([0.5 * s2, 0.5 * s2, frac * span / kernel.effective_range_factor()]),
                          method="L-BFGS-B", bounds=log_bounds)
        for frac in (0.05, 0.2, 0.5)
    ]
    tau2, sigma2, beta = np.exp(min(fits, key=lambda r: r.fun).x)
    tau2 = float(np.clip(tau2, floor, hi))
    if kernel.effective_range_factor() * beta > edges[-1]:  # no sill within the bins: only σ²/β^(2ν) is identified
        sill = float(np.clip(s2 - tau2, lo, hi))
        beta, sigma2 = beta * (sill / sigma2) ** (0.5 / kernel.nu), sill
    return tau2, float(np.clip(sigma2, lo, hi)), float(beta)


def initial_params(gamma, delta, sigma2, beta, knots, kernel) -> Params:
    """φ₀ = (μ = 0, Σ = K(σ², β), γ, δ, σ², β) (step 5)."""
    K = blocks.knot_covariance(knots, kernel, sigma2, beta)
    return Params(mu=np.zeros(K.shape[0]), Sigma=K, gamma=np.asarray(gamma, dtype=float),
                  delta=delta, sigma2=sigma2, beta=beta)
