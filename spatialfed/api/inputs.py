"""What ``FederatedGP.fit`` and ``predict`` accept besides a store path: DataFrames, GeoDataFrames and arrays.

The partitioned store (SPEC §5) is the federated contract: each site holds its own partition and nothing else.
In-memory data are a convenience (notebooks, tests, cross-validation): ``fit_store`` writes them to a temporary
store with ``spatialfed.data.ingest.ingest_frame`` (same checks, projection and partitions as ``spatialfed ingest``),
which lives as long as the estimator that fitted it (prediction needs the sites' data for the residual part); a
pickled copy carries the store's files into a temporary store of its own, and ``save`` copies it into the fit
directory (``api.loading``).

Coordinates come from, in order: ``coords=`` (an n×2 array or a pair of column names), a GeoDataFrame's point
geometry (with its CRS), or the columns x/y, lon/lat or longitude/latitude of a DataFrame, in any case
(``data.points.coordinate_columns``, the detection ``spatialfed predict --locations`` uses). Every other column of a
DataFrame is a covariate (an intercept is added), except the partition column named by ``groups="agency"``, unless
``covariates=[...]`` names them; inferred covariates are screened and announced (``api.covariates``).
"""

from __future__ import annotations

import difflib

import os
import shutil
import tempfile
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd

from spatialfed.api import covariates as covariates_module
from spatialfed.api import signals
from spatialfed.data import geometry, points
from spatialfed.errors import DataError, warn

VALUE, SITE = "__value__", "__site__"   # the temporary store's value and partition columns (never covariates)


@dataclass
class Points:
    """Locations (n×2, in `crs`), their covariates (a DataFrame, n×p, user column names) and where they came from."""

    xy: np.ndarray
    crs: object
    covariates: pd.DataFrame
    coord_names: tuple
    from_arrays: bool = False   # covariates given as an array: matched to the fitted ones by position


class TemporaryStore:
    """A store directory (private: mkdtemp's 0700) removed when this object is garbage-collected, at interpreter exit
    (also after a SIGTERM or SIGHUP: api.signals), or on ``cleanup()``."""

    def __init__(self):
        signals.stop_as_interrupt()  # a SIGTERM/SIGHUP runs the exit handlers (Python's default skips them)
        self.dir = Path(tempfile.mkdtemp(prefix="spatialfed-"))
        self.path = self.dir / "data.zarr"
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.dir), ignore_errors=True)

    def cleanup(self) -> None:
        self._finalizer()

    def __reduce__(self):
        """A pickled copy (joblib, multiprocessing, deepcopy) carries the store's files and unpickles into a
        temporary store of its own, so it predicts after this one is removed (the estimator then points its
        ``store_`` there: ``follow_temporary_store``)."""
        files = {str(f.relative_to(self.path)): f.read_bytes() for f in sorted(self.path.rglob("*")) if f.is_file()}
        return (_restored, (files,))


def _restored(files: dict) -> TemporaryStore:
    store = TemporaryStore()
    for name, data in files.items():
        (store.path / name).parent.mkdir(parents=True, exist_ok=True)
        (store.path / name).write_bytes(data)
    return store


def follow_temporary_store(gp) -> None:
    """After unpickling: an estimator fitted on in-memory data uses its own copy of the temporary store."""
    temporary = gp.__dict__.get("_temporary_store")
    if temporary is not None and hasattr(gp, "store_"):
        gp.store_ = str(temporary.path)


def is_store_path(X) -> bool:
    return isinstance(X, (str, os.PathLike))


def read_points(X, coords=None, crs=None, *, drop=()) -> Points:
    """Points from a DataFrame/GeoDataFrame (coordinates as described in the module docstring; columns in `drop`
    left out of the covariates) or from arrays (X n×p covariates or None, coords n×2)."""
    if isinstance(X, pd.DataFrame):
        return _frame_points(X, coords, crs, drop)
    if coords is None:
        raise DataError("give the locations: coords= an (n, 2) array of x/y (or lon/lat with crs='EPSG:4326'), or "
                        "pass X as a DataFrame with x/y columns or a GeoDataFrame of points")
    xy = _xy_array(coords)
    if X is None:
        cov = pd.DataFrame(index=range(len(xy)))
    else:
        arr = np.asarray(X, dtype=float)
        arr = arr.reshape(-1, 1) if arr.ndim == 1 else arr
        if arr.ndim != 2 or len(arr) != len(xy):
            raise DataError(f"X must be an (n, p) array of covariates with one row per location (n = {len(xy)} "
                            f"from coords), got shape {np.shape(X)}")
        cov = pd.DataFrame(arr, columns=[f"x{j}" for j in range(arr.shape[1])])
    return Points(xy, geometry.parse_crs(crs), cov, ("x", "y"), from_arrays=True)


