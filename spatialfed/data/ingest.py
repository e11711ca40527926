"""Turn a table of observations (CSV, GeoPackage, GeoParquet) into a partitioned store (SPEC §5–6).

Steps: read → check columns and numeric types → drop (and report) rows with missing values → validate the
coordinates (finite, sane magnitude, enough distinct locations; lon/lat without a CRS refused) → project lon/lat
to a metric CRS (UTM within one zone, else a centred equal-area projection) → handle duplicate coordinates → hold
out a test set → partition → write.
Every check runs before anything is written, and the store is written atomically, so a failure
never leaves a partial store behind.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd

from spatialfed.atomic import refuse_existing
from spatialfed.data import partition as partitions
from spatialfed.data.coords import MAX_ABS_VALUE
from spatialfed.data.crs import check_degrees_mislabelled
from spatialfed.data.geometry import PLANAR, check_coordinates, crs_name, crs_string, looks_geographic, parse_crs, \
    project
from spatialfed.data.points import coordinate_columns
from spatialfed.data.store import StoreInfo, write_store
from spatialfed.errors import DataError, option, warn
from spatialfed.model import transform as value_transform

DUPLICATES = ("error", "merge", "keep")
#: the Python spelling of advice (spatialfed.errors.option): crs= for lon/lat or planar, duplicates= merge or keep
LONLAT = ("crs='EPSG:4326'", "crs='planar'")
MERGE = ("duplicates='merge'", "duplicates='keep'")
GEO_SUFFIXES = (".gpkg", ".geojson", ".json", ".shp", ".fgb")
PARQUET_SUFFIXES = (".parquet", ".geoparquet")


@dataclass
class IngestReport:
    """What ingest did to the table: rows read, dropped, merged, held out, and the CRS used."""

    n_read: int = 0
    missing: dict = field(default_factory=dict)
    n_dropped: int = 0
    n_duplicates: int = 0
    duplicates: str = "error"
    n_test: int = 0
    crs_in: str | None = None
    crs_out: str | None = None
    crs_note: str | None = None
    sizes: list = field(default_factory=list)
    coords: tuple | None = None       # coordinate columns found by name (none given)

    def warnings(self) -> list[str]:
        """What the user should act on: rows dropped for missing values, with the count per column."""
        if not self.n_dropped:
            return []
        detail = ", ".join(f"{c}: {k}" for c, k in self.missing.items() if k)
        return [f"dropped {self.n_dropped} rows with missing values ({detail})"]

    def lines(self, warnings: bool = True) -> list[str]:
        """Human-readable summary, one fact per line (`warnings`: with those of `warnings()`)."""
        out = [f"read {self.n_read} rows"] + (self.warnings() if warnings else [])
        if self.coords:
            out.append(f"coordinates from columns {self.coords[0]}, {self.coords[1]} (found by name)")
        if self.n_duplicates:
            action = {"merge": "merged (averaged)", "keep": "kept"}[self.duplicates]
            out.append(f"{self.n_duplicates} rows had duplicate coordinates: {action}")
        if self.crs_in != self.crs_out:
            out.append(f"projected coordinates from {crs_name(self.crs_in)} to {crs_name(self.crs_out)}")
        if self.crs_note:
            out.append(self.crs_note)
        out.append(f"crs: {crs_name(self.crs_out) or 'none (planar units)'}")
        if self.n_test:
            out.append(f"held out {self.n_test} rows as the test set")
        shown = self.sizes if len(self.sizes) <= 10 else f"{min(self.sizes)}..{max(self.sizes)}"
        out.append(f"{sum(self.sizes)} rows over {len(self.sizes)} workers: sizes {shown}")
        return out


def read_table(path, layer: str | None = None) -> pd.DataFrame:
    """Read CSV with pandas, GeoPackage (and other vector files) or (Geo)Parquet with geopandas."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"table {path} {'is a directory, not a table file' if path.is_dir() else 'does not exist'}")
    suffix = path.suffix.lower()
    try:
        if suffix in PARQUET_SUFFIXES:
            try:
                return gpd.read_parquet(path)
            except ValueError:  # plain Parquet without geo metadata
                return pd.read_parquet(path)
        if suffix in GEO_SUFFIXES:
            return gpd.read_file(path, layer=layer)
        frame = pd.read_csv(path)
        with open(path, newline="", encoding="utf-8", errors="replace") as fh:
            header = next(csv.reader(fh), [])
        repeated = sorted({name for name in header if header.count(name) > 1})
        if repeated:  # pandas would silently rename the second one NAME.1
            raise DataError(f"{path}: duplicate column name(s) {repeated} in the header; rename them so that each "
                            "column has its own name")
        if frame.empty:
            raise DataError(f"{path} has a header but no data rows; nothing to ingest")
        return frame
    except DataError:
        raise
    except Exception as exc:  # parsers raise many unrelated types
        raise DataError(f"cannot read {path}: {exc}") from None


