"""Orderings and conditioning sets of a Vecchia approximation (SPEC §2c): which earlier points each point is
conditioned on.

Depends on the site's locations alone, so a LocalModel builds its `VecchiaPlan` once and reuses it for every request
(O(n_j k) integers). Two orderings:

- "maxmin": an approximate max-min ordering (coarse to fine): on nested grids of 2^l × 2^l cells over the
  bounding square, level l adds, in a seeded random order, the point nearest the centre of every cell that holds no
  earlier point; each point is thus roughly as far from all earlier points as the level's cell size. O(n_j log n_j).
- "coord": sorted by x, then y.

Conditioning sets: the ≤ k nearest earlier points (Euclidean). Positions are visited in blocks: a k-d tree of the
prefix gives the exact nearest earlier points outside the block; inside it, brute force (small blocks: exact) or the
3k + 1 nearest of the block's own tree that come earlier.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.spatial import cKDTree
from scipy.spatial.distance import cdist

ORDERINGS = ("maxmin", "coord")
#: default neighbour count k (docs/algorithm.md, "Residual structures")
VECCHIA_K = 15
#: a prediction conditions each location's residual on PREDICT_FACTOR·k nearest points of its site: solved once per
#: location (O(k³)), not per request and round as the fit's k, and GpGp predicts with 60 neighbours by default
PREDICT_FACTOR = 4
#: residual="auto": a site of more points than this uses the Vecchia residual, a smaller one the dense full one
VECCHIA_AUTO_N = 1000
#: positions per block of the neighbour search (a k-d tree of the prefix is built once per block)
SEARCH_BLOCK = 1024


@dataclass(frozen=True)
class VecchiaPlan:
    """Ordering and conditioning sets of one site's points.

    order : (n,) point indices in Vecchia order; nbrs : (n, k) for the point at each position, the point indices of
    its ≤ k nearest earlier points (nearest first), padded with −1; k = the column count (≥ 1)."""

    order: np.ndarray
    nbrs: np.ndarray

    @property
    def k(self) -> int:
        return int(self.nbrs.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.order.nbytes + self.nbrs.nbytes)


def check_ordering(ordering: str) -> str:
    if ordering not in ORDERINGS:
        raise ValueError(f"vecchia_ordering must be one of {ORDERINGS}, got {ordering!r}")
    return ordering


def check_k(k) -> int:
    """The neighbour count k: an integer ≥ 1."""
    if isinstance(k, bool) or not float(k).is_integer() or int(k) < 1:
        raise ValueError(f"vecchia_k (--vecchia-k: neighbours per point of the Vecchia residual) must be an integer "
                         f"≥ 1, got {k!r}")
    return int(k)


def maxmin_order(locs: np.ndarray, seed: int = 0) -> np.ndarray:
    """Approximate max-min ordering (coarse-to-fine grid levels, seeded within a level); see the module docstring."""
    n = locs.shape[0]
    rng = np.random.default_rng(seed)
    lo = locs.min(axis=0)
    span = float(np.max(locs.max(axis=0) - lo)) or 1.0
    x = (locs - lo) / span * (1.0 - 1e-12)  # in [0, 1)
    taken = np.zeros(n, dtype=bool)
    out = []
    for level in range(31):
        g = 2**level
        cells = np.floor(x * g).astype(np.int64)
        # a cell's id: x·g + y in the plane; in 3-D (Earth-centred points) its rank, as g³ overflows int64
        cid = (cells[:, 0] * g + cells[:, 1] if cells.shape[1] == 2
               else np.unique(cells, axis=0, return_inverse=True)[1].reshape(-1))
        occupied = np.unique(cid[taken])
        free = np.flatnonzero(~taken & ~np.isin(cid, occupied))
        if free.size:
            centre = (cells[free] + 0.5) / g
            dist = np.sum((x[free] - centre) ** 2, axis=1)
            srt = np.lexsort((dist, cid[free]))
            first = np.ones(srt.size, dtype=bool)
            first[1:] = cid[free][srt[1:]] != cid[free][srt[:-1]]
            pick = free[srt[first]]
            pick = pick[rng.permutation(pick.size)]
            taken[pick] = True
            out.append(pick)
        if taken.all():
            break
    rest = np.flatnonzero(~taken)  # coincident points never separate on a grid
    out.append(rest[rng.permutation(rest.size)])
    return np.concatenate(out)


def coord_order(locs: np.ndarray) -> np.ndarray:
    """Sorted by x, then y."""
    return np.lexsort((locs[:, 1], locs[:, 0]))


def _blocks(n: int, block: int):
    """Position blocks [s, e): `block` positions while the prefix is short, then a quarter of the prefix (so a
    k-d tree of the prefix is built O(log n) times)."""
    s = 0
    while s < n:
        e = min(n, s + max(block, s // 4))
        yield s, e
        s = e


def _within_block(locs_b: np.ndarray, k: int, brute: bool):
    """(distances, positions) of the ≤ k nearest earlier points inside one block: exact by brute force for small
    blocks, else among the 3k + 1 nearest of a k-d tree of the block (the prefix holds most neighbours)."""
    b = locs_b.shape[0]
    if brute:
        D = cdist(locs_b, locs_b)
        D[np.triu_indices(b)] = np.inf  # only earlier positions of the block
        kk = min(k, b - 1)
        j = np.argpartition(D, kk - 1, axis=1)[:, :kk] if kk < b - 1 else np.argsort(D, axis=1)[:, :kk]
        return np.take_along_axis(D, j, axis=1), j
    kk = min(3 * k + 1, b)
    d, j = cKDTree(locs_b).query(locs_b, k=kk)
    d = np.where(j < np.arange(b)[:, None], d, np.inf)  # only earlier positions of the block
    return d, j


def ordered_neighbours(locs_o: np.ndarray, k: int, block: int = SEARCH_BLOCK) -> np.ndarray:
    """(n, k) positions of the ≤ k nearest earlier points of each position of the ordered locations `locs_o`
    (nearest first, −1 padded): exact among the prefix before each block and, within a block of ≤ `block`
    positions, exact; in larger blocks among each point's 3k + 1 nearest of the block."""
    n = locs_o.shape[0]
    out = np.full((n, k), -1, dtype=np.int64)
    for s, e in _blocks(n, block):
        b = e - s
        cand_d, cand_i = [], []
        if s > 0:
            kk = min(k, s)
            d, j = cKDTree(locs_o[:s]).query(locs_o[s:e], k=kk)
            cand_d.append(np.asarray(d).reshape(b, kk))
            cand_i.append(np.asarray(j).reshape(b, kk))
        if b > 1:
            d, j = _within_block(locs_o[s:e], k, brute=b <= block)
            cand_d.append(d)
            cand_i.append(j + s)
        if not cand_d:
            continue
        d, j = np.hstack(cand_d), np.hstack(cand_i)
        srt = np.argsort(d, axis=1, kind="stable")[:, :k]
        d, j = np.take_along_axis(d, srt, axis=1), np.take_along_axis(j, srt, axis=1)
        j[~np.isfinite(d)] = -1
        out[s:e, : j.shape[1]] = j
    return out


def vecchia_plan(locs: np.ndarray, k: int, ordering: str = "maxmin", seed: int = 0) -> VecchiaPlan:
    """The ordering and the ≤ k nearest earlier neighbours (as point indices) of every point of `locs`."""
    check_ordering(ordering)
    n = locs.shape[0]
    k = max(1, min(check_k(k), n - 1))
    order = maxmin_order(locs, seed) if ordering == "maxmin" else coord_order(locs)
    pos = ordered_neighbours(locs[order], k)
    nbrs = np.where(pos >= 0, order[np.maximum(pos, 0)], -1)
    return VecchiaPlan(order=order, nbrs=nbrs)
