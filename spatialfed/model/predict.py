"""Federated prediction from a fitted low-rank model: the server's low-rank part plus the owners' residuals.

y(s₀) = x₀ᵀγ + b₀ᵀη + w̃(s₀) with η | z ~ N(μ, Σ) (the optimum of Eq. 5 is the exact posterior of η). Worker j
holds the only data correlated with w̃(s₀) for the points it owns, so
  E[y₀ | z]   = x₀ᵀγ + b₀ᵀμ + k̃R_j⁻¹(z_j − X_jγ − B_jμ),
  Var[y₀ | z] = aᵀΣa + (c(0) − b₀ᵀKb₀) − k̃R_j⁻¹k̃ᵀ,   a = b₀ − B_jᵀR_j⁻¹k̃ᵀ,
with k̃ = cov(w̃(s₀), w̃_j). A new observation adds the noise variance δ⁻¹.
Owner rule: s₀ belongs to the worker holding its nearest observation (each worker reports only its distance to s₀).
"""

from __future__ import annotations

import numpy as np
from scipy import linalg
from scipy.spatial.distance import cdist

from spatialfed.errors import check_finite
from spatialfed.model.basis import check_knots
from spatialfed.model.local import check_residual
from spatialfed.model.matern import Matern, check_points
from spatialfed.model.params import Params
from spatialfed.model.residuals import residual_strategy


def assign_owners(distances: np.ndarray) -> np.ndarray:
    """Owner of each prediction point: argmin over workers of the reported nearest-observation distance (J × n₀)."""
    return np.argmin(np.asarray(distances), axis=0)


def lowrank_prior(locs0, knots, kernel: Matern, params: Params) -> tuple[np.ndarray, np.ndarray]:
    """b₀ = ρ(s₀,S*)ρ_K⁻¹ (n₀ × m) and the prior residual variance c(0) − b₀ᵀKb₀ at each s₀."""
    knots = check_knots(knots)
    rK = kernel.correlation(cdist(knots, knots), params.beta)
    r0 = kernel.correlation(cdist(check_points(locs0, "prediction locations", knots.shape[1]), knots), params.beta)
    b0 = linalg.solve(rK, r0.T, assume_a="pos").T
    return b0, params.sigma2 * np.clip(1.0 - np.einsum("ij,ij->i", b0, r0), 0.0, None)


def combine_prediction(locs0, X0, params: Params, knots, kernel: Matern, residual: str, owned: dict) -> dict:
    """Mean and sd of y(s₀) (latent) and of a new observation, from the server state and the owners' residual parts.

    `owned` maps worker j to (indices of the points it owns, its LocalModel.residual_kriging result); it is empty
    for residual="pp", whose residual is zero.
    """
    check_residual(residual)
    X0 = check_finite(np.atleast_2d(np.asarray(X0, dtype=float)), "prediction covariates")
    if X0.shape != (len(locs0), params.gamma.size):
        raise ValueError(
            f"prediction covariates must have shape ({len(locs0)}, {params.gamma.size}) to match the fitted γ, "
            f"got {X0.shape}; give every covariate used in the fit at each prediction location"
        )
    b0, prior_res = lowrank_prior(locs0, knots, kernel, params)
    mean = X0 @ params.gamma + b0 @ params.mu
    a = b0.copy()
    explained = np.zeros(len(locs0))
    for idx, part in owned.values():
        mean[idx] += part["mean"]
        a[idx] -= part["BRk"]
        explained[idx] += part["kRk"]
    if not residual_strategy(residual).kriges:
        prior_res = np.zeros_like(prior_res)
    var = np.einsum("ij,jk,ik->i", a, params.Sigma, a) + np.clip(prior_res - explained, 0.0, None)
    var = np.clip(var, 0.0, None)
    return {"mean": mean, "sd_latent": np.sqrt(var), "sd": np.sqrt(var + 1.0 / params.delta)}


def federated_predict(models, locs0, X0, params: Params, knots, kernel: Matern, residual: str) -> dict:
    """Low-rank prediction with every worker computing its own residual part (in-process driver of the protocol)."""
    locs0 = check_points(locs0, "prediction locations")
    owned = {}
    if residual_strategy(residual).kriges:
        owners = assign_owners([lm.nearest_distance(locs0) for lm in models])
        for j, lm in enumerate(models):
            idx = np.flatnonzero(owners == j)
            if idx.size:
                owned[j] = (idx, lm.residual_kriging(locs0[idx], params))
    return combine_prediction(locs0, X0, params, knots, kernel, residual, owned)
