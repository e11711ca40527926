"""Boundary exchange (seamless prediction): the sites' residuals tied through their posteriors at shared points.

The fitted model makes the residual w̃ of different sites independent, so a site kriges a location near its boundary
from its own side only. Here the server places exchange points U along the boundaries between the sites' regions,
and treats the values there as virtual observations v = w̃(U) + e, e ~ N(0, δ⁻¹I) (the data's own noise, which
keeps every matrix below well-posed), with the sites' data independent given v and site j's data informing only
v_j = v(U_j), the points on its own boundaries. Site j sends its posterior of w̃(U_j) from its data (η = μ): mean
m_j, covariance P_j and BRk_j (`LocalModel.anchor_posterior`); with P̃_j = P_j + δ⁻¹I and C = c̃(U, U) + δ⁻¹I,

    p(v | z) ∝ N(v; 0, C) Π_j N(v_j; m_j, P̃_j) / N(v_j; 0, C_jj)
    Q = C⁻¹ + Σ_j E_jᵀ(P̃_j⁻¹ − C_jj⁻¹)E_j,   μ_v = Q⁻¹ Σ_j E_jᵀ P̃_j⁻¹ m_j,   Σ_v = Q⁻¹.

A location s₀ that site j predicts (mean m(s₀), cross = cov(w̃(s₀), w̃(U_j) | z_j), G = cross P̃_j⁻¹):

    mean   m(s₀) + G(μ_v,j − m_j)
    var    (P − kRk) − G crossᵀ + G Σ_v,jj Gᵀ          (P − kRk: the site's own residual variance)
    BRk    BRk(s₀) + G(M_j − BRk_j),  M = Q⁻¹ Σ_j E_jᵀ P̃_j⁻¹ BRk_j   (the η-coefficients: m and μ_v are linear in η)

so `correct` returns the site's residual part in `residual_kriging`'s form and the blend (outputs/seamless.py)
combines it as before. At an exchange point the corrected predictions of both sites are μ_v up to the noise: the
sides agree there. U: a grid of GRID sampling spacings kept where the two nearest sites' data are within SLACK
spacings of equidistant (the boundary between them) and the nearer within the residual's effective range; each
point ties its two sites. docs/maps.md, "Seamless prediction".
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from scipy import linalg
from scipy.linalg import blas, lapack

from spatialfed.model.basis import residual_covariance
from spatialfed.outputs import nearest

#: exchange points lie on a grid of this many sampling spacings: dense enough to tie each boundary every few points
GRID = 2.0
#: a grid point is on the boundary of its two nearest sites when their distances differ by at most this (spacings)
SLACK = 1.0
#: the server's solve is O(|U|³) time and O(|U|²) memory: beyond this many points the grid is thinned
MAX_POINTS = 6000
#: on a large grid, every PROBE-th point in each direction first (to choose the thinning)
PROBE = 4
#: the grid is queried in chunks of this many points (the sites' distances, J per point, stay O(J · CHUNK))
CHUNK = 50_000


@dataclass
class Exchange:
    """What the server keeps between prediction batches: per site j, its exchange points U_j and the pieces of
    `correct` (shift = μ_v,j − m_j, dshift = M_j − BRk_j, the Cholesky factor of P̃_j and Σ_v,jj)."""

    anchors: dict
    shift: dict
    dshift: dict
    factor: dict
    cov: dict


def boundary_points(bounds: np.ndarray, nearest, spacing: float, reach: float,
                    max_points: int = MAX_POINTS, to_space=None) -> tuple[np.ndarray, np.ndarray]:
    """(U, pairs): grid points within SLACK·spacing of equidistant from their two nearest sites and within `reach`
    of the nearer, with those two sites (|U| × 2). `bounds` (J × 4: x₀, y₀, x₁, y₁ per site), `nearest(points)`
    the sites' nearest-observation distances (J × n). The grid has GRID spacings, or every c-th of its points in
    each direction, c the least integer that keeps at most max_points: along a band of fixed width the points scale
    as 1/c², so a first pass on every PROBE-th point estimates c. `to_space`: the grid is laid in the store's
    coordinates (`bounds` there) and mapped by it (chordal distances: Earth-centred points; the grid points with no
    longitude/latitude dropped), U returned mapped."""
    lo, hi = bounds[:, :2].min(axis=0), bounds[:, 2:].max(axis=0)
    xs, ys = (np.arange(a, b + GRID * spacing, GRID * spacing) for a, b in zip(lo, hi))

    def on_boundary(c):
        gx, gy = (a.ravel() for a in np.meshgrid(xs[::c], ys[::c]))
        grid, keep, pairs = np.column_stack([gx, gy]), [], []
        grid = grid if to_space is None else to_space(grid)
        for start in range(0, len(grid), CHUNK):
            d = np.asarray(nearest(grid[start:start + CHUNK]), dtype=float)
            two = np.argsort(d, axis=0)[:2]
            d1, d2 = (np.take_along_axis(d, two[i:i + 1], axis=0)[0] for i in (0, 1))
            ok = (d2 - d1 <= SLACK * spacing) & (d1 <= reach)
            keep.append(start + np.flatnonzero(ok))
            pairs.append(two[:, ok].T)
        return grid[np.concatenate(keep)], np.concatenate(pairs).reshape(-1, 2)

    c = 1
    if len(xs) * len(ys) > PROBE * PROBE * max_points:  # a large grid: estimate the thinning first
        c = max(1, int(np.ceil(PROBE * np.sqrt(len(on_boundary(PROBE)[0]) / max_points))))
    while True:
        U, pairs = on_boundary(c)
        if len(U) <= max_points:
            return U, pairs
        c += 1


def site_points(pairs: np.ndarray, n_sites: int) -> dict:
    """Site j → indices of the exchange points on its boundaries (those that tie it to a neighbour)."""
    return {j: ix for j in range(n_sites) if (ix := np.flatnonzero((pairs == j).any(axis=1))).size}


def _inverse_lower(A: np.ndarray, what: str) -> np.ndarray:
    """The lower triangle of A⁻¹ for a symmetric positive definite A, of which only the lower triangle is read
    (LAPACK potrf and potri in place: no copies of an |U| × |U| matrix)."""
    L, info = lapack.dpotrf(A, lower=1, overwrite_a=1)
    if info == 0:
        L, info = lapack.dpotri(L, lower=1, overwrite_c=1)
    if info != 0:
        raise np.linalg.LinAlgError(f"{what} is not positive definite (LAPACK info {info})")
    return L


def _block(lower: np.ndarray, ix: np.ndarray) -> np.ndarray:
    """The symmetric block [ix, ix] of a matrix stored as its lower triangle (ix increasing)."""
    B = np.tril(lower[np.ix_(ix, ix)])
    return B + np.tril(B, -1).T


def solve_exchange(U: np.ndarray, anchors: dict, posteriors: dict, model) -> Exchange:
    """The server's side (module docstring): from the sites' posteriors at their exchange points, μ_v, M and Σ_v,
    and each site's pieces of `correct`. Only lower triangles of the |U| × |U| matrices are formed."""
    par, noise = model.params, 1.0 / model.params.delta
    C = residual_covariance(model.kernel, model.space_knots, par.beta, par.sigma2, U, U).T  # symmetric; F-order, which
    C[np.diag_indices_from(C)] += noise  # LAPACK factorises in place (a C-ordered one would be copied first)
    prior = {j: linalg.cho_factor(C[np.ix_(ix, ix)], lower=True) for j, ix in anchors.items()}
    Q = _inverse_lower(C, "the exchange points' prior covariance")
    h, HB = np.zeros(len(U)), np.zeros((len(U), len(par.mu)))
    factor = {}
    for j, ix in anchors.items():
        post, eye = posteriors[j], np.eye(len(ix))
        factor[j] = linalg.cho_factor(post["cov"] + noise * eye, lower=True)
        Q[np.ix_(ix, ix)] += linalg.cho_solve(factor[j], eye) - linalg.cho_solve(prior[j], eye)
        h[ix] += linalg.cho_solve(factor[j], post["mean"])
        HB[ix] += linalg.cho_solve(factor[j], post["BRk"])
    S = _inverse_lower(Q, "the exchange posterior precision")
    mu, M = (blas.dsymm(1.0, S, v.reshape(len(U), -1), lower=1) for v in (h, HB))
    mu = mu[:, 0]
    return Exchange(
        anchors={j: U[ix] for j, ix in anchors.items()},
        shift={j: mu[ix] - posteriors[j]["mean"] for j, ix in anchors.items()},
        dshift={j: M[ix] - posteriors[j]["BRk"] for j, ix in anchors.items()},
        factor=factor,
        cov={j: _block(S, ix) for j, ix in anchors.items()},
    )


