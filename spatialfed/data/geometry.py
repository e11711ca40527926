"""Study domains, knot grids and prediction grids (shapely/geopandas); CRS handling is in data/crs.py.

Knots depend on the domain only, never on worker data (paper Remark 1): every worker can rebuild
them from the domain, m and a seed. Coordinates are validated (`check_coordinates`) and domains checked
(`check_domain`) before any geometry is built, so absurd inputs fail in one line instead of hanging.
"""

from __future__ import annotations

from dataclasses import dataclass

import geopandas as gpd
import numpy as np
import shapely
from pyproj import CRS
from scipy.spatial import cKDTree

from spatialfed.data.coords import MAX_ABS_COORD, MIN_EXTENT, check_coordinates  # noqa: F401 (re-exported)
from spatialfed.data.crs import (  # noqa: F401 (re-exported: geometry was the CRS module before data/crs.py)
    LAT_NAMES, LON_NAMES, PLANAR, Projection, check_degrees_mislabelled, check_lonlat, crs_name, crs_string,
    laea_crs, lonlat_centre, lonlat_projection, looks_geographic, parse_crs, project, scale_error, to_projected,
    utm_crs, utm_zone,
)
from spatialfed.errors import DataError, option, warn

MAX_ASPECT = 1e4                   # domains longer than this along one axis are strips, not 2-D regions
MIN_FILL = 1e-3                    # domains filling less of their bounding box make the knot lattice huge
MAX_CANDIDATE_STEPS = 2_000_000    # bound on the knot-grid search (never hangs)




