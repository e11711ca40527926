"""The three asynchronous strategies of Section 4 (SPEC §4): adaptive weights, gradient correction, moving average;
and the staleness-scaled step size of Section 5.

Each is a small pure function; the server decides when to apply them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from spatialfed.model.params import Params


def uniform_weights(n_workers: int) -> np.ndarray:
    """w_j = 1/J: the plain sums of SPEC §2 once multiplied by J (Eq. 17 with equal weights)."""
    return np.full(n_workers, 1.0 / n_workers)


def staleness_weights(t: int, t_js: Sequence[int], grad_norm: float, a: float, T_c: int) -> np.ndarray:
    """w_j of Eq. (18): ∝ (τ_j + 1 + max{√t, ‖g^{t−1}‖})^{−a} while some t_j ≤ T_c; uniform once all t_j > T_c."""
    t_js = np.asarray(t_js, dtype=float)
    if np.all(t_js > T_c):
        return uniform_weights(t_js.size)
    raw = (t - t_js + 1.0 + max(np.sqrt(t), grad_norm)) ** (-a)
    return raw / raw.sum()


def staleness_step_size(alpha: float, weights: np.ndarray, staleness: Sequence[int]) -> float:
    """α_t = α / (1 + τ̄_t), τ̄_t = Σ_j w_j τ_j: the (τ̄ + 1)⁻¹ scaling of Section 5 (no factor in the maximum staleness)."""
    return alpha / (1.0 + float(np.dot(weights, staleness)))


def section5_step_size(alpha: float, weights: np.ndarray, staleness: Sequence[int]) -> float:
    """α_t = α (τ̄_t + 1)⁻¹ (τ_t + 1)⁻¹ of Lemma 11 / Theorem 12, τ_t the largest staleness aggregated."""
    return staleness_step_size(alpha, weights, staleness) / (1.0 + float(np.max(staleness)))


def dominance_weights(weights: np.ndarray, arrivals: Sequence[int]) -> np.ndarray:
    """w_j ∝ w_j / (J p_j), p_j = arrivals_j / Σ_k arrivals_k: AsyncManifold's dominance penalty (after Leconte et
    al. 2024), so workers that report often do not dominate the aggregate."""
    arrivals = np.asarray(arrivals, dtype=float)
    p = arrivals / arrivals.sum()
    raw = np.asarray(weights, dtype=float) / (p.size * p)
    return raw / raw.sum()


def corrected_gradient(xi: Mapping, at: Params, rec: Params) -> np.ndarray:
    """g_j^corr of Eq. (15): g_j + ∂²f_j/∂u² Δu + ∂²f_j/∂u∂μ Δμ + ⟨∂²f_j/∂u∂Σ, ΔΣ⟩, Δ = rec − at (γ left out)."""
    return (
        xi["grad"]
        + xi["hess"] @ (rec.u - at.u)
        + xi["d2_du_dmu"] @ (rec.mu - at.mu)
        + np.einsum("aik,ik->a", xi["d2_du_dSigma"], rec.Sigma - at.Sigma)
    )


def aggregate(xis: Sequence[Mapping], weights: np.ndarray) -> dict:
    """J · Σ_j w_j ξ_j of Eq. (17), key by key (uniform w gives the sums of SPEC §2)."""
    J = len(xis)
    return {key: J * sum(w * np.asarray(xi[key], dtype=float) for w, xi in zip(weights, xis)) for key in xis[0]}


def moving_average_weights(M: int, omega: float) -> np.ndarray:
    """ω^i / Z for i = 0..M, Z = Σ_i ω^i (Eq. 19); i = 0 is the newest tuple."""
    raw = omega ** np.arange(M + 1, dtype=float)
    return raw / raw.sum()


def moving_average(newest_first: Sequence[np.ndarray], omega: float) -> np.ndarray:
    """Σ_{i=0}^{M} ω^i/Z φ_{t−i} of Eq. (19), element-wise; newest_first[0] = φ_t, M = len − 1."""
    w = moving_average_weights(len(newest_first) - 1, omega)
    return sum(wi * np.asarray(phi, dtype=float) for wi, phi in zip(w, newest_first))
