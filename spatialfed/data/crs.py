"""Coordinate reference systems (pyproj): parsing, short names, lon/lat detection and the projection of lon/lat data
(UTM within one zone, else a Lambert azimuthal equal-area projection centred on the data).
"""

from __future__ import annotations

import warnings
from typing import NamedTuple

import numpy as np
from pyproj import CRS, Proj, Transformer
from pyproj.aoi import AreaOfInterest
from pyproj.crs import ProjectedCRS
from pyproj.crs.coordinate_operation import LambertAzimuthalEqualAreaConversion
from pyproj.database import query_utm_crs_info
from pyproj.exceptions import CRSError

from spatialfed.errors import DataError, option, warn

PLANAR = ("planar", "none")        # what users write for "planar units, no CRS" (--crs planar)
LON_NAMES = ("lon", "long", "lng", "longitude", "x_lon", "lon_deg", "longitude_deg")
LAT_NAMES = ("lat", "latitude", "y_lat", "lat_deg", "latitude_deg")


def parse_crs(crs) -> CRS | None:
    """A pyproj CRS from 'EPSG:xxxx', WKT, a PROJ string or a CRS; None (or 'planar'/'none') is planar units."""
    if crs is None or isinstance(crs, CRS):
        return crs
    if isinstance(crs, str) and crs.strip().lower() in PLANAR:
        return None
    try:
        return CRS.from_user_input(crs)
    except CRSError as exc:
        raise DataError(f"unknown CRS {crs!r} ({exc}); give an EPSG code such as EPSG:4326 or EPSG:28992") from None


def crs_string(crs) -> str | None:
    """The CRS as stored in files: 'EPSG:xxxx' when it has an EPSG code, another authority's exact code
    ('ESRI:102003'), else its WKT; None for planar units. For display use `crs_name`."""
    crs = parse_crs(crs)
    if crs is None:
        return None
    code = crs.to_epsg()
    if code is not None:
        return f"EPSG:{code}"
    authority = crs.to_authority(min_confidence=100)
    return ":".join(authority) if authority else crs.to_wkt()


def crs_name(crs) -> str | None:
    """Short display name of a CRS: 'EPSG:28992', another authority code ('ESRI:102003'), else the CRS's own name
    (e.g. 'WGS 84 / LAEA centred 40.62N 88.27W'), never a WKT; None for planar units."""
    crs = parse_crs(crs)
    if crs is None:
        return None
    authority = crs.to_authority()
    if authority:
        return ":".join(authority)
    if crs.name and crs.name.lower() != "unknown":
        return crs.name
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)       # "you will likely lose information": display only
        return crs.to_proj4() or crs.type_name

def check_lonlat(lon, lat) -> None:
    """Raise DataError unless longitudes lie in [−180, 180] and latitudes in [−90, 90]."""
    lon, lat = np.asarray(lon, dtype=float), np.asarray(lat, dtype=float)
    bad = ~((np.abs(lon) <= 180) & (np.abs(lat) <= 90))
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise DataError(
            f"{int(bad.sum())} point(s) are outside lon [-180, 180] / lat [-90, 90], e.g. row {i}: "
            f"({lon[i]}, {lat[i]}); check that x is longitude and y latitude, or give the data's real CRS"
        )


