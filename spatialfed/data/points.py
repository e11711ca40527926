"""Tables of points coming in (prediction locations, covariate points, knots): one reader for columns, CRS and
reprojection, shared by `spatialfed predict --locations`, `map --covariates`, `fit --knots FILE` and the estimator.

- Coordinates: the columns named by the caller (`--x COL --y COL`, ``coords=``), matched case-insensitively; else a
  GeoDataFrame's point geometry (GeoPackage, GeoParquet, ...); else the first pair of `COORD_PAIRS` found (x/y,
  lon/lat, long/lat, lng/lat, longitude/latitude, easting/northing, in any case).
- CRS: the file's own (GeoPackage, GeoParquet, ...) or the one given (`--crs`, ``crs=``); a table with neither is
  taken in the target (the store's) CRS, and refused when its values look like lon/lat while that CRS is projected.
- `PointTable.in_crs(target)` reprojects with pyproj (`crs.project`); every refusal is one line naming the fix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd

from spatialfed.data.coords import check_coordinates
from spatialfed.data.crs import check_lonlat, crs_name, looks_geographic, parse_crs, project
from spatialfed.errors import DataError, option

CSV_SUFFIXES = (".csv", ".txt")
VECTOR_SUFFIXES = (".gpkg", ".geojson", ".json", ".shp", ".fgb")
PARQUET_SUFFIXES = (".parquet", ".geoparquet")
#: coordinate column pairs detected when none is named (compared case-insensitively)
COORD_PAIRS = (("x", "y"), ("lon", "lat"), ("long", "lat"), ("lng", "lat"), ("longitude", "latitude"),
               ("easting", "northing"))


@dataclass(frozen=True)
class Hints:
    """How the caller's user names the columns and the CRS: command-line flags or Python parameters."""

    columns: str = "--x COL --y COL"
    crs: str = "--crs"
    lonlat: str = "--crs EPSG:4326"


CLI = Hints()
#: the keyword arguments of predict, predict_to_file and make_map (the estimator passes its own)
PYTHON = Hints(columns="x='COL', y='COL'", crs="crs=", lonlat="crs='EPSG:4326'")


def caller_hints() -> Hints:
    """The hints in the spelling of the interface that called (spatialfed.errors.option)."""
    return option(PYTHON, CLI)


@dataclass
class PointTable:
    """Points as given: `xy` (n×2) in `crs` (None: not stated), from the columns `names` (or the geometry), with the
    table's other columns in `columns`; `source` names them in messages."""

    xy: np.ndarray
    crs: object
    names: tuple
    columns: pd.DataFrame
    source: str
    hints: Hints = CLI
    from_geometry: bool = False

    def arrived_in(self, arrived) -> "PointTable":
        """Points without a CRS of their own whose values look like lon/lat are taken in `arrived` when it is
        geographic: the CRS a store's points came in (its "input_crs": lon/lat ingested with --crs EPSG:4326), so
        lon/lat is reprojected without being told twice. Returns self."""
        arrived = parse_crs(arrived)
        if self.crs is None and arrived is not None and arrived.is_geographic and \
                looks_geographic(self.xy[:, 0], self.xy[:, 1], self.names):
            self.crs = arrived
        return self

    def in_crs(self, target) -> np.ndarray:
        """The points' x/y in `target` (the store's CRS; None = planar units), reprojected from their own CRS."""
        target = parse_crs(target)
        xy, name = self.xy, crs_name(target)
        if self.crs is None:
            if target is not None and target.is_projected and looks_geographic(xy[:, 0], xy[:, 1], self.names):
                raise DataError(f"the coordinates {list(self.names)} of {self.source} look like longitude/latitude "
                                f"but the store is in {name} (metres); give their CRS ({self.hints.lonlat}) "
                                f"to have them reprojected, or convert them to {name}")
            return xy
        if target is None:
            raise DataError(f"{self.source} is in {crs_name(self.crs)} but the store has planar units (no CRS); give "
                            f"points in the store's units without a CRS"
                            + (f" (drop {self.hints.crs})" if self.hints.crs.startswith("--") else ""))
        if parse_crs(self.crs) == target:
            return xy
        if parse_crs(self.crs).is_geographic:
            check_lonlat(xy[:, 0], xy[:, 1])
        return project(xy, self.crs, target).xy

    def given_columns(self, taken=()) -> pd.DataFrame:
        """The coordinates as given, under their own column names (`<name>_input` where a name is in `taken`, or
        x_input/y_input for a geometry), for writing beside the reprojected ones."""
        names = ("x", "y") if self.from_geometry else self.names
        out = [f"{n}_input" if (self.from_geometry or n in taken) else n for n in names]
        return pd.DataFrame({out[0]: self.xy[:, 0], out[1]: self.xy[:, 1]})


