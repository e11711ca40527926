"""Split N rows over J workers (SPEC §5): random, area, neighbor and column:<name> partitions.

Every scheme returns a *labels* array: an int64 vector of length N whose entry i is the worker
(0..J−1) that holds row i. Labels are disjoint and complete by construction; `split` turns them
into the per-worker index arrays (ascending row order) that `store.write_store` consumes.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

from spatialfed.errors import DataError

SCHEMES = ("random", "area", "neighbor")
#: the default number of sites, for `spatialfed ingest` and the estimator's in-memory data alike (`default_sites`)
ROWS_PER_SITE = 500
DEFAULT_SITES = (4, 64)
#: the smallest site worth having: each site's within-site pairs are its only contribution to the starting variogram
#: (20 rows give 190 pairs, over 10 for each of its 15 bins), and its summaries (XᵀX, Xᵀz, the local covariance
#: blocks) should not be as many numbers as the p + 3 rows they summarise
MIN_SITE_ROWS = 20
#: the fewest rows a site takes part with (ingest and fit refuse fewer): the start pass sends XᵀX and Xᵀz, which for
#: a 1-row site give its value exactly (Xᵀz / XᵀX) and for a few rows pin the values down with the variogram bins
MIN_PRIVATE_ROWS = 10


def default_sites(n: int) -> int:
    """J when none is given: about ROWS_PER_SITE rows per site, between DEFAULT_SITES (4 and 64), and fewer sites
    where that would leave a site under MIN_SITE_ROWS rows (1 below 40 rows)."""
    J = int(np.clip(np.ceil(n / ROWS_PER_SITE), *DEFAULT_SITES))
    return max(1, min(J, n // MIN_SITE_ROWS))


def small_sites_warning(sizes, flag: str = "--workers") -> str | None:
    """One line when a site has fewer than MIN_SITE_ROWS rows (None otherwise), naming the fix (`flag`)."""
    sizes = np.asarray(sizes)
    small = int((sizes < MIN_SITE_ROWS).sum())
    if not small:
        return None
    return (f"{small} of {sizes.size} sites have fewer than {MIN_SITE_ROWS} rows (smallest {int(sizes.min())}): "
            f"such sites add almost no pairs to the starting variogram and their summaries nearly reveal their rows; "
            f"use at most {max(1, int(sizes.sum()) // MIN_SITE_ROWS)} sites ({flag}), or leave it out for the "
            f"default of about {ROWS_PER_SITE} rows per site")


def check_site_sizes(sizes, labels=None, minimum: int = MIN_PRIVATE_ROWS,
                     fix: str = "merge it with a neighbouring site or leave its rows out") -> None:
    """Refuse (one DataError line) sites with fewer than `minimum` rows; `labels` name the sites (else w<j>)."""
    sizes = np.asarray(sizes)
    small = np.flatnonzero(sizes < minimum)
    if small.size:
        names = [repr(labels[j]) if labels is not None and j < len(labels) else f"w{j}" for j in small]
        listed = ", ".join(f"{name} has {int(sizes[j])}" for name, j in zip(names[:5], small[:5]))
        raise DataError(f"{small.size} of {sizes.size} sites have fewer than {minimum} rows ({listed}"
                        f"{', ...' if small.size > 5 else ''}): a site that small reveals its values in the start "
                        f"pass; {fix}")


def store_minimum(attrs: dict) -> int:
    """The smallest site a store's owners agreed to (its "min_site_rows" attribute, set at ingest), else the default."""
    return int(attrs.get("min_site_rows", MIN_PRIVATE_ROWS))


def worker_sizes(n: int, n_workers: int | None = None, sizes=None) -> np.ndarray:
    """Rows per worker: the given `sizes`, or N split as evenly as possible over `n_workers`."""
    if sizes is not None:
        sizes = np.asarray(sizes)
        if sizes.ndim != 1 or sizes.size == 0 or not np.issubdtype(sizes.dtype, np.integer):
            raise DataError(f"sizes must be a non-empty list of integers, got {sizes.tolist()!r}")
        if n_workers is not None and sizes.size != n_workers:
            raise DataError(f"sizes lists {sizes.size} workers but n_workers={n_workers}; give one size per worker")
        if np.any(sizes < 1):
            raise DataError(f"every worker needs at least one row; sizes={sizes.tolist()}")
        if int(sizes.sum()) != n:
            raise DataError(f"sizes sum to {int(sizes.sum())} but there are {n} rows; make them add up to {n}")
        return sizes.astype(np.int64)
    if n_workers is None or int(n_workers) != n_workers or n_workers <= 0:
        raise DataError(f"the number of workers must be a positive integer, got {n_workers!r}")
    if n < n_workers:
        raise DataError(f"{n} rows cannot be split over {n_workers} workers; use at most {n} workers")
    base, extra = divmod(n, int(n_workers))
    return np.array([base + 1] * extra + [base] * (int(n_workers) - extra), dtype=np.int64)


def random_partition(n: int, n_workers: int | None = None, *, sizes=None, seed=0) -> np.ndarray:
    """Uniform random assignment with exactly the requested number of rows per worker."""
    sizes = worker_sizes(n, n_workers, sizes)
    labels = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)
    return np.random.default_rng(seed).permutation(labels)