def looks_geographic(x, y, names=(None, None)) -> bool:
    """Whether coordinates given without a CRS are probably lon/lat: every x in [−180, 180] and y in [−90, 90],
    and either the columns are named like lon/lat or the points are not confined to the unit square [0, 1]²
    (the simulated designs of SPEC §7)."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size == 0 or not (np.all(np.abs(x) <= 180) and np.all(np.abs(y) <= 90)):
        return False
    xname, yname = (str(n).strip().lower() if n is not None else "" for n in names)
    if xname in LON_NAMES or yname in LAT_NAMES:
        return True
    unit_square = x.min() >= 0 and y.min() >= 0 and x.max() <= 1 and y.max() <= 1
    return not unit_square


def check_degrees_mislabelled(x, y, crs, what: str = "coordinates", names=(None, None), fix: str = "") -> None:
    """Refuse coordinates that look like lon/lat degrees under a projected `crs` whose area of use they miss
    (degrees labelled EPSG:28992): every distance would be read in its units (a range of "11 m" for 11 km).
    A refusal, not a warning: no number fitted from them would mean anything."""
    crs = parse_crs(crs)
    if crs is None or not crs.is_projected or not looks_geographic(x, y, names) or not outside_area_of_use(x, y, crs):
        return
    fix = fix or (f"give {option('crs=EPSG:4326', '--crs EPSG:4326')} if they are degrees (they are then projected "
                  "to metres), or the CRS they are in")
    raise DataError(f"{what} look like longitude/latitude and lie outside the area of use of {crs_name(crs)}, a "
                    f"projected CRS: they are not in its units; {fix}")


def outside_area_of_use(x, y, crs) -> bool:
    """Whether the points' bounding box misses the area of use of the projected `crs` altogether (its lon/lat
    bounds, projected): coordinates labelled with the wrong CRS, e.g. degrees called EPSG:28992. False when the CRS
    records no area of use."""
    from pyproj import Transformer

    area = getattr(crs, "area_of_use", None)
    if area is None or not getattr(crs, "is_projected", False):
        return False
    to_crs = Transformer.from_crs("EPSG:4326", crs, always_xy=True)
    xmin, ymin, xmax, ymax = to_crs.transform_bounds(area.west, area.south, area.east, area.north)
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    return bool(x.max() < xmin or x.min() > xmax or y.max() < ymin or y.min() > ymax)


def utm_zone(lon) -> np.ndarray:
    """UTM zone numbers 1…60 of longitudes (6° bands from −180°; the Norway/Svalbard exceptions are ignored)."""
    lon = (np.asarray(lon, dtype=float) + 180.0) % 360.0
    return np.clip(np.floor(lon / 6.0).astype(int) + 1, 1, 60)


def utm_crs(lon, lat) -> CRS:
    """The WGS 84 UTM zone CRS (metres) containing the centroid of the given lon/lat points."""
    lon_c, lat_c = float(np.mean(lon)), float(np.mean(lat))
    info = query_utm_crs_info(
        datum_name="WGS 84", area_of_interest=AreaOfInterest(lon_c, lat_c, lon_c, lat_c)
    )
    if not info:
        raise DataError(f"no UTM zone covers lon/lat ({lon_c:.3f}, {lat_c:.3f}); pass a projected target CRS")
    return CRS.from_epsg(int(info[0].code))


def laea_crs(lon0: float, lat0: float) -> CRS:
    """WGS 84 Lambert azimuthal equal-area projection (metres) centred at (lon0, lat0), named after its centre."""
    name = (f"WGS 84 / LAEA centred {abs(lat0):.2f}{'N' if lat0 >= 0 else 'S'} "
            f"{abs(lon0):.2f}{'E' if lon0 >= 0 else 'W'}")
    return CRS(ProjectedCRS(LambertAzimuthalEqualAreaConversion(lat0, lon0), name=name))


def _lon_extent(lon) -> tuple[float, float]:
    """Westmost and eastmost longitude (° in [−180, 180)) of a point set, across the antimeridian if shorter."""
    lon = np.radians(np.asarray(lon, dtype=float))
    mean = np.degrees(np.arctan2(np.sin(lon).mean(), np.cos(lon).mean()))
    rel = (np.degrees(lon) - mean + 180.0) % 360.0 - 180.0           # longitudes relative to the circular mean
    west, east = ((mean + r + 180.0) % 360.0 - 180.0 for r in (rel.min(), rel.max()))
    return float(west), float(east)


def lonlat_centre(lon, lat) -> tuple[float, float]:
    """Centre of the lon/lat bounding box, rounded to 0.01°, taking longitudes across the antimeridian correctly."""
    west, east = _lon_extent(lon)
    lon0 = (west + ((east - west) % 360.0) / 2 + 180.0) % 360.0 - 180.0
    lat = np.asarray(lat, dtype=float)
    return round(float(lon0), 2), round(float((lat.min() + lat.max()) / 2), 2)


def scale_error(crs: CRS, lon, lat, max_points: int = 20_000) -> float:
    """Largest relative error of distances (max |scale factor − 1| along meridians and parallels) at the points
    (above `max_points`: at a seeded sample plus the points extreme in lon, lat and their sums and differences,
    where the distortion of a projection centred on the data peaks)."""
    lon, lat = np.asarray(lon, dtype=float), np.asarray(lat, dtype=float)
    if lon.size > max_points:
        extremes = [f(v) for v in (lon, lat, lon + lat, lon - lat) for f in (np.argmin, np.argmax)]
        keep = np.union1d(np.random.default_rng(0).choice(lon.size, max_points, replace=False), extremes)
        lon, lat = lon[keep], lat[keep]
    factors = Proj(crs).get_factors(lon, lat)
    h, k = np.asarray(factors.meridional_scale), np.asarray(factors.parallel_scale)
    return float(np.nanmax(np.abs(np.concatenate([h, k]) - 1.0)))


def lonlat_projection(lon, lat) -> tuple[CRS, str]:
    """Metric CRS for lon/lat data and a note naming the choice: the UTM zone when every point lies in one zone
    (latitudes −80°…84°), else a Lambert azimuthal equal-area projection centred on the data (one UTM zone would
    stretch distances far from its central meridian). The note states the largest distance error over the data."""
    lon, lat = np.asarray(lon, dtype=float), np.asarray(lat, dtype=float)
    zones = np.unique(utm_zone(lon))
    if len(zones) == 1 and lat.min() >= -80 and lat.max() <= 84:
        crs = utm_crs(lon, lat)
        note = f"lon/lat lie in UTM zone {zones[0]}: projected to {crs_name(crs)}"
    else:
        lon0, lat0 = lonlat_centre(lon, lat)
        crs = laea_crs(lon0, lat0)
        west, east = _lon_extent(lon)
        span = (f"UTM zones {utm_zone(west)} to {utm_zone(east)}" if len(zones) > 1
                else "polar latitudes outside UTM")
        note = (f"lon/lat spans {span}: a Lambert azimuthal equal-area projection centred on the data is used "
                "instead of one UTM zone (areas exact")
    error = scale_error(crs, lon, lat)
    note += f"{', ' if note.endswith('exact') else ' ('}distances within {100 * error:.2g}% over the data)"
    if error > 0.02:
        warn(f"{note}: more than 2% distortion, the data span too much of the globe for one planar CRS (a fit's "
             "chordal distances, its default for data over 1,000 km, stay exact; maps are drawn in it); "
             f"split the study area or give {option('target_crs=', '--target-crs')}")
    return crs, note


class Projection(NamedTuple):
    """Projected coordinates, their CRS (None = planar units) and a note naming an automatic CRS choice."""

    xy: np.ndarray
    crs: CRS | None
    note: str | None = None


def project(xy, crs, target=None) -> Projection:
    """Project x/y from `crs` to `target`; without a target keep a projected CRS and send lon/lat to
    `lonlat_projection` (UTM for one zone, a centred equal-area projection for wider data)."""
    xy = np.asarray(xy, dtype=float)
    crs, target = parse_crs(crs), parse_crs(target)
    if crs is None:
        if target is not None:
            raise DataError(f"cannot reproject coordinates with no CRS; give the source CRS "
                            f"({option('crs=', '--crs')}) as well")
        return Projection(xy, None)
    note = None
    if crs.is_geographic:
        check_lonlat(xy[:, 0], xy[:, 1])
        if target is None:
            target, note = lonlat_projection(xy[:, 0], xy[:, 1])
    if target is None or target == crs:
        return Projection(xy, crs)
    if target.is_geographic:
        raise DataError(f"target CRS {crs_name(target)} is geographic (degrees); distances need a projected CRS")
    x, y = Transformer.from_crs(crs, target, always_xy=True).transform(xy[:, 0], xy[:, 1])
    out = np.column_stack([x, y])
    if not np.isfinite(out).all():
        raise DataError(f"{int((~np.isfinite(out).all(axis=1)).sum())} point(s) fall outside where "
                        f"{crs_name(target)} is defined; choose a target CRS that covers the data")
    return Projection(out, target, note)


def to_projected(xy, crs, target=None) -> tuple[np.ndarray, CRS | None]:
    """`project` without the note: (xy, crs)."""
    xy, crs, _ = project(xy, crs, target)
    return xy, crs