def _xy_array(coords) -> np.ndarray:
    xy = np.asarray(coords, dtype=float)
    if xy.ndim != 2 or xy.shape[1] != 2:
        raise DataError(f"coords must be an (n, 2) array of x/y coordinates, got shape {xy.shape}")
    return xy


def _frame_points(frame: pd.DataFrame, coords, crs, drop) -> Points:
    frame = frame.reset_index(drop=True)
    source = geometry.parse_crs(crs)
    if isinstance(frame, gpd.GeoDataFrame) and coords is None:
        kinds = set(frame.geom_type.dropna())
        if kinds - {"Point"} or frame.geometry.isna().any():
            raise DataError(f"the GeoDataFrame holds {sorted(kinds)} geometries; give points (e.g. "
                            "gdf.set_geometry(gdf.centroid)) or coords=")
        xy = np.column_stack([frame.geometry.x, frame.geometry.y])
        if frame.crs is not None:
            source = frame.crs        # the GeoDataFrame's own CRS takes precedence over crs=
        rest, names = pd.DataFrame(frame.drop(columns=frame.geometry.name)), ("x", "y")
    elif coords is not None and not (isinstance(coords, (tuple, list)) and len(coords) == 2
                                     and all(isinstance(c, str) for c in coords)):
        xy, rest, names = _xy_array(coords), pd.DataFrame(frame), ("x", "y")
        if len(xy) != len(frame):
            raise DataError(f"coords has {len(xy)} rows but X has {len(frame)}")
    else:
        pair = points.coordinate_columns(frame.columns, *(coords if coords is not None else (None, None)))
        if pair is None:
            wanted = tuple(coords) if coords is not None else "x/y, lon/lat or longitude/latitude (any case)"
            raise DataError(f"X has no coordinate columns {wanted}; name them with coords=('east', 'north'), give "
                            "coords= an (n, 2) array, or pass a GeoDataFrame")
        xy = frame[list(pair)].apply(pd.to_numeric, errors="coerce").to_numpy(float)
        rest, names = pd.DataFrame(frame.drop(columns=list(pair))), pair
    rest = rest.drop(columns=[c for c in drop if c is not None and c in rest.columns])
    rest.columns = [str(c) for c in rest.columns]
    return Points(xy, source, rest, names)


def numeric_covariates(cov: pd.DataFrame) -> pd.DataFrame:
    """The covariate columns as floats; one DataError naming the non-numeric ones."""
    bad = [c for c in cov.columns if not (pd.api.types.is_numeric_dtype(cov[c]) or pd.api.types.is_bool_dtype(cov[c]))]
    if bad:
        raise DataError(f"X has non-numeric column(s) {bad}; every column of X other than the coordinates, y and "
                        "the groups column is a covariate unless you name them: pass covariates=[...], drop them "
                        "(X.drop(columns=[...])) or encode them as numbers")
    return cov.astype(float)


def check_crs_given(points: Points) -> None:
    """lon/lat without a CRS is refused with the fix (the same rule as `spatialfed ingest`)."""
    if points.crs is None and geometry.looks_geographic(points.xy[:, 0], points.xy[:, 1], points.coord_names):
        raise DataError(f"coordinates {points.coord_names} look like longitude/latitude but no CRS was given; pass "
                        "FederatedGP(crs='EPSG:4326') (they are then projected to metres), or crs='planar' if they are "
                        "planar units")


