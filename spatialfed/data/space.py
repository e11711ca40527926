"""The coordinates a fitted covariance is isotropic in, and the maps to them from a store's (docs/equations.md,
"Covariance options"):

    Linear(A):            x = A s, a fitted geometric anisotropy (Eq. 25);
    Chordal(crs, R):      x = R p(lon, lat) ∈ ℝ³, (lon, lat) the store's point s in EPSG:4326 and p its unit vector,
                          so that ‖x − x'‖ = 2R sin(θ/2) is the chordal distance (θ the angle at the Earth's centre;
                          Eq. 26), R the Earth's mean radius in the store CRS's length unit.

The sites map their locations on load and the server the knots and prediction points, so every kernel, residual and
predictor runs unchanged on the mapped points (chordal: Euclidean distance in ℝ³, a Matérn valid on the sphere for
every ν). `back` maps points (the sites shown on a map, a site's hull) to the store's coordinates again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pyproj import CRS, Transformer

from spatialfed.data.crs import crs_name, crs_string, parse_crs
from spatialfed.errors import DataError, option
from spatialfed.model.family import EARTH_RADIUS_KM, unit_vectors
from spatialfed.model.names import DISTANCES


@dataclass(frozen=True)
class Linear:
    """x = A s (A 2×2, nested tuples: a fitted anisotropy's MaternFamily.metric)."""

    A: tuple

    def forward(self, s) -> np.ndarray:
        return np.asarray(s, dtype=float).reshape(-1, 2) @ np.asarray(self.A).T

    def back(self, x) -> np.ndarray:
        return np.asarray(x, dtype=float).reshape(-1, 2) @ np.linalg.inv(np.asarray(self.A)).T


@dataclass(frozen=True)
class Chordal:
    """x = R p(lon, lat): Earth-centred coordinates (in the store CRS's length unit) of points in the store `crs`."""

    crs: str
    radius: float

    def forward(self, s) -> np.ndarray:
        x = self._earth_centred(s)
        if not np.isfinite(x).all():
            raise DataError(f"{int((~np.isfinite(x).all(axis=1)).sum())} point(s) have no longitude/latitude in "
                            f"{crs_name(self.crs)}; check the points' coordinates")
        return x

    def _earth_centred(self, s) -> np.ndarray:
        s = np.asarray(s, dtype=float).reshape(-1, 2)
        lon, lat = Transformer.from_crs(self.crs, "EPSG:4326", always_xy=True).transform(s[:, 0], s[:, 1])
        with np.errstate(invalid="ignore"):  # no lon/lat (inf): NaN rows, which forward names and has_lonlat drops
            return self.radius * unit_vectors(np.column_stack([lon, lat]))

    def on_sphere(self, s) -> np.ndarray:
        """`forward` of the points of `s` that have a longitude/latitude, the others dropped."""
        x = self._earth_centred(s)
        return x[np.isfinite(x).all(axis=1)]

    def has_lonlat(self, s) -> np.ndarray:
        """Which points of the store's plane have a longitude/latitude (a global equal-area plane is a disk)."""
        return np.isfinite(self._earth_centred(s)).all(axis=1)

    def region(self):
        """The part of the store's plane that maps to the sphere, as a shapely polygon, for the equal-area projection
        ingest uses for wide lon/lat data (a disk of radius 2R about its origin, less 0.1 %); None for other CRSs."""
        import shapely

        op = CRS(self.crs).coordinate_operation
        if op is None or op.method_name != "Lambert Azimuthal Equal Area":
            return None
        values = {p.name: p.value for p in op.params}
        return shapely.Point(values.get("False easting", 0.0), values.get("False northing", 0.0)).buffer(
            2.0 * self.radius * 0.999, quad_segs=64)

    def back(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=float).reshape(-1, 3)
        lon = np.degrees(np.arctan2(x[:, 1], x[:, 0]))
        lat = np.degrees(np.arcsin(np.clip(x[:, 2] / np.linalg.norm(x, axis=1), -1.0, 1.0)))
        xs, ys = Transformer.from_crs("EPSG:4326", self.crs, always_xy=True).transform(lon, lat)
        return np.column_stack([xs, ys])

    def arc_degrees(self, d: float) -> float:
        """The angle (degrees of arc) at the Earth's centre whose chord is d (the CRS's unit): 2 asin(d / 2R)."""
        return float(np.degrees(2.0 * np.arcsin(min(float(d) / (2.0 * self.radius), 1.0))))

    @property
    def km(self) -> float:
        """Kilometres per unit of the CRS."""
        return EARTH_RADIUS_KM / self.radius


def chordal(crs) -> Chordal:
    """The Chordal map of a store in `crs`; a store in planar units (no CRS) has no longitude/latitude: refused."""
    parsed = parse_crs(crs)
    if parsed is None:
        raise DataError(f"distance='chordal' needs the store's CRS to find each point's longitude/latitude, and this "
                        f"store is in planar units; give the data's CRS at ingest ({option('crs=', '--crs')}), or fit "
                        "with planar distances")
    if parsed.is_geographic:  # stores are projected at ingest; a geographic CRS here is a hand-made store
        raise DataError(f"the store's CRS {crs_name(parsed)} is in degrees; ingest the data again (lon/lat is "
                        "projected to metres) to fit with chordal distances")
    factor = CRS(parsed).axis_info[0].unit_conversion_factor or 1.0  # metres per unit
    return Chordal(crs_string(parsed), EARTH_RADIUS_KM * 1000.0 / factor)


def check_distance(distance) -> str:
    """The `distance` setting: "planar" or "chordal" (None: "planar")."""
    if distance is None:
        return "planar"
    if distance not in DISTANCES:
        raise ValueError(f"distance must be one of {', '.join(map(repr, DISTANCES))}, got {distance!r}")
    return distance
