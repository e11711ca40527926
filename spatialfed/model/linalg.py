"""Small linear-algebra helpers: the jitter policy for K, and operators that are dense or diagonal.

A symmetric operator is held either as an (n, n) array or, when diagonal, as an (n,) array of its
diagonal; the helpers below let one formula serve both (the `full` residual is dense, `mpp`/`pp` are diagonal).
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy import linalg
from scipy.linalg import lapack

#: Relative jitters tried, in order, when a knot correlation matrix is numerically singular.
JITTER_LADDER = (0.0, 1e-10, 1e-9, 1e-8, 1e-7, 1e-6)


class JitterWarning(UserWarning):
    """A knot matrix needed diagonal jitter to be factorised; the fitted model uses K + τ·σ²·I."""


def cholesky_with_jitter(A: np.ndarray, what: str) -> tuple[np.ndarray, float]:
    """Lower Cholesky factor of A + τ·mean(diag A)·I for the first τ in JITTER_LADDER that succeeds.

    τ = 0 whenever A is numerically positive definite, so well-posed problems are never altered;
    otherwise a JitterWarning states the τ used. Deterministic in A, so server and workers agree.
    """
    if A.shape[0] == 0:
        return np.zeros((0, 0)), 0.0
    scale = float(np.mean(np.diag(A)))
    for tau in JITTER_LADDER:
        L, info = lapack.dpotrf(A + tau * scale * np.eye(A.shape[0]) if tau else A, lower=1, clean=1)
        if info == 0 and np.min(np.diag(L)) > 1e-7 * np.sqrt(scale):
            if tau:
                warnings.warn(
                    f"{what} is numerically singular (knots too close for this range); added relative "
                    f"diagonal jitter {tau:g} to factorise it. Use fewer or better-spread knots to avoid this.",
                    JitterWarning,
                    stacklevel=3,
                )
            return L, tau
    raise np.linalg.LinAlgError(
        f"{what} is singular even with relative jitter {JITTER_LADDER[-1]:g}: knots coincide or are far closer "
        "than the correlation length; remove duplicate knots or use fewer knots"
    )


def apply(A: np.ndarray, X: np.ndarray) -> np.ndarray:
    """A @ X for a dense (n, n) or diagonal (n,) operator A."""
    if A.ndim == 1:
        return A[:, None] * X if X.ndim == 2 else A * X
    return A @ X


def inner(A: np.ndarray, C: np.ndarray) -> float:
    """Frobenius inner product ⟨A, C⟩ = tr(AᵀC) of dense or diagonal operators."""
    if A.ndim == 1 and C.ndim == 1:
        return float(A @ C)
    if A.ndim == 1:
        return float(A @ np.diagonal(C))
    if C.ndim == 1:
        return float(np.diagonal(A) @ C)
    return float(np.einsum("ij,ij->", A, C))


def trace(A: np.ndarray) -> float:
    """tr A of a dense or diagonal operator."""
    return float(A.sum() if A.ndim == 1 else np.trace(A))


def transpose(A: np.ndarray) -> np.ndarray:
    """Aᵀ of a dense or diagonal operator."""
    return A if A.ndim == 1 else A.T


def matmul(A: np.ndarray, C: np.ndarray) -> np.ndarray:
    """A @ C of two dense or diagonal operators (diagonal when both are)."""
    if A.ndim == 1 and C.ndim == 1:
        return A * C
    if A.ndim == 1:
        return A[:, None] * C
    if C.ndim == 1:
        return A * C[None, :]
    return A @ C


class DenseFactor:
    """Cholesky factor R = L Lᵀ of a dense SPD residual covariance (the `full` structure)."""

    def __init__(self, R: np.ndarray, what: str):
        L, info = lapack.dpotrf(R, lower=1, clean=1, overwrite_a=1)
        if info != 0:
            raise np.linalg.LinAlgError(
                f"{what} is not positive definite (leading minor {info} fails); the residual covariance is "
                "numerically singular for these parameters: check for duplicate locations or use residual='mpp'"
            )
        self.L = L

    def logdet(self) -> float:
        """log det R."""
        return 2.0 * float(np.sum(np.log(np.diag(self.L))))

    def whiten(self, X: np.ndarray) -> np.ndarray:
        """L⁻¹ X."""
        return linalg.solve_triangular(self.L, X, lower=True, check_finite=False)

    def unwhiten_t(self, X: np.ndarray) -> np.ndarray:
        """L⁻ᵀ X (so L⁻ᵀ L⁻¹ X = R⁻¹ X)."""
        return linalg.solve_triangular(self.L, X, lower=True, trans="T", check_finite=False)

    def sqrt_t_times(self, X: np.ndarray) -> np.ndarray:
        """Lᵀ X (so ‖Lᵀ X‖² = Xᵀ R X)."""
        return self.L.T @ X

    def inverse(self) -> np.ndarray:
        """R⁻¹ as a dense symmetric matrix (LAPACK potri)."""
        inv, info = lapack.dpotri(self.L, lower=1)
        if info != 0:
            raise np.linalg.LinAlgError("inverting the residual covariance failed")
        lower = np.tril(inv)
        return lower + np.tril(inv, -1).T


class DiagFactor:
    """A diagonal residual covariance R = diag(r) (the `mpp` and `pp` structures)."""

    def __init__(self, r: np.ndarray, what: str):
        if np.any(~(r > 0)):
            raise np.linalg.LinAlgError(f"{what} has non-positive diagonal entries; parameters are degenerate")
        self.r = r
        self.sqrt_r = np.sqrt(r)

    def logdet(self) -> float:
        """log det R."""
        return float(np.sum(np.log(self.r)))

    def whiten(self, X: np.ndarray) -> np.ndarray:
        """R^{-1/2} X."""
        return apply(1.0 / self.sqrt_r, X)

    def unwhiten_t(self, X: np.ndarray) -> np.ndarray:
        """R^{-1/2} X."""
        return apply(1.0 / self.sqrt_r, X)

    def sqrt_t_times(self, X: np.ndarray) -> np.ndarray:
        """R^{1/2} X."""
        return apply(self.sqrt_r, X)

    def inverse(self) -> np.ndarray:
        """R⁻¹ as its diagonal."""
        return 1.0 / self.r
