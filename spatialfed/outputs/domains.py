"""The prediction domain: where `predict` flags a location as outside and where `map` lays its cells."""

from __future__ import annotations


import numpy as np

from spatialfed.data import geometry
from spatialfed.data.store import StoreInfo
from spatialfed.errors import warn


def default_domain(info: StoreInfo, workers, kind: str = "hull") -> geometry.Domain:
    """The study area the data span (geometry.store_hull_domain): the convex hull of the hulls the sites report of
    their observation sites (a polygon each, not the points), or its bounding box (`kind` "bbox")."""
    return geometry.store_hull_domain(
        info, lambda: list(workers.call("hull", {j: () for j in range(workers.n_workers)}).values()), kind=kind)


def load_domain(path, info: StoreInfo) -> geometry.Domain:
    """The domain polygon(s) of a vector file, reprojected to the store's CRS when the file has another."""
    domain = geometry.domain_from_file(path, crs=info.crs)
    return geometry.Domain(domain.geometry, geometry.parse_crs(info.crs))


def resolve_domain(domain, info: StoreInfo, workers) -> geometry.Domain:
    """The prediction domain `domain` names: None or "hull" (default), "bbox", a Domain or a polygon file."""
    if isinstance(domain, geometry.Domain):
        return domain
    if domain is None or str(domain) in geometry.DOMAIN_KINDS:
        return default_domain(info, workers, "hull" if domain is None else str(domain))
    return load_domain(domain, info)


def outside_domain(locs, domain: geometry.Domain, flagged: str = "flagged in column outside_domain") -> np.ndarray:
    """Mask of locations outside the domain, with one warning naming how many (prediction there is extrapolation)."""
    outside = ~domain.contains(locs)
    if outside.any():
        warn(f"{int(outside.sum())} of {len(outside)} prediction location(s) lie outside the domain "
             f"(extrapolation; {flagged})", once=False)
    return outside
