"""The Vecchia residual (SPEC §2c): a site's statistics of SPEC §2b in O(n_j k³ + n_j k(m + p)) time and O(n_j k)
memory beyond its data, with no n_j × n_j matrix.

R = σ²W̃ + εI (ε = 1/δ, W̃ = C̃_jj − Q̃ the unit-variance residual of the `full` structure) is replaced by its Vecchia
approximation in the plan's ordering (model/vecchia_order.py): the point at each position, conditioned on its ≤ k
nearest earlier points N, has a = R_NN⁻¹R_N,i and D = R_ii − R_i,N a, and

    R⁻¹ ≈ (I − A)ᵀ D⁻¹ (I − A),   log det R ≈ Σ log D,   S = Σ e eᵀ / D,   e = W_iᵀ − aᵀW_N   (W = [B X z]).

With k = n_j − 1 this is the Cholesky factorisation of R: the statistics are the full residual's.

Derivatives in u = (log δ, log σ², κ), κ the correlation's K kernel coordinates (log β for the fixed-ν Matérn,
MaternCorrelation; a MaternFamily's (log β [, log ν] [, log r, φ]) through model/family_stats.py), point by point
(C = R_NN, c = R_N,i, r = R_ii; ∂ = ∂/∂u_s, ∂' = ∂/∂u_t):
    ∂a = C⁻¹(∂c − ∂C a),  ∂D = ∂r − 2∂cᵀa + aᵀ∂C a,
    ∂∂'a = C⁻¹(∂∂'c − ∂∂'C a − ∂C ∂'a − ∂'C ∂a),  ∂∂'D = ∂∂'r − 2∂∂'cᵀa + aᵀ∂∂'C a − 2(C∂a)ᵀ∂'a,
    R_δ = −εI, R_σ = σ²W̃, R_k = σ²∂_kW̃;  R_δδ = εI, R_σσ = R_σ, R_σk = R_k, R_kl = σ²∂_kl W̃, R_δσ = R_δk = 0,
and with s = 1/D, s_t = −∂_tD/D², s_st = −∂_stD/D² + 2∂_sD∂_tD/D³:
    ∂_tS = Σ sym(e(s e_t + ½ s_t e)ᵀ),  ∂_stS = Σ sym(e(s e_st + s_s e_t + s_t e_s + ½ s_st e)ᵀ) + sym(s e_s e_tᵀ).
The knot basis is whitened: F = ρ_js L⁻ᵀ (ρ_K = LLᵀ), so Q̃ = FFᵀ and B = F T with T = L⁻¹; with
Ḟ_k = ρ_js,k L⁻ᵀ, F̈_kl = ρ_js,kl L⁻ᵀ, M_k = Tρ_K,kTᵀ, N_kl = ½(M_kM_l + M_lM_k) − ½Tρ_K,klTᵀ,
H_k = Ḟ_k − ½FM_k, H_kl = F̈_kl − Ḟ_kM_l − Ḟ_lM_k + FN_kl (K = 1: H₂ = F̈ − 2ḞM₁ + F(M₁² − ½M₂)):
    ∂_kQ̃ = H_kFᵀ + FH_kᵀ,  ∂_klQ̃ = H_klFᵀ + FH_klᵀ + Ḟ_kḞ_lᵀ + Ḟ_lḞ_kᵀ,  ∂_kB = (H_k − ½FM_k)T,
    ∂_klB = (H_kl + FN_kl)T,
so the statistics are computed for W' = [F X z] with those derivatives and mapped by T at the end. Every local
matrix (the (k+1) × (k+1) R, ∂R, ∂²R of a point and its neighbours) comes from the neighbours' rows of F, Ḟ, H:
O(k²m) per point and coordinate pair. Points are processed in batches of (batch, k+1, k+1) arrays.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg
from scipy.linalg import blas
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist

from spatialfed.model.linalg import cholesky_with_jitter
from spatialfed.model.matern import norm
from spatialfed.model.names import pairs
from spatialfed.model.vecchia_order import VecchiaPlan

#: bytes of the per-batch arrays (the gathered (batch, k+1, m) rows dominate)
BATCH_BYTES = 24 * 2**20
#: rows per chunk when the whitened knot basis is built
ROW_CHUNK = 8192


class MaternCorrelation:
    """A fixed-ν Matérn at β as KnotFactors and the batches ask for ρ (one kernel coordinate, κ = log β): `cross`
    (points × knots), `local` (each batch's local sets) and `knot_derivatives` give ρ, or with derivatives
    (ρ, [∂ρ/∂κ_k], {(k, l): ∂²ρ/∂κ_k∂κ_l}) as MaternFamily.derivatives does (model/family_stats.py)."""

    K = 1

    def __init__(self, kernel, d_K: np.ndarray, locs: np.ndarray, knots: np.ndarray, beta: float):
        self.kernel, self.d_K, self.locs, self.knots, self.beta = kernel, d_K, locs, knots, beta

    def _at(self, d, derivatives: bool):
        if not derivatives:
            return self.kernel.correlation(d, self.beta)
        r, r1, r2 = self.kernel.correlation_derivatives(d, self.beta)
        return r, [r1], {(0, 0): r2}

    def knot_derivatives(self):
        return self._at(self.d_K, True)

    def cross(self, rows: slice, derivatives: bool):
        return self._at(cdist(self.locs[rows], self.knots), derivatives)

    def local(self, idx: np.ndarray, derivatives: bool):
        return self._at(_pairwise(self.locs[idx]), derivatives)


class KnotFactors:
    """The whitened knot basis F (n × m) and T = L⁻¹ of a correlation `corr` (MaternCorrelation's interface), and
    with `derivatives`, for each kernel coordinate k, Ḟ_k, H_k, M_k and for each pair k ≤ l, H_kl, N_kl (module
    docstring).

    With derivatives, F, H_k and H_kl (pairs(K) order) are stored row by row together (FH, n × (1 + K + K(K+1)/2)
    × m; F a view), so that one gather and one product per batch give Q̃ and the factors of its derivatives; Ḟ is
    Fd, n × K × m."""

    def __init__(self, kernel, d_K: np.ndarray, locs: np.ndarray, knots: np.ndarray, beta: float,
                 derivatives: bool = True):
        """The factors of the fixed-ν Matérn `kernel` at β."""
        self._build(MaternCorrelation(kernel, d_K, locs, knots, beta), locs.shape[0], derivatives)

    @classmethod
    def of(cls, corr, n: int, derivatives: bool = True) -> "KnotFactors":
        """The factors of any correlation with MaternCorrelation's interface on its n points."""
        kf = cls.__new__(cls)
        kf._build(corr, n, derivatives)
        return kf

    def _build(self, corr, n: int, derivatives: bool):
        self.corr, self.K, self.pairs = corr, corr.K, pairs(corr.K)
        rK, dK, d2K = corr.knot_derivatives()
        LK, jitter = cholesky_with_jitter(rK, "the knot correlation matrix K")
        m = rK.shape[0]
        T = linalg.solve_triangular(LK, np.eye(m), lower=True, check_finite=False) if m else np.zeros((0, 0))
        self.T = T
        self.M = [T @ d @ T.T for d in dK]
        self.N = {(k, l): (self.M[k] @ self.M[k] if k == l else 0.5 * (self.M[k] @ self.M[l] + self.M[l] @ self.M[k]))
                  - 0.5 * (T @ d2K[k, l] @ T.T) for k, l in self.pairs}
        K = self.K
        self.FH = self.Fd = None
        if derivatives:
            self.FH, self.Fd = np.empty((n, 1 + K + len(self.pairs), m)), np.empty((n, K, m))
            self.F = self.FH[:, 0]
        else:
            self.F = np.empty((n, m))
        for r0 in range(0, n, ROW_CHUNK):
            rows = slice(r0, min(r0 + ROW_CHUNK, n))
            if not derivatives:
                self.F[rows] = corr.cross(rows, False) @ T.T
                continue
            r, r1, r2 = corr.cross(rows, True)
            F, Fd = r @ T.T, [d @ T.T for d in r1]
            self.F[rows] = F
            for k in range(K):
                self.Fd[rows, k] = Fd[k]
                self.FH[rows, 1 + k] = Fd[k] - 0.5 * F @ self.M[k]
            for i, (k, l) in enumerate(self.pairs):
                mixed = 2.0 * Fd[k] @ self.M[k] if k == l else Fd[k] @ self.M[l] + Fd[l] @ self.M[k]
                self.FH[rows, 1 + K + i] = r2[k, l] @ T.T - mixed + F @ self.N[k, l]


def _batches(n: int, k: int, m: int, q: int, rows: int = 4, terms: int = 10):
    """Consecutive position blocks whose per-batch arrays stay near BATCH_BYTES (≥ 16 positions each): `rows`
    gathered m-vectors per point (F, Ḟ, the H's), `terms` coefficient rows (α and its u-derivatives)."""
    per_point = 8 * (k + 1) * (rows * m + q + 3 * (k + 1)) + 8 * 3 * terms * q
    size = max(16, BATCH_BYTES // per_point)
    for s in range(0, n, size):
        yield np.arange(s, min(s + size, n))


def _sets(plan: VecchiaPlan, pos: np.ndarray):
    """(idx, valid) of a batch: idx (b, k+1) point indices [neighbours..., the point] (padded slots hold the point
    itself), valid (b, k+1) which slots are real."""
    i = plan.order[pos]
    nb = plan.nbrs[pos]
    valid = np.concatenate([nb >= 0, np.ones((len(pos), 1), dtype=bool)], axis=1)
    idx = np.concatenate([np.where(nb >= 0, nb, i[:, None]), i[:, None]], axis=1)
    return idx, valid


def _pairwise(P: np.ndarray) -> np.ndarray:
    """(b, k, k) distances among each row's points P (b, k, 2; or 3 Earth-centred), per coordinate (a sum over a
    short axis is several times slower)."""
    out = np.zeros(P.shape[:2] + P.shape[1:2])
    for a in range(P.shape[-1]):
        c = P[..., a]
        d = c[:, :, None] - c[:, None, :]
        d *= d
        out += d
    return np.sqrt(out, out=out)


def _bt(A: np.ndarray) -> np.ndarray:
    return A.transpose(0, 2, 1)


def _local(kf: KnotFactors, idx, valid, sigma2: float, eps: float, derivatives: bool):
    """R on the batch's local sets (b, k+1, k+1), padded slots identity; with `derivatives` also the list dR
    [R_δ, R_σ, R_κ₁, …] and the dict d2R {(k, l): R_κkκl} (padded slots zero) and the gathered rows G (b, k+1, ·, m)
    of kf.FH; without, the gathered F_L."""
    padded = not valid.all()  # only the first k positions have fewer than k earlier points
    mask = (valid[:, :, None] & valid[:, None, :]).astype(float) if padded else 1.0
    b, k1 = idx.shape
    if derivatives:
        rho, rho1, rho2 = kf.corr.local(idx, True)
        G = np.take(kf.FH, idx, axis=0)  # (b, k+1, 1 + K + K(K+1)/2, m): F, H_k, H_kl rows
        FL = G[:, :, 0]
        P = (G.reshape(b, -1, G.shape[3]) @ _bt(FL)).reshape(b, k1, G.shape[2], k1)  # [F; H_k; H_kl]_L F_Lᵀ
        Q = P[:, :, 0]
    else:
        rho = kf.corr.local(idx, False)
        FL = np.take(kf.F, idx, axis=0)
        Q = FL @ _bt(FL)
    rho -= Q
    rho *= sigma2
    Rs = rho * mask if padded else rho  # R_σ = σ²W̃
    eye = np.eye(k1)[None] * valid[:, :, None] if padded else np.eye(k1)[None]  # identity on the real slots
    R = Rs + eps * eye
    if padded:
        R += np.eye(k1)[None] * (~valid)[:, :, None]
    if not derivatives:
        return R, None, None, FL
    FdL = np.take(kf.Fd, idx, axis=0)  # (b, k+1, K, m)
    dR = [-eps * eye, Rs]
    for k in range(kf.K):  # σ²(ρ_k − H_kFᵀ − FH_kᵀ)
        Qk = P[:, :, 1 + k]
        r = rho1[k]
        r -= Qk
        r -= _bt(Qk)
        r *= sigma2 * mask
        dR.append(r)
    d2R = {}
    for i, (k, l) in enumerate(kf.pairs):  # σ²(ρ_kl − H_klFᵀ − FH_klᵀ − Ḟ_kḞ_lᵀ − Ḟ_lḞ_kᵀ)
        Qkl = P[:, :, 1 + kf.K + i]
        r = rho2[k, l]
        r -= Qkl
        r -= _bt(Qkl)
        if k == l:
            r -= 2.0 * FdL[:, :, k] @ _bt(FdL[:, :, k])
        else:
            Y = FdL[:, :, k] @ _bt(FdL[:, :, l])
            r -= Y
            r -= _bt(Y)
        r *= sigma2 * mask
        d2R[k, l] = r
    return R, dR, d2R, G


def _mv(A, x):
    """Batched matrix-vector products A_b x_b."""
    return (A @ x[..., None])[..., 0]


def _dot(x, y):
    """Batched inner products x_b · y_b."""
    return (x[:, None, :] @ y[:, :, None])[:, 0, 0]


def _conditionals(R, dR, d2R):
    """a (b, k), D (b,) and, with dR, their u-derivatives da (b, k, q), dD (b, q), d2a (b, k, P), d2D (b, P)
    (q = len(dR), P = q(q+1)/2 pairs in pairs(q) order).

    dR = [R_δ, R_σ, R_κ…] and d2R {(k, l): R_κkκl} as `_local` returns them; the other second derivatives are first
    ones, R_δδ = −R_δ, R_σσ = R_σ, R_σκ = R_κ (so their products with a are the first derivatives'), or zero,
    R_δσ = R_δκ = 0."""
    k = R.shape[1] - 1
    C, c, r = R[:, :k, :k], R[:, :k, k], R[:, k, k]
    try:
        if dR is None:
            a = np.linalg.solve(C, c[:, :, None])[:, :, 0]
        else:  # one inverse serves every right-hand side
            Ci = np.linalg.inv(C)
            a = _mv(Ci, c)
    except np.linalg.LinAlgError:
        _check_positive(np.zeros(1))
    D = r - _dot(c, a)
    if dR is None:
        return a, D, None, None, None, None
    q = len(dR)
    G = np.empty((len(a), q) + R.shape[1:])  # (b, q, k+1, k+1)
    for t in range(q):
        G[:, t] = dR[t]
    dC, dc, dr = G[:, :, :k, :k], G[:, :, :k, k], G[:, :, k, k]
    dCa = (dC @ a[:, None, :, None])[..., 0]
    rhs = dc - dCa  # C ∂_t a
    da = Ci @ rhs.transpose(0, 2, 1)  # (b, k, q)
    dD = dr - ((dc + rhs) @ a[:, :, None])[..., 0]  # ∂r − 2∂cᵀa + aᵀ∂C a
    cross = dC @ da[:, None]  # [b, s, :, t] = ∂_sC ∂_t a
    rda = rhs @ da  # [b, s, t] = (C ∂_s a)ᵀ ∂_t a
    pr = pairs(q)
    # ∂_st c − ∂_st C a for each pair: (δδ) −(∂_δ c − ∂_δ C a), (σσ) C∂_σa, (σκ) C∂_κa, (κκ') from R_κκ', else 0
    second = {pr.index((0, 0)): -rhs[:, 0], pr.index((1, 1)): rhs[:, 1]}
    second_D = {pr.index((0, 0)): -dD[:, 0], pr.index((1, 1)): dD[:, 1]}
    for t in range(2, q):
        second[pr.index((1, t))], second_D[pr.index((1, t))] = rhs[:, t], dD[:, t]
    for (s_, t), Gst in d2R.items():
        p = pr.index((s_ + 2, t + 2))
        stC, stc = Gst[:, :k, :k], Gst[:, :k, k]
        stCa = _mv(stC, a)
        second[p], second_D[p] = stc - stCa, Gst[:, k, k] - _dot(2.0 * stc - stCa, a)
    rhs2, d2D = np.empty((len(a), k, len(pr))), np.empty((len(a), len(pr)))
    for p, (s_, t) in enumerate(pr):
        rhs2[:, :, p] = -cross[:, s_, :, t] - cross[:, t, :, s_]
        d2D[:, p] = -2.0 * rda[:, s_, t]
        if p in second:
            rhs2[:, :, p] += second[p]
            d2D[:, p] += second_D[p]
    d2a = Ci @ rhs2
    return a, D, da, dD, d2a, d2D


def _check_positive(D: np.ndarray, n: int | None = None) -> None:
    if not np.all(D > 0):
        raise np.linalg.LinAlgError("the Vecchia residual of worker data has a singular or non-positive conditional "
                                    "variance: the residual covariance is numerically singular for these parameters "
                                    "(check for duplicate locations, or use a larger nugget or residual='full')")


def _data(X, z, idx, FL):
    """W'_L = [F X z] on the local sets (b, k+1, m+p+1)."""
    return np.concatenate([FL, np.take(X, idx, axis=0), np.take(z, idx)[:, :, None]], axis=2)


def whitened(X, z, plan: VecchiaPlan, kf: KnotFactors, sigma2: float, eps: float):
    """(log det R, D^{-1/2}(I − A)[B X z]) of the Vecchia residual: the whitened data of the mu_sigma, gamma and
    value sub-steps (rows in Vecchia order), O(n_j(k³ + k(m + p)))."""
    n, m = len(z), kf.T.shape[0]
    out = np.empty((n, m + X.shape[1] + 1))
    logdet = 0.0
    for pos in _batches(n, plan.k, m, out.shape[1]):
        idx, valid = _sets(plan, pos)
        R, _, _, FL = _local(kf, idx, valid, sigma2, eps, derivatives=False)
        a, D, *_ = _conditionals(R, None, None)
        _check_positive(D, n)
        alpha = np.concatenate([-a, np.ones((len(pos), 1))], axis=1)
        e = np.einsum("bk,bkq->bq", alpha, _data(X, z, idx, FL))
        e[:, :m] = e[:, :m] @ kf.T
        out[pos] = e / np.sqrt(D)[:, None]
        logdet += float(np.sum(np.log(D)))
    return logdet, out


def statistics(X, z, plan: VecchiaPlan, kf: KnotFactors, sigma2: float, eps: float) -> dict:
    """S, ∂S, ∂²S, d = log det R, ∂d, ∂²d of SPEC §2b for the Vecchia residual, u = (log δ, log σ², κ) with κ the
    kf.K kernel coordinates (module docstring); second derivatives in pairs(q) order."""
    n, m = len(z), kf.T.shape[0]
    q = m + X.shape[1] + 1
    qu = 2 + kf.K
    pr = pairs(qu)
    terms = 1 + qu + len(pr)  # rows e, e_t, e_st
    big = np.zeros((q, terms * q))
    cross = np.zeros((qu * q, qu * q), order="F")
    d, dd, d2d = 0.0, np.zeros(qu), np.zeros(len(pr))
    for pos in _batches(n, plan.k, m, q, kf.FH.shape[1] + kf.K, terms):
        b = len(pos)
        idx, valid = _sets(plan, pos)
        R, dR, d2R, G = _local(kf, idx, valid, sigma2, eps, derivatives=True)
        a, D, da, dD, d2a, d2D = _conditionals(R, dR, d2R)
        _check_positive(D, n)
        # coefficients over the local set: α = (−a, 1), ∂α = (−∂a, 0), ∂∂'α = (−∂∂'a, 0); rows [α, ∂_t α, ∂_st α]
        alpha = np.zeros((b, terms, idx.shape[1]))
        alpha[:, 0, :-1], alpha[:, 0, -1] = -a, 1.0
        alpha[:, 1:1 + qu, :-1] = -_bt(da)
        alpha[:, 1 + qu:, :-1] = -_bt(d2a)
        E = alpha @ _data(X, z, idx, G[:, :, 0])  # (b, terms, q): e, e_t, e_st without the ∂W terms
        AF = E[:, :1 + qu, :m].copy()  # [α, ∂α] F_L
        dW = [alpha[:, :1 + qu] @ G[:, :, 1 + k] - 0.5 * AF @ kf.M[k]  # [α, ∂α] ∂_kW_L (B columns, whitened)
              for k in range(kf.K)]
        for k in range(kf.K):
            E[:, 3 + k, :m] += dW[k][:, 0]
        for p, (s_, t) in enumerate(pr):  # + ∂_sα ∂_tW + ∂_tα ∂_sW + α ∂_stW (∂W zero along log δ, log σ²)
            if t < 2:
                continue
            if s_ < 2:
                E[:, 1 + qu + p, :m] += dW[t - 2][:, 1 + s_]
                continue
            k, l = s_ - 2, t - 2
            both = 2.0 * dW[k][:, 1 + t] if k == l else dW[l][:, 1 + s_] + dW[k][:, 1 + t]
            Hkl = G[:, :, 1 + kf.K + kf.pairs.index((k, l))]
            E[:, 1 + qu + p, :m] += both + np.einsum("bk,bkm->bm", alpha[:, 0], Hkl) + AF[:, 0] @ kf.N[k, l]
        s = 1.0 / D
        st = -dD * s[:, None] ** 2
        sst = np.stack([-d2D[:, p] * s**2 + 2.0 * dD[:, u] * dD[:, v] * s**3 for p, (u, v) in enumerate(pr)], 1)
        e = E[:, 0]
        right = np.empty_like(E)
        right[:, 0] = s[:, None] * e
        right[:, 1:1 + qu] = s[:, None, None] * E[:, 1:1 + qu] + 0.5 * st[:, :, None] * e[:, None]
        for p, (u, v) in enumerate(pr):
            right[:, 1 + qu + p] = (s[:, None] * E[:, 1 + qu + p] + st[:, u, None] * E[:, 1 + v]
                                    + st[:, v, None] * E[:, 1 + u] + 0.5 * sst[:, p, None] * e)
        big += e.T @ right.reshape(b, terms * q)
        Et = E[:, 1:1 + qu].reshape(b, qu * q) * np.sqrt(s)[:, None]
        cross = blas.dsyrk(1.0, Et, beta=1.0, c=cross, trans=1, overwrite_c=1)  # upper triangle of Σ s e_s e_tᵀ
        d += float(np.sum(np.log(D)))
        dd += dD.T @ s
        d2d += (d2D * s[:, None]).sum(0) - np.stack([dD[:, u] * dD[:, v] for u, v in pr], 1).T @ s**2
    big = big.reshape(q, terms, q).transpose(1, 0, 2)
    cross = np.triu(cross) + np.triu(cross, 1).T
    Tb = np.eye(q)
    Tb[:m, :m] = kf.T

    def basis(A):  # whitened knot basis → B basis: Tbᵀ A Tb
        return Tb.T @ A @ Tb

    def sym(A):
        return A + A.T

    S = basis(0.5 * sym(big[0]))
    dS = np.stack([basis(sym(big[1 + t])) for t in range(qu)])
    d2S = np.stack([basis(sym(big[1 + qu + p]) + sym(cross[u * q:(u + 1) * q, v * q:(v + 1) * q]))
                    for p, (u, v) in enumerate(pr)])
    d2S = 0.5 * (d2S + d2S.transpose(0, 2, 1))
    return {"S": S, "dS": dS, "d2S": d2S, "d": d, "dd": dd, "d2d": d2d}


# --- prediction: a location's residual conditioned on its k nearest points of the site -------------------------
def kriging(lm, locs0: np.ndarray, params, k: int, tree: cKDTree) -> dict:
    """mean = k̃_N R_NN⁻¹ r_N, BRk = (R_NN⁻¹k̃_N)ᵀB_N, kRk = k̃_N R_NN⁻¹ k̃_Nᵀ with N the k nearest points of the site
    (r = z − Xγ − Bμ, k̃ = cov(w̃(s₀), w̃_N)): LocalModel.residual_kriging's pieces, O(n₀(k³ + km))."""
    sigma2, beta, eps = params.sigma2, params.beta, 1.0 / params.delta
    k = max(1, min(int(k), lm.n))
    n0, m = locs0.shape[0], lm.m
    out = {"mean": np.empty(n0), "BRk": np.empty((n0, m)), "kRk": np.empty(n0)}
    rK = lm.kernel.correlation(lm.d_K, beta)
    LK, _ = cholesky_with_jitter(rK, "the knot correlation matrix K")
    T = linalg.solve_triangular(LK, np.eye(m), lower=True, check_finite=False) if m else np.zeros((0, 0))
    Tmu = T @ params.mu
    step = max(16, BATCH_BYTES // (8 * (k + 1) * (m + k + 4)))
    for r0 in range(0, n0, step):
        rows = slice(r0, min(r0 + step, n0))
        _, nb = tree.query(locs0[rows], k=k)
        nb = np.asarray(nb).reshape(-1, k)
        P = lm.locs[nb]  # (b, k, 2)
        used, slot = np.unique(nb, return_inverse=True)  # nearby locations share most of their neighbours
        FN = (lm.kernel.correlation(cdist(lm.locs[used], lm.knots), beta) @ T.T)[slot.reshape(nb.shape)]
        f0 = lm.kernel.correlation(cdist(locs0[rows], lm.knots), beta) @ T.T
        RNN = sigma2 * (lm.kernel.correlation(_pairwise(P), beta) - FN @ _bt(FN)) + eps * np.eye(k)
        d0 = norm(P - locs0[rows, None, :])
        kt = sigma2 * (lm.kernel.correlation(d0, beta) - np.einsum("bkm,bm->bk", FN, f0))
        v = np.linalg.solve(RNN, kt[:, :, None])[:, :, 0]
        resid = lm.z[nb] - lm.X[nb] @ params.gamma - FN @ Tmu
        out["mean"][rows] = _dot(v, resid)
        out["BRk"][rows] = np.einsum("bk,bkm->bm", v, FN) @ T
        out["kRk"][rows] = _dot(v, kt)
    return out