def _coordinates(frame: pd.DataFrame, x: str | None, y: str | None, crs):
    """x/y columns, or a GeoDataFrame's point geometry, and the CRS they are in."""
    geo_crs = frame.crs if isinstance(frame, gpd.GeoDataFrame) else None
    if crs is not None and geo_crs is not None and parse_crs(crs) != geo_crs:
        flag = option("crs=", "--crs")
        raise DataError(f"the file is in {crs_name(geo_crs)} but {flag} says {crs_name(crs) or 'planar'}; drop {flag} "
                        f"(the file's CRS is used) or use {option('target_crs=', '--target-crs')} to reproject")
    crs = parse_crs(crs) if crs is not None else geo_crs
    if x is not None and y is not None:
        return frame[x], frame[y], crs
    if x is not None or y is not None:
        raise DataError(f"give both {_xy()} (coordinate columns), or neither for a point GeoPackage/GeoParquet")
    if not isinstance(frame, gpd.GeoDataFrame):
        raise DataError(f"this table has no geometry and no coordinate columns found by name (x/y, lon/lat, "
                        f"long/lat, lng/lat, longitude/latitude, easting/northing, any case); name them with {_xy()}; "
                        f"its columns: {', '.join(map(str, frame.columns))}")
    kinds = set(frame.geometry.geom_type.dropna())
    if kinds - {"Point"}:
        raise DataError(f"the geometry holds {sorted(kinds)}, not points; give {_xy()} columns instead")
    return pd.Series(frame.geometry.x, index=frame.index), pd.Series(frame.geometry.y, index=frame.index), crs


def _xy() -> str:
    """The coordinate column options as the caller spells them."""
    return option("x= and y=", "--x and --y")


def _planar(crs) -> bool:
    """Whether the user said explicitly that the coordinates are planar units (--crs planar / none)."""
    return isinstance(crs, str) and crs.strip().lower() in PLANAR


def _numeric(series: pd.Series, name: str) -> np.ndarray:
    """Column as float, raising DataError naming rows whose non-empty values are not numbers."""
    values = pd.to_numeric(series, errors="coerce")
    bad = values.isna() & series.notna()
    if bad.any():
        rows = list(series.index[bad][:3])
        examples = ", ".join(f"row {r}: {series[r]!r}" for r in rows)
        raise DataError(f"column '{name}' has {int(bad.sum())} non-numeric value(s) ({examples}); "
                        "fix or blank them (blank values are dropped as missing)")
    return values.to_numpy(dtype=float)


