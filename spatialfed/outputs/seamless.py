"""Seamless federated prediction: the sites' residual predictions blended by a partition of unity.

The owner predictor (`prediction._predict_block`, predictor `lowrank`) kriges the residual w̃(s₀) from the one site
holding the nearest observation; residuals of different sites are independent in the model, so the mapped surface
jumps where the owner changes. Here every site j whose data lie within a band of s₀ predicts it as if s₀ were its
own (`LocalModel.residual_kriging`, from its own data only: mean m_j, BRk_j, kRk_j), and the server blends:

    weights   w_j(s₀) = φ(e_j/h) / Σ_k φ(e_k/h),   e_j = d_j(s₀) − min_k d_k(s₀),   φ(t) = 1 − 3t² + 2t³ on [0, 1]
    mean      x₀ᵀγ + b₀ᵀμ + Σ_j w_j m_j
    latent    Var = āᵀΣā + (Σ_j w_j √(P − kRk_j))²,   ā = b₀ − Σ_j w_j BRk_j,   P = c(0) − b₀ᵀKb₀

d_j is site j's distance to its nearest observation (what the owner rule already asks), continuous in s₀, so the
weights are continuous, sum to one, and equal one for the owner wherever every other site is at least h farther
(deep inside a region the prediction is the owner predictor's, bit for bit up to rounding). The variance: the
knot part is exact for the blended predictor (its error's η-component is āᵀ(η − μ)); the residual part is the
variance of Σ_j w_j u_j, each site's residual error u_j having variance P − kRk_j, bounded whatever the sites' errors'
correlation by (Σ_j w_j sd_j)² (Cauchy-Schwarz; equality when they are perfectly correlated), so the blend never
claims more precision than its parts. docs/maps.md, "Seamless prediction".

Band: h = BAND × the data's sampling spacing (the median over sites of each site's median nearest-neighbour
distance, `geometry.spacing`; one number per site crosses the network). Sites answer only for the locations of
their band; what they return is sized by those locations, never by n_j. Before the blend each site's part is tied
to its neighbours' by the boundary exchange (outputs/exchange.py), which brings the data across a boundary in.
Fits with residual pp or mpp have no correlated residual to blend: `prediction.predict_batches` gives them the
owner predictor.
"""

from __future__ import annotations

import numpy as np

from spatialfed.model.params import Params
from spatialfed.model.predict import assign_owners, lowrank_prior
from spatialfed.outputs import exchange, nearest

#: band half-width h in sampling spacings (docs/maps.md, "Seamless prediction")
BAND = 3.0


def taper(t) -> np.ndarray:
    """φ(t) = 1 − 3t² + 2t³ on [0, 1], 1 below, 0 above: C¹, φ(0) = 1, φ(1) = 0."""
    t = np.clip(np.asarray(t, dtype=float), 0.0, 1.0)
    return 1.0 - t * t * (3.0 - 2.0 * t)


def blend_weights(distances, h: float) -> np.ndarray:
    """Partition-of-unity weights (J × n₀) from each site's nearest-observation distance d_j(s₀) (J × n₀) and the
    band half-width h: w_j ∝ φ((d_j − min_k d_k)/h), so Σ_j w_j = 1, w ≥ 0, continuous in s₀, and the owner's weight
    is 1 where every other site is at least h farther."""
    d = np.asarray(distances, dtype=float)
    if not h > 0:
        raise ValueError(f"the band half-width must be > 0, got {h!r}")
    raw = taper((d - d.min(axis=0)) / h)
    return raw / raw.sum(axis=0)


def band_width(workers, band: float = BAND) -> float:
    """h = band × the data's sampling spacing (`sampling_spacing`)."""
    if not band > 0:
        raise ValueError(f"the seamless band (band) must be > 0 sampling spacings, got {band!r}")
    return float(band * sampling_spacing(workers))


def sampling_spacing(workers) -> float:
    """The median of the sites' sampling spacings (each site reports one number)."""
    spacings = workers.call("spacing", {j: () for j in range(workers.n_workers)})
    s = np.array([spacings[j] for j in range(workers.n_workers)], dtype=float)
    s = s[np.isfinite(s) & (s > 0)]
    if not s.size:
        raise ValueError("no site has two distinct observations: the seamless predictor's band needs a sampling "
                         "spacing; use predictor='lowrank'")
    return float(np.median(s))


def combine_blend(locs0, X0, params: Params, knots, kernel, weights: np.ndarray, parts: dict) -> dict:
    """Mean and sd of the blend (module docstring) from the weights (J × n₀) and the sites' residual parts:
    parts[j] = (indices of s₀ site j predicted, its residual_kriging result there)."""
    b0, prior = lowrank_prior(locs0, knots, kernel, params)
    resid = np.zeros(len(locs0))
    a = b0.copy()
    sd_res = np.zeros(len(locs0))
    for j, (idx, part) in parts.items():
        w = weights[j, idx]
        resid[idx] += w * part["mean"]
        a[idx] -= w[:, None] * part["BRk"]
        sd_res[idx] += w * np.sqrt(np.clip(prior[idx] - part["kRk"], 0.0, None))
    var = np.clip(np.einsum("ij,jk,ik->i", a, params.Sigma, a) + sd_res ** 2, 0.0, None)
    mean = X0 @ params.gamma + b0 @ params.mu + resid
    return {"mean": mean, "sd_latent": np.sqrt(var), "sd": np.sqrt(var + 1.0 / params.delta)}


def predict_block(workers, model, locs0, X0, h: float, ex: exchange.Exchange | None = None,
                  boxes: np.ndarray | None = None) -> dict:
    """{"mean", "sd", "sd_latent", "owner"} of the seamless predictor at one block of locations: the sites'
    distances (asked only where a site's bounding box is within h of the nearest data when `boxes` are given:
    nearest.nearest_distances), then one round of residual kriging by every site with a location in its band, each
    part tied to the boundary exchange `ex` when given (outputs/exchange.py)."""
    if boxes is None:
        boxes = nearest.site_boxes(workers)
    d = nearest.nearest_distances(workers, locs0, boxes, h)
    owners = assign_owners(d)
    weights = blend_weights(d, h)
    asked = {j: np.flatnonzero(weights[j] > 0) for j in range(workers.n_workers)}
    asked = {j: idx for j, idx in asked.items() if idx.size}
    tied = {} if ex is None else ex.anchors
    answers = workers.call("residual_kriging", {j: (locs0[idx], model.params) + ((tied[j],) if j in tied else ())
                                                for j, idx in asked.items()})
    parts = {j: (asked[j], exchange.correct(ex, j, answers[j]) if j in tied else answers[j]) for j in asked}
    out = combine_blend(locs0, X0, model.params, model.space_knots, model.kernel, weights, parts)
    return {**out, "owner": owners}