def fit_store(X, y=None, *, coords=None, groups=None, crs=None, n_sites=None, seed=0, covariates=None,
              transform=None):
    """(store path, TemporaryStore or None, whether the covariates were inferred): `X` itself when it is a store
    path, else a temporary store written by ingest_frame from the table or arrays (see the module docstring), with
    the `covariates` named (None: inferred and screened, ``api.covariates``)."""
    if is_store_path(X):
        given = [name for name, v in (("y", y), ("coords", coords), ("groups", groups)) if v is not None]
        if given:
            raise DataError(f"X is a store path ({X}); {', '.join(given)}= apply to in-memory data only: the store "
                            "already holds the values, locations and partition")
        if covariates is not None:
            raise DataError(f"X is a store path ({X}); its covariates were fixed when it was written (ingest's "
                            "covariates=): drop covariates=, or fit a DataFrame")
        return X, None, False
    from spatialfed.data.ingest import ingest_frame  # in-memory data only: a store path needs none of it

    group_col = groups if isinstance(groups, str) else None
    y_col = y if isinstance(y, str) else None
    points = read_points(X, coords, crs, drop=(group_col, y_col))
    check_crs_given(points)
    n = len(points.xy)
    frame = X.reset_index(drop=True) if isinstance(X, pd.DataFrame) else None
    z = _column(frame, y_col, "y") if y_col else _vector(y, n, "y")
    if points.from_arrays:   # an array X is its own explicit list of covariates
        if covariates is not None:
            what = "X is None (no covariates: an intercept-only model)" if X is None else \
                "with an array X every column is a covariate"
            raise DataError(f"covariates= names columns of a DataFrame X; {what}: drop covariates=, or pass X as a "
                            "DataFrame")
        cov, inferred = numeric_covariates(points.covariates), False
    else:
        chosen, inferred = covariates_module.select(points.covariates, z, covariates)
        cov = numeric_covariates(chosen)
        if inferred:
            covariates_module.announce(cov.columns)
    labels = None if groups is None else (_column(frame, group_col, "groups", numeric=False) if group_col
                                          else _vector(groups, n, "groups", numeric=False))
    xname, yname = (str(c) for c in points.coord_names)
    if xname in cov.columns or yname in cov.columns:
        xname, yname = "__x", "__y"
    table = pd.concat([pd.DataFrame({xname: points.xy[:, 0], yname: points.xy[:, 1], VALUE: z}), cov], axis=1)
    if labels is not None:
        table[SITE] = labels
    store = TemporaryStore()
    partition = f"column:{SITE}" if labels is not None else "area"
    J = None if labels is not None else n_sites   # None: partition.default_sites, as for spatialfed ingest
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        _, report = ingest_frame(table, store.path, value=VALUE, x=xname, y=yname, covariates=list(cov.columns),
                                 crs=points.crs if points.crs is not None else crs, partition=partition, n_workers=J,
                                 seed=seed, sites_option="n_sites=", transform=transform)
    if report.n_dropped:
        warn(f"{report.n_dropped} of {report.n_read} rows have missing values and were left out of the fit")
    return store.path, store, inferred and cov.shape[1] > 0


def _column(frame, name, what, numeric=True) -> np.ndarray:
    """Column `name` of the DataFrame X; one line listing X's columns (and the nearest name) when it has none."""
    if frame is None:
        raise DataError(f"{what}={name!r} names a column, but X is not a DataFrame; give {what} as an array of "
                        f"values, or X as a DataFrame with a column {name!r}")
    if name not in frame.columns:
        near = difflib.get_close_matches(str(name), [str(c) for c in frame.columns], n=1)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise DataError(f"{what}={name!r} is not a column of X; {hint}X's columns: "
                        f"{', '.join(map(str, frame.columns))}")
    if not numeric:
        return frame[name].astype(str).to_numpy()
    values = pd.to_numeric(frame[name], errors="coerce").to_numpy(float)
    bad = np.flatnonzero(np.isnan(values) & frame[name].notna().to_numpy())
    if bad.size:
        raise DataError(f"{what}={name!r}: {bad.size} value(s) are not numbers (e.g. {frame[name].iloc[bad[0]]!r} "
                        f"in row {bad[0]}); fix or drop those rows")
    return values


def observed_values(X, y) -> np.ndarray:
    """The observed values to score against: y itself, or the column of the DataFrame X that y names."""
    if isinstance(y, str):
        return _column(X.reset_index(drop=True) if isinstance(X, pd.DataFrame) else None, y, "y")
    return np.asarray(y, dtype=float).ravel()


def _vector(v, n: int, what: str, numeric=True) -> np.ndarray:
    if v is None:
        raise DataError(f"{what} is missing: fit(X, y, ...) needs the observed values with in-memory X")
    arr = np.asarray(v, dtype=float if numeric else object).ravel()
    if len(arr) != n:
        raise DataError(f"{what} has {len(arr)} values but X has {n} rows")
    return arr if numeric else np.array([str(a) for a in arr], dtype=object)


PYTHON = points.Hints(columns="coords=('east', 'north')", crs="crs=", lonlat="FederatedGP(crs='EPSG:4326')")


def to_store_crs(given: Points, store_crs, what: str = "the prediction points") -> np.ndarray:
    """The points' x/y in the store's CRS (reprojected when they have another CRS), with one-line refusals
    (``data.points.PointTable.in_crs``)."""
    xy = geometry.check_coordinates(given.xy, what="prediction coordinates")
    table = points.PointTable(xy, given.crs, tuple(given.coord_names), given.covariates, what, PYTHON)
    return table.in_crs(store_crs)


def prediction_design(points: Points, covariate_names) -> np.ndarray:
    """X₀ (n₀×p) for the fitted covariates: DataFrame columns by name ('intercept' added), array columns by
    position (as in fit)."""
    from spatialfed.outputs.prediction import design_matrix

    names = [str(c) for c in covariate_names]
    cov = points.covariates
    if points.from_arrays:
        fitted = [c for c in names if c != "intercept"]
        if cov.shape[1] != len(fitted):
            raise DataError(f"X has {cov.shape[1]} covariate column(s) but the fit used {len(fitted)} ({fitted})")
        cov = cov.set_axis(fitted, axis=1)
    return design_matrix(cov, names, "X")
