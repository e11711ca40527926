"""Coordinates checked before any geometry: finite, of sane magnitude, enough distinct locations, a real spread.

Absurd inputs (NaN, 1e300, one repeated location, differences lost to rounding) fail here in one line that names the
cause and the fix, instead of hanging a knot search or returning a silently wrong domain.
"""

from __future__ import annotations

import numpy as np

from spatialfed.errors import DataError

MAX_ABS_COORD = 1e12               # |x|, |y| beyond this are not map coordinates (Earth's stay below 4e7 m)
MAX_ABS_VALUE = 1e150              # |z|, |x_k| beyond this: their squares (the sites' moments) overflow float64
MIN_EXTENT = 1e-6                  # a point cloud narrower than this (map units) cannot carry a 2-D domain


def check_coordinates(xy, *, min_distinct: int = 1, what: str = "coordinates", purpose: str = "") -> np.ndarray:
    """The (n, 2) float array `xy`, or DataError naming the cause and the fix: not n×2, NaN/inf, |value| beyond
    MAX_ABS_COORD, fewer than `min_distinct` distinct locations, a spread below MIN_EXTENT, or differences lost to
    floating-point rounding. Call before any geometry (hulls, knot grids, projections)."""
    xy = np.asarray(xy, dtype=float)
    if xy.ndim != 2 or xy.shape[1] != 2:
        raise DataError(f"{what} must be an (n, 2) array of x/y, got shape {xy.shape}")
    n = len(xy)
    if n == 0:
        raise DataError(f"there are no {what}; give at least one point")
    if not np.isfinite(xy).all():
        bad = ~np.isfinite(xy).all(axis=1)
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"{int(bad.sum())} of {n} {what} are NaN or infinite (e.g. row {i}: "
                        f"({xy[i, 0]}, {xy[i, 1]})); drop or fix those rows")
    lo, hi = xy.min(axis=0), xy.max(axis=0)
    scale = float(max(np.abs(lo).max(), np.abs(hi).max()))
    if scale > MAX_ABS_COORD:
        big = np.abs(xy).max(axis=1) > MAX_ABS_COORD
        i = int(np.flatnonzero(big)[0])
        raise DataError(f"{int(big.sum())} of {n} {what} lie beyond ±{MAX_ABS_COORD:.0e} map units (e.g. row {i}: "
                        f"({xy[i, 0]:.3g}, {xy[i, 1]:.3g})), while projected coordinates on Earth stay below 4e7 m; "
                        "check the x/y columns and their units")
    distinct = n if min_distinct <= 1 else len(np.unique(xy[:10_000], axis=0))   # a head decides for large n
    if distinct < min_distinct and n > 10_000:
        distinct = len(np.unique(xy, axis=0))
    if distinct < min_distinct:
        why = f" {purpose}" if purpose else ""
        raise DataError(f"only {distinct} distinct location(s) among {n} {what}, fewer than the {min_distinct} "
                        f"needed{why}; add observations at more locations")
    extent = float((hi - lo).max())
    if extent > 0:                        # one repeated location is checked by min_distinct alone
        if extent < MIN_EXTENT:
            raise DataError(f"{what} span only {extent:.3g} map units (< {MIN_EXTENT:g}); the units are wrong "
                            "(rescale the coordinates, e.g. to metres)")
        if extent < 1e-9 * scale:
            raise DataError(f"{what} span only {extent:.3g} map units at magnitude {scale:.3g}, near the rounding "
                            "error of their values; subtract a common offset or use a local projected CRS")
    return xy