def area_partition(locs, n_workers: int | None = None, *, sizes=None) -> np.ndarray:
    """Spatially compact blocks by recursive coordinate bisection with splits proportional to sizes."""
    locs = np.asarray(locs, dtype=float)
    sizes = worker_sizes(len(locs), n_workers, sizes)
    labels = np.empty(len(locs), dtype=np.int64)
    stack = [(np.arange(len(locs)), np.arange(sizes.size))]
    while stack:
        idx, workers = stack.pop()
        if workers.size == 1:
            labels[idx] = workers[0]
            continue
        half = workers.size // 2
        n_left = int(sizes[workers[:half]].sum())
        pts = locs[idx]
        axis = int(np.argmax(np.ptp(pts, axis=0)))
        order = np.argpartition(pts[:, axis], n_left)
        stack.append((idx[order[:n_left]], workers[:half]))
        stack.append((idx[order[n_left:]], workers[half:]))
    return labels


def neighbor_clusters(locs, cluster_size: int = 10, *, seed=0) -> list[np.ndarray]:
    """Random seed points, each taken with its cluster_size−1 nearest unassigned neighbours (paper Fig. 12)."""
    locs = np.asarray(locs, dtype=float)
    n = len(locs)
    rng = np.random.default_rng(seed)
    assigned = np.zeros(n, dtype=bool)
    candidates = rng.permutation(n)
    tree_idx = np.arange(n)
    tree = cKDTree(locs)
    clusters, n_left, ptr = [], n, 0
    while n_left > 0:
        while assigned[candidates[ptr]]:
            ptr += 1
        s = candidates[ptr]
        need = min(cluster_size, n_left) - 1
        if 2 * n_left < tree_idx.size:
            tree_idx = np.flatnonzero(~assigned)
            tree = cKDTree(locs[tree_idx])
        k = min(tree_idx.size, 2 * (need + 1) * tree_idx.size // n_left)
        while True:
            _, nb = tree.query(locs[s], k=max(k, 1))
            near = tree_idx[np.atleast_1d(nb)]
            near = near[(~assigned[near]) & (near != s)]
            if near.size >= need or k >= tree_idx.size:
                break
            k = min(2 * k, tree_idx.size)
        members = np.concatenate(([s], near[:need]))
        assigned[members] = True
        n_left -= members.size
        clusters.append(members)
    return clusters


def neighbor_partition(locs, n_workers: int | None = None, *, sizes=None, cluster_size: int = 10, seed=0) -> np.ndarray:
    """Neighbour clusters of `cluster_size` points dealt out in random order to fill each worker's size."""
    sizes = worker_sizes(len(locs), n_workers, sizes)
    rng = np.random.default_rng(seed)
    clusters = neighbor_clusters(locs, cluster_size, seed=rng)
    order = np.concatenate([clusters[c] for c in rng.permutation(len(clusters))])
    labels = np.empty(len(order), dtype=np.int64)
    labels[order] = np.repeat(np.arange(sizes.size, dtype=np.int64), sizes)
    return labels


def column_partition(values) -> tuple[np.ndarray, list[str]]:
    """One worker per distinct value of a grouping column; returns labels and the sorted group names."""
    values = np.asarray(values).astype(str)
    names, labels = np.unique(values, return_inverse=True)
    return labels.astype(np.int64), [str(v) for v in names]


def parse_scheme(scheme: str) -> tuple[str, str | None]:
    """Split 'random' | 'area' | 'neighbor' | 'column:<name>' into (kind, column name or None)."""
    if isinstance(scheme, str) and scheme.startswith("column:") and len(scheme) > len("column:"):
        return "column", scheme[len("column:"):]
    if scheme in SCHEMES:
        return scheme, None
    raise DataError(f"unknown partition {scheme!r}; use one of random, area, neighbor or column:<name>")


def partition(locs, scheme: str, n_workers: int | None = None, *, sizes=None, seed=0) -> np.ndarray:
    """Labels for a spatial scheme ('random', 'area' or 'neighbor'); column partitions use column_partition."""
    kind, _ = parse_scheme(scheme)
    if kind == "random":
        return random_partition(len(locs), n_workers, sizes=sizes, seed=seed)
    if kind == "area":
        return area_partition(locs, n_workers, sizes=sizes)
    if kind == "neighbor":
        return neighbor_partition(locs, n_workers, sizes=sizes, seed=seed)
    raise DataError(f"partition {scheme!r} needs the column's values: call column_partition(values)")


def split(labels, n_workers: int | None = None) -> list[np.ndarray]:
    """Per-worker ascending row indices from a labels array (worker j gets rows with label j)."""
    labels = np.asarray(labels, dtype=np.int64)
    n_workers = int(labels.max()) + 1 if n_workers is None else int(n_workers)
    order = np.argsort(labels, kind="stable")
    bounds = np.searchsorted(labels[order], np.arange(n_workers + 1))
    return [order[bounds[j]:bounds[j + 1]] for j in range(n_workers)]
