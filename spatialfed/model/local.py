"""Worker-side low-rank model: B_j, R_j, f_j and the local quantities L_j(p) of Eq. (13) with G_j of Eq. (16).

Notation (SPEC §1–3): ρ are unit-variance correlations, ρ̇ = ∂ρ/∂log β, ρ̈ = ∂²ρ/∂log β²; subscripts js
(worker × knots) and K (knots × knots). B = ρ_js ρ_K⁻¹ does not depend on σ²; the residual part of R_j is
W = σ² W̃(β) and R = W + ε I with ε = 1/δ. The objective is written f_j = ½ log det R + ½ tr(R⁻¹ Ψ) with
Ψ = V Ξ Vᵀ, V = [r, B], Ξ = blockdiag(1, Σ), r = z − Xγ − Bμ (this is SPEC §1's f_j). Every derivative in
u = (log δ, log σ², log β) is analytic; docs/equations.md maps each term to the paper.
"""

from __future__ import annotations

import numpy as np
from scipy import linalg
from scipy.spatial.distance import cdist

from spatialfed.errors import check_finite
from spatialfed.model.linalg import DenseFactor, DiagFactor, apply, cholesky_with_jitter, inner, matmul, trace, transpose
from spatialfed.model.matern import Matern, check_points
from spatialfed.model.names import BLOCK_STEPS, RESIDUALS, Residual
from spatialfed.model.params import Params

STEPS = BLOCK_STEPS


def check_residual(residual: str) -> Residual:
    """Validate the residual structure name of Remark 3."""
    if residual not in RESIDUALS:
        raise ValueError(f"residual must be one of {RESIDUALS} (Remark 3), got {residual!r}")
    return Residual(residual)


def check_knots(knots) -> np.ndarray:
    """Validate knots: finite (m, 2) coordinates with no duplicates (duplicates make K singular).

    m = 0 is allowed: with no knots and the `full` residual, R_j = C_jj + δ⁻¹I and f_j = −ℓ_j − (n_j/2) log 2π,
    so the low-rank machinery computes the independence model of Eq. (3) exactly.
    """
    knots = check_points(np.asarray(knots, dtype=float).reshape(-1, 2), "knots")
    uniq, counts = np.unique(knots, axis=0, return_counts=True)
    if np.any(counts > 1):
        dup = uniq[counts > 1][0]
        raise ValueError(
            f"knots contain {int(np.sum(counts[counts > 1] - 1))} duplicate point(s), e.g. {dup.tolist()}; "
            "duplicate knots make K singular: remove them"
        )
    return knots


class KnotBasis:
    """β-dependent knot quantities: ρ_K, ρ_js with their log-β derivatives, B, Ḃ, B̈ (Eq. 4)."""

    def __init__(self, kernel: Matern, d_K: np.ndarray, d_js: np.ndarray, beta: float):
        self.beta = beta
        self.rK, self.rK1, self.rK2 = kernel.correlation_derivatives(d_K, beta)
        self.rjs, self.rjs1, self.rjs2 = kernel.correlation_derivatives(d_js, beta)
        self._local = None
        self.LK, self.jitter = cholesky_with_jitter(self.rK, "the knot correlation matrix K")
        if self.jitter:
            self.rK = self.rK + self.jitter * np.eye(self.rK.shape[0])
        self.B = self._right_solve(self.rjs)
        self.BrK1 = self.B @ self.rK1
        # Ḃ ρ_K = ρ̇_js − B ρ̇_K,  B̈ ρ_K = ρ̈_js − 2 Ḃ ρ̇_K − B ρ̈_K
        self.dB_rK = self.rjs1 - self.BrK1
        self.dB = self._right_solve(self.dB_rK)
        self.d2B = self._right_solve(self.rjs2 - 2.0 * self.dB @ self.rK1 - self.B @ self.rK2)

    def local_correlations(self, kernel: Matern, d_jj: np.ndarray):
        """(ρ_jj, ρ̇_jj, ρ̈_jj) among the worker's own locations, evaluated once per β (full residual only)."""
        if self._local is None:
            self._local = kernel.correlation_derivatives(d_jj, self.beta)
        return self._local

    def _right_solve(self, M: np.ndarray) -> np.ndarray:
        """M ρ_K⁻¹."""
        return linalg.cho_solve((self.LK, True), M.T, check_finite=False).T

    def lowrank_sqrt(self) -> np.ndarray:
        """F with F Fᵀ = Q̃ = ρ_js ρ_K⁻¹ ρ_sj (the unit-variance low-rank covariance)."""
        return linalg.solve_triangular(self.LK, self.rjs.T, lower=True, check_finite=False).T

    def lowrank_d1_factors(self) -> tuple[np.ndarray, np.ndarray]:
        """(U₁, B) with ∂Q̃/∂log β = U₁Bᵀ + BU₁ᵀ, U₁ = ρ̇_js − ½ B ρ̇_K."""
        return self.rjs1 - 0.5 * self.BrK1, self.B

    def lowrank_d2_factors(self) -> tuple[np.ndarray, np.ndarray]:
        """(U, V) with ∂²Q̃/∂log β² = UVᵀ + VUᵀ, U = [ρ̈_js − ½ B ρ̈_K, Ḃ ρ_K], V = [B, Ḃ]."""
        U = np.hstack([self.rjs2 - 0.5 * self.B @ self.rK2, self.dB_rK])
        return U, np.hstack([self.B, self.dB])


