"""Prediction (federated kriging): the residual part, computed where the data live, and FGPR's local kriging.

Each function takes the worker's LocalModel `lm`; what it returns is sized by the prediction request (n₀), never by
n_j. The dense (`full`) and diagonal (`mpp`, `pp`) residuals krige through a factorisation of R_j (`fz`,
LocalModel._kriging_factor); the Vecchia residual conditions on nearest neighbours (model/vecchia_predict.py).
"""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import cdist

from spatialfed.errors import check_finite
from spatialfed.model.basis import KnotBasis, residual_covariance
from spatialfed.model.dense import column_blocks
from spatialfed.model.linalg import DenseFactor
from spatialfed.model.matern import check_points
from spatialfed.model.params import Params

#: prediction: a worker kriges its locations in row blocks whose n₀ × n_j cross-covariance stays within this
KRIGING_BYTES = 32 * 2**20


def residual_cross(lm, locs0: np.ndarray, kb: KnotBasis, sigma2: float) -> np.ndarray:
    """cov(w̃(s₀), w̃_j) (n₀ × n_j) of Remark 3; zero off coincident points for mpp, zero for pp."""
    if lm.strategy.dense:
        return residual_covariance(lm.kernel, lm.knots, kb.beta, sigma2, locs0, lm.locs)
    cross = np.zeros((locs0.shape[0], lm.n))
    if lm.strategy.kriges:  # mpp: white, only coincident points share it
        b0 = kb._right_solve(lm.kernel.correlation(cdist(locs0, lm.knots), kb.beta))
        i, k = np.nonzero(cdist(locs0, lm.locs) == 0.0)
        cross[i, k] = sigma2 * (1.0 - np.einsum("ij,ij->i", b0[i], kb.rjs[k]))
    return cross


def residual_kriging(lm, fz, locs0: np.ndarray, params: Params, anchors: np.ndarray | None = None) -> dict:
    """E[w̃(s₀) | η = μ, z_j] and the variance pieces (LocalModel.residual_kriging) through the factorisation `fz`;
    with `anchors` U also "cross" = cov(w̃(s₀), w̃(U) | z_j) (n₀ × |U|, `anchor_cross`). Needs a dense factor
    (`full`) for the cross."""
    rh = fz.zh - fz.Xh @ params.gamma - fz.Bh @ params.mu
    out = {"mean": np.empty(len(locs0)), "BRk": np.empty((len(locs0), lm.m)), "kRk": np.empty(len(locs0))}
    if anchors is not None:
        weights = anchor_weights(lm, fz, anchors, params)
        out["cross"] = np.empty((len(locs0), len(anchors)))
    for rows in column_blocks(len(locs0), KRIGING_BYTES, height=lm.n):  # memory O(KRIGING_BYTES), any n₀
        k0 = residual_cross(lm, locs0[rows], fz.kb, params.sigma2)
        kh = fz.factor.whiten(k0.T)
        out["mean"][rows], out["BRk"][rows] = kh.T @ rh, kh.T @ fz.Bh
        out["kRk"][rows] = np.einsum("ij,ij->j", kh, kh)
        if anchors is not None:
            out["cross"][rows] = _cross(lm, locs0[rows], anchors, params, k0, weights)
    return out


def anchor_weights(lm, fz, anchors: np.ndarray, params: Params) -> np.ndarray:
    """R_j⁻¹ k̃(S_j, U) (n_j × |U|): what the cross-covariances need of the exchange points, once per (δ, θ)."""
    return fz.factor.unwhiten_t(fz.factor.whiten(residual_cross(lm, anchors, fz.kb, params.sigma2).T))


def anchor_cross(lm, fz, locs0: np.ndarray, anchors: np.ndarray, params: Params, weights: np.ndarray) -> np.ndarray:
    """cov(w̃(s₀), w̃(U) | z_j) alone (no kriging of the mean), in row blocks: O(n_j (m + |U|)) per location."""
    out = np.empty((len(locs0), len(anchors)))
    for rows in column_blocks(len(locs0), KRIGING_BYTES, height=lm.n):
        k0 = residual_cross(lm, locs0[rows], fz.kb, params.sigma2)
        out[rows] = _cross(lm, locs0[rows], anchors, params, k0, weights)
    return out


def _cross(lm, locs0, anchors, params: Params, k0: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """c̃(s₀, U) − k̃(s₀, S_j) R_j⁻¹ k̃(S_j, U), from k0 = k̃(s₀, S_j) and `anchor_weights`."""
    return residual_covariance(lm.kernel, lm.knots, params.beta, params.sigma2, locs0, anchors) - k0 @ weights


def anchor_posterior(lm, fz, anchors: np.ndarray, params: Params) -> dict:
    """This site's posterior of its residual at the exchange points U (η = μ): "mean" m = k̃_U R_j⁻¹ r_j, "BRk"
    (its η-coefficients, as residual_kriging) and "cov" P = c̃(U, U) − k̃_U R_j⁻¹ k̃_Uᵀ (outputs/exchange.py)."""
    out = residual_kriging(lm, fz, anchors, params, anchors)
    out["cov"] = out.pop("cross")
    del out["kRk"]
    return out


def independent_kriging(lm, locs0, X0, params: Params) -> dict:
    """Kriging from this worker's data alone under the independence model (Eq. 3) with global (γ, δ, θ).

    Returns the predictive mean and latent variance: FGPR's personalised prediction.
    """
    locs0 = check_points(locs0, "prediction locations", lm.locs.shape[1])
    X0 = check_finite(np.atleast_2d(np.asarray(X0, dtype=float)), "prediction covariates")
    if X0.shape != (locs0.shape[0], lm.p):
        raise ValueError(f"prediction covariates must have shape ({locs0.shape[0]}, {lm.p}), got {X0.shape}")
    M = params.sigma2 * lm.kernel.correlation(cdist(lm.locs, lm.locs), params.beta)
    M[np.diag_indices_from(M)] += 1.0 / params.delta
    factor = DenseFactor(M, f"C_jj + δ⁻¹I of worker data (n={lm.n})")
    eh = factor.whiten(lm.z - lm.X @ params.gamma)
    mean, var = X0 @ params.gamma, np.full(len(locs0), params.sigma2)
    for rows in column_blocks(len(locs0), KRIGING_BYTES, height=lm.n):  # memory O(KRIGING_BYTES), any n₀
        k0 = factor.whiten(params.sigma2 * lm.kernel.correlation(cdist(lm.locs, locs0[rows]), params.beta))
        mean[rows] += k0.T @ eh
        var[rows] -= np.einsum("ij,ij->j", k0, k0)
    return {"mean": mean, "var": var}
