"""The dense residual of the `full` structure and the diagonal ones of `mpp`/`pp` (Remark 3), unit variance: W = σ²W̃.

The `full` residual's n_j × n_j work is done in column blocks of the lower triangle (distances and correlations are
recomputed from the locations when needed, never stored), in place where LAPACK allows. Functions take
the worker's LocalModel `lm` (its locations, kernel and residual name) and a KnotBasis `kb`.
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import lapack
from scipy.spatial.distance import cdist

from spatialfed.model.basis import KnotBasis, rowsum2
from spatialfed.model.linalg import DiagFactor, apply, inner

#: bytes of one column block of an n_j × n_j computation (the blocks' temporaries stay near a few times this)
BLOCK_BYTES = 4 * 2**20


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


def local_blocks(lm, beta: float, lower: bool, derivative: int):
    """(slice c, rows, block) over column blocks of an n_j × n_j function of the distances among S_j:
    block = ρ (derivative 0), ρ̇ (1) or ρ̈ (2) at rows × c, rows = c.start: (the lower triangle) or all.
    Each block is returned transposed in memory (C order of c × rows), i.e. Fortran order of rows × c."""
    for c in column_blocks(lm.n):
        r0 = c.start if lower else 0
        d = cdist(lm.locs[c], lm.locs[r0:])
        if derivative == 0:
            block = lm.kernel.correlation(d, beta)
        else:
            block = lm.kernel.correlation_derivatives(d, beta)[derivative]
        yield c, slice(r0, lm.n), block.T


def dense_residual(lm, kb: KnotBasis, sigma2: float, eps: float) -> np.ndarray:
    """R_j = σ²(C̃_jj − Q̃) + εI of the full residual: its lower triangle, Fortran order (for LAPACK in place);
    the strict upper triangle is left unset."""
    F = kb.lowrank_sqrt()
    R = np.empty((lm.n, lm.n), order="F")
    for c, rows, block in local_blocks(lm, kb.beta, lower=True, derivative=0):
        block -= F[rows] @ F[c].T
        block *= sigma2
        R[rows, c] = block
    R[np.diag_indices(lm.n)] += eps
    return R


def residual_unit(lm, kb: KnotBasis) -> np.ndarray:
    """The diagonal of W̃: 1 − diag(Q̃) (mpp) or 0 (pp); the full residual's dense W̃ is `dense_residual`'s."""
    if not lm.strategy.kriges:  # pp: no residual
        return np.zeros(lm.n)
    if lm.strategy.diagonal:  # mpp
        F = kb.lowrank_sqrt()
        return 1.0 - np.einsum("ij,ij->i", F, F)
    raise ValueError("the full residual's W̃ is dense: use dense_residual")


def residual_beta(lm, kb: KnotBasis, sigma2: float) -> np.ndarray:
    """σ² ∂W̃/∂log β: dense (full, the one n_j × n_j array it allocates, built by column blocks of its lower
    triangle) or its diagonal (mpp, pp)."""
    if not lm.strategy.kriges:  # pp: no residual
        return np.zeros(lm.n)
    U1, V1 = kb.lowrank_d1_factors()
    if lm.strategy.diagonal:  # mpp
        # the diagonal of C̃_jj is 1 for every β, so only the low-rank part moves
        return -sigma2 * rowsum2(U1, V1)
    Wb = np.empty((lm.n, lm.n), order="F")
    for c, rows, block in local_blocks(lm, kb.beta, lower=True, derivative=1):
        block -= U1[rows] @ V1[c].T
        block -= V1[rows] @ U1[c].T
        block *= sigma2
        Wb[rows, c] = block
    return fill_upper(Wb)


def residual_beta2_terms(lm, kb: KnotBasis, G: np.ndarray, Y: np.ndarray):
    """∂²W̃/∂log β² = D₂ − (U₂V₂ᵀ + V₂U₂ᵀ): returns (⟨G, D₂⟩, YᵀD₂Y, U₂, V₂), with the dense D₂ = ρ̈_jj of the
    full residual visited by column blocks (never formed); for mpp/pp D₂ is diagonal and U₂ = V₂ = None."""
    if not lm.strategy.kriges:  # pp: no residual
        return 0.0, np.zeros((Y.shape[1], Y.shape[1])), None, None
    U2, V2 = kb.lowrank_d2_factors()
    if lm.strategy.diagonal:  # mpp
        D2 = -rowsum2(U2, V2)
        return inner(G, D2), Y.T @ apply(D2, Y), None, None
    tGD2, YD2Y = 0.0, np.zeros((Y.shape[1], Y.shape[1]))
    for c, _, block in local_blocks(lm, kb.beta, lower=False, derivative=2):
        tGD2 += float(np.einsum("ij,ij->", G[:, c], block))
        YD2Y += Y[c].T @ (block.T @ Y)
    return tGD2, 0.5 * (YD2Y + YD2Y.T), U2, V2