def _sym_lowrank(U: np.ndarray, V: np.ndarray) -> np.ndarray:
    """U Vᵀ + V Uᵀ."""
    M = U @ V.T
    M += M.T
    return M


def _rowsum2(U: np.ndarray, V: np.ndarray) -> np.ndarray:
    """diag(U Vᵀ + V Uᵀ)."""
    return 2.0 * np.einsum("ij,ij->i", U, V)


class _Factorised:
    """R_j(δ, θ) with its factorisation and whitened data: the cache shared by all sub-steps at (δ, θ)."""

    def __init__(self, model: "LocalModel", delta: float, sigma2: float, beta: float):
        self.kb = model._basis(beta)
        self.eps = 1.0 / delta
        self.sigma2 = sigma2
        self.Wt = model._residual_unit(self.kb)
        R = sigma2 * self.Wt
        if R.ndim == 2:
            R[np.diag_indices_from(R)] += self.eps
            self.factor = DenseFactor(R, f"R_j of worker data (n={model.n})")
        else:
            self.factor = DiagFactor(R + self.eps, f"R_j of worker data (n={model.n})")
        # one triangular solve serves the mu_sigma, gamma and value sub-steps: L⁻¹[B, X, z]
        W = self.factor.whiten(np.hstack([self.kb.B, model.X, model.z[:, None]]))
        m, p = self.kb.B.shape[1], model.X.shape[1]
        self.Bh, self.Xh, self.zh = W[:, :m], W[:, m : m + p], W[:, -1]
        self.G = None


