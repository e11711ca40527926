"""Worker-side low-rank model: B_j, R_j, f_j and the local quantities L_j(p) of Eq. (13) with G_j of Eq. (16).

Notation (SPEC §1–3): ρ are unit-variance correlations, ρ̇ = ∂ρ/∂log β, ρ̈ = ∂²ρ/∂log β²; subscripts js
(worker × knots) and K (knots × knots). B = ρ_js ρ_K⁻¹ does not depend on σ²; the residual part of R_j is
W = σ² W̃(β) and R = W + ε I with ε = 1/δ. The objective is written f_j = ½ log det R + ½ tr(R⁻¹ Ψ) with
Ψ = V Ξ Vᵀ, V = [r, B], Ξ = blockdiag(1, Σ), r = z − Xγ − Bμ (this is SPEC §1's f_j). Every derivative in
u = (log δ, log σ², log β) is analytic; docs/equations.md maps each term to the paper.

Memory (issue 14): between requests a worker keeps only its data, the knots and, for the latest (δ, θ), the whitened
L⁻¹[B, X, z] with log det R (O(n_j(m + p)) numbers); no n_j × n_j matrix and no knot basis outlive a request,
except one factorisation kept for prediction (`residual_kriging`). The `full` residual's n_j × n_j work is done in
column blocks of the lower triangle (distances and correlations are recomputed from the locations when needed, never
stored), in place where LAPACK allows: a theta step holds at most three n_j × n_j arrays at once (R⁻¹, σ²∂W̃/∂log β
and their product), an R_j factorisation one. The price: the theta step of the full residual factorises R_j again
(≈ 10 % of its time) instead of reusing the mu_sigma step's factor.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from scipy import linalg
from scipy.linalg import lapack
from scipy.spatial import cKDTree
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
    """β-dependent knot quantities: ρ_K, ρ_js with their log-β derivatives, B, Ḃ, B̈ (Eq. 4).

    B (and ρ_js) are computed at once; the derivative blocks (ρ̇_js, ρ̈_js, Ḃ, B̈, ...) on first use, so a
    mu_sigma or gamma request pays for B alone. Built per request and dropped after it (n_j × m arrays each).
    """

    def __init__(self, kernel: Matern, d_K: np.ndarray, locs: np.ndarray, knots: np.ndarray, beta: float):
        self.beta = beta
        self.kernel = kernel
        self.d_js = cdist(locs, knots)
        self.rK, self.rK1, self.rK2 = kernel.correlation_derivatives(d_K, beta)
        self.LK, self.jitter = cholesky_with_jitter(self.rK, "the knot correlation matrix K")
        if self.jitter:
            self.rK = self.rK + self.jitter * np.eye(self.rK.shape[0])
        self.rjs = kernel.correlation(self.d_js, beta)
        self.B = self._right_solve(self.rjs)

    @cached_property
    def _rjs_derivatives(self) -> tuple[np.ndarray, np.ndarray]:
        """(ρ̇_js, ρ̈_js)."""
        return self.kernel.correlation_derivatives(self.d_js, self.beta)[1:]

    @property
    def rjs1(self) -> np.ndarray:
        return self._rjs_derivatives[0]

    @property
    def rjs2(self) -> np.ndarray:
        return self._rjs_derivatives[1]

    @cached_property
    def BrK1(self) -> np.ndarray:
        """B ρ̇_K."""
        return self.B @ self.rK1

    @cached_property
    def dB_rK(self) -> np.ndarray:
        """Ḃ ρ_K = ρ̇_js − B ρ̇_K."""
        return self.rjs1 - self.BrK1

    @cached_property
    def dB(self) -> np.ndarray:
        """Ḃ = ∂B/∂log β."""
        return self._right_solve(self.dB_rK)

    @cached_property
    def d2B(self) -> np.ndarray:
        """B̈ = ∂²B/∂log β², from B̈ ρ_K = ρ̈_js − 2 Ḃ ρ̇_K − B ρ̈_K."""
        return self._right_solve(self.rjs2 - 2.0 * self.dB @ self.rK1 - self.B @ self.rK2)

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


def _rowsum2(U: np.ndarray, V: np.ndarray) -> np.ndarray:
    """diag(U Vᵀ + V Uᵀ)."""
    return 2.0 * np.einsum("ij,ij->i", U, V)


#: bytes of one column block of an n_j × n_j computation (the blocks' temporaries stay near a few times this)
BLOCK_BYTES = 4 * 2**20
#: prediction: a worker kriges its locations in row blocks whose n₀ × n_j cross-covariance stays within this
KRIGING_BYTES = 32 * 2**20


def column_blocks(n: int, block_bytes: int | None = None, height: int | None = None):
    """Slices [c0, c1) covering 0..n, each of about block_bytes (default BLOCK_BYTES) / (8 · height) columns (≥ 16;
    height defaults to n: blocks of an n × n array)."""
    rows = n if height is None else height
    width = max(16, int(BLOCK_BYTES if block_bytes is None else block_bytes) // (8 * max(rows, 1)))
    for c0 in range(0, n, width):
        yield slice(c0, min(c0 + width, n))


def fill_upper(A: np.ndarray) -> np.ndarray:
    """Copy the lower triangle of a square array onto its upper triangle, in place and by blocks (no n × n
    temporary); returns A, now symmetric."""
    for c in column_blocks(A.shape[0]):
        diag = A[c, c]
        A[c, c] = np.tril(diag) + np.tril(diag, -1).T
        A[c, c.stop :] = A[c.stop :, c].T
    return A


def inverse_in_place(factor) -> np.ndarray:
    """R⁻¹ from its factor: dense R⁻¹ computed in the factor's own storage (LAPACK potri, then the upper triangle
    filled), so the factor is consumed (`factor.L` is None afterwards); the diagonal of R⁻¹ for a DiagFactor."""
    if isinstance(factor, DiagFactor):
        return factor.inverse()
    L, factor.L = factor.L, None
    inv, info = lapack.dpotri(L, lower=1, overwrite_c=1)
    if info != 0:
        raise np.linalg.LinAlgError("inverting the residual covariance failed")
    return fill_upper(inv)


class _Whitened:
    """What the mu_sigma, gamma and value sub-steps at one (δ, θ) need, kept between requests: log det R_j and
    L⁻¹[B, X, z] (n_j × (m + p + 1))."""

    __slots__ = ("key", "logdet", "Bh", "Xh", "zh")

    def __init__(self, key, logdet: float, Bh: np.ndarray, Xh: np.ndarray, zh: np.ndarray):
        self.key, self.logdet, self.Bh, self.Xh, self.zh = key, logdet, Bh, Xh, zh


class _Factorised:
    """R_j(δ, θ) factorised, with its knot basis and whitened data: built for one request and dropped after it
    (or kept for prediction)."""

    def __init__(self, model: "LocalModel", delta: float, sigma2: float, beta: float, whiten: bool = True):
        self.key = (delta, sigma2, beta)
        self.kb = model._basis(beta)
        self.eps = 1.0 / delta
        self.sigma2 = sigma2
        what = f"R_j of worker data (n={model.n})"
        if model.residual == "full":
            self.factor = DenseFactor(model._dense_residual(self.kb, sigma2, self.eps), what)  # in place
        else:
            self.factor = DiagFactor(sigma2 * model._residual_unit(self.kb) + self.eps, what)
        self.logdet = self.factor.logdet()
        self.Bh = self.Xh = self.zh = None
        if not whiten:
            return
        # one triangular solve serves the mu_sigma, gamma and value sub-steps: L⁻¹[B, X, z]
        W = self.factor.whiten(np.hstack([self.kb.B, model.X, model.z[:, None]]))
        m, p = self.kb.B.shape[1], model.X.shape[1]
        self.Bh, self.Xh, self.zh = W[:, :m], W[:, m : m + p], W[:, -1]

    def whitened(self) -> _Whitened:
        return _Whitened(self.key, self.logdet, self.Bh, self.Xh, self.zh)


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
        self._white: _Whitened | None = None  # the latest (δ, θ)'s whitened data: what the fit keeps between requests
        self._kriging: _Factorised | None = None  # one factorisation, kept for prediction requests only
        self._tree: cKDTree | None = None  # k-d tree of locs (owner assignment), O(n_j), built on first use

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
        """Drop what is kept between requests (the whitened data and the prediction factorisation)."""
        self._white = None
        self._kriging = None

    def cached_arrays(self) -> list[np.ndarray]:
        """The arrays this model keeps between requests beyond its data (for memory checks and diagnostics)."""
        out = []
        if self._white is not None:
            out += [self._white.Bh, self._white.Xh, self._white.zh]
        if self._kriging is not None:
            fz = self._kriging
            out += [a for a in (getattr(fz.factor, "L", None), getattr(fz.factor, "r", None), fz.Bh, fz.Xh, fz.zh)
                    if a is not None]
            out += [v for v in vars(fz.kb).values() if isinstance(v, np.ndarray)]
        return out

    def cached_nbytes(self) -> int:
        """Bytes of `cached_arrays` (views of one buffer counted once per view)."""
        return int(sum(a.nbytes for a in self.cached_arrays()))

    def _basis(self, beta: float) -> KnotBasis:
        return KnotBasis(self.kernel, self.d_K, self.locs, self.knots, beta)

    def _factorise(self, params: Params, whiten: bool = True) -> _Factorised:
        """A fresh factorisation of R_j at params' (δ, θ); with `whiten`, its whitened data become the kept
        `_white` (the statistics route needs no whitened data: whiten=False)."""
        fz = _Factorised(self, *params.theta_key, whiten=whiten)
        if whiten:
            self._white = fz.whitened()
        if self._kriging is not None and self._kriging.key != fz.key:
            self._kriging = None
        return fz

    def _whitened(self, params: Params) -> _Whitened:
        """The kept whitened data at params' (δ, θ), factorising R_j (then dropping the factor) on a miss."""
        if self._white is None or self._white.key != params.theta_key:
            self._factorise(params)
        return self._white

    def _check_params(self, params: Params) -> None:
        if params.mu.shape[0] != self.m or params.gamma.shape[0] != self.p:
            raise ValueError(
                f"params have {params.mu.shape[0]} knots and {params.gamma.shape[0]} covariates, but this worker "
                f"has {self.m} knots and {self.p} covariates"
            )

    # --- residual structure (Remark 3), unit variance: W = σ² W̃ -------------------------------------
    def _local_blocks(self, beta: float, lower: bool, derivative: int):
        """(slice c, rows, block) over column blocks of an n_j × n_j function of the distances among S_j:
        block = ρ (derivative 0), ρ̇ (1) or ρ̈ (2) at rows × c, rows = c.start: (the lower triangle) or all.
        Each block is returned transposed in memory (C order of c × rows), i.e. Fortran order of rows × c."""
        for c in column_blocks(self.n):
            r0 = c.start if lower else 0
            d = cdist(self.locs[c], self.locs[r0:])
            if derivative == 0:
                block = self.kernel.correlation(d, beta)
            else:
                block = self.kernel.correlation_derivatives(d, beta)[derivative]
            yield c, slice(r0, self.n), block.T

    def _dense_residual(self, kb: KnotBasis, sigma2: float, eps: float) -> np.ndarray:
        """R_j = σ²(C̃_jj − Q̃) + εI of the full residual: its lower triangle, Fortran order (for LAPACK in place);
        the strict upper triangle is left unset."""
        F = kb.lowrank_sqrt()
        R = np.empty((self.n, self.n), order="F")
        for c, rows, block in self._local_blocks(kb.beta, lower=True, derivative=0):
            block -= F[rows] @ F[c].T
            block *= sigma2
            R[rows, c] = block
        R[np.diag_indices(self.n)] += eps
        return R

    def _residual_unit(self, kb: KnotBasis) -> np.ndarray:
        """The diagonal of W̃: 1 − diag(Q̃) (mpp) or 0 (pp); the full residual's dense W̃ is `_dense_residual`'s."""
        if self.residual == "pp":
            return np.zeros(self.n)
        if self.residual == "mpp":
            F = kb.lowrank_sqrt()
            return 1.0 - np.einsum("ij,ij->i", F, F)
        raise ValueError("the full residual's W̃ is dense: use _dense_residual")

    def _residual_beta(self, kb: KnotBasis, sigma2: float) -> np.ndarray:
        """σ² ∂W̃/∂log β: dense (full, the one n_j × n_j array it allocates, built by column blocks of its lower
        triangle) or its diagonal (mpp, pp)."""
        if self.residual == "pp":
            return np.zeros(self.n)
        U1, V1 = kb.lowrank_d1_factors()
        if self.residual == "mpp":
            # the diagonal of C̃_jj is 1 for every β, so only the low-rank part moves
            return -sigma2 * _rowsum2(U1, V1)
        Wb = np.empty((self.n, self.n), order="F")
        for c, rows, block in self._local_blocks(kb.beta, lower=True, derivative=1):
            block -= U1[rows] @ V1[c].T
            block -= V1[rows] @ U1[c].T
            block *= sigma2
            Wb[rows, c] = block
        return fill_upper(Wb)

    def _residual_beta2_terms(self, kb: KnotBasis, G: np.ndarray, Y: np.ndarray):
        """∂²W̃/∂log β² = D₂ − (U₂V₂ᵀ + V₂U₂ᵀ): returns (⟨G, D₂⟩, YᵀD₂Y, U₂, V₂), with the dense D₂ = ρ̈_jj of the
        full residual visited by column blocks (never formed); for mpp/pp D₂ is diagonal and U₂ = V₂ = None."""
        if self.residual == "pp":
            return 0.0, np.zeros((Y.shape[1], Y.shape[1])), None, None
        U2, V2 = kb.lowrank_d2_factors()
        if self.residual == "mpp":
            D2 = -_rowsum2(U2, V2)
            return inner(G, D2), Y.T @ apply(D2, Y), None, None
        tGD2, YD2Y = 0.0, np.zeros((Y.shape[1], Y.shape[1]))
        for c, _, block in self._local_blocks(kb.beta, lower=False, derivative=2):
            tGD2 += float(np.einsum("ij,ij->", G[:, c], block))
            YD2Y += Y[c].T @ (block.T @ Y)
        return tGD2, 0.5 * (YD2Y + YD2Y.T), U2, V2

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
        wh = self._whitened(params)
        r0h = wh.zh - wh.Xh @ params.gamma
        return {"A": wh.Bh.T @ wh.Bh, "b": wh.Bh.T @ r0h, "BtRX": wh.Bh.T @ wh.Xh}

    def gamma_step(self, params: Params) -> dict:
        """X_jᵀR_j⁻¹X_j and X_jᵀR_j⁻¹(z_j − B_jμ) for Eq. (9)."""
        wh = self._whitened(params)
        return {"XtRX": wh.Xh.T @ wh.Xh, "XtRr": wh.Xh.T @ (wh.zh - wh.Bh @ params.mu)}

    def value(self, params: Params) -> float:
        """f_j = ½ log det R_j + ½ rᵀR_j⁻¹r + ½ tr(B_jᵀR_j⁻¹B_jΣ) (SPEC §1)."""
        wh = self._whitened(params)
        rh = wh.zh - wh.Xh @ params.gamma - wh.Bh @ params.mu
        return 0.5 * (wh.logdet + rh @ rh + inner(wh.Bh.T @ wh.Bh, params.Sigma))

    def theta(self, params: Params) -> dict:
        """f_j, ∂f_j/∂u, ∂²f_j/∂u² (Eq. 10 and 13) and G_j = (∂²f_j/∂u∂μ, ∂²f_j/∂u∂Σ) (Eq. 16).

        Full residual: at most three n_j × n_j arrays at once (R⁻¹ in the factor's storage, W_b, then R⁻¹W_b in
        place of nothing: W_b is dropped as soon as the product exists); ∂²W̃/∂log β² is visited by blocks.
        """
        fz = self._factorise(params)
        kb, eps, s2, n, m = fz.kb, fz.eps, fz.sigma2, self.n, self.m

        # V = [r, B], V_b = ∂V/∂log β = [−Ḃμ, Ḃ], V_bb = [−B̈μ, B̈]; Ξ = blockdiag(1, Σ)
        rh = fz.zh - fz.Xh @ params.gamma - fz.Bh @ params.mu
        Vh = np.hstack([rh[:, None], fz.Bh])  # L⁻¹V
        Y = fz.factor.unwhiten_t(Vh)  # R⁻¹V
        Yw = fz.factor.whiten(Y)
        del Vh
        G = inverse_in_place(fz.factor)  # R⁻¹ (consumes the factor)
        V = np.hstack([(self.z - self.X @ params.gamma - kb.B @ params.mu)[:, None], kb.B])
        Vb = np.hstack([-(kb.dB @ params.mu)[:, None], kb.dB])
        Vbb = np.hstack([-(kb.d2B @ params.mu)[:, None], kb.d2B])
        Yb = apply(G, Vb)
        Wb = self._residual_beta(kb, s2)  # W_b = ∂W/∂log β
        WbY = apply(Wb, Y)
        Z = apply(G, WbY)  # R⁻¹W_bR⁻¹V
        P = matmul(G, Wb)  # R⁻¹W_b
        del Wb
        t1, t2 = trace(G), inner(G, G)
        trP, tPP, tGP = trace(P), inner(P, transpose(P)), inner(G, transpose(P))
        del P
        # W_bb = σ²[D₂ − (U₂V₂ᵀ + V₂U₂ᵀ)]: ⟨R⁻¹, W_bb⟩ and YᵀW_bbY without forming W_bb
        tGWbb, YWbbY, U2, V2 = self._residual_beta2_terms(kb, G, Y)
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

    # --- prediction (federated kriging): the residual part, computed where the data live -------------
    def nearest_distance(self, locs0) -> np.ndarray:
        """Distance from each prediction location to this worker's nearest observation (owner assignment): a k-d
        tree query, O(n₀ log n_j) time and O(n₀) memory (a dense n₀ × n_j distance matrix cost 40× more)."""
        if self._tree is None:
            self._tree = cKDTree(self.locs)
        return self._tree.query(check_points(locs0, "prediction locations"), k=1)[0]

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

    def _kriging_factor(self, params: Params) -> _Factorised:
        """The one factorisation a worker keeps: R_j at params' (δ, θ), reused by every prediction batch."""
        if self._kriging is None or self._kriging.key != params.theta_key:
            self._kriging = None  # free the old factor before building the new one
            self._kriging = _Factorised(self, *params.theta_key)
        return self._kriging

    def residual_kriging(self, locs0, params: Params) -> dict:
        """E[w̃(s₀) | η = μ, z_j], and the pieces of Var(y(s₀) | z) owed to this worker's residual.

        With k̃ = cov(w̃(s₀), w̃_j): mean = k̃R_j⁻¹(z_j − X_jγ − B_jμ), BRk = (B_jᵀR_j⁻¹k̃ᵀ)ᵀ and kRk = diag(k̃R_j⁻¹k̃ᵀ);
        sizes grow with the number of prediction points, never with n_j.
        """
        self._check_params(params)
        locs0 = check_points(locs0, "prediction locations")
        fz = self._kriging_factor(params)
        rh = fz.zh - fz.Xh @ params.gamma - fz.Bh @ params.mu
        out = {"mean": np.empty(len(locs0)), "BRk": np.empty((len(locs0), self.m)), "kRk": np.empty(len(locs0))}
        for rows in column_blocks(len(locs0), KRIGING_BYTES, height=self.n):  # memory O(KRIGING_BYTES), any n₀
            kh = fz.factor.whiten(self._residual_cross(locs0[rows], fz.kb, params.sigma2).T)
            out["mean"][rows], out["BRk"][rows] = kh.T @ rh, kh.T @ fz.Bh
            out["kRk"][rows] = np.einsum("ij,ij->j", kh, kh)
        return out

    def independent_kriging(self, locs0, X0, params: Params) -> dict:
        """Kriging from this worker's data alone under the independence model (Eq. 3) with global (γ, δ, θ).

        Returns the predictive mean and latent variance: FGPR's personalised prediction.
        """
        locs0 = check_points(locs0, "prediction locations")
        X0 = check_finite(np.atleast_2d(np.asarray(X0, dtype=float)), "prediction covariates")
        if X0.shape != (locs0.shape[0], self.p):
            raise ValueError(f"prediction covariates must have shape ({locs0.shape[0]}, {self.p}), got {X0.shape}")
        M = params.sigma2 * self.kernel.correlation(cdist(self.locs, self.locs), params.beta)
        M[np.diag_indices_from(M)] += 1.0 / params.delta
        factor = DenseFactor(M, f"C_jj + δ⁻¹I of worker data (n={self.n})")
        eh = factor.whiten(self.z - self.X @ params.gamma)
        mean, var = X0 @ params.gamma, np.full(len(locs0), params.sigma2)
        for rows in column_blocks(len(locs0), KRIGING_BYTES, height=self.n):  # memory O(KRIGING_BYTES), any n₀
            k0 = factor.whiten(params.sigma2 * self.kernel.correlation(cdist(self.locs, locs0[rows]), params.beta))
            mean[rows] += k0.T @ eh
            var[rows] -= np.einsum("ij,ij->j", k0, k0)
        return {"mean": mean, "var": var}


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
