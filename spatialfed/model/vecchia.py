"""The Vecchia residual (SPEC §2c): a site's statistics of SPEC §2b in O(n_j k³ + n_j k(m + p)) time and O(n_j k)
memory beyond its data, with no n_j × n_j matrix.

R = σ²W̃ + εI (ε = 1/δ, W̃ = C̃_jj − Q̃ the unit-variance residual of the `full` structure) is replaced by its Vecchia
approximation in the plan's ordering (model/vecchia_order.py): the point at each position, conditioned on its ≤ k
nearest earlier points N, has a = R_NN⁻¹R_N,i and D = R_ii − R_i,N a, and

    R⁻¹ ≈ (I − A)ᵀ D⁻¹ (I − A),   log det R ≈ Σ log D,   S = Σ e eᵀ / D,   e = W_iᵀ − aᵀW_N   (W = [B X z]).

With k = n_j − 1 this is the Cholesky factorisation of R: the statistics are the full residual's.

Derivatives in u = (log δ, log σ², log β), point by point (C = R_NN, c = R_N,i, r = R_ii; ∂ = ∂/∂u_s, ∂' = ∂/∂u_t):
    ∂a = C⁻¹(∂c − ∂C a),  ∂D = ∂r − 2∂cᵀa + aᵀ∂C a,
    ∂∂'a = C⁻¹(∂∂'c − ∂∂'C a − ∂C ∂'a − ∂'C ∂a),  ∂∂'D = ∂∂'r − 2∂∂'cᵀa + aᵀ∂∂'C a − 2(C∂a)ᵀ∂'a,
    R_δ = −εI, R_σ = σ²W̃, R_β = σ²∂W̃;  R_δδ = εI, R_σσ = R_σ, R_σβ = R_β, R_ββ = σ²∂²W̃, R_δσ = R_δβ = 0,
and with s = 1/D, s_t = −∂_tD/D², s_st = −∂_stD/D² + 2∂_sD∂_tD/D³:
    ∂_tS = Σ sym(e(s e_t + ½ s_t e)ᵀ),  ∂_stS = Σ sym(e(s e_st + s_s e_t + s_t e_s + ½ s_st e)ᵀ) + sym(s e_s e_tᵀ).
The knot basis is whitened: F = ρ_js L⁻ᵀ (ρ_K = LLᵀ), so Q̃ = FFᵀ and B = F T with T = L⁻¹; with
M₁ = L⁻¹ρ̇_K L⁻ᵀ, M₂ = L⁻¹ρ̈_K L⁻ᵀ, H₁ = Ḟ − ½FM₁, H₂ = F̈ − 2ḞM₁ + F(M₁² − ½M₂) (Ḟ = ρ̇_js L⁻ᵀ, F̈ = ρ̈_js L⁻ᵀ):
    ∂Q̃ = H₁Fᵀ + FH₁ᵀ,  ∂²Q̃ = H₂Fᵀ + FH₂ᵀ + 2ḞḞᵀ,  ∂B = (H₁ − ½FM₁)T,  ∂²B = (H₂ + F(M₁² − ½M₂))T,
so the statistics are computed for W' = [F X z] with those derivatives and mapped by T at the end. Every local
matrix (the (k+1) × (k+1) R, ∂R, ∂²R of a point and its neighbours) comes from the neighbours' rows of F, Ḟ, H₁, H₂:
O(k²m) per point. Points are processed in batches of (batch, k+1, k+1) arrays.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg
from scipy.linalg import blas
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist

from spatialfed.model.linalg import cholesky_with_jitter
from spatialfed.model.names import PAIRS
from spatialfed.model.vecchia_order import VecchiaPlan

#: bytes of the per-batch arrays (the gathered (batch, k+1, m) rows dominate)
BATCH_BYTES = 24 * 2**20
#: rows per chunk when the whitened knot basis is built
ROW_CHUNK = 8192


class KnotFactors:
    """The whitened knot basis at β: F (n × m), and with `derivatives` Ḟ, H₁, H₂; T = L⁻¹, M₁, M₂ (m × m).

    With derivatives, F, H₁ and H₂ are stored row by row together (FH, n × 3 × m; F, H1, H2 are views), so that one
    gather and one product per batch give Q̃ and the two factors of its derivatives."""

    def __init__(self, kernel, d_K: np.ndarray, locs: np.ndarray, knots: np.ndarray, beta: float,
                 derivatives: bool = True):
        rK, rK1, rK2 = kernel.correlation_derivatives(d_K, beta)
        LK, jitter = cholesky_with_jitter(rK, "the knot correlation matrix K")
        m = rK.shape[0]
        self.T = linalg.solve_triangular(LK, np.eye(m), lower=True, check_finite=False) if m else np.zeros((0, 0))
        self.M1 = self.T @ rK1 @ self.T.T
        self.M2 = self.T @ rK2 @ self.T.T
        self.M12 = self.M1 @ self.M1 - 0.5 * self.M2
        n = locs.shape[0]
        self.FH = self.Fd = self.H1 = self.H2 = None
        if derivatives:
            self.FH, self.Fd = np.empty((n, 3, m)), np.empty((n, m))
            self.F, self.H1, self.H2 = self.FH[:, 0], self.FH[:, 1], self.FH[:, 2]
        else:
            self.F = np.empty((n, m))
        for r0 in range(0, n, ROW_CHUNK):
            rows = slice(r0, min(r0 + ROW_CHUNK, n))
            d = cdist(locs[rows], knots)
            if not derivatives:
                self.F[rows] = kernel.correlation(d, beta) @ self.T.T
                continue
            r, r1, r2 = kernel.correlation_derivatives(d, beta)
            F, Fd = r @ self.T.T, r1 @ self.T.T
            self.F[rows], self.Fd[rows] = F, Fd
            self.H1[rows] = Fd - 0.5 * F @ self.M1
            self.H2[rows] = r2 @ self.T.T - 2.0 * Fd @ self.M1 + F @ self.M12


def _batches(n: int, k: int, m: int, q: int):
    """Consecutive position blocks whose per-batch arrays stay near BATCH_BYTES (≥ 16 positions each)."""
    per_point = 8 * (k + 1) * (4 * m + q + 3 * (k + 1)) + 8 * 30 * q
    size = max(16, BATCH_BYTES // per_point)
    for s in range(0, n, size):
        yield np.arange(s, min(s + size, n))


def _geometry(locs: np.ndarray, plan: VecchiaPlan, pos: np.ndarray):
    """(idx, valid, dist) of a batch: idx (b, k+1) point indices [neighbours..., the point] (padded slots hold the
    point itself), valid (b, k+1) which slots are real, dist (b, k+1, k+1) distances among them."""
    i = plan.order[pos]
    nb = plan.nbrs[pos]
    valid = np.concatenate([nb >= 0, np.ones((len(pos), 1), dtype=bool)], axis=1)
    idx = np.concatenate([np.where(nb >= 0, nb, i[:, None]), i[:, None]], axis=1)
    return idx, valid, _pairwise(locs[idx])


def _pairwise(P: np.ndarray) -> np.ndarray:
    """(b, k, k) distances among each row's points P (b, k, 2), per coordinate (a sum over a length-2 axis is
    several times slower)."""
    x, y = P[..., 0], P[..., 1]
    dx, dy = x[:, :, None] - x[:, None, :], y[:, :, None] - y[:, None, :]
    dx *= dx
    dy *= dy
    dx += dy
    return np.sqrt(dx, out=dx)


def _bt(A: np.ndarray) -> np.ndarray:
    return A.transpose(0, 2, 1)


def _local(kernel, kf: KnotFactors, idx, valid, dist, beta: float, sigma2: float, eps: float, derivatives: bool):
    """R on the batch's local sets (b, k+1, k+1), padded slots identity; with `derivatives` also the lists dR (3)
    and d2R (6, PAIRS order) of u-derivatives (None where zero), padded slots zero; and the gathered rows
    (F_L, H₁_L, H₂_L)."""
    padded = not valid.all()  # only the first k positions have fewer than k earlier points
    mask = (valid[:, :, None] & valid[:, None, :]).astype(float) if padded else 1.0
    b, k1 = idx.shape
    if derivatives:
        rho, rho1, rho2 = kernel.correlation_derivatives(dist, beta)
        G = np.take(kf.FH, idx, axis=0)  # (b, k+1, 3, m): F, H₁, H₂ rows
        FL, H1L, H2L = G[:, :, 0], G[:, :, 1], G[:, :, 2]
        P = (G.reshape(b, 3 * k1, -1) @ _bt(FL)).reshape(b, k1, 3, k1)  # [F; H₁; H₂]_L F_Lᵀ
        Q, Q1, Q2 = P[:, :, 0], P[:, :, 1], P[:, :, 2]
    else:
        rho = kernel.correlation(dist, beta)
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
    FdL = np.take(kf.Fd, idx, axis=0)
    rho1 -= Q1
    rho1 -= _bt(Q1)
    rho1 *= sigma2 * mask
    rho2 -= Q2
    rho2 -= _bt(Q2)
    rho2 -= 2.0 * FdL @ _bt(FdL)
    rho2 *= sigma2 * mask
    dR = [-eps * eye, Rs, rho1]
    d2R = [eps * eye, None, None, Rs, rho1, rho2]
    return R, dR, d2R, (FL, H1L, H2L)


def _mv(A, x):
    """Batched matrix-vector products A_b x_b."""
    return (A @ x[..., None])[..., 0]


def _dot(x, y):
    """Batched inner products x_b · y_b."""
    return (x[:, None, :] @ y[:, :, None])[:, 0, 0]


def _conditionals(R, dR, d2R):
    """a (b, k), D (b,) and, with dR, their u-derivatives da (b, k, 3), dD (b, 3), d2a (b, k, 6), d2D (b, 6).

    dR = [R_δ, R_σ, R_β] and d2R (PAIRS order) as `_local` returns them: R_δδ = −R_δ, R_σσ = R_σ, R_σβ = R_β (so
    their products with a are the first derivatives'), R_δσ = R_δβ = 0 and R_ββ."""
    k = R.shape[1] - 1
    C, c, r = R[:, :k, :k], R[:, :k, k], R[:, k, k]
    try:
        if dR is None:
            a = np.linalg.solve(C, c[:, :, None])[:, :, 0]
        else:  # one inverse serves the ten right-hand sides
            Ci = np.linalg.inv(C)
            a = _mv(Ci, c)
    except np.linalg.LinAlgError:
        _check_positive(np.zeros(1))
    D = r - _dot(c, a)
    if dR is None:
        return a, D, None, None, None, None
    G = np.empty((len(a), 3) + R.shape[1:])  # (b, 3, k+1, k+1)
    for t in range(3):
        G[:, t] = dR[t]
    dC, dc, dr = G[:, :, :k, :k], G[:, :, :k, k], G[:, :, k, k]
    dCa = (dC @ a[:, None, :, None])[..., 0]
    rhs = dc - dCa  # C ∂_t a
    da = Ci @ rhs.transpose(0, 2, 1)  # (b, k, 3)
    dD = dr - ((dc + rhs) @ a[:, :, None])[..., 0]  # ∂r − 2∂cᵀa + aᵀ∂C a
    cross = dC @ da[:, None]  # [b, s, :, t] = ∂_sC ∂_t a
    rda = rhs @ da  # [b, s, t] = (C ∂_s a)ᵀ ∂_t a
    Gbb = d2R[5]
    bbC, bbc = Gbb[:, :k, :k], Gbb[:, :k, k]
    bbCa = _mv(bbC, a)
    # ∂_st c − ∂_st C a for each pair: (δδ) −(∂_δ c − ∂_δ C a), (σσ) C∂_σa, (σβ) C∂_βa, (ββ) from R_ββ, else 0
    second = {0: -rhs[:, 0], 3: rhs[:, 1], 4: rhs[:, 2], 5: bbc - bbCa}
    second_D = {0: -dD[:, 0], 3: dD[:, 1], 4: dD[:, 2], 5: Gbb[:, k, k] - _dot(2.0 * bbc - bbCa, a)}
    rhs2, d2D = np.empty((len(a), k, 6)), np.empty((len(a), 6))
    for p, (s_, t) in enumerate(PAIRS):
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


def _data(lm, idx, FL):
    """W'_L = [F X z] on the local sets (b, k+1, m+p+1)."""
    return np.concatenate([FL, np.take(lm.X, idx, axis=0), np.take(lm.z, idx)[:, :, None]], axis=2)


def whitened(lm, plan: VecchiaPlan, kf: KnotFactors, sigma2: float, eps: float, beta: float):
    """(log det R, D^{-1/2}(I − A)[B X z]) of the Vecchia residual: the whitened data of the mu_sigma, gamma and
    value sub-steps (rows in Vecchia order), O(n_j(k³ + k(m + p)))."""
    n, m = lm.n, lm.m
    out = np.empty((n, m + lm.p + 1))
    logdet = 0.0
    for pos in _batches(n, plan.k, m, out.shape[1]):
        idx, valid, dist = _geometry(lm.locs, plan, pos)
        R, _, _, FL = _local(lm.kernel, kf, idx, valid, dist, beta, sigma2, eps, derivatives=False)
        a, D, *_ = _conditionals(R, None, None)
        _check_positive(D, n)
        alpha = np.concatenate([-a, np.ones((len(pos), 1))], axis=1)
        e = np.einsum("bk,bkq->bq", alpha, _data(lm, idx, FL))
        e[:, :m] = e[:, :m] @ kf.T
        out[pos] = e / np.sqrt(D)[:, None]
        logdet += float(np.sum(np.log(D)))
    return logdet, out


def statistics(lm, plan: VecchiaPlan, kf: KnotFactors, sigma2: float, eps: float, beta: float) -> dict:
    """S, ∂S, ∂²S, d = log det R, ∂d, ∂²d of SPEC §2b for the Vecchia residual (module docstring)."""
    n, m = lm.n, lm.m
    q = m + lm.p + 1
    big = np.zeros((q, 10 * q))
    cross = np.zeros((3 * q, 3 * q), order="F")
    d, dd, d2d = 0.0, np.zeros(3), np.zeros(6)
    for pos in _batches(n, plan.k, m, q):
        b = len(pos)
        idx, valid, dist = _geometry(lm.locs, plan, pos)
        R, dR, d2R, (FL, H1L, H2L) = _local(lm.kernel, kf, idx, valid, dist, beta, sigma2, eps, derivatives=True)
        a, D, da, dD, d2a, d2D = _conditionals(R, dR, d2R)
        _check_positive(D, n)
        # coefficients over the local set: α = (−a, 1), ∂α = (−∂a, 0), ∂∂'α = (−∂∂'a, 0); rows [α, ∂_t α, ∂_st α]
        alpha = np.zeros((b, 10, idx.shape[1]))
        alpha[:, 0, :-1], alpha[:, 0, -1] = -a, 1.0
        alpha[:, 1:4, :-1] = -_bt(da)
        alpha[:, 4:, :-1] = -_bt(d2a)
        E = alpha @ _data(lm, idx, FL)  # (b, 10, q): e, e_t, e_st without the ∂W terms
        AF = E[:, :4, :m].copy()  # [α, ∂α] F_L
        G1 = alpha[:, :4] @ H1L - 0.5 * AF @ kf.M1  # [α, ∂α] ∂W_L (B columns, whitened basis)
        E[:, 3, :m] += G1[:, 0]
        E[:, 4 + PAIRS.index((0, 2)), :m] += G1[:, 1]
        E[:, 4 + PAIRS.index((1, 2)), :m] += G1[:, 2]
        E[:, 4 + PAIRS.index((2, 2)), :m] += (2.0 * G1[:, 3] + np.einsum("bk,bkm->bm", alpha[:, 0], H2L)
                                              + AF[:, 0] @ kf.M12)  # 2∂_βα ∂W + α ∂²W
        s = 1.0 / D
        st = -dD * s[:, None] ** 2
        sst = np.stack([-d2D[:, p] * s**2 + 2.0 * dD[:, u] * dD[:, v] * s**3 for p, (u, v) in enumerate(PAIRS)], 1)
        e = E[:, 0]
        right = np.empty_like(E)
        right[:, 0] = s[:, None] * e
        right[:, 1:4] = s[:, None, None] * E[:, 1:4] + 0.5 * st[:, :, None] * e[:, None]
        for p, (u, v) in enumerate(PAIRS):
            right[:, 4 + p] = (s[:, None] * E[:, 4 + p] + st[:, u, None] * E[:, 1 + v] + st[:, v, None] * E[:, 1 + u]
                               + 0.5 * sst[:, p, None] * e)
        big += e.T @ right.reshape(b, 10 * q)
        Et = E[:, 1:4].reshape(b, 3 * q) * np.sqrt(s)[:, None]
        cross = blas.dsyrk(1.0, Et, beta=1.0, c=cross, trans=1, overwrite_c=1)  # upper triangle of Σ s e_s e_tᵀ
        d += float(np.sum(np.log(D)))
        dd += dD.T @ s
        d2d += (d2D * s[:, None]).sum(0) - np.stack([dD[:, u] * dD[:, v] for u, v in PAIRS], 1).T @ s**2
    big = big.reshape(q, 10, q).transpose(1, 0, 2)
    cross = np.triu(cross) + np.triu(cross, 1).T
    Tb = np.eye(q)
    Tb[:m, :m] = kf.T

    def basis(A):  # whitened knot basis → B basis: Tbᵀ A Tb
        return Tb.T @ A @ Tb

    def sym(A):
        return A + A.T

    S = basis(0.5 * sym(big[0]))
    dS = np.stack([basis(sym(big[1 + t])) for t in range(3)])
    d2S = np.stack([basis(sym(big[4 + p]) + sym(cross[u * q:(u + 1) * q, v * q:(v + 1) * q]))
                    for p, (u, v) in enumerate(PAIRS)])
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
        d0 = np.hypot(P[..., 0] - locs0[rows, 0, None], P[..., 1] - locs0[rows, 1, None])
        kt = sigma2 * (lm.kernel.correlation(d0, beta) - np.einsum("bkm,bm->bk", FN, f0))
        v = np.linalg.solve(RNN, kt[:, :, None])[:, :, 0]
        resid = lm.z[nb] - lm.X[nb] @ params.gamma - FN @ Tmu
        out["mean"][rows] = _dot(v, resid)
        out["BRk"][rows] = np.einsum("bk,bkm->bm", v, FN) @ T
        out["kRk"][rows] = _dot(v, kt)
    return out