def jittered_unit_grid(n: int, seed=0, jitter: float = 0.4) -> np.ndarray:
    """The paper's locations (SPEC §7): unit grid + U(−jitter, jitter) jitter, shifted and scaled into [0,1]²."""
    if int(n) != n or n <= 0:
        raise DataError(f"number of grid points must be a positive integer, got {n!r}")
    rng = np.random.default_rng(seed)
    g = int(np.ceil(np.sqrt(n)))
    cells = rng.choice(g * g, size=int(n), replace=False) if g * g > n else np.arange(g * g)
    pts = np.column_stack([cells % g, cells // g]).astype(float)
    pts += rng.uniform(-jitter, jitter, size=pts.shape)
    return (pts + jitter) / (g - 1 + 2 * jitter)


@dataclass(frozen=True)
class Domain:
    """A study region: a shapely (Multi)Polygon and its CRS (None = planar units)."""

    geometry: shapely.Geometry
    crs: CRS | None = None

    def contains(self, points) -> np.ndarray:
        """Boolean mask of points (n×2) inside the domain or on its boundary."""
        points = np.asarray(points, dtype=float).reshape(-1, 2)
        return shapely.intersects_xy(self.geometry, points[:, 0], points[:, 1])

    def to_crs(self, crs) -> "Domain":
        """The same region expressed in another CRS."""
        series = self.to_geoseries().to_crs(parse_crs(crs))
        return Domain(series.iloc[0], series.crs)

    def to_geoseries(self) -> gpd.GeoSeries:
        """A one-row GeoSeries holding the domain, for plotting and file output."""
        return gpd.GeoSeries([self.geometry], crs=self.crs)


def _domain() -> str:
    """The domain option in the caller's spelling."""
    return option("domain=...", "--domain FILE")


def check_domain(domain: Domain) -> tuple[float, float, float, float]:
    """The domain's bounds, or DataError when it cannot carry knots or a grid: empty, non-finite or absurd bounds,
    zero area, a strip (aspect > MAX_ASPECT) or a polygon filling < MIN_FILL of its bounding box."""
    geom = domain.geometry
    if geom is None or geom.is_empty:
        raise DataError(f"the domain is empty; give a polygon with positive area ({_domain()})")
    bounds = np.asarray(geom.bounds, dtype=float)
    if not np.isfinite(bounds).all() or np.abs(bounds).max() > MAX_ABS_COORD:
        raise DataError(f"the domain's bounds {bounds.tolist()} are not finite map coordinates within "
                        f"±{MAX_ABS_COORD:.0e}; check the coordinates' units and CRS")
    xmin, ymin, xmax, ymax = bounds.tolist()
    width, height = xmax - xmin, ymax - ymin
    area = float(geom.area)
    if min(width, height) <= 0 or not area > 0:
        raise DataError(f"the domain ({width:.6g} × {height:.6g} map units) has zero area; the points are collinear "
                        f"or coincide: give a domain polygon ({_domain()})")
    if max(width / height, height / width) > MAX_ASPECT:
        raise DataError(f"the domain is a strip of {width:.6g} × {height:.6g} map units (aspect > {MAX_ASPECT:.0e}); "
                        f"the points are (nearly) collinear: give a two-dimensional domain polygon ({_domain()})")
    if area / (width * height) < MIN_FILL:
        raise DataError(f"the domain fills only {area / (width * height):.2g} of its bounding box (< {MIN_FILL:g}); "
                        "give a more compact domain polygon or split the study area")
    return xmin, ymin, xmax, ymax


def domain_from_bbox(xmin: float, ymin: float, xmax: float, ymax: float, crs=None) -> Domain:
    """A rectangular domain [xmin, xmax] × [ymin, ymax]."""
    check_coordinates([[xmin, ymin], [xmax, ymax]], what="bounding-box corners")
    if not (xmax > xmin and ymax > ymin):
        raise DataError(f"bounding box needs xmin < xmax and ymin < ymax, got ({xmin}, {ymin}, {xmax}, {ymax})")
    return Domain(shapely.box(xmin, ymin, xmax, ymax), parse_crs(crs))


def store_domain(info, worker_bounds) -> Domain:
    """A store's default domain: [0,1]² for simulated stores (SPEC §7), else the union of the workers' bounding
    boxes, padded by 10⁻⁹ of its size so that points on the boundary count as inside. `worker_bounds()` returns
    the (J, 4) boxes; it is only called when needed (each worker reveals just these 4 numbers)."""
    if info.crs is None and info.truth is not None:
        return domain_from_bbox(0.0, 0.0, 1.0, 1.0)
    b = np.asarray(worker_bounds(), dtype=float).reshape(-1, 4)
    check_coordinates(np.vstack([b[:, :2], b[:, 2:]]), what="workers' bounding-box corners")
    (xmin, ymin), (xmax, ymax) = b[:, :2].min(axis=0), b[:, 2:].max(axis=0)
    check_degrees_mislabelled([xmin, xmax], [ymin, ymax], info.crs, f"the store's coordinates (bounding box "
                              f"{xmin:.6g}, {ymin:.6g}, {xmax:.6g}, {ymax:.6g})",
                              fix="ingest the source table again with --crs EPSG:4326 if they are degrees (they "
                                  "are then projected to metres), or with the CRS they are in")
    if xmax == xmin and ymax == ymin:
        raise DataError(f"all observations lie at one location ({xmin:.6g}, {ymin:.6g}); a spatial model needs "
                        "observations at several locations: check the coordinates of the store's partitions")
    pad_x, pad_y = 1e-9 * max(1.0, xmax - xmin), 1e-9 * max(1.0, ymax - ymin)
    domain = domain_from_bbox(xmin - pad_x, ymin - pad_y, xmax + pad_x, ymax + pad_y, crs=info.crs)
    check_domain(domain)
    return domain


#: the default prediction domains a store can build from its sites' hulls (`store_hull_domain`)
DOMAIN_KINDS = ("hull", "bbox")


def store_hull_domain(info, worker_hulls, *, kind: str = "hull") -> Domain:
    """A store's default prediction domain: [0,1]² for simulated stores (SPEC §7), else the study area the sites'
    hulls span (`worker_hulls()` returns one polygon or WKB per worker, each `points_hull` of that worker's sites,
    grown by their spacing, computed where the partition lives; only called when needed). `kind` "hull": the convex
    hull of their union, so the map has no holes or slits where sites meet; "bbox": its bounding box."""
    if kind not in DOMAIN_KINDS:
        raise DataError(f"the default domain must be one of {', '.join(DOMAIN_KINDS)} (or a polygon file), "
                        f"got {kind!r}")
    if info.crs is None and getattr(info, "truth", None) is not None:
        return domain_from_bbox(0.0, 0.0, 1.0, 1.0)
    hulls = [shapely.from_wkb(h) if isinstance(h, (bytes, bytearray)) else h for h in worker_hulls()]
    if not hulls:
        raise DataError("no worker hulls to build the domain from; check that the store has workers")
    geom = shapely.convex_hull(shapely.union_all(hulls))
    domain = Domain(geom if kind == "hull" else shapely.box(*geom.bounds), parse_crs(info.crs))
    check_domain(domain)
    return domain


def domain_from_file(path, crs=None, layer=None) -> Domain:
    """The union of the polygons in a vector file (GeoPackage, shapefile, GeoJSON…), optionally reprojected."""
    try:
        frame = gpd.read_file(path, layer=layer)
    except Exception as exc:  # pyogrio raises several unrelated types for unreadable files
        raise DataError(f"cannot read domain file {path}: {exc}") from None
    geom = shapely.union_all(frame.geometry.values)
    if geom is None or geom.is_empty or geom.area <= 0:
        raise DataError(f"domain file {path} holds no polygon with positive area; for points use domain_from_points")
    domain = Domain(geom, frame.crs)
    if crs is None:
        return domain
    if frame.crs is None:
        return Domain(geom, parse_crs(crs))
    return domain.to_crs(crs)


def domain_from_points(points, hull: str = "convex", *, ratio: float = 0.3, buffer: float = 0.0, crs=None) -> Domain:
    """Convex or concave (shapely.concave_hull, `ratio` in (0,1]) hull of points, optionally buffered."""
    points = check_coordinates(points, what="points")
    cloud = shapely.multipoints(points)
    if hull == "convex":
        geom = shapely.convex_hull(cloud)
    elif hull == "concave":
        geom = shapely.concave_hull(cloud, ratio=ratio)
    else:
        raise DataError(f"hull must be 'convex' or 'concave', got {hull!r}")
    if buffer:
        geom = geom.buffer(buffer)
    if geom.area <= 0:
        raise DataError("the points' hull has zero area (fewer than 3 points or all collinear); pass buffer > 0")
    return Domain(geom, parse_crs(crs))


def spacing(points) -> float:
    """Median distance from each point to its nearest distinct neighbour (the sampling spacing)."""
    points = np.unique(np.asarray(points, dtype=float), axis=0)
    if len(points) < 2:
        raise DataError("the sampling spacing needs at least 2 distinct points; give the hull's buffer explicitly")
    dist, _ = cKDTree(points).query(points, k=2)
    return float(np.median(dist[:, 1]))


def points_hull(points, *, ratio: float = 0.3, buffer: float | None = None) -> shapely.Geometry:
    """The region the points sample: their concave hull (shapely.concave_hull; `ratio` 1 = convex, → 0 tighter)
    grown by `buffer` map units (default: the median nearest-neighbour spacing, so that edge points and the half
    cell around them are inside). Computable by each worker on its own points: send it, not the points."""
    if not 0 < ratio <= 1:
        raise DataError(f"the hull's ratio must be in (0, 1] (1 = convex hull), got {ratio!r}")
    points = check_coordinates(points, min_distinct=1 if buffer else 2, what="points",
                               purpose="to measure their spacing (or give buffer > 0)")
    buffer = spacing(points) if buffer is None else float(buffer)
    if not (np.isfinite(buffer) and buffer >= 0):
        raise DataError(f"the hull's buffer must be a finite distance ≥ 0 in map units, got {buffer!r}")
    geom = shapely.concave_hull(shapely.multipoints(points), ratio=ratio)
    return geom.buffer(buffer) if buffer else geom


def hull_domain(points, crs=None, *, ratio: float = 0.3, buffer: float | None = None) -> Domain:
    """The data's hull (`points_hull`) as a Domain: unlike the bounding box, it leaves out empty corners."""
    geom = points_hull(points, ratio=ratio, buffer=buffer)
    domain = Domain(geom, parse_crs(crs))
    check_domain(domain)
    return domain


def domain_from_hulls(hulls, crs=None, *, close: float = 0.0) -> Domain:
    """Union of per-worker hulls (shapely geometries or WKB, e.g. `points_hull` computed where each partition lives),
    with gaps narrower than 2·`close` map units closed (buffer(close) then buffer(−close))."""
    geoms = [shapely.from_wkb(h) if isinstance(h, (bytes, bytearray)) else h for h in hulls]
    if not geoms:
        raise DataError("no worker hulls to build the domain from; check that the store has workers")
    geom = shapely.union_all(geoms)
    if close:
        geom = geom.buffer(close).buffer(-close)
    domain = Domain(geom, parse_crs(crs))
    check_domain(domain)
    return domain


def _lattice(bounds, nx: int, ny: int, jitter: float, seed) -> np.ndarray:
    """Centres of an nx × ny grid of cells over the bounding box, each moved by U(−jitter, jitter) cell widths."""
    xmin, ymin, xmax, ymax = bounds
    iy, ix = np.mgrid[0:ny, 0:nx]
    cells = np.column_stack([ix.ravel(), iy.ravel()]) + 0.5
    if jitter:
        cells = cells + np.random.default_rng(seed).uniform(-jitter, jitter, size=cells.shape)
    return np.column_stack([xmin + cells[:, 0] * (xmax - xmin) / nx, ymin + cells[:, 1] * (ymax - ymin) / ny])


def _grid_candidates(domain: Domain, m: int):
    """Grid shapes (nx, ny) with cell aspect within 3:2 whose expected count inside the domain is near m.

    The search visits only the ny allowed by both the aspect and the count bounds and stops after
    MAX_CANDIDATE_STEPS steps, so it ends for any domain (`check_domain` refuses strips and absurd bounds first)."""
    xmin, ymin, xmax, ymax = check_domain(domain)
    width, height = xmax - xmin, ymax - ymin
    fill = domain.geometry.area / (width * height)
    ratio = height / width
    out, steps = [], 0
    for nx in range(1, int(np.ceil(np.sqrt(3 * m / fill / ratio))) + 2):
        lo = max(1, int(np.floor(nx * ratio / 1.5)), int(np.ceil(m / (2 * nx * fill) - 1e-9)))
        hi = min(int(np.ceil(nx * ratio * 1.5)), int(np.floor(2 * m / (nx * fill) + 1e-9)))
        steps += 1 + max(0, hi - lo + 1)
        if steps > MAX_CANDIDATE_STEPS:
            raise DataError(f"the knot-grid search for {m} knots over this {width:.6g} × {height:.6g} domain "
                            f"exceeds {MAX_CANDIDATE_STEPS} steps; use fewer knots or a more compact domain")
        for ny in range(lo, hi + 1):
            aspect = abs(np.log((width / nx) / (height / ny)))
            if aspect <= np.log(1.5) + 1e-12 and m / 2 <= nx * ny * fill <= 2 * m:
                out.append((aspect, nx, ny))
    return sorted(out)


def regular_knots(domain: Domain, m: int) -> np.ndarray:
    """Centres of a regular grid (cell aspect ≤ 3:2) clipped to the domain: exactly m, else the nearest count (warned)."""
    _check_m(m)
    best, best_gap = None, None
    for _, nx, ny in _grid_candidates(domain, m):
        pts = _lattice(domain.geometry.bounds, nx, ny, 0.0, None)
        pts = pts[domain.contains(pts)]
        if best_gap is None or abs(len(pts) - m) < best_gap:
            best, best_gap = pts, abs(len(pts) - m)
            if best_gap == 0:
                return best
    if best is None:
        raise DataError(f"no grid fits {m} knots in this domain; check the domain's extent and units")
    warn(f"no regular grid gives exactly {m} knots in this domain; using {len(best)} (nearest feasible)")
    return best


def jittered_knots(domain: Domain, m: int, *, jitter: float = 0.4, seed=0) -> np.ndarray:
    """The paper's knots: grid cells jittered by U(−jitter, jitter) cell widths, clipped to the domain; exactly m
    knots by taking the smallest grid with ≥ m cells inside and leaving randomly chosen surplus cells empty."""
    _check_m(m)
    rng = np.random.default_rng(seed)
    best = None
    for _, nx, ny in _grid_candidates(domain, m):
        pts = _lattice(domain.geometry.bounds, nx, ny, jitter, rng.integers(2**32))
        pts = pts[domain.contains(pts)]
        if len(pts) >= m and (best is None or len(pts) < len(best)):
            best = pts
    if best is None:
        raise DataError(f"no grid fits {m} knots in this domain; check the domain's extent and units")
    keep = np.sort(rng.choice(len(best), size=m, replace=False))
    return best[keep]


def _check_m(m) -> None:
    """Raise DataError unless m is a positive integer."""
    if int(m) != m or m <= 0:
        raise DataError(f"number of knots must be a positive integer, got {m!r}")


def knots_in_domain(knots, domain: Domain) -> np.ndarray:
    """Return knots (m×2) unchanged, or raise DataError naming the knots that fall outside the domain."""
    knots = np.asarray(knots, dtype=float)
    if knots.ndim != 2 or knots.shape[1] != 2 or len(knots) == 0:
        raise DataError(f"knots must be a non-empty (m, 2) array of x/y, got shape {knots.shape}")
    outside = np.flatnonzero(~domain.contains(knots))
    if outside.size:
        shown = ", ".join(f"#{i} ({knots[i, 0]:.6g}, {knots[i, 1]:.6g})" for i in outside[:5])
        raise DataError(
            f"{outside.size} of {len(knots)} knots lie outside the domain: {shown}"
            f"{' …' if outside.size > 5 else ''}; give knots inside the domain (by default the sites' bounding boxes) "
            f"or a domain that contains them ({_domain()})"
        )
    return knots


@dataclass(frozen=True)
class PredictionGrid:
    """Raster cells (north-up) over a domain: centres `x` (nx), `y` (ny, descending) and the inside `mask`."""

    x: np.ndarray
    y: np.ndarray
    mask: np.ndarray
    resolution: float
    crs: CRS | None

    @property
    def points(self) -> np.ndarray:
        """Centres (k×2) of the cells inside the domain, in row-major raster order."""
        yy, xx = np.meshgrid(self.y, self.x, indexing="ij")
        return np.column_stack([xx[self.mask], yy[self.mask]])

    @property
    def transform(self) -> Affine:
        """Affine transform of the raster (upper-left corner origin), as rasterio expects."""
        from affine import Affine  # with attrs, 20-100 ms to import: only for rasters

        half = self.resolution / 2
        return Affine.translation(self.x[0] - half, self.y[0] + half) @ Affine.scale(self.resolution, -self.resolution)

    def to_raster(self, values) -> np.ndarray:
        """Place per-point values (in `points` order) into a (ny, nx) array with NaN outside the domain."""
        out = np.full(self.mask.shape, np.nan)
        out[self.mask] = np.asarray(values, dtype=float)
        return out


def prediction_grid(domain: Domain, resolution: float, max_cells: int = 50_000_000) -> PredictionGrid:
    """Square cells of side `resolution` covering the domain's bounding box; cells whose centre is inside are kept."""
    if not (np.isfinite(resolution) and resolution > 0):
        raise DataError(f"grid resolution must be a finite number > 0 (in the domain's CRS units), got {resolution!r}")
    xmin, ymin, xmax, ymax = check_domain(domain)
    nx = max(1, int(np.ceil((xmax - xmin) / resolution)))
    ny = max(1, int(np.ceil((ymax - ymin) / resolution)))
    if nx * ny > max_cells:
        raise DataError(f"resolution {resolution} gives {nx}×{ny} cells (> {max_cells}); use a coarser resolution")
    x = xmin + (np.arange(nx) + 0.5) * resolution
    y = ymax - (np.arange(ny) + 0.5) * resolution
    yy, xx = np.meshgrid(y, x, indexing="ij")
    mask = domain.contains(np.column_stack([xx.ravel(), yy.ravel()])).reshape(ny, nx)
    return PredictionGrid(x, y, mask, float(resolution), domain.crs)
