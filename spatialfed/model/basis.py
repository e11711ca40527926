"""The knot basis of one worker (Eq. 4): ρ_K, ρ_js, B = ρ_js ρ_K⁻¹ and their log-β derivatives, and the knots' checks.

Notation (SPEC §1): ρ are unit-variance correlations, ρ̇ = ∂ρ/∂log β, ρ̈ = ∂²ρ/∂log β²; subscripts js (worker × knots)
and K (knots × knots). B does not depend on σ². Q̃ = ρ_js ρ_K⁻¹ ρ_sj is the unit-variance low-rank covariance among
the worker's points; every residual structure (dense, diagonal, Vecchia) subtracts it from the correlation C̃_jj.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from scipy import linalg
from scipy.spatial.distance import cdist

from spatialfed.model.linalg import cholesky_with_jitter
from spatialfed.model.matern import Matern, as_points, check_points


def check_knots(knots) -> np.ndarray:
    """Validate knots: finite (m, 2) (or Earth-centred (m, 3)) coordinates with no duplicates (duplicates make K
    singular).

    m = 0 is allowed: with no knots and the `full` residual, R_j = C_jj + δ⁻¹I and f_j = −ℓ_j − (n_j/2) log 2π,
    so the low-rank machinery computes the independence model of Eq. (3) exactly.
    """
    knots = check_points(as_points(knots), "knots")
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


#: residual_covariance fills its result this many rows at a time: the temporaries stay small enough for the
#: allocator to reuse (a fresh array of hundreds of MB costs its page faults again on every call)
ROW_BLOCK = 512


def residual_covariance(kernel: Matern, knots: np.ndarray, beta: float, sigma2: float, a, b) -> np.ndarray:
    """cov(w̃(a), w̃(b)) = σ²(ρ(a, b) − ρ(a, S*) ρ_K⁻¹ ρ(S*, b)) between two sets of locations: the residual process
    of Remark 3 (what the low-rank part leaves), for sites and server alike."""
    knots, a, b = as_points(knots), as_points(a), as_points(b)
    fa = fb = None
    if knots.shape[0]:
        LK, _ = cholesky_with_jitter(kernel.correlation(cdist(knots, knots), beta), "the knot correlation matrix K")
        fa, fb = (linalg.solve_triangular(LK, kernel.correlation(cdist(knots, x), beta), lower=True,
                                          check_finite=False) for x in (a, b))
    out = np.empty((a.shape[0], b.shape[0]))
    for r0 in range(0, a.shape[0], ROW_BLOCK):
        rows = slice(r0, r0 + ROW_BLOCK)
        block = kernel.correlation(cdist(a[rows], b), beta)
        if fa is not None:
            block -= fa[:, rows].T @ fb
        np.multiply(block, sigma2, out=out[rows])
    return out


def rowsum2(U: np.ndarray, V: np.ndarray) -> np.ndarray:
    """diag(U Vᵀ + V Uᵀ)."""
    return 2.0 * np.einsum("ij,ij->i", U, V)