class LocalModel:
    """Worker j's partition (S_j, z_j, X_j) with the shared knots: computes L_j(p) (Eq. 13, SPEC §3)."""

    def __init__(self, locs, z, X, knots, kernel: Matern, residual: str = "full"):
        self.locs = check_points(locs, "locs")
        self.z = check_finite(np.asarray(z, dtype=float).reshape(-1), "z")
        X = np.asarray(X, dtype=float)
        if X.ndim == 1:
            X = X[:, None]
        self.X = check_finite(X, "X")
        n = self.locs.shape[0]
        if n == 0:
            raise ValueError("this worker's partition is empty: every worker needs at least one observation")
        if self.z.shape[0] != n or self.X.shape[0] != n:
            raise ValueError(
                f"locs, z and X must have the same number of rows, got {n}, {self.z.shape[0]}, {self.X.shape[0]}"
            )
        self.knots = check_knots(knots)
        if not isinstance(kernel, Matern):
            raise TypeError(f"kernel must be a spatialfed Matern, got {type(kernel).__name__}")
        self.kernel = kernel
        self.residual = check_residual(residual)
        self.d_K = cdist(self.knots, self.knots)
        self.d_js = cdist(self.locs, self.knots)
        self.d_jj = cdist(self.locs, self.locs) if residual == "full" else None
        self._basis_cache: KnotBasis | None = None
        self._fact_cache: tuple[tuple, _Factorised] | None = None

    @property
    def n(self) -> int:
        """n_j, the number of observations held by this worker."""
        return self.locs.shape[0]

    @property
    def p(self) -> int:
        """Number of covariates (columns of X_j)."""
        return self.X.shape[1]

    @property
    def m(self) -> int:
        """Number of knots."""
        return self.knots.shape[0]

    def clear_cache(self) -> None:
        """Drop the cached knot basis and factorisation of R_j."""
        self._basis_cache = None
        self._fact_cache = None

    def _basis(self, beta: float) -> KnotBasis:
        if self._basis_cache is None or self._basis_cache.beta != beta:
            self._basis_cache = KnotBasis(self.kernel, self.d_K, self.d_js, beta)
        return self._basis_cache

    def _factorised(self, params: Params) -> _Factorised:
        key = params.theta_key
        if self._fact_cache is None or self._fact_cache[0] != key:
            self._fact_cache = (key, _Factorised(self, *key))
        return self._fact_cache[1]

    def _check_params(self, params: Params) -> None:
        if params.mu.shape[0] != self.m or params.gamma.shape[0] != self.p:
            raise ValueError(
                f"params have {params.mu.shape[0]} knots and {params.gamma.shape[0]} covariates, but this worker "
                f"has {self.m} knots and {self.p} covariates"
            )

    # --- residual structure (Remark 3), unit variance: W = σ² W̃ -------------------------------------
    def _residual_unit(self, kb: KnotBasis) -> np.ndarray:
        """W̃ = C̃_jj − Q̃ (full), its diagonal (mpp), or 0 (pp)."""
        if self.residual == "pp":
            return np.zeros(self.n)
        F = kb.lowrank_sqrt()
        if self.residual == "mpp":
            return 1.0 - np.einsum("ij,ij->i", F, F)
        Wt = kb.local_correlations(self.kernel, self.d_jj)[0].copy()
        Wt -= F @ F.T
        return Wt

    def _residual_unit_derivatives(self, kb: KnotBasis):
        """∂W̃/∂log β (dense or diagonal, like W̃) and ∂²W̃/∂log β² as (D, U, V): D − (UVᵀ + VUᵀ).

        For `full` the second derivative keeps its low-rank part factored (U = [ρ̈_js − ½Bρ̈_K, Ḃρ_K],
        V = [B, Ḃ]) so that no second dense n×n matrix is formed; for `mpp`/`pp` U = V = None.
        """
        if self.residual == "pp":
            return np.zeros(self.n), (np.zeros(self.n), None, None)
        U1, V1 = kb.lowrank_d1_factors()
        U2, V2 = kb.lowrank_d2_factors()
        if self.residual == "mpp":
            # the diagonal of C̃_jj is 1 for every β, so only the low-rank part moves
            return -_rowsum2(U1, V1), (-_rowsum2(U2, V2), None, None)
        _, rho1, rho2 = kb.local_correlations(self.kernel, self.d_jj)
        Wt1 = rho1 - _sym_lowrank(U1, V1)
        return Wt1, (rho2, U2, V2)

    # --- initialisation summaries -------------------------------------------------------------------
    def moments(self) -> dict:
        """X_jᵀX_j, X_jᵀz_j, z_jᵀz_j, n_j (the pooled OLS start of SPEC §4) and the diameter of S_j's bounding box."""
        extent = float(np.hypot(*(self.locs.max(axis=0) - self.locs.min(axis=0))))
        return {"XtX": self.X.T @ self.X, "Xtz": self.X.T @ self.z, "ztz": float(self.z @ self.z), "n": self.n,
                "extent": extent}

    #: at most this many of the worker's points enter the semivariogram (a seeded random subsample above it), so the
    #: pass costs O(n_j) for the residuals plus O(VARIOGRAM_MAX_POINTS²) for the pairs, whatever n_j is
    VARIOGRAM_MAX_POINTS = 2000
    VARIOGRAM_SEED = 0

    def variogram(self, gamma, edges, max_points: int | None = VARIOGRAM_MAX_POINTS,
                  seed: int = VARIOGRAM_SEED) -> dict:
        """Binned Σ ½(e_i − e_k)² and pair counts of OLS residuals e = z − Xγ over pairs within this worker
        (init.py step 2), bins [edges[k], edges[k+1]).

        Pairs come from all n_j points when n_j ≤ `max_points` (every pair, the O(n_j²) estimator), otherwise from a
        uniform random subsample of `max_points` points drawn with `seed` (deterministic): each pair of the worker is
        then kept with the same probability, so every bin's mean ½(e_i − e_k)² is still unbiased for the
        semivariogram, from at most max_points·(max_points − 1)/2 pairs. `max_points=None` uses every point.
        Only the binned sums and counts leave the worker.
        """
        edges = np.asarray(edges, dtype=float)
        idx = self.variogram_subsample(self.n, max_points, seed)
        locs, z, X = (self.locs, self.z, self.X) if idx is None else (self.locs[idx], self.z[idx], self.X[idx])
        e = z - X @ np.asarray(gamma, dtype=float)
        sum_sq, count = binned_semivariogram(locs, e, edges)
        return {"sum_sq": sum_sq, "count": count}

    @staticmethod
    def variogram_subsample(n: int, max_points: int | None, seed: int) -> np.ndarray | None:
        """Sorted indices of a seeded uniform subsample of `max_points` of n rows, or None to keep all n."""
        if max_points is None or n <= max_points:
            return None
        if max_points < 2:
            raise ValueError(f"max_points={max_points}: the variogram subsample needs at least 2 points (one pair)")
        return np.sort(np.random.default_rng(seed).choice(n, size=int(max_points), replace=False))

    # --- local quantities L_j(p), Eq. (13) ---------------------------------------------------------
    def quantity(self, step: str, params: Params) -> dict:
        """L_j(p) for the sub-step named in p (SPEC §3), plus "value" (f_j alone) for the final pass."""
        self._check_params(params)
        if step == "mu_sigma":
            return self.mu_sigma(params)
        if step == "gamma":
            return self.gamma_step(params)
        if step == "theta":
            return self.theta(params)
        if step == "value":
            return {"f": self.value(params)}
        raise ValueError(f"unknown sub-step {step!r}; expected one of {STEPS + ('value',)}")

    def mu_sigma(self, params: Params) -> dict:
        """A_j = B_jᵀR_j⁻¹B_j and b_j = B_jᵀR_j⁻¹(z_j − X_jγ) for Eq. (8), and W_j = B_jᵀR_j⁻¹X_j (m × p).

        W_j lets the server take the exact joint (μ, γ) step given θ (docs/algorithm.md): with an intercept in X,
        the intercept and Bμ both carry the mean and alternating μ- and γ-updates crawl.
        """
        fz = self._factorised(params)
        r0h = fz.zh - fz.Xh @ params.gamma
        return {"A": fz.Bh.T @ fz.Bh, "b": fz.Bh.T @ r0h, "BtRX": fz.Bh.T @ fz.Xh}

    def gamma_step(self, params: Params) -> dict:
        """X_jᵀR_j⁻¹X_j and X_jᵀR_j⁻¹(z_j − B_jμ) for Eq. (9)."""
        fz = self._factorised(params)
        return {"XtRX": fz.Xh.T @ fz.Xh, "XtRr": fz.Xh.T @ (fz.zh - fz.Bh @ params.mu)}

    def value(self, params: Params) -> float:
        """f_j = ½ log det R_j + ½ rᵀR_j⁻¹r + ½ tr(B_jᵀR_j⁻¹B_jΣ) (SPEC §1)."""
        fz = self._factorised(params)
        rh = fz.zh - fz.Xh @ params.gamma - fz.Bh @ params.mu
        return 0.5 * (fz.factor.logdet() + rh @ rh + inner(fz.Bh.T @ fz.Bh, params.Sigma))

    def theta(self, params: Params) -> dict:
        """f_j, ∂f_j/∂u, ∂²f_j/∂u² (Eq. 10 and 13) and G_j = (∂²f_j/∂u∂μ, ∂²f_j/∂u∂Σ) (Eq. 16)."""
        fz = self._factorised(params)
        kb, eps, s2, n, m = fz.kb, fz.eps, fz.sigma2, self.n, self.m
        if fz.G is None:
            fz.G = fz.factor.inverse()
        G = fz.G
        Wt1, (D2, U2, V2) = self._residual_unit_derivatives(kb)
        Wb = s2 * Wt1

        # V = [r, B], V_b = ∂V/∂log β = [−Ḃμ, Ḃ], V_bb = [−B̈μ, B̈]; Ξ = blockdiag(1, Σ)
        rh = fz.zh - fz.Xh @ params.gamma - fz.Bh @ params.mu
        Vh = np.hstack([rh[:, None], fz.Bh])  # L⁻¹V
        Y = fz.factor.unwhiten_t(Vh)  # R⁻¹V
        V = np.hstack([(self.z - self.X @ params.gamma - kb.B @ params.mu)[:, None], kb.B])
        Vb = np.hstack([-(kb.dB @ params.mu)[:, None], kb.dB])
        Vbb = np.hstack([-(kb.d2B @ params.mu)[:, None], kb.d2B])
        Yb = apply(G, Vb)
        P = matmul(G, Wb)  # R⁻¹W_b
        Z = apply(P, Y)  # R⁻¹W_bR⁻¹V
        Yw = fz.factor.whiten(Y)
        Zs = fz.factor.sqrt_t_times(Z)
        Xi = np.zeros((m + 1, m + 1))
        Xi[0, 0] = 1.0
        Xi[1:, 1:] = params.Sigma

        C_VY = V.T @ Y
        C_YY = Y.T @ Y
        C_VZ = V.T @ Z
        C_VbY = Vb.T @ Y

        def xi(C):
            return float(np.einsum("ij,ij->", C, Xi))

        t1, t2 = trace(G), inner(G, G)
        trP, tPP, tGP = trace(P), inner(P, transpose(P)), inner(G, transpose(P))
        # W_bb = σ²[D₂ − (U₂V₂ᵀ + V₂U₂ᵀ)]: ⟨R⁻¹, W_bb⟩ and YᵀW_bbY without forming W_bb
        YWbbY = Y.T @ apply(D2, Y)
        tGWbb = inner(G, D2)
        if U2 is not None:
            GV2 = np.hstack([Y[:, 1:], Yb[:, 1:]])  # R⁻¹[B, Ḃ]
            tGWbb -= 2.0 * float(np.einsum("ij,ij->", GV2, U2))
            YU, YV = Y.T @ U2, Y.T @ V2
            YWbbY -= YU @ YV.T + YV @ YU.T
        tGWbb *= s2
        YWbbY *= s2
        psi0 = xi(C_VY)  # tr(R⁻¹Ψ) = rᵀR⁻¹r + tr(BᵀR⁻¹BΣ)
        trGam = xi(C_YY)  # tr Γ, Γ = R⁻¹ΨR⁻¹
        trGamG = xi(Yw.T @ Yw)  # tr(ΓR⁻¹)
        WbGam = xi(C_VZ)  # ⟨W_b, Γ⟩
        GamWbG = xi(Y.T @ Z)  # tr(ΓW_bR⁻¹)
        WbGamWbG = xi(Zs.T @ Zs)  # tr(W_bΓW_bR⁻¹)
        WbbGam = xi(YWbbY)  # ⟨W_bb, Γ⟩
        GPsib = 2.0 * xi(C_VbY)  # tr(R⁻¹Ψ_b)
        G2Psib = 2.0 * xi(Yb.T @ Y)  # tr(R⁻²Ψ_b)
        GWbGPsib = 2.0 * xi(Vb.T @ Z)  # tr(R⁻¹W_bR⁻¹Ψ_b)
        GPsibb = 2.0 * xi(Vbb.T @ Y) + 2.0 * xi(Vb.T @ Yb)  # tr(R⁻¹Ψ_bb)

        f = 0.5 * (fz.factor.logdet() + psi0)
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

    # --- prediction (federated kriging): the residual part, computed where the data live -------------
    def nearest_distance(self, locs0) -> np.ndarray:
        """Distance from each prediction location to this worker's nearest observation (owner assignment)."""
        return cdist(check_points(locs0, "prediction locations"), self.locs).min(axis=1)

    def _residual_cross(self, locs0: np.ndarray, kb: KnotBasis, sigma2: float) -> np.ndarray:
        """cov(w̃(s₀), w̃_j) (n₀ × n_j) of Remark 3; zero off coincident points for mpp, zero for pp."""
        b0 = kb._right_solve(self.kernel.correlation(cdist(locs0, self.knots), kb.beta))
        if self.residual == "full":
            return sigma2 * (self.kernel.correlation(cdist(locs0, self.locs), kb.beta) - b0 @ kb.rjs.T)
        cross = np.zeros((locs0.shape[0], self.n))
        if self.residual == "mpp":
            i, k = np.nonzero(cdist(locs0, self.locs) == 0.0)
            cross[i, k] = sigma2 * (1.0 - np.einsum("ij,ij->i", b0[i], kb.rjs[k]))
        return cross

    def residual_kriging(self, locs0, params: Params) -> dict:
        """E[w̃(s₀) | η = μ, z_j], and the pieces of Var(y(s₀) | z) owed to this worker's residual.

        With k̃ = cov(w̃(s₀), w̃_j): mean = k̃R_j⁻¹(z_j − X_jγ − B_jμ), BRk = (B_jᵀR_j⁻¹k̃ᵀ)ᵀ and kRk = diag(k̃R_j⁻¹k̃ᵀ);
        sizes grow with the number of prediction points, never with n_j.
        """
        self._check_params(params)
        locs0 = check_points(locs0, "prediction locations")
        fz = self._factorised(params)
        kh = fz.factor.whiten(self._residual_cross(locs0, fz.kb, params.sigma2).T)
        rh = fz.zh - fz.Xh @ params.gamma - fz.Bh @ params.mu
        return {"mean": kh.T @ rh, "BRk": kh.T @ fz.Bh, "kRk": np.einsum("ij,ij->j", kh, kh)}

    def independent_kriging(self, locs0, X0, params: Params) -> dict:
        """Kriging from this worker's data alone under the independence model (Eq. 3) with global (γ, δ, θ).

        Returns the predictive mean and latent variance: FGPR's personalised prediction.
        """
        locs0 = check_points(locs0, "prediction locations")
        X0 = check_finite(np.atleast_2d(np.asarray(X0, dtype=float)), "prediction covariates")
        if X0.shape != (locs0.shape[0], self.p):
            raise ValueError(f"prediction covariates must have shape ({locs0.shape[0]}, {self.p}), got {X0.shape}")
        d_jj = self.d_jj if self.d_jj is not None else cdist(self.locs, self.locs)
        M = params.sigma2 * self.kernel.correlation(d_jj, params.beta)
        M[np.diag_indices_from(M)] += 1.0 / params.delta
        factor = DenseFactor(M, f"C_jj + δ⁻¹I of worker data (n={self.n})")
        k0 = factor.whiten(params.sigma2 * self.kernel.correlation(cdist(self.locs, locs0), params.beta))
        eh = factor.whiten(self.z - self.X @ params.gamma)
        return {"mean": X0 @ params.gamma + k0.T @ eh, "var": params.sigma2 - np.einsum("ij,ij->j", k0, k0)}


