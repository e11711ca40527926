"""The block scheme's theta sub-step on one worker: f_j, ∂f_j/∂u, ∂²f_j/∂u² (Eq. 10, 13) and G_j of Eq. (16).

The objective is written f_j = ½ log det R + ½ tr(R⁻¹ Ψ) with Ψ = V Ξ Vᵀ, V = [r, B], Ξ = blockdiag(1, Σ),
r = z − Xγ − Bμ (SPEC §1's f_j); R = σ²W̃(β) + εI, ε = 1/δ. Every derivative in u = (log δ, log σ², log β) is
analytic; docs/equations.md maps each term to the paper. Dense (`full`) or diagonal (`mpp`, `pp`) residuals.
"""

from __future__ import annotations

import numpy as np

from spatialfed.model.dense import inverse_in_place, residual_beta, residual_beta2_terms
from spatialfed.model.linalg import apply, inner, matmul, trace, transpose
from spatialfed.model.params import Params


def theta(lm, fz, params: Params) -> dict:
    """f_j, ∂f_j/∂u, ∂²f_j/∂u² (Eq. 10 and 13) and G_j = (∂²f_j/∂u∂μ, ∂²f_j/∂u∂Σ) (Eq. 16).

    `fz`: a fresh factorisation of R_j at params (LocalModel.factorise), consumed here. Full residual: at most
    three n_j × n_j arrays at once (R⁻¹ in the factor's storage, W_b, then R⁻¹W_b in place of nothing: W_b is
    dropped as soon as the product exists); ∂²W̃/∂log β² is visited by blocks.
    """
    kb, eps, s2, n, m = fz.kb, fz.eps, fz.sigma2, lm.n, lm.m

    # V = [r, B], V_b = ∂V/∂log β = [−Ḃμ, Ḃ], V_bb = [−B̈μ, B̈]; Ξ = blockdiag(1, Σ)
    rh = fz.zh - fz.Xh @ params.gamma - fz.Bh @ params.mu
    Vh = np.hstack([rh[:, None], fz.Bh])  # L⁻¹V
    Y = fz.factor.unwhiten_t(Vh)  # R⁻¹V
    Yw = fz.factor.whiten(Y)
    del Vh
    G = inverse_in_place(fz.factor)  # R⁻¹ (consumes the factor)
    V = np.hstack([(lm.z - lm.X @ params.gamma - kb.B @ params.mu)[:, None], kb.B])
    Vb = np.hstack([-(kb.dB @ params.mu)[:, None], kb.dB])
    Vbb = np.hstack([-(kb.d2B @ params.mu)[:, None], kb.d2B])
    Yb = apply(G, Vb)
    Wb = residual_beta(lm, kb, s2)  # W_b = ∂W/∂log β
    WbY = apply(Wb, Y)
    Z = apply(G, WbY)  # R⁻¹W_bR⁻¹V
    P = matmul(G, Wb)  # R⁻¹W_b
    del Wb
    t1, t2 = trace(G), inner(G, G)
    trP, tPP, tGP = trace(P), inner(P, transpose(P)), inner(G, transpose(P))
    del P
    # W_bb = σ²[D₂ − (U₂V₂ᵀ + V₂U₂ᵀ)]: ⟨R⁻¹, W_bb⟩ and YᵀW_bbY without forming W_bb
    tGWbb, YWbbY, U2, V2 = residual_beta2_terms(lm, kb, G, Y)
    del G
    if U2 is not None:
        GV2 = np.hstack([Y[:, 1:], Yb[:, 1:]])  # R⁻¹[B, Ḃ]
        tGWbb -= 2.0 * float(np.einsum("ij,ij->", GV2, U2))
        YU, YV = Y.T @ U2, Y.T @ V2
        YWbbY -= YU @ YV.T + YV @ YU.T
    tGWbb *= s2
    YWbbY *= s2
    Xi = np.zeros((m + 1, m + 1))
    Xi[0, 0] = 1.0
    Xi[1:, 1:] = params.Sigma

    C_VY = V.T @ Y
    C_YY = Y.T @ Y
    C_VZ = V.T @ Z
    C_VbY = Vb.T @ Y

    def xi(C):
        return float(np.einsum("ij,ij->", C, Xi))

    psi0 = xi(C_VY)  # tr(R⁻¹Ψ) = rᵀR⁻¹r + tr(BᵀR⁻¹BΣ)
    trGam = xi(C_YY)  # tr Γ, Γ = R⁻¹ΨR⁻¹
    trGamG = xi(Yw.T @ Yw)  # tr(ΓR⁻¹)
    WbGam = xi(C_VZ)  # ⟨W_b, Γ⟩
    GamWbG = xi(Y.T @ Z)  # tr(ΓW_bR⁻¹)
    WbGamWbG = xi(WbY.T @ Z)  # tr(W_bΓW_bR⁻¹) = ⟨Ξ, (W_bY)ᵀR⁻¹W_bY⟩
    WbbGam = xi(YWbbY)  # ⟨W_bb, Γ⟩
    GPsib = 2.0 * xi(C_VbY)  # tr(R⁻¹Ψ_b)
    G2Psib = 2.0 * xi(Yb.T @ Y)  # tr(R⁻²Ψ_b)
    GWbGPsib = 2.0 * xi(Vb.T @ Z)  # tr(R⁻¹W_bR⁻¹Ψ_b)
    GPsibb = 2.0 * xi(Vbb.T @ Y) + 2.0 * xi(Vb.T @ Yb)  # tr(R⁻¹Ψ_bb)

    f = 0.5 * (fz.logdet + psi0)
    grad = 0.5 * np.array([
        -eps * t1 + eps * trGam,
        n - eps * t1 - psi0 + eps * trGam,
        trP - WbGam + GPsib,
    ])
    h_dd = 0.5 * eps * t1 - 0.5 * eps**2 * t2 + eps**2 * trGamG - 0.5 * eps * trGam
    h_ds = 0.5 * eps * (t1 - eps * t2) - eps * (trGam - eps * trGamG)
    h_ss = 0.5 * eps * t1 - 0.5 * eps**2 * t2 + 0.5 * psi0 - 1.5 * eps * trGam + eps**2 * trGamG
    h_db = 0.5 * eps * tGP - eps * GamWbG + 0.5 * eps * G2Psib
    h_sb = 0.5 * eps * tGP + 0.5 * WbGam - eps * GamWbG - 0.5 * GPsib + 0.5 * eps * G2Psib
    h_bb = 0.5 * tGWbb - 0.5 * tPP + WbGamWbG - 0.5 * WbbGam - GWbGPsib + 0.5 * GPsibb
    hess = np.array([[h_dd, h_ds, h_db], [h_ds, h_ss, h_sb], [h_db, h_sb, h_bb]])

    # G_j of Eq. (16): ∂²f_j/∂u∂μ (3×m) and ∂²f_j/∂u∂Σ (3×m×m), from ∂f/∂μ = −BᵀR⁻¹r, ∂f/∂Σ = ½BᵀR⁻¹B
    d2_mu = np.vstack([
        -eps * C_YY[1:, 0],
        C_VY[1:, 0] - eps * C_YY[1:, 0],
        -C_VbY[1:, 0] + C_VZ[1:, 0] - C_VbY[0, 1:],
    ])
    BGB, GBGB, dBGB = C_VY[1:, 1:], C_YY[1:, 1:], C_VbY[1:, 1:]
    d2_Sigma = 0.5 * np.stack([
        eps * GBGB,
        eps * GBGB - BGB,
        dBGB + dBGB.T - C_VZ[1:, 1:],
    ])
    return {"f": f, "grad": grad, "hess": hess, "d2_du_dmu": d2_mu, "d2_du_dSigma": d2_Sigma}
