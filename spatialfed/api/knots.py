"""Where the knots go: a jittered grid of m knots over the domain (the paper's layout on [0,1]²), or the user's own.

The domain is the user's (a Domain or a vector file, reprojected to the store's CRS) or, by default, the union of the
sites' bounding boxes, which each site reports where its data live (4 numbers).
"""

from __future__ import annotations

import math
import uuid

import numpy as np

from spatialfed.api import progress
from spatialfed.data import geometry
from spatialfed.errors import DataError, WorkerTaskError
from spatialfed.model.matern import Matern
from spatialfed.runtime import site


def layout(knots, domain, info, runtime, *, seed: int = 0):
    """(knots, domain): `knots` an integer m, an (m, 2) array checked against the domain, or None (no knots: the
    independence model); `domain` the user's (None: from the sites' bounding boxes, computed on `runtime`)."""
    domain = given_domain(domain, info)
    if knots is None:
        return np.empty((0, 2)), domain
    if domain is None:
        domain = geometry.store_domain(info, lambda: site_bounds(info, runtime))
    if np.ndim(knots) == 0:
        if isinstance(knots, bool) or not float(knots).is_integer() or knots < 1:
            raise DataError(f"knots must be a positive integer m or an (m, 2) array of knot locations, got {knots!r}")
        m = int(knots)
        check_knot_memory(m, info.n_workers)
        points = geometry.jittered_unit_grid(m, seed=seed) if is_unit_square(domain) else \
            geometry.jittered_knots(domain, m, seed=seed)
    else:
        points = np.asarray(knots, dtype=float)
        if points.ndim != 2 or points.shape[1] != 2 or len(points) == 0:
            raise DataError(f"knots must be an (m, 2) array of x/y locations, got shape {points.shape}")
        if not np.all(np.isfinite(points)):
            raise DataError("knots hold NaN or infinite coordinates")
    if len(points) < 2:  # one knot has no spread: the starting length scale β₀ (a fraction of it) would be 0
        raise DataError(f"knots={len(points)}: the low-rank model needs at least 2 knots spread over the domain; use "
                        "more knots (the default is 100)")
    points = geometry.knots_in_domain(points, domain)
    _, first, counts = np.unique(np.round(points, 12), axis=0, return_index=True, return_counts=True)
    if (counts > 1).any():
        i = int(first[np.argmax(counts > 1)])
        raise DataError(f"{int((counts[counts > 1] - 1).sum())} knot(s) repeat another knot's location (e.g. "
                        f"({points[i, 0]:.6g}, {points[i, 1]:.6g}), knot #{i}); K would be singular: drop the "
                        "duplicates")
    return points, domain


def check_knot_memory(m: int, n_workers: int) -> None:
    """Refuse a knot count whose m×m matrices (about 5 per worker on the server, Σ, K and their factors) cannot fit
    in the memory available, before anything is allocated."""
    import psutil

    count = 5 * n_workers + 10
    need, have = 8.0 * m * m * count, float(psutil.virtual_memory().available)
    if need > have:
        raise DataError(f"knots={m} would need about {need / 1e9:.3g} GB for the {count} m×m matrices of a fit with "
                        f"{n_workers} workers, more than the {have / 1e9:.3g} GB of memory available; use fewer "
                        "knots (the default is 100)")


def given_domain(domain, info):
    """The user's domain (a Domain or a vector file), expressed in the store's CRS; None when not given."""
    if domain is None:
        return None
    if not isinstance(domain, geometry.Domain):
        domain = geometry.domain_from_file(domain, crs=info.crs)
    if domain.crs is not None and info.crs is not None and domain.crs != geometry.parse_crs(info.crs):
        domain = domain.to_crs(info.crs)
    return domain


def site_bounds(info, runtime) -> np.ndarray:
    """Each site's bounding box (4 numbers), computed where the data live (a short run of `runtime`: it loads every
    partition, so it is shown as a phase of the fit)."""
    progress.phase(f"default domain: the bounding boxes of {info.n_workers} sites")
    specs = site.site_specs(f"bounds-{uuid.uuid4().hex[:12]}", info.path, info.n_workers, np.empty((0, 2)),
                            Matern(0.5), "pp")  # no model is needed to read a bounding box
    try:
        for event in runtime.start(specs):
            if event.error is not None:
                raise WorkerTaskError(event.error)
        bounds = runtime.call("bounds", {j: () for j in range(info.n_workers)})
    finally:
        runtime.stop()
    return np.array([bounds[j] for j in range(info.n_workers)])


def is_unit_square(domain) -> bool:
    """Whether `domain` is the planar unit square of the simulations (SPEC §7)."""
    try:
        return domain.crs is None and tuple(np.round(domain.geometry.bounds, 12)) == (0.0, 0.0, 1.0, 1.0) and \
            math.isclose(domain.geometry.area, 1.0)
    except Exception:
        return False
