"""Which sites a prediction location needs: each site's distance to its nearest observation, asked only of the
sites that can matter, and an order that keeps a batch's locations together (docs/maps.md, "Seamless prediction").

A site's distance d_j(s₀) is at least g_j(s₀), the distance from s₀ to the bounding box of its data (4 numbers per
site, asked once). Round 1 asks, for each location, the site of its nearest box, which bounds the least distance:
min_k d_k(s₀) ≤ U(s₀). Round 2 asks every other site with g_j(s₀) ≤ U(s₀) + slack. A site not asked has
d_j(s₀) ≥ g_j(s₀) > U(s₀) + slack ≥ min_k d_k(s₀) + slack: it is not the owner and lies outside a band of that
half-width (the seamless blend's h, the exchange's SLACK), so every distance the caller uses is the one it would
get by asking every site; the others are reported as +∞. Where the sites own compact areas a location needs a few
sites, not J, and a batch in `spatial_order` a few tens of sites.
"""

from __future__ import annotations

import numpy as np

from spatialfed.model.matern import as_points, norm


def site_boxes(workers, call: str = "bounds") -> np.ndarray:
    """Each site's bounding box of its data, J × 4 (x₀, y₀, x₁, y₁; J × 6 for Earth-centred points): one call
    ("store_bounds": in the store's coordinates)."""
    boxes = workers.call(call, {j: () for j in range(workers.n_workers)})
    return np.array([boxes[j] for j in range(workers.n_workers)], dtype=float).reshape(workers.n_workers, -1)


def box_gaps(boxes: np.ndarray, locs0: np.ndarray) -> np.ndarray:
    """g_j(s₀): the distance from each location to each site's box (J × n₀; 0 inside)."""
    dims = boxes.shape[1] // 2
    lo, hi = boxes[:, None, :dims], boxes[:, None, dims:]
    return norm(np.maximum(np.maximum(lo - locs0[None], locs0[None] - hi), 0.0))


def nearest_distances(workers, locs0, boxes: np.ndarray, slack: float) -> np.ndarray:
    """d_j(s₀) (J × n₀) for every site within `slack` of the nearest, +∞ for the sites that cannot be (module
    docstring): two rounds of `nearest_distance` calls, each site asked only for its candidate locations."""
    locs0 = as_points(locs0)
    gaps = box_gaps(boxes, locs0)
    d = np.full(gaps.shape, np.inf)
    asked = np.zeros(gaps.shape, dtype=bool)
    asked[gaps.argmin(axis=0), np.arange(len(locs0))] = True
    for _ in range(2):
        todo = {j: np.flatnonzero(row) for j, row in enumerate(asked & np.isinf(d))}
        answers = workers.call("nearest_distance", {j: (locs0[ix],) for j, ix in todo.items() if ix.size})
        for j, dist in answers.items():
            d[j, todo[j]] = dist
        asked |= gaps <= d.min(axis=0) + slack
    return d


def spatial_order(locs0) -> np.ndarray:
    """A permutation of the locations along a Z-order (Morton) curve of their 16-bit grid cells: consecutive
    locations lie close together, so a batch of them needs the sites of one area."""
    locs0 = as_points(locs0)[:, :2]  # Earth-centred points: their x/y, enough to keep a batch together
    lo, span = locs0.min(axis=0), np.ptp(locs0, axis=0)
    cells = np.floor((locs0 - lo) / np.where(span > 0, span, 1.0) * 65535).astype(np.uint64)
    key = np.zeros(len(locs0), dtype=np.uint64)
    for bit in range(16):
        for axis in (0, 1):
            key |= ((cells[:, axis] >> np.uint64(bit)) & np.uint64(1)) << np.uint64(2 * bit + axis)
    return np.argsort(key, kind="stable")
