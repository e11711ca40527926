"""Partitions are disjoint and complete, sizes are honoured, area blocks are compact, neighbour sets are nearest."""

import numpy as np
import pytest
import shapely
from scipy.spatial import cKDTree

from spatialfed.data import partition as P
from spatialfed.data.geometry import jittered_unit_grid
from spatialfed.errors import DataError

LOCS = jittered_unit_grid(1203, seed=3)


def assert_disjoint_complete(labels, n, sizes):
    parts = P.split(labels, len(sizes))
    rows = np.concatenate(parts)
    assert len(rows) == n and np.array_equal(np.sort(rows), np.arange(n))
    assert [len(p) for p in parts] == list(sizes)


@pytest.mark.parametrize("scheme", ["random", "area", "neighbor"])
@pytest.mark.parametrize("n_workers", [1, 3, 7, 16])
def test_equal_sizes_disjoint_complete(scheme, n_workers):
    labels = P.partition(LOCS, scheme, n_workers, seed=1)
    assert_disjoint_complete(labels, len(LOCS), P.worker_sizes(len(LOCS), n_workers))


@pytest.mark.parametrize("scheme", ["random", "area", "neighbor"])
def test_unequal_sizes(scheme):
    sizes = [100, 300, 803]  # e.g. the paper's aligned / unaligned / inverse experiments
    labels = P.partition(LOCS, scheme, sizes=sizes, seed=2)
    assert_disjoint_complete(labels, len(LOCS), sizes)


def test_partition_is_deterministic():
    for scheme in ("random", "neighbor"):
        assert np.array_equal(P.partition(LOCS, scheme, 5, seed=4), P.partition(LOCS, scheme, 5, seed=4))


@pytest.mark.parametrize("n_workers", [4, 6, 9])
def test_area_blocks_are_compact(n_workers):
    hulls = [shapely.convex_hull(shapely.multipoints(LOCS[i])) for i in P.split(P.area_partition(LOCS, n_workers))]
    total = sum(h.area for h in hulls)
    assert total < 1.05  # blocks tile the unit square with almost no overlap
    for a in range(n_workers):
        for b in range(a + 1, n_workers):
            assert hulls[a].intersection(hulls[b]).area < 0.01 * min(hulls[a].area, hulls[b].area)


def test_neighbor_clusters_hold_each_seeds_nearest_unassigned():
    clusters = P.neighbor_clusters(LOCS, 10, seed=5)
    assert sum(len(c) for c in clusters) == len(LOCS)
    assert all(len(c) == 10 for c in clusters[:-1])
    taken = np.zeros(len(LOCS), dtype=bool)
    for members in clusters:
        seed_pt, rest = members[0], members[1:]
        free = np.flatnonzero(~taken & (np.arange(len(LOCS)) != seed_pt))
        d = np.hypot(*(LOCS[free] - LOCS[seed_pt]).T)
        expected = free[np.argsort(d, kind="stable")[: len(rest)]]
        assert set(rest) == set(expected)
        taken[members] = True
    first = clusters[0]
    _, nearest = cKDTree(LOCS).query(LOCS[first[0]], k=10)
    assert set(first) == set(nearest)


def test_column_partition_groups_by_value():
    labels, names = P.column_partition(["b", "a", "b", "c", "a"])
    assert names == ["a", "b", "c"] and labels.tolist() == [1, 0, 1, 2, 0]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(n_workers=0), "positive integer"),
        (dict(n_workers=-2), "positive integer"),
        (dict(n_workers=2000), "cannot be split"),
        (dict(sizes=[600, 600]), "sum to 1200"),
        (dict(sizes=[1203, 0]), "at least one row"),
        (dict(n_workers=3, sizes=[600, 603]), "one size per worker"),
    ],
)
def test_bad_sizes(kwargs, message):
    with pytest.raises(DataError, match=message):
        P.random_partition(len(LOCS), **kwargs)


def test_unknown_scheme():
    with pytest.raises(DataError, match="unknown partition"):
        P.parse_scheme("blocks")
    assert P.parse_scheme("column:state") == ("column", "state")
