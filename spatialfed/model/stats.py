"""Per-site sufficient statistics of the low-rank likelihood and their u-derivatives (SPEC §2b).

At u = (log δ, log σ², log β) worker j summarises its data by

    W_j = [B_j  X_j  z_j]  (n_j × k, k = m + p + 1),   S_j = W_jᵀ R_j⁻¹ W_j,   d_j = log det R_j,   n_j,

with ∂S_j/∂u_a, ∂²S_j/∂u_a∂u_b, ∂d_j/∂u_a, ∂²d_j/∂u_a∂u_b. Everything the server needs at u (Σ, μ, GLS γ̂, ℓ_LR and
its gradient and Hessian) follows from the sums over workers (algorithm/likelihood.py). The message holds 10·k² + 11
numbers (S, three first and six distinct second derivatives, d with its derivatives, n): independent of n_j.

Derivatives (P = R⁻¹, R_a = ∂R/∂u_a, E_a = ∂W/∂u_a = [∂_aB 0 0], nonzero for a = β only):
    R_δ = −εI, R_σ = σ²W̃ = R − εI, R_β = σ²∂W̃/∂log β;  R_δδ = εI, R_σσ = R_σ, R_σβ = R_β, R_ββ = σ²∂²W̃/∂log β²
    ∂_aS  = E_aᵀY + YᵀE_a − YᵀR_aY,                                  Y = PW
    ∂_abS = E_abᵀY + YᵀE_ab + E_aᵀPE_b + E_bᵀPE_a − (E_aᵀT_b + E_bᵀT_a + transposes)
            + Z_aᵀT_b + Z_bᵀT_a − YᵀR_abY,                          Z_a = R_aY, T_a = PZ_a
    ∂_ad  = tr(PR_a),   ∂_abd = tr(PR_ab) − tr(PR_aPR_b).
Cost: one Cholesky of R_j, its inverse and one n_j × n_j product for `full` (O(n_j³)); O(n_j k²) for `mpp`/`pp`.
The independence model of Eq. (3) is the case m = 0 with the `full` residual (R_j = C_jj + δ⁻¹I).
"""

from __future__ import annotations

import numpy as np

from spatialfed.model import vecchia
from spatialfed.model.dense import inverse_in_place, residual_beta, residual_beta2_terms
from spatialfed.model.linalg import apply, inner, matmul, trace, transpose
from spatialfed.model.family import MaternFamily
from spatialfed.model.family_stats import family_statistics
from spatialfed.model.local import LocalModel
from spatialfed.model.names import PAIRS
from spatialfed.model.params import Params
from spatialfed.model.residuals import VECCHIA_RATE_FACTOR, residual_strategy  # noqa: F401 (re-exported)
from spatialfed.model.vecchia_order import VECCHIA_K

#: keys of a statistics message (site_statistics) that are summed over sites
SUMMED = ("n", "S", "dS", "d2S", "d", "dd", "d2d")


def pair_index(a: int, b: int) -> int:
    """Position of the unordered pair (a, b) in PAIRS."""
    return PAIRS.index((min(a, b), max(a, b)))


def _u_of(params) -> np.ndarray:
    """u = (log δ, log σ², log β) from a Params or a length-3 array."""
    if isinstance(params, Params):
        return params.u
    u = np.asarray(params, dtype=float).reshape(-1)
    if u.shape != (3,) or not np.all(np.isfinite(u)):
        raise ValueError(f"u must be 3 finite numbers (log δ, log σ², log β), got {params!r}")
    return u


