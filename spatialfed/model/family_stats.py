"""Sufficient statistics of SPEC §2b for a MaternFamily: u = (log δ, log σ², κ) of any length q (model/family.py).

The same message as model/stats.py (S_j, d_j, n_j and their first and second u-derivatives, second derivatives
in pairs(q) order), by the same formulas written for every coordinate a:
    R = σ²W̃ + εI;  R_δ = −εI, R_σ = σ²W̃, R_k = σ²W̃_k;  R_δδ = εI, R_σσ = σ²W̃, R_σk = σ²W̃_k, R_kl = σ²W̃_kl,
    E_k = [B_k 0 0], E_kl = [B_kl 0 0] (k, l in κ);
    B = ρ_js ρ_K⁻¹, B_k = (ρ_js,k − Bρ_K,k)ρ_K⁻¹, B_kl = (ρ_js,kl − B_kρ_K,l − B_lρ_K,k − Bρ_K,kl)ρ_K⁻¹,
    Q̃_k = U_kBᵀ + BU_kᵀ with U_k = ρ_js,k − ½Bρ_K,k;  Q̃_kl = U_k,lBᵀ + U_kB_lᵀ + transposes,
    U_k,l = ρ_js,kl − ½B_lρ_K,k − ½Bρ_K,kl;  W̃ = ρ_jj − Q̃ (full), its diagonal (mpp), 0 (pp).
The residual's n_j × n_j derivative arrays are formed densely (q(q+1)/2 + q of them) for the full residual, as
diagonals for mpp and pp. The Vecchia residual (SPEC §2c) runs model/vecchia.py's point-by-point statistics on
FamilyCorrelation, its kernel coordinates κ in place of log β: Ḟ_k, H_k, M_k for each k and H_kl, N_kl for each
pair in the whitened knot basis, R_k and R_kl on each local set (model/vecchia.py's docstring), with no n_j × n_j
array. Its ordering and neighbours are those of model/vecchia_order.py on the coordinates as given (lon/lat
degrees when chordal), fixed for a site whatever κ.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg

from spatialfed.model import vecchia
from spatialfed.model.blocks import _spd_inverse
from spatialfed.model.family import MaternFamily
from spatialfed.model.linalg import cholesky_with_jitter
from spatialfed.model.matern import as_points
from spatialfed.model.names import pairs
from spatialfed.model.residuals import residual_strategy
from spatialfed.model.vecchia_order import VECCHIA_K, vecchia_plan


def _knot_blocks(family: MaternFamily, knots, kappa):
    """(ρ_K with the jitter of KnotBasis, its Cholesky factor, [ρ_K,k], {ρ_K,kl})."""
    rK, dK, d2K = family.derivatives(knots, knots, kappa)
    LK, tau = cholesky_with_jitter(rK, "the knot correlation matrix K")
    return (rK + tau * np.eye(rK.shape[0]) if tau else rK), LK, dK, d2K


def _residual_pieces(family, locs, knots, kappa, residual):
    """B, [B_k], {B_kl}, W̃, [W̃_k], {W̃_kl} (W̃'s dense for full, 1-D diagonals for mpp/pp)."""
    n, K = len(locs), len(family.names)
    rK, LK, dK, d2K = _knot_blocks(family, knots, kappa)
    rjs, djs, d2js = family.derivatives(locs, knots, kappa)

    def right(M):
        return linalg.cho_solve((LK, True), M.T, check_finite=False).T

    B = right(rjs)
    Bk = [right(djs[k] - B @ dK[k]) for k in range(K)]
    Bkl = {(k, l): right(d2js[k, l] - Bk[k] @ dK[l] - Bk[l] @ dK[k] - B @ d2K[k, l]) for k, l in d2K}
    U = [djs[k] - 0.5 * B @ dK[k] for k in range(K)]
    if not residual_strategy(residual).kriges:  # pp
        zero = np.zeros(n)
        return B, Bk, Bkl, zero, [zero] * K, {kl: zero for kl in Bkl}
    if residual_strategy(residual).dense:
        rjj, djj, d2jj = family.derivatives(locs, locs, kappa)

        def sym(A, C):
            P = A @ C.T
            return P + P.T

        W = rjj - B @ rjs.T
        Wk = [djj[k] - sym(U[k], B) for k in range(K)]
        Wkl = {}
        for k, l in Bkl:
            Ukl = d2js[k, l] - 0.5 * Bk[l] @ dK[k] - 0.5 * B @ d2K[k, l]
            Wkl[k, l] = d2jj[k, l] - sym(Ukl, B) - sym(U[k], Bk[l])
        return B, Bk, Bkl, W, Wk, Wkl
    # mpp: the diagonals (ρ_jj = 1 and its derivatives vanish on the diagonal)

    def dsym(A, C):
        return 2.0 * np.einsum("ij,ij->i", A, C)

    W = 1.0 - np.einsum("ij,ij->i", B, rjs)
    Wk = [-dsym(U[k], B) for k in range(K)]
    Wkl = {(k, l): -dsym(d2js[k, l] - 0.5 * Bk[l] @ dK[k] - 0.5 * B @ d2K[k, l], B) - dsym(U[k], Bk[l])
           for k, l in Bkl}
    return B, Bk, Bkl, W, Wk, Wkl


class FamilyCorrelation:
    """ρ of a MaternFamily at κ on a site's points and knots in vecchia.MaternCorrelation's interface (K = dim κ)."""

    def __init__(self, family: MaternFamily, kappa, locs: np.ndarray, knots: np.ndarray):
        self.family, self.kappa, self.locs, self.knots = family, kappa, locs, knots
        self.K = len(family.names)

    def _at(self, a, b, derivatives: bool):
        return (self.family.derivatives if derivatives else self.family.correlation)(a, b, self.kappa)

    def knot_derivatives(self):
        return self._at(self.knots, self.knots, True)

    def cross(self, rows: slice, derivatives: bool):
        return self._at(self.locs[rows], self.knots, derivatives)

    def local(self, idx: np.ndarray, derivatives: bool):
        P = self.locs[idx]  # (b, k+1, 2): one symmetric set per point
        return self._at(P, P, derivatives)


def _scale_direction(q: int, residual: str) -> np.ndarray:
    """c with S(u + sc) = e^{s}S(u) (SPEC §2b): (1, −1, 0, …) unless pp."""
    c = np.zeros(q)
    c[0] = 1.0
    c[1] = residual_strategy(residual).scale_direction[1]
    return c


def family_statistics(locs, z, X, knots, family: MaternFamily, residual: str, u, vecchia_k: int = VECCHIA_K,
                      vecchia_ordering: str = "maxmin") -> dict:
    """S_j, d_j, n_j and their u-derivatives (SPEC §2b) for the family's u = (log δ, log σ², κ); with
    residual="vecchia", of the Vecchia residual on vecchia_k neighbours (SPEC §2c)."""
    u = np.asarray(u, dtype=float)
    q = family.q
    if u.shape != (q,) or not np.all(np.isfinite(u)):
        raise ValueError(f"u must be {q} finite numbers (log δ, log σ², {', '.join(family.names)}), got {u!r}")
    if residual not in ("full", "mpp", "pp", "vecchia"):
        raise ValueError(f"the {family} covariance has the full, mpp, pp and vecchia residuals, not "
                         f"residual={residual!r}")
    locs, z = np.asarray(locs, dtype=float), np.asarray(z, dtype=float)
    X = np.asarray(X, dtype=float).reshape(len(z), -1)
    knots = as_points(knots)
    eps, s2, kappa = float(np.exp(-u[0])), float(np.exp(u[1])), u[2:]
    n, m, p = len(z), len(knots), X.shape[1]
    if residual_strategy(residual).pointwise:
        plan = vecchia_plan(locs, vecchia_k, vecchia_ordering)
        kf = vecchia.KnotFactors.of(FamilyCorrelation(family, kappa, locs, knots), n)
        return {"u": u, "c": _scale_direction(q, residual), "n": int(n), "m": int(m), "p": int(p),
                **vecchia.statistics(X, z, plan, kf, s2, eps)}
    B, Bk, Bkl, W, Wk, Wkl = _residual_pieces(family, locs, knots, kappa, residual)
    dense = residual_strategy(residual).dense
    eye = np.eye(n) if dense else np.ones(n)
    R = s2 * W + (eps * np.eye(n) if dense else eps)
    if dense:
        P = _spd_inverse(R, "the residual covariance R_j")
        logdet = 2.0 * float(np.sum(np.log(np.diag(linalg.cholesky(R, lower=True, check_finite=False)))))
    else:
        P, logdet = 1.0 / R, float(np.sum(np.log(R)))

    def mul(A, C):  # A C for a dense or diagonal A
        return A @ C if dense else A[:, None] * C

    Ra = [-eps * eye, s2 * W] + [s2 * w for w in Wk]
    Rab = {(0, 0): eps * eye, (1, 1): s2 * W}
    for k in range(len(Wk)):
        Rab[(1, k + 2)] = s2 * Wk[k]
    for (k, l), w in Wkl.items():
        Rab[(k + 2, l + 2)] = s2 * w
    k_all = m + p + 1
    Wm = np.hstack([B, X, z[:, None]])
    Y = mul(P, Wm)
    S = Wm.T @ Y

    def pad(block):
        out = np.zeros((n, k_all))
        out[:, :m] = block
        return out

    E = [None, None] + [pad(b) for b in Bk]
    Eab = {(k + 2, l + 2): pad(b) for (k, l), b in Bkl.items()}
    Z = [mul(r, Y) for r in Ra]
    T = [mul(P, z_) for z_ in Z]
    PE = [None if e is None else mul(P, e) for e in E]
    dS = np.empty((q, k_all, k_all))
    for a in range(q):
        H = -Y.T @ Z[a]
        if E[a] is not None:
            H += E[a].T @ Y + Y.T @ E[a]
        dS[a] = 0.5 * (H + H.T)
    PR = [mul(P, r) if dense else P * r for r in Ra]
    dd = np.array([float(np.trace(x)) if dense else float(np.sum(x)) for x in PR])
    pr = pairs(q)
    d2S = np.empty((len(pr), k_all, k_all))
    d2d = np.empty(len(pr))
    for i, (a, b) in enumerate(pr):
        H = Z[a].T @ T[b] + Z[b].T @ T[a]
        if (a, b) in Rab:
            H -= Y.T @ mul(Rab[a, b], Y)
        if (a, b) in Eab:
            H += Eab[a, b].T @ Y + Y.T @ Eab[a, b]
        if E[a] is not None and E[b] is not None:
            H += E[a].T @ PE[b] + E[b].T @ PE[a]
        for x, y in ((a, b), (b, a)):
            if E[x] is not None:
                C = E[x].T @ T[y]
                H -= C + C.T
        d2S[i] = 0.5 * (H + H.T)
        tr_ab = 0.0
        if (a, b) in Rab:
            tr_ab = float(np.sum(P * Rab[a, b])) if dense else float(np.sum(P * Rab[a, b]))
        d2d[i] = tr_ab - (float(np.sum(PR[a] * PR[b].T)) if dense else float(np.sum(PR[a] * PR[b])))
    return {"u": u, "c": _scale_direction(q, residual), "n": int(n), "m": int(m), "p": int(p),
            "S": 0.5 * (S + S.T), "dS": dS, "d2S": d2S,
            "d": logdet, "dd": dd, "d2d": d2d}


class FamilyKnots:
    """K = σ²ρ_K(κ) with its u-derivatives, the server's knot terms for a MaternFamily (KnotCovariance's interface):
    ∂_aK⁻¹ = −K⁻¹K_aK⁻¹, ∂_abK⁻¹ = K⁻¹K_aK⁻¹K_bK⁻¹ + K⁻¹K_bK⁻¹K_aK⁻¹ − K⁻¹K_abK⁻¹,
    ∂_a log det K = tr(K⁻¹K_a), ∂_ab log det K = tr(K⁻¹K_ab) − tr(K⁻¹K_aK⁻¹K_b)."""

    def __init__(self, knots, family: MaternFamily, u):
        u = np.asarray(u, dtype=float)
        s2 = float(np.exp(u[1]))
        rK, LK, dK, d2K = _knot_blocks(family, as_points(knots), u[2:])
        self.q = family.q
        self.K = s2 * rK
        self.logdet = float(np.log(s2) * rK.shape[0] + 2.0 * np.sum(np.log(np.diag(LK))))
        self.Kinv = _spd_inverse(self.K, "K")
        zero = np.zeros_like(rK)
        self.d1 = [zero, self.K] + [s2 * d for d in dK]
        self.d2 = {(1, 1): self.K}
        for k in range(len(dK)):
            self.d2[(1, k + 2)] = s2 * dK[k]
        for (k, l), d in d2K.items():
            self.d2[(k + 2, l + 2)] = s2 * d

    def inverse_derivatives(self):
        """(∂_aK⁻¹ list, ∂_abK⁻¹ nested q×q list, ∂_a log det K, ∂_ab log det K) in u."""
        Ki, q = self.Kinv, self.q
        L = [Ki @ d for d in self.d1]
        dKi = [-x @ Ki for x in L]
        d2Ki = [[None] * q for _ in range(q)]
        dlogdet = np.array([float(np.trace(x)) for x in L])
        d2logdet = np.zeros((q, q))
        for a, b in pairs(q):
            Kab = self.d2.get((a, b))
            Lab = Ki @ Kab if Kab is not None else np.zeros_like(Ki)
            d2Ki[a][b] = d2Ki[b][a] = (L[a] @ L[b] + L[b] @ L[a] - Lab) @ Ki
            d2logdet[a, b] = d2logdet[b, a] = float(np.trace(Lab) - np.sum(L[a] * L[b].T))
        return dKi, d2Ki, dlogdet, d2logdet