def build(workers, model, spacing: float, boxes: np.ndarray) -> Exchange | None:
    """One exchange round before the prediction batches: the server places U (the sites whose bounding box,
    `boxes`, is within SLACK of a grid point's nearest data answer their distances there:
    nearest.nearest_distances), every site its posterior at its own points; None when no two sites share a
    boundary."""
    J = workers.n_workers
    if J < 2:
        return None
    chordal = boxes.shape[1] == 6  # Earth-centred sites: the grid in the store's coordinates, mapped
    grid_boxes = nearest.site_boxes(workers, "store_bounds") if chordal else boxes
    U, pairs = boundary_points(grid_boxes, lambda points: nearest.nearest_distances(workers, points, boxes,
                                                                                    SLACK * spacing),
                               spacing, model.kernel.range_from_beta(model.params.beta),
                               to_space=model.space.on_sphere if chordal else None)
    anchors = site_points(pairs, J)
    if not anchors:
        return None
    posteriors = workers.call("anchor_posterior", {j: (U[ix], model.params) for j, ix in anchors.items()})
    try:
        return solve_exchange(U, anchors, posteriors, model)
    except np.linalg.LinAlgError as exc:
        warnings.warn(f"{exc}: the seamless predictor's boundary exchange is numerically singular at these "
                      "parameters; predicting with the blend of the sites' own kriging alone", RuntimeWarning,
                      stacklevel=2)
        return None


def correct(ex: Exchange, j: int, part: dict) -> dict:
    """Site j's residual part (mean, BRk, kRk, cross to its exchange points) tied to the exchange (module
    docstring), in residual_kriging's form without "cross"."""
    G = linalg.cho_solve(ex.factor[j], part["cross"].T).T
    explained = np.einsum("ij,ij->i", G, part["cross"]) - np.einsum("ij,jk,ik->i", G, ex.cov[j], G)
    return {"mean": part["mean"] + G @ ex.shift[j], "BRk": part["BRk"] + G @ ex.dshift[j],
            "kRk": part["kRk"] + explained}