def binned_semivariogram(locs: np.ndarray, e: np.ndarray, edges: np.ndarray,
                         block: int = 256) -> tuple[np.ndarray, np.ndarray]:
    """(Σ ½(e_i − e_k)², pair count) per distance bin [edges[k], edges[k+1]) over the pairs i < k of `locs`.

    Pairs are visited in row blocks, so memory is O(block · n) beside the inputs (never an n × n matrix); the cost is
    O(n²), which LocalModel.variogram bounds by subsampling. Pairs at d ≥ edges[-1] are dropped.
    """
    locs = np.asarray(locs, dtype=float)
    e = np.asarray(e, dtype=float)
    edges = np.asarray(edges, dtype=float)
    nb = edges.size - 1
    sum_sq, count = np.zeros(nb + 1), np.zeros(nb + 1)  # bin nb collects what is not a pair in range
    n = locs.shape[0]
    for i0 in range(0, max(n - 1, 0), block):
        i1 = min(i0 + block, n - 1)
        d = cdist(locs[i0:i1], locs[i0 + 1 :])  # row r = point i0 + r, column c = point i0 + 1 + c
        bins = np.searchsorted(edges, d, side="right") - 1  # edges[k] ≤ d < edges[k+1] ↦ k (np.digitize − 1)
        bins[(bins < 0) | (bins >= nb)] = nb
        bins[np.tril_indices(i1 - i0, k=-1)] = nb  # c < r: the pair (or the point itself) counted in an earlier row
        sq = 0.5 * (e[i0:i1, None] - e[None, i0 + 1 :]) ** 2
        sum_sq += np.bincount(bins.ravel(), weights=sq.ravel(), minlength=nb + 1)
        count += np.bincount(bins.ravel(), minlength=nb + 1)
    return sum_sq[:nb], count[:nb]
