"""The binned empirical semivariogram of a worker's residuals (start.py step 2), computed by row blocks."""

from __future__ import annotations

import numpy as np
from scipy.spatial.distance import cdist


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
