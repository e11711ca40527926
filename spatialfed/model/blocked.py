"""A site's part of site-blocked cross-validation (the server's part is api/blocked_cv.py; docs/equations.md, the
map's "site-blocked CV" row): site j's own points scored under the low-rank model conditioned on the other sites.

The server sends (μ₋ⱼ, Σ₋ⱼ, γ₋ⱼ) of the knot posterior without site j and the fitted u; at each of its points s
with covariates x the site predicts

    mean = xᵀγ₋ⱼ + b(s)ᵀμ₋ⱼ,   var = b(s)ᵀΣ₋ⱼb(s) + σ²(1 − b(s)ᵀρ(S*, s)) + 1/δ,   b(s)ᵀ = ρ(s, S*)ρ_K⁻¹,

the residual taken marginally (its correlation with the site's own points is not used: they are held out; it is 0
for `pp`), and returns only sums over its n_j points: n_j, Σ (z − mean)², Σ CRPS, Σ log N(z; mean, var).
"""

from __future__ import annotations

import numpy as np
from scipy import linalg, stats

from spatialfed.model.family import MaternFamily
from spatialfed.model.linalg import cholesky_with_jitter
from spatialfed.model.transform import crps_normal


def knot_basis(lm, u) -> tuple[np.ndarray, np.ndarray]:
    """(B = ρ(s, S*)ρ_K⁻¹, ρ(s, S*)) at the site's points for u, with ρ_K jittered as the statistics' (Eq. 4)."""
    u = np.asarray(u, dtype=float)
    if not isinstance(lm.kernel, MaternFamily):
        kb = lm._basis(float(np.exp(u[2])))
        return kb.B, kb.rjs
    kappa = u[2:]
    LK, _ = cholesky_with_jitter(lm.kernel.correlation(lm.knots, lm.knots, kappa), "the knot correlation matrix K")
    rjs = lm.kernel.correlation(lm.locs, lm.knots, kappa)
    return linalg.cho_solve((LK, True), rjs.T, check_finite=False).T, rjs


def held_out_prediction(lm, mu, Sigma, gamma, u) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance of a new observation at each of the site's points (module docstring)."""
    u = np.asarray(u, dtype=float)
    delta, sigma2 = float(np.exp(u[0])), float(np.exp(u[1]))
    B, rjs = knot_basis(lm, u)
    mean = lm.X @ np.asarray(gamma, dtype=float) + B @ np.asarray(mu, dtype=float)
    var = np.einsum("ij,jk,ik->i", B, np.asarray(Sigma, dtype=float), B) + 1.0 / delta
    if lm.strategy.kriges:  # the residual's marginal variance σ²(1 − bᵀρ) (pp has none)
        var += sigma2 * np.clip(1.0 - np.einsum("ij,ij->i", B, rjs), 0.0, None)
    return mean, var


def blocked_scores(lm, mu, Sigma, gamma, u) -> dict:
    """{"n", "sse", "crps", "log_density"}: sums over the site's points of its held-out prediction's squared error,
    Gaussian CRPS and log predictive density (4 numbers, whatever n_j)."""
    mean, var = held_out_prediction(lm, mu, Sigma, gamma, u)
    sd = np.sqrt(var)
    return {"n": int(lm.n), "sse": float(np.sum((lm.z - mean) ** 2)),
            "crps": float(np.sum(crps_normal(lm.z, mean, sd))),
            "log_density": float(np.sum(stats.norm.logpdf(lm.z, mean, sd)))}
