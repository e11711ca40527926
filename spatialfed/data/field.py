"""Gaussian random fields with Matérn covariance: exact Cholesky sampling and circulant embedding for large N.

Exact: C = L Lᵀ (LAPACK potrf on the lower triangle of C, built in column blocks), field = L ξ.
Large N: the stationary covariance on a regular grid of step h, embedded in a periodic torus, has a
circulant covariance matrix diagonalised by the 2-D FFT (Dietrich & Newsam 1997), so a grid field costs
O(M log M) for M torus cells. Values at arbitrary points are bilinear interpolations of the four
surrounding grid nodes plus independent N(0, v) noise, v = σ² − wᵀC₄w, which restores the exact marginal
variance σ² lost by interpolation. The covariance this produces is computable exactly
(`CirculantEmbedding.implied_covariance`), so its error against the Matérn target can be checked.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy import fft
from scipy.linalg import blas, lapack
from scipy.spatial.distance import cdist

from spatialfed.errors import DataError
from spatialfed.model.matern import Matern

EXACT_MAX_POINTS = 20_000
MAX_GRID_SIDE = 4096
MAX_TORUS_CELLS = 80_000_000


def lower_covariance(model: Matern, locs, sigma2: float, beta: float, block: int = 1024) -> np.ndarray:
    """Lower triangle (by column blocks, Fortran order) of the n×n Matérn covariance; the rest is unset."""
    locs = np.asarray(locs, dtype=float)
    cov = np.empty((len(locs), len(locs)), order="F")
    for j in range(0, len(locs), block):
        cov[j:, j:j + block] = model.covariance(cdist(locs[j:], locs[j:j + block]), sigma2, beta)
    return cov


def sample_exact(model: Matern, locs, sigma2: float, beta: float, rng, n_samples: int = 1) -> np.ndarray:
    """Exact draws (n × n_samples) of the zero-mean Matérn field at locs via Cholesky (jitter added if needed)."""
    n = len(locs)
    if n > EXACT_MAX_POINTS:
        raise DataError(f"exact sampling is limited to {EXACT_MAX_POINTS} points (got {n}); use method='circulant'")
    for jitter in (0.0, 1e-10, 1e-8, 1e-6):
        cov = lower_covariance(model, locs, sigma2, beta)
        cov[np.diag_indices(n)] += jitter * sigma2
        chol, info = lapack.dpotrf(cov, lower=1, clean=0, overwrite_a=1)
        if info == 0:
            break
    else:
        raise DataError("the covariance matrix is not positive definite even with jitter 1e-6·σ²; "
                        "remove duplicate locations")
    if jitter:
        warnings.warn(f"added {jitter:g}·σ² to the diagonal to factor the covariance matrix", stacklevel=2)
    xi = np.asfortranarray(rng.standard_normal((n, n_samples)))
    return blas.dtrmm(1.0, chol, xi, lower=1)


def default_step(beta: float, span: float) -> float:
    """Grid step β/100, coarsened if needed so that at most MAX_GRID_SIDE nodes cross `span`."""
    return max(beta / 100.0, span / (MAX_GRID_SIDE - 1))


class CirculantEmbedding:
    """Matérn field on a regular grid over `bounds` via FFT on a periodic torus, interpolated to points."""

    def __init__(self, model: Matern, sigma2: float, beta: float, bounds, step: float | None = None):
        xmin, ymin, xmax, ymax = (float(b) for b in bounds)
        span = max(xmax - xmin, ymax - ymin, np.finfo(float).tiny)
        self.model, self.sigma2, self.beta = model, float(sigma2), float(beta)
        self.step = float(step) if step else default_step(beta, span)
        self.origin = np.array([xmin, ymin])
        self.shape = (int(np.ceil((ymax - ymin) / self.step)) + 2, int(np.ceil((xmax - xmin) / self.step)) + 2)
        self.eigenvalues, self.clipped_fraction = self._eigenvalues()
        base = fft.ifft2(self.eigenvalues, workers=-1).real
        self._corner_cov = np.array([base[0, 0], base[0, 1], base[1, 1]])

    @property
    def torus_shape(self) -> tuple[int, int]:
        """Shape of the periodic torus the grid is embedded in."""
        return self.eigenvalues.shape

    def _torus_covariance(self, my: int, mx: int) -> np.ndarray:
        """First row of the block-circulant covariance: c at wrapped lags on an my × mx torus (one quadrant evaluated)."""
        ky, kx = np.arange(my // 2 + 1), np.arange(mx // 2 + 1)
        quadrant = self.model.covariance(np.hypot(ky[:, None], kx[None, :]) * self.step, self.sigma2, self.beta)
        wrap_y = np.minimum(np.arange(my), my - np.arange(my))
        wrap_x = np.minimum(np.arange(mx), mx - np.arange(mx))
        return quadrant[np.ix_(wrap_y, wrap_x)]

    def _eigenvalues(self) -> tuple[np.ndarray, float]:
        """Eigenvalues of the embedding, enlarging the torus until they are ≥ 0 (else clipped, with a warning)."""
        my, mx = (fft.next_fast_len(2 * (s - 1)) for s in self.shape)
        while True:
            lam = fft.fft2(self._torus_covariance(my, mx), workers=-1).real
            negative = lam < -1e-10 * lam.max()
            if not negative.any():
                return np.maximum(lam, 0.0), 0.0
            grown = fft.next_fast_len(int(1.5 * my)), fft.next_fast_len(int(1.5 * mx))
            if grown[0] * grown[1] > MAX_TORUS_CELLS:
                break
            my, mx = grown
        fraction = float(-lam[negative].sum() / np.abs(lam).sum())
        warnings.warn(f"circulant embedding has negative eigenvalues (share {fraction:.2e}) at the largest torus "
                      f"{my}×{mx}; they were set to 0, so the covariance is approximate", stacklevel=3)
        return np.maximum(lam, 0.0), fraction

    def sample_grid(self, rng) -> tuple[np.ndarray, np.ndarray]:
        """Two independent grid fields (real and imaginary parts of one FFT), each of shape `self.shape`."""
        my, mx = self.torus_shape
        xi = rng.standard_normal((my, 2 * mx)).view(np.complex128)
        xi *= np.sqrt(self.eigenvalues / (my * mx))
        field = fft.fft2(xi, workers=-1, overwrite_x=True)[: self.shape[0], : self.shape[1]]
        return field.real.copy(), field.imag.copy()

    def _weights(self, locs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Lower-left grid node (iy, ix) and the four bilinear weights of each point."""
        rel = (np.asarray(locs, dtype=float) - self.origin) / self.step
        ix = np.clip(np.floor(rel[:, 0]).astype(np.int64), 0, self.shape[1] - 2)
        iy = np.clip(np.floor(rel[:, 1]).astype(np.int64), 0, self.shape[0] - 2)
        fx, fy = rel[:, 0] - ix, rel[:, 1] - iy
        w = np.column_stack([(1 - fx) * (1 - fy), fx * (1 - fy), (1 - fx) * fy, fx * fy])
        return iy, ix, w

    def _residual_variance(self, w: np.ndarray) -> np.ndarray:
        """σ² − wᵀC₄w: variance missing from a bilinear interpolation with weights w."""
        c0, c1, c2 = self._corner_cov
        c4 = np.array([[c0, c1, c1, c2], [c1, c0, c2, c1], [c1, c2, c0, c1], [c2, c1, c1, c0]])
        return np.maximum(self.sigma2 - np.einsum("ni,ij,nj->n", w, c4, w), 0.0)

    def interpolate(self, grid_field: np.ndarray, locs, rng) -> np.ndarray:
        """Field values at locs: bilinear interpolation of the grid plus the variance-restoring noise."""
        iy, ix, w = self._weights(locs)
        values = (w[:, 0] * grid_field[iy, ix] + w[:, 1] * grid_field[iy, ix + 1]
                  + w[:, 2] * grid_field[iy + 1, ix] + w[:, 3] * grid_field[iy + 1, ix + 1])
        return values + np.sqrt(self._residual_variance(w)) * rng.standard_normal(len(values))

    def implied_covariance(self, locs) -> np.ndarray:
        """Exact covariance matrix (n×n) of the values `interpolate` produces at locs (for accuracy checks)."""
        iy, ix, w = self._weights(locs)
        base = fft.ifft2(self.eigenvalues, workers=-1).real
        my, mx = self.torus_shape
        nodes = [(iy, ix), (iy, ix + 1), (iy + 1, ix), (iy + 1, ix + 1)]
        cov = np.zeros((len(w), len(w)))
        for a, (ay, ax) in enumerate(nodes):
            for b, (by, bx) in enumerate(nodes):
                lag = base[(ay[:, None] - by[None, :]) % my, (ax[:, None] - bx[None, :]) % mx]
                cov += w[:, a, None] * w[None, :, b] * lag
        cov[np.diag_indices(len(w))] += self._residual_variance(w)
        return cov

    def sample(self, locs, rng, n_samples: int = 1) -> np.ndarray:
        """Draws (n × n_samples) of the field at locs, two per FFT."""
        out = np.empty((len(locs), n_samples))
        for k in range(0, n_samples, 2):
            pair = self.sample_grid(rng)
            for i in range(min(2, n_samples - k)):
                out[:, k + i] = self.interpolate(pair[i], locs, rng)
        return out