def read_file(path) -> pd.DataFrame:
    """A table of points as read by pandas (CSV, plain Parquet) or geopandas (vector files, GeoParquet)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"points file {path} {'is a directory' if path.is_dir() else 'does not exist'}")
    suffix = path.suffix.lower()
    known = CSV_SUFFIXES + VECTOR_SUFFIXES + PARQUET_SUFFIXES
    if suffix not in known:
        raise DataError(f"cannot read points from {path}: unknown extension {suffix or '(none)'}; use one of "
                        f"{', '.join(known)}")
    try:
        if suffix in CSV_SUFFIXES:
            return pd.read_csv(path)
        if suffix in PARQUET_SUFFIXES:
            try:
                return gpd.read_parquet(path)
            except ValueError:  # plain Parquet without geo metadata
                return pd.read_parquet(path)
        return gpd.read_file(path)
    except Exception as exc:  # parsers raise many unrelated types
        raise DataError(f"cannot read points from {path}: {exc}") from None


def coordinate_columns(columns, x=None, y=None) -> tuple | None:
    """The (x, y) column names of a table: the ones named (matched case-insensitively when not exact), else the
    first of COORD_PAIRS present in any case; None when neither is found (or, for named ones, DataError)."""
    columns = [str(c) for c in columns]

    def find(name):
        return find_column(columns, name)

    if x is not None or y is not None:
        if x is None or y is None:
            raise DataError("name both coordinate columns (x and y), or neither to have them detected")
        found = (find(x), find(y))
        return found if None not in found else None
    for pair in COORD_PAIRS:
        found = (find(pair[0]), find(pair[1]))
        if None not in found:
            return found
    return None


def find_column(columns, name) -> str | None:
    """The column called `name`, matched case-insensitively when no column has it exactly (None when absent or
    ambiguous)."""
    columns = [str(c) for c in columns]
    if name in columns:
        return name
    hits = [c for c in columns if c.lower() == str(name).lower()]
    return hits[0] if len(hits) == 1 else None


def point_table(frame: pd.DataFrame, *, x=None, y=None, crs=None, source: str = "the points",
                hints: Hints | None = None) -> PointTable:
    """A PointTable from a DataFrame (coordinate columns named or detected) or a GeoDataFrame of points."""
    hints = hints or caller_hints()
    frame = frame.reset_index(drop=True)
    given = parse_crs(crs)
    if (x is None) != (y is None):
        raise DataError(f"name both coordinate columns of {source} ({hints.columns}), or neither to have them "
                        "detected")
    is_geo = isinstance(frame, gpd.GeoDataFrame)
    pair = None if is_geo and x is None and y is None else coordinate_columns(frame.columns, x, y)
    if pair is None and (x is not None or not is_geo):
        absent = [c for c in (x, y) if c is not None and find_column(frame.columns, c) is None]
        wanted = (f"column{'s' * (len(absent) > 1)} {' and '.join(map(repr, absent))}" if x is not None
                  else "coordinate columns (x/y or lon/lat, any case)")
        raise DataError(f"{source} has no {wanted} among {[str(c) for c in frame.columns if c != 'geometry']}; "
                        f"name them with {hints.columns}" + ("" if is_geo else " or give a point GeoPackage"))
    if pair is not None:
        xy = np.column_stack([pd.to_numeric(frame[c], errors="coerce").to_numpy(float) for c in pair])
        rest = frame.drop(columns=list(pair))
        if is_geo:
            rest = pd.DataFrame(rest.drop(columns=frame.geometry.name))
        table = PointTable(xy, _own_crs(frame.crs if is_geo else None, given, source, hints), pair, rest, source,
                           hints)
    else:
        kinds = set(frame.geom_type.dropna())
        if kinds - {"Point"} or frame.geometry.isna().any() or frame.geometry.is_empty.any():
            raise DataError(f"{source} must hold point geometries (locations), found {sorted(kinds) or 'empty geometries'}; "
                            "convert polygons to centroids first")
        xy = np.column_stack([frame.geometry.x, frame.geometry.y])
        table = PointTable(xy, _own_crs(frame.crs, given, source, hints), ("x", "y"),
                           pd.DataFrame(frame.drop(columns=frame.geometry.name)), source, hints, from_geometry=True)
    table.xy = check_coordinates(table.xy, what=f"points in {Path(source).name}")
    return table


def _own_crs(own, given, source: str, hints: Hints):
    """The points' CRS: the file's own, else the one given; one line when both are known and differ."""
    if own is not None and given is not None and own != given:
        raise DataError(f"{source} is in {crs_name(own)} but {hints.crs} says {crs_name(given)}; drop {hints.crs} "
                        "(the file's CRS is used)")
    return own if own is not None else given


def read_point_table(path, *, x=None, y=None, crs=None, hints: Hints | None = None) -> PointTable:
    """`point_table` of a CSV / GeoPackage / GeoParquet / vector file."""
    return point_table(read_file(path), x=x, y=y, crs=crs, source=str(path), hints=hints)
