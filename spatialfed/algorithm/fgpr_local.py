"""FGPR's site side (Algorithm 2 of the FGPR paper): E mini-batch SGD/Adam steps on the exact local GP likelihood.

From the global parameters, E steps on the mini-batch negative log-likelihood of Eq. (2) divided by the batch size M,
in ω = (γ, ρ) with the positive parameters θ = (δ⁻¹, σ², β) = softplus(ρ) + floor. The server side, settings and
references are in algorithm/fgpr.py.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg, special
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist

from spatialfed.model.blocks import LOG_2PI
from spatialfed.model.params import Params

#: Adam's moment decay rates and denominator offset (Kingma & Ba 2014 defaults)
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8


def softplus(rho, floor: float) -> np.ndarray:
    """θ = log(1 + e^ρ) + floor: positive parameters kept above `floor`."""
    return np.logaddexp(0.0, np.asarray(rho, dtype=float)) + floor


def softplus_derivative(rho) -> np.ndarray:
    """dθ/dρ = 1/(1 + e^{−ρ})."""
    return special.expit(np.asarray(rho, dtype=float))


def softplus_inverse(theta, floor: float) -> np.ndarray:
    """ρ with softplus(ρ) + floor = θ; raises unless θ > floor."""
    x = np.asarray(theta, dtype=float) - floor
    if np.any(~(x > 0)):
        raise ValueError(f"parameters {np.asarray(theta).tolist()} (δ⁻¹, σ², β) must exceed the softplus floor "
                         f"{floor:g}; lower FgprConfig.floor")
    return x + np.log(-np.expm1(-x))


def pack(params: Params, floor: float) -> np.ndarray:
    """ω = (γ, ρ) of the global parameters, ρ = softplus⁻¹((δ⁻¹, σ², β) − floor)."""
    return np.concatenate([params.gamma, softplus_inverse([1.0 / params.delta, params.sigma2, params.beta], floor)])


def unpack(omega, floor: float) -> dict:
    """(γ, δ, σ², β) of ω = (γ, ρ)."""
    tau2, sigma2, beta = softplus(omega[-3:], floor)
    return {"gamma": np.asarray(omega[:-3], dtype=float), "delta": 1.0 / tau2, "sigma2": sigma2, "beta": beta}


# --- the local loss: the exact GP likelihood of one mini-batch (FGPR Eq. 2) ------------------------------------
def minibatch_loss(omega, locs, z, X, kernel, floor: float) -> tuple[float, np.ndarray]:
    """(L, ∂L/∂ω): L = −log N(z; Xγ, σ²ρ_β + δ⁻¹I)/M on M points (FGPR Eq. 2 over M), ω = (γ, ρ), analytic.

    With C = σ²ρ + τ²I, α = C⁻¹e, e = z − Xγ: ∂/∂γ = −Xᵀα, ∂/∂θ_a = ½ tr(C⁻¹C_a) − ½ αᵀC_aα with C_τ² = I,
    C_σ² = ρ, C_β = σ² ∂ρ/∂β = σ² ρ̇/β (ρ̇ = ∂ρ/∂log β); then ∂θ/∂ρ = softplus'(ρ).
    """
    omega = np.asarray(omega, dtype=float)
    gamma, rho = omega[:-3], omega[-3:]
    tau2, sigma2, beta = softplus(rho, floor)
    M = len(z)
    corr, corr1, _ = kernel.correlation_derivatives(cdist(locs, locs), beta)
    C = sigma2 * corr
    C[np.diag_indices_from(C)] += tau2
    try:
        cf = linalg.cho_factor(C, lower=True, check_finite=False)
    except linalg.LinAlgError:
        raise np.linalg.LinAlgError(f"the mini-batch covariance σ²ρ + δ⁻¹I is not positive definite at σ²={sigma2:g}, "
                                    f"β={beta:g}, δ⁻¹={tau2:g}; raise FgprConfig.floor") from None
    e = z - X @ gamma
    alpha = linalg.cho_solve(cf, e, check_finite=False)
    Cinv = linalg.cho_solve(cf, np.eye(M), check_finite=False)
    logdet = 2.0 * float(np.sum(np.log(np.diag(cf[0]))))
    loss = 0.5 * (logdet + e @ alpha + M * LOG_2PI) / M
    C_beta = (sigma2 / beta) * corr1
    grad_theta = 0.5 * np.array([
        np.trace(Cinv) - alpha @ alpha,
        np.einsum("ij,ij->", Cinv, corr) - alpha @ corr @ alpha,
        np.einsum("ij,ij->", Cinv, C_beta) - alpha @ C_beta @ alpha,
    ])
    grad = np.concatenate([-(X.T @ alpha), grad_theta * softplus_derivative(rho)]) / M
    return float(loss), grad


def minibatch(rng, locs, size: int, batching: str, tree=None) -> np.ndarray:
    """Indices of one mini-batch ξ: `size` points uniformly without replacement, or a uniformly drawn centre and its
    size − 1 nearest neighbours (`nearest`, via the cKDTree `tree` of `locs`); all points when size ≥ n."""
    n = len(locs)
    if size >= n:
        return np.arange(n)
    if batching == "uniform":
        return rng.choice(n, size=size, replace=False)
    centre = int(rng.integers(n))
    return np.sort(tree.query(locs[centre], k=size)[1])


def local_update(lm, p, worker: int) -> dict:
    """Algorithm 2 of the FGPR paper on worker `worker`: E optimiser steps from the global p.params in round p.t.

    Returns the local (γ, δ, σ², β), n_j (the FedAvg weight) and the mean mini-batch loss. Mini-batches come from a
    generator seeded by (seed, worker, round), so the update is a pure function of (partition, p).
    """
    cfg = p.extra["config"]
    omega = pack(p.params, cfg.floor)
    rng = np.random.default_rng([cfg.seed, worker, p.t])
    tree = cKDTree(lm.locs) if cfg.batching == "nearest" and cfg.batch_size < lm.n else None
    m1, m2 = np.zeros_like(omega), np.zeros_like(omega)
    (b1, b2), losses = ADAM_BETAS, []
    for e in range(cfg.local_steps):
        idx = minibatch(rng, lm.locs, cfg.batch_size, cfg.batching, tree)
        loss, g = minibatch_loss(omega, lm.locs[idx], lm.z[idx], lm.X[idx], lm.kernel, cfg.floor)
        losses.append(loss)
        if cfg.optimizer == "sgd":
            omega = omega - cfg.lr / ((p.t - 1) * cfg.local_steps + e + 1) * g
        else:
            m1 = b1 * m1 + (1 - b1) * g
            m2 = b2 * m2 + (1 - b2) * g * g
            step = (m1 / (1 - b1 ** (e + 1))) / (np.sqrt(m2 / (1 - b2 ** (e + 1))) + ADAM_EPS)
            omega = omega - cfg.lr / np.sqrt(p.t) * step
        if not np.all(np.isfinite(omega)):
            raise FloatingPointError(f"FGPR's local {cfg.optimizer} step diverged on worker {worker} in round {p.t}; "
                                     "lower FgprConfig.lr")
    return {**unpack(omega, cfg.floor), "n": int(lm.n), "loss": float(np.mean(losses))}


def local_flops(lm, p) -> float:
    """Flops of one local update: E·(4/3·b³ + (p + 3)·b²), b = min(M, n_j) (Cholesky, C⁻¹ and the trace terms)."""
    cfg = p.extra["config"]
    b = min(cfg.batch_size, lm.n)
    return cfg.local_steps * (4.0 / 3.0 * b**3 + (lm.p + 3) * b**2)


# --- the server (Algorithm 1 of the FGPR paper) as a sans-IO state machine ----------------------------------