def prepare(frame: pd.DataFrame, *, value: str, x: str | None = None, y: str | None = None, covariates=(),
            crs=None, target_crs=None, intercept: bool = True, duplicates: str = "error", group: str | None = None):
    """Validated (locs, z, X, covariate names, group values or None, crs string, report) from a table."""
    if duplicates not in DUPLICATES:
        raise DataError(f"duplicates must be one of {DUPLICATES}, got {duplicates!r}")
    covariates = list(covariates)
    names = (["intercept"] if intercept else []) + covariates
    if not names:
        raise DataError(f"the design matrix would have no columns; keep the intercept or give "
                        f"{option('covariates=', '--covariates')}")
    found = None
    if x is None and y is None and not isinstance(frame, gpd.GeoDataFrame):
        found = coordinate_columns(frame.columns)  # as predict and map find them (data.points)
        x, y = found or (None, None)
    wanted = [c for c in [x, y, value, *covariates, group] if c is not None]
    missing_cols = [c for c in dict.fromkeys(wanted) if c not in frame.columns]
    if missing_cols:
        sep = next((c for c in (";", "\t", "|") if len(frame.columns) == 1 and c in str(frame.columns[0])), None)
        hint = f"; the table reads as one column: is it separated by {sep!r} instead of commas?" if sep else ""
        raise DataError(f"column(s) {missing_cols} not in the table; available: {list(map(str, frame.columns))}{hint}")
    report = IngestReport(n_read=len(frame), duplicates=duplicates, coords=found)
    xs, ys, source_crs = _coordinates(frame, x, y, crs)
    columns = {"__x": _numeric(xs, x or "geometry x"), "__y": _numeric(ys, y or "geometry y"),
               value: _numeric(frame[value], value)}
    columns.update({c: _numeric(frame[c], c) for c in covariates})
    table = pd.DataFrame(columns, index=frame.index)
    if group is not None:
        table["__group"] = frame[group].astype(object).where(frame[group].notna())
    shown = {"__x": x or "geometry x", "__y": y or "geometry y", "__group": group}
    for name in table.columns:
        col = table[name]
        if col.isna().all() if name == "__group" else not np.isfinite(col.to_numpy(dtype=float)).any():
            raise DataError(f"column '{shown.get(name, name)}' has no values at all (every row is missing, NaN or "
                            "infinite); choose another column")
    missing = table.isna() | table.isin([np.inf, -np.inf])
    report.missing = {shown.get(c, c): int(k) for c, k in missing.sum().items()}
    keep = ~missing.any(axis=1)
    report.n_dropped = int((~keep).sum())
    table = table[keep]
    if table.empty:
        raise DataError(f"every row has a missing value in {wanted}; nothing left to ingest")
    for name in [value, *covariates]:  # a value whose square overflows: a missing-value code, or the wrong column
        big = np.abs(table[name].to_numpy(dtype=float)) > MAX_ABS_VALUE
        if big.any():
            row = table.index[np.flatnonzero(big)[0]]
            raise DataError(f"column '{name}' holds {table[name].loc[row]:.3g} in row {row} ({int(big.sum())} "
                            f"value(s) beyond ±{MAX_ABS_VALUE:.0e}, whose squares overflow float64): an absurd "
                            "value, e.g. a missing-value code; remove those rows or rescale the column")
    if table[value].nunique() == 1:
        raise DataError(f"column '{value}' has the same value ({table[value].iloc[0]:g}) in all {len(table)} rows: "
                        f"zero variance, nothing to model; check the {option('value=', '--value')} column")

    n_params = len(names) + 3
    xy = check_coordinates(table[["__x", "__y"]].to_numpy(), min_distinct=max(3, n_params + 1),
                           what=f"coordinates ({shown['__x']}, {shown['__y']})",
                           purpose=f"to estimate {n_params} parameters (γ, δ, σ², β) and a 2-D domain")
    if source_crs is None and not _planar(crs) and looks_geographic(xy[:, 0], xy[:, 1], (x, y)):
        raise DataError(f"coordinates ({shown['__x']}, {shown['__y']}) look like longitude/latitude but no CRS was "
                        f"given; pass {option(LONLAT[0], '--crs EPSG:4326')} (they are then projected to metres), or "
                        f"{option(LONLAT[1], '--crs planar')} if they are planar units")
    if source_crs is not None:
        check_degrees_mislabelled(xy[:, 0], xy[:, 1], source_crs, f"coordinates ({shown['__x']}, {shown['__y']})",
                                  (x, y), fix=f"pass {option(LONLAT[0], '--crs EPSG:4326')} if they are degrees, or "
                                               "the CRS they are in")
    target = parse_crs(target_crs)
    if target is not None and target.is_geographic:  # project() keeps a geographic target equal to the source
        flag = option("target_crs=", "--target-crs")
        raise DataError(f"{flag} {crs_name(target)} is geographic (degrees), but distances need a projected CRS; "
                        f"omit {flag} (lon/lat is projected to UTM) or give a projected one such as EPSG:3035")
    xy, out_crs, report.crs_note = project(xy, source_crs, target_crs)
    table["__x"], table["__y"] = xy[:, 0], xy[:, 1]
    report.crs_in, report.crs_out = crs_string(source_crs), crs_string(out_crs)

    dup = table.duplicated(subset=["__x", "__y"], keep=False)
    report.n_duplicates = int(dup.sum())
    if report.n_duplicates and duplicates == "error":
        first = table[dup].iloc[0]
        rows = list(table.index[dup & (table["__x"] == first["__x"]) & (table["__y"] == first["__y"])][:3])
        raise DataError(f"{report.n_duplicates} rows share their coordinates with another row (e.g. rows {rows} at "
                        f"({first['__x']:.6g}, {first['__y']:.6g})); pass "
                        f"{option(MERGE[0], '--duplicates merge')} to average them or "
                        f"{option(MERGE[1], '--duplicates keep')} to keep them all")
    if report.n_duplicates and duplicates == "merge":
        aggregations = {c: "mean" for c in table.columns if c not in ("__x", "__y", "__group")}
        if group is not None:
            aggregations["__group"] = "first"
        table = table.groupby(["__x", "__y"], sort=False, as_index=False).agg(aggregations)

    X = table[covariates].to_numpy(dtype=float)
    if intercept:
        X = np.column_stack([np.ones(len(table)), X])
    groups = table["__group"].astype(str).to_numpy() if group is not None else None
    return (table[["__x", "__y"]].to_numpy(dtype=float), table[value].to_numpy(dtype=float), X, names, groups,
            report.crs_out, report)


