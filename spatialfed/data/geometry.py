"""Study domains, knot grids and prediction grids (shapely/geopandas), and CRS handling (pyproj).

Knots depend on the domain only, never on worker data (paper Remark 1): every worker can rebuild
them from the domain, m and a seed.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import geopandas as gpd
import numpy as np
import shapely
from affine import Affine
from pyproj import CRS, Transformer
from pyproj.aoi import AreaOfInterest
from pyproj.database import query_utm_crs_info
from pyproj.exceptions import CRSError

from spatialfed.errors import DataError

def parse_crs(crs) -> CRS | None:
    """A pyproj CRS from 'EPSG:xxxx', WKT, a PROJ string or a CRS; None stays None (planar units)."""
    if crs is None or isinstance(crs, CRS):
        return crs
    try:
        return CRS.from_user_input(crs)
    except CRSError as exc:
        raise DataError(f"unknown CRS {crs!r} ({exc}); give an EPSG code such as EPSG:4326 or EPSG:28992") from None


def crs_string(crs) -> str | None:
    """'EPSG:xxxx' when the CRS has an EPSG code, else its WKT; None for planar units."""
    crs = parse_crs(crs)
    if crs is None:
        return None
    code = crs.to_epsg()
    return f"EPSG:{code}" if code is not None else crs.to_wkt()


def check_lonlat(lon, lat) -> None:
    """Raise DataError unless longitudes lie in [−180, 180] and latitudes in [−90, 90]."""
    lon, lat = np.asarray(lon, dtype=float), np.asarray(lat, dtype=float)
    bad = (np.abs(lon) > 180) | (np.abs(lat) > 90)
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{int(bad.sum())} point(s) are outside lon [-180, 180] / lat [-90, 90], e.g. row {i}: "
            f"({lon[i]}, {lat[i]}); check that x is longitude and y latitude, or give the data's real CRS"
        )


def utm_crs(lon, lat) -> CRS:
    """The WGS 84 UTM zone CRS (metres) containing the centroid of the given lon/lat points."""
    lon_c, lat_c = float(np.mean(lon)), float(np.mean(lat))
    info = query_utm_crs_info(
        datum_name="WGS 84", area_of_interest=AreaOfInterest(lon_c, lat_c, lon_c, lat_c)
    )
    if not info:
        raise DataError(f"no UTM zone covers lon/lat ({lon_c:.3f}, {lat_c:.3f}); pass a projected target CRS")
    return CRS.from_epsg(int(info[0].code))


def to_projected(xy, crs, target=None) -> tuple[np.ndarray, CRS | None]:
    """Project x/y from `crs` to `target` (default: keep a projected CRS, lon/lat → UTM of the centroid)."""
    xy = np.asarray(xy, dtype=float)
    crs, target = parse_crs(crs), parse_crs(target)
    if crs is None:
        if target is not None:
            raise DataError("cannot reproject coordinates with no CRS; give the source CRS (--crs) as well")
        return xy, None
    if crs.is_geographic:
        check_lonlat(xy[:, 0], xy[:, 1])
        target = target or utm_crs(xy[:, 0], xy[:, 1])
    if target is None or target == crs:
        return xy, crs
    if target.is_geographic:
        raise DataError(f"target CRS {crs_string(target)} is geographic (degrees); distances need a projected CRS")
    x, y = Transformer.from_crs(crs, target, always_xy=True).transform(xy[:, 0], xy[:, 1])
    return np.column_stack([x, y]), target


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


def domain_from_bbox(xmin: float, ymin: float, xmax: float, ymax: float, crs=None) -> Domain:
    """A rectangular domain [xmin, xmax] × [ymin, ymax]."""
    if not (xmax > xmin and ymax > ymin):
        raise DataError(f"bounding box needs xmin < xmax and ymin < ymax, got ({xmin}, {ymin}, {xmax}, {ymax})")
    return Domain(shapely.box(xmin, ymin, xmax, ymax), parse_crs(crs))


def store_domain(info, worker_bounds) -> Domain:
    """A store's default domain: [0,1]² for simulated stores (SPEC §7), else the union of the workers' bounding
    boxes, padded by 10⁻⁹ of its size so that points on the boundary count as inside. `worker_bounds()` returns
    the (J, 4) boxes; it is only called when needed (each worker reveals just these 4 numbers)."""
    if info.crs is None and info.truth is not None:
        return domain_from_bbox(0.0, 0.0, 1.0, 1.0)
    b = np.asarray(worker_bounds(), dtype=float)
    (xmin, ymin), (xmax, ymax) = b[:, :2].min(axis=0), b[:, 2:].max(axis=0)
    pad_x, pad_y = 1e-9 * max(1.0, xmax - xmin), 1e-9 * max(1.0, ymax - ymin)
    return domain_from_bbox(xmin - pad_x, ymin - pad_y, xmax + pad_x, ymax + pad_y, crs=info.crs)


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
    points = np.asarray(points, dtype=float)
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


def _lattice(bounds, nx: int, ny: int, jitter: float, seed) -> np.ndarray:
    """Centres of an nx × ny grid of cells over the bounding box, each moved by U(−jitter, jitter) cell widths."""
    xmin, ymin, xmax, ymax = bounds
    iy, ix = np.mgrid[0:ny, 0:nx]
    cells = np.column_stack([ix.ravel(), iy.ravel()]) + 0.5
    if jitter:
        cells = cells + np.random.default_rng(seed).uniform(-jitter, jitter, size=cells.shape)
    return np.column_stack([xmin + cells[:, 0] * (xmax - xmin) / nx, ymin + cells[:, 1] * (ymax - ymin) / ny])


def _grid_candidates(domain: Domain, m: int):
    """Grid shapes (nx, ny) with cell aspect within 3:2 whose expected count inside the domain is near m."""
    xmin, ymin, xmax, ymax = domain.geometry.bounds
    width, height = xmax - xmin, ymax - ymin
    fill = domain.geometry.area / (width * height)
    out = []
    for nx in range(1, int(np.ceil(np.sqrt(3 * m / fill * width / height))) + 2):
        lo = max(1, int(np.floor(nx * height / width / 1.5)))
        hi = int(np.ceil(nx * height / width * 1.5))
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
    warnings.warn(f"no regular grid gives exactly {m} knots in this domain; using {len(best)} (nearest feasible)",
                  stacklevel=2)
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
            f"{' …' if outside.size > 5 else ''}; build knots with regular_knots/jittered_knots on this domain"
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
        half = self.resolution / 2
        return Affine.translation(self.x[0] - half, self.y[0] + half) @ Affine.scale(self.resolution, -self.resolution)

    def to_raster(self, values) -> np.ndarray:
        """Place per-point values (in `points` order) into a (ny, nx) array with NaN outside the domain."""
        out = np.full(self.mask.shape, np.nan)
        out[self.mask] = np.asarray(values, dtype=float)
        return out


def prediction_grid(domain: Domain, resolution: float, max_cells: int = 50_000_000) -> PredictionGrid:
    """Square cells of side `resolution` covering the domain's bounding box; cells whose centre is inside are kept."""
    if not resolution > 0:
        raise DataError(f"grid resolution must be > 0 (in the domain's CRS units), got {resolution!r}")
    xmin, ymin, xmax, ymax = domain.geometry.bounds
    nx = max(1, int(np.ceil((xmax - xmin) / resolution)))
    ny = max(1, int(np.ceil((ymax - ymin) / resolution)))
    if nx * ny > max_cells:
        raise DataError(f"resolution {resolution} gives {nx}×{ny} cells (> {max_cells}); use a coarser resolution")
    x = xmin + (np.arange(nx) + 0.5) * resolution
    y = ymax - (np.arange(ny) + 0.5) * resolution
    yy, xx = np.meshgrid(y, x, indexing="ij")
    mask = domain.contains(np.column_stack([xx.ravel(), yy.ravel()])).reshape(ny, nx)
    return PredictionGrid(x, y, mask, float(resolution), domain.crs)