def site_statistics(lm: LocalModel, params) -> dict:
    """S_j, d_j, n_j and their first and second u-derivatives at u (SPEC §2b), from worker j's LocalModel.

    `params`: a Params (only δ, σ², β are used) or u itself. Returns numpy arrays: "u" (3), "n", "m", "p",
    "S" (k×k), "dS" (3×k×k), "d2S" (6×k×k, pairs in PAIRS order), "d", "dd" (3), "d2d" (6), and "c", the
    direction of u along which S scales exactly (S(u + sc) = e^{s}S(u): c = (1, −1, 0) for full/mpp, where
    R = σ²W̃ + δ⁻¹I scales by e^{−s}; (1, 0, 0) for pp).
    Reuses the LocalModel's cached knot basis and factorisation of R_j at (δ, σ², β). A LocalModel of a
    MaternFamily (ν estimated, anisotropy, chordal) answers at its u = (log δ, log σ², κ) (family_statistics).
    """
    if isinstance(lm.kernel, MaternFamily):
        u = params.u if isinstance(params, Params) else np.asarray(params, dtype=float).reshape(-1)
        return family_statistics(lm.locs, lm.z, lm.X, lm.knots, lm.kernel, lm.residual, u, lm.vecchia_k,
                                 lm.vecchia_ordering)
    u = _u_of(params)
    delta, sigma2, beta = (float(v) for v in np.exp(u))
    m, p, n = lm.m, lm.p, lm.n
    c = np.array(lm.strategy.scale_direction)
    head = {"u": u, "c": c, "n": int(n), "m": int(m), "p": int(p)}
    if lm.strategy.pointwise:  # SPEC §2c: point by point, no n_j × n_j array
        kf = vecchia.KnotFactors(lm.kernel, lm.d_K, lm.locs, lm.knots, beta)
        return {**head, **vecchia.statistics(lm.X, lm.z, lm.vecchia_plan, kf, sigma2, 1.0 / delta)}
    key = Params(np.zeros(m), np.eye(m), np.zeros(p), delta, sigma2, beta)
    fz = lm.factorise(key, whiten=False)
    kb, eps, s2 = fz.kb, fz.eps, fz.sigma2
    G = inverse_in_place(fz.factor)  # P = R⁻¹, dense (full, in the factor's storage) or its diagonal (mpp, pp)
    k = m + p + 1
    W = np.hstack([kb.B, lm.X, lm.z[:, None]])
    Y = apply(G, W)
    S = W.T @ Y
    YY = Y.T @ Y
    PY = apply(G, Y)
    Rb = residual_beta(lm, kb, s2)  # R_β: the second (and last) dense n×n array of the full residual
    Zb = apply(Rb, Y)
    Tb = apply(G, Zb)
    Z = [-eps * Y, W - eps * Y, Zb]  # R_aY (R_σY = RY − εY = W − εY)
    T = [-eps * PY, Y - eps * PY, Tb]  # PR_aY
    Yb = apply(G, kb.dB)  # P ∂B

    def pad(block: np.ndarray) -> np.ndarray:
        """An m×k block in the B rows of a k×k matrix."""
        out = np.zeros((k, k))
        out[:m] = block
        return out

    def sym(A: np.ndarray) -> np.ndarray:
        return A + A.T

    EY = pad(kb.dB.T @ Y)  # E_βᵀY
    dS = np.stack([eps * YY, -(S - eps * YY), sym(EY) - Y.T @ Zb])  # −YᵀR_aY (+ E-terms for β)

    # −YᵀR_abY; R_ββ = σ²[D₂ − (U₂V₂ᵀ + V₂U₂ᵀ)] (U₂ = V₂ = None for mpp/pp); R_δσ = R_δβ = 0
    tPD2, YWbbY, U2, V2 = residual_beta2_terms(lm, kb, G, Y)
    if U2 is not None:
        YU, YV = Y.T @ U2, Y.T @ V2
        YWbbY -= sym(YU @ YV.T)
    minus_YRabY = {(0, 0): -eps * YY, (1, 1): dS[1], (1, 2): -Y.T @ Zb, (2, 2): -s2 * YWbbY}
    EPE = np.zeros((k, k))
    EPE[:m, :m] = kb.dB.T @ Yb  # E_βᵀPE_β
    d2S = np.zeros((len(PAIRS), k, k))
    for i, (a, b) in enumerate(PAIRS):
        H = sym(Z[a].T @ T[b])  # Z_aᵀT_b + Z_bᵀT_a
        if (a, b) in minus_YRabY:
            H += minus_YRabY[(a, b)]
        if b == 2:  # −(E_βᵀT_a + transpose), twice when a = β too
            H -= sym(pad(kb.dB.T @ T[a]))
        if a == 2:
            H -= sym(pad(kb.dB.T @ T[b]))
            H += sym(pad(kb.d2B.T @ Y)) + 2.0 * EPE  # E_ββᵀY + YᵀE_ββ + 2E_βᵀPE_β
        d2S[i] = 0.5 * (H + H.T)

    # log det R and its derivatives
    trP, trP2 = trace(G), inner(G, G)
    PRb = matmul(G, Rb)
    del Rb
    tPRb, tP2Rb, tPRbPRb = trace(PRb), inner(G, transpose(PRb)), inner(PRb, transpose(PRb))
    del PRb, G
    tPRbb = tPD2
    if U2 is not None:
        tPRbb -= 2.0 * float(np.einsum("ij,ij->", np.hstack([Y[:, :m], Yb]), U2))  # ⟨P, U₂V₂ᵀ + V₂U₂ᵀ⟩
    tPRbb *= s2
    dd = np.array([-eps * trP, n - eps * trP, tPRb])
    d2d = np.array([
        eps * trP - eps**2 * trP2,  # δδ
        eps * (trP - eps * trP2),  # δσ
        eps * tP2Rb,  # δβ
        eps * trP - eps**2 * trP2,  # σσ
        eps * tP2Rb,  # σβ
        tPRbb - tPRbPRb,  # ββ
    ])
    return {**head, "S": 0.5 * (S + S.T),
            "dS": 0.5 * (dS + dS.transpose(0, 2, 1)),
            "d2S": d2S, "d": fz.logdet, "dd": dd, "d2d": d2d}


def message_size(stats: dict) -> int:
    """Numbers in a statistics message: 10·k² + 11 (k = m + p + 1), whatever n_j."""
    return int(sum(np.size(stats[key]) for key in SUMMED))


def stats_flops(n: int, m: int, p: int, residual: str, vecchia_k: int = VECCHIA_K) -> float:
    """Floating-point operations of site_statistics for this residual (model/residuals.py: stats_flops)."""
    return residual_strategy(residual).stats_flops(n, m, p, vecchia_k)