def ingest_frame(frame: pd.DataFrame, out, *, value: str, x: str | None = None, y: str | None = None, covariates=(),
                 crs=None, target_crs=None, partition: str = "area", n_workers: int | None = None, sizes=None,
                 test_fraction: float = 0.0, seed=0, intercept: bool = True, duplicates: str = "error",
                 overwrite: bool = False, extra_attrs: dict | None = None,
                 sites_option: str | None = None, transform=None,
                 min_site_rows: int = partitions.MIN_PRIVATE_ROWS) -> tuple[StoreInfo, IngestReport]:
    """Validate, project, split and write a table (DataFrame/GeoDataFrame) as the store `out`; J defaults to
    `partition.default_sites` (about 500 rows per site, 4 to 64 sites), and a chosen J (not a column partition) that
    leaves sites under `partition.MIN_SITE_ROWS` rows is warned about once, naming `sites_option` (the caller's name
    for J); a site under `min_site_rows` rows (default `partition.MIN_PRIVATE_ROWS`) is refused, and a
    non-default minimum is recorded in the store so that fits apply the same one. `transform` "log" writes log `value` (model.transform; positive values checked) and records it in the
    store's "transform" attribute, so fits and predictions know the scale."""
    out = Path(out)
    refuse_existing(out, overwrite, error=DataError)
    transform = value_transform.check_transform(transform)
    kind, column = partitions.parse_scheme(partition)
    if n_workers is not None and (int(n_workers) != n_workers or n_workers <= 0):
        raise DataError(f"{option('n_workers', '--workers')} must be a positive integer, got {n_workers!r}")
    if not 0.0 <= test_fraction < 1.0:
        raise DataError(f"{option('test_fraction', '--test-fraction')} must be in [0, 1), got {test_fraction!r}")
    locs, z, X, names, groups, crs_out, report = prepare(
        frame, value=value, x=x, y=y, covariates=covariates, crs=crs, target_crs=target_crs, intercept=intercept,
        duplicates=duplicates, group=column)
    z = value_transform.forward(z, transform, what=f"column {value!r}")
    if isinstance(min_site_rows, bool) or int(min_site_rows) != min_site_rows or min_site_rows < 1:
        raise DataError(f"{option('min_site_rows', '--min-site-rows')} must be a positive integer, "
                        f"got {min_site_rows!r}")
    rng = np.random.default_rng(seed)
    n_test = int(round(test_fraction * len(z)))
    held = np.zeros(len(z), dtype=bool)
    held[rng.choice(len(z), size=n_test, replace=False)] = True
    test = (locs[held], z[held], X[held]) if n_test else None
    locs, z, X = locs[~held], z[~held], X[~held]
    attrs = dict(extra_attrs or {}, **({"transform": transform} if transform != "none" else {}))
    if min_site_rows != partitions.MIN_PRIVATE_ROWS:
        attrs["min_site_rows"] = int(min_site_rows)  # the owners' choice: fit applies it instead of the default
    if report.crs_note:
        attrs["crs_note"] = report.crs_note          # why this CRS (UTM zone or centred equal-area), for reports
    if report.crs_in != report.crs_out:
        attrs["input_crs"] = report.crs_in           # the CRS the points came in: predict reads tables in it too
    if kind == "column":
        if sizes is not None:
            raise DataError(f"{option('sizes', '--sizes')} cannot be used with a column partition: the groups of "
                            f"'{column}' fix the sizes")
        all_groups = np.unique(groups)
        labels, worker_labels = partitions.column_partition(groups[~held])
        if len(worker_labels) != len(all_groups):
            lost = sorted(set(all_groups) - set(worker_labels))
            raise DataError(f"holding out the test set emptied group(s) {lost} of '{column}'; lower "
                            f"{option('test_fraction', '--test-fraction')}")
        if n_workers is not None and n_workers != len(worker_labels):
            flag = option("n_workers", "--workers")
            raise DataError(f"column '{column}' has {len(worker_labels)} groups but {flag} is {n_workers}; "
                            f"drop {flag} for a column partition")
        attrs["worker_labels"] = worker_labels
    else:
        n_workers = partitions.default_sites(len(z)) if n_workers is None and sizes is None else n_workers
        if len(z) < (n_workers or len(sizes)):
            raise DataError(f"only {len(z)} rows remain for {n_workers or len(sizes)} workers; use fewer workers "
                            f"({option('n_workers', '--workers')}) or a smaller "
                            f"{option('test_fraction', '--test-fraction')}")
        labels = partitions.partition(locs, partition, n_workers, sizes=sizes, seed=rng)
    parts = [(locs[i], z[i], X[i]) for i in partitions.split(labels, labels.max() + 1)]
    report.n_test, report.sizes = n_test, [len(p[1]) for p in parts]
    partitions.check_site_sizes(report.sizes, attrs.get("worker_labels"), int(min_site_rows), fix=(
        f"merge the small groups of '{column}' into neighbouring ones or leave their rows out" if kind == "column"
        else f"use fewer sites ({sites_option or option('n_workers', '--workers')})"))
    small = None if kind == "column" else partitions.small_sites_warning(
        report.sizes, sites_option or option("n_workers=", "--workers"))
    if small:  # a column partition is the data's real ownership (one agency per site), not a chosen J
        warn(small)
    info = write_store(out, parts, partition=partition, crs=crs_out, covariate_names=names, test=test,
                       overwrite=overwrite, extra_attrs=attrs)
    return info, report


def ingest(table, out, *, layer: str | None = None, **options) -> tuple[StoreInfo, IngestReport]:
    """Read a CSV / GeoPackage / GeoParquet table and write it as a store (options as in `ingest_frame`)."""
    refuse_existing(out, options.get("overwrite", False), error=DataError)  # before reading the table
    return ingest_frame(read_table(table, layer), out, **options)
