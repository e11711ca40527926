"""Point tables in and out, GIS conventions kept: inputs reprojected to the store's CRS, output format by extension.

- `read_points(path, store_crs, x=, y=, crs=, arrived=)`: prediction locations or covariate points from a CSV, a GeoPackage /
  GeoJSON / shapefile / FlatGeobuf or a GeoParquet, read by the shared reader `spatialfed.data.points` (coordinate
  columns named or detected in any case, or the point geometry; any input with a CRS, the file's or `crs`, is
  reprojected to the store's). Returns a DataFrame with columns x, y (store CRS) and the file's other columns.
- `write_table(frame, path, crs=None)`: `.csv`, `.gpkg` (GeoPackage, point geometry from x/y) or `.parquet`
  (GeoParquet); any other extension is refused with the list. Written through `spatialfed.atomic.write_atomic`,
  so a reader never sees a partial file.
- `stream_table(path, crs=None)`: the same formats written batch by batch (prediction at 10⁵–10⁶ points): a context
  manager yielding a `TableStream` whose `append(frame)` adds rows to a staged temporary file (`atomic.staged`),
  renamed into place when the block ends normally; memory is one batch, not the table.
"""

from __future__ import annotations

import json
import warnings
from contextlib import contextmanager
from pathlib import Path

import geopandas as gpd
import pandas as pd

from spatialfed.atomic import staged, write_atomic
from spatialfed.data import geometry, points
from spatialfed.errors import DataError

WRITERS = (".csv", ".gpkg", ".parquet")


def read_points(path, store_crs, *, x=None, y=None, crs=None, arrived=None) -> pd.DataFrame:
    """Points in the store's CRS: the file's other columns and x, y (`data.points`: coordinate columns named by
    `x`, `y` or detected in any case, or the point geometry; reprojected from the file's CRS or `crs` when either is
    known, else taken in the store's CRS, or in `arrived`, the CRS the store's points came in, when they look like
    its lon/lat: `PointTable.arrived_in`)."""
    table = points.read_point_table(path, x=x, y=y, crs=crs).arrived_in(arrived)
    xy = table.in_crs(store_crs)
    return table.columns.assign(x=xy[:, 0], y=xy[:, 1])


def _geo(frame: pd.DataFrame, crs, path: Path) -> gpd.GeoDataFrame:
    """A GeoDataFrame of the rows: the frame itself, or points built from its x and y columns."""
    if isinstance(frame, gpd.GeoDataFrame):
        return frame if frame.crs is not None or crs is None else frame.set_crs(geometry.parse_crs(crs))
    missing = [c for c in ("x", "y") if c not in frame.columns]
    if missing:
        raise DataError(f"cannot write {path} as {path.suffix}: the table lacks column(s) {missing} for the point "
                        "geometry; write .csv instead")
    return gpd.GeoDataFrame(frame, geometry=gpd.points_from_xy(frame["x"], frame["y"]),
                            crs=geometry.parse_crs(crs))


def write_table(frame: pd.DataFrame, path, *, crs=None, layer: str | None = None) -> Path:
    """Write a table whose format follows the extension: .csv, .gpkg (GeoPackage, layer `layer` or the file's stem)
    or .parquet (GeoParquet); points from x/y in `crs` (the store's) unless `frame` is a GeoDataFrame. Atomic."""
    path = Path(path)
    suffix = check_writer(path)
    if suffix == ".csv":
        plain = pd.DataFrame(frame.drop(columns=frame.geometry.name)) if isinstance(frame, gpd.GeoDataFrame) \
            else frame
        return write_atomic(path, lambda tmp: plain.to_csv(tmp, index=False))
    geo = _geo(frame, crs, path)
    if suffix == ".gpkg":
        name = layer or path.stem
        return write_atomic(path, lambda tmp: geo.to_file(tmp, driver="GPKG", layer=name))
    return write_atomic(path, lambda tmp: geo.to_parquet(tmp, index=False))


def check_writer(path) -> str:
    """The output format (suffix) of `path`; DataError naming the writable ones otherwise, or, for .parquet in an
    install without pyarrow (a base dependency, but a venv may lack it), naming the package: before any work."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in WRITERS:
        raise DataError(f"cannot write {path}: the output format follows the extension and "
                        f"{suffix or '(no extension)'} is not one of {', '.join(WRITERS)}; rename the output")
    if suffix == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise DataError(f"cannot write {path}: GeoParquet needs pyarrow, which this Python lacks; install it "
                            "(pip install pyarrow) or write .csv or .gpkg") from None
    return suffix


class TableStream:
    """Rows appended batch by batch to `tmp` (a staged temporary file) in the format of `suffix`: CSV (header with
    the first batch), GeoPackage (layer `layer`, appended through GDAL) or GeoParquet (one row group per batch,
    pyarrow's ParquetWriter; the `geo` metadata without the optional per-file bbox, which only the whole table
    knows). Points come from x/y in `crs`. `rows` counts what was written."""

    def __init__(self, tmp, suffix: str, *, crs=None, layer: str = "prediction", target: Path | None = None):
        self.path, self.suffix, self.crs, self.layer = Path(tmp), suffix, crs, layer
        self.target = target or self.path
        self.rows = 0
        self._parquet = None

    def append(self, frame: pd.DataFrame) -> None:
        """Write the rows of `frame` after those already written."""
        first = self.rows == 0
        if self.suffix == ".csv":
            plain = pd.DataFrame(frame.drop(columns=frame.geometry.name)) if isinstance(frame, gpd.GeoDataFrame) \
                else frame
            plain.to_csv(self.path, mode="w" if first else "a", header=first, index=False)
        elif self.suffix == ".gpkg":
            geo = _geo(frame, self.crs, self.target)
            with warnings.catch_warnings():  # a store in planar units has no CRS to give (not news, per batch)
                warnings.filterwarnings("ignore", message="'crs' was not provided")
                geo.to_file(self.path, driver="GPKG", layer=self.layer, mode="w" if first else "a")
        else:
            self._append_parquet(_geo(frame, self.crs, self.target))
        self.rows += len(frame)

    def _append_parquet(self, geo: gpd.GeoDataFrame) -> None:
        import pyarrow.parquet as pq
        from geopandas.io.arrow import _geopandas_to_arrow

        table = _geopandas_to_arrow(geo, index=False)
        if self._parquet is None:
            meta = dict(table.schema.metadata or {})
            geo_meta = json.loads(meta[b"geo"])
            for column in geo_meta.get("columns", {}).values():
                column.pop("bbox", None)  # optional in GeoParquet; a batch's bbox would be wrong for the file
            meta[b"geo"] = json.dumps(geo_meta).encode()
            self._schema = table.schema.with_metadata(meta)
            self._parquet = pq.ParquetWriter(self.path, self._schema)
        self._parquet.write_table(table.replace_schema_metadata(self._schema.metadata))

    def close(self) -> None:
        """Finish the file (the Parquet footer); CSV and GeoPackage need nothing."""
        if self._parquet is not None:
            self._parquet.close()
            self._parquet = None


@contextmanager
def stream_table(path, *, crs=None, layer: str | None = None):
    """Yield a TableStream writing to a staged temporary sibling of `path` (format by its extension); on a normal
    exit the file is closed and renamed into place (atomic: a reader sees the old file or the complete new one).
    No rows appended is an error (there would be nothing to write)."""
    path = Path(path)
    suffix = check_writer(path)
    with staged(path) as tmp:
        stream = TableStream(tmp, suffix, crs=crs, layer=layer or path.stem, target=path)
        try:
            yield stream
        finally:
            stream.close()
        if stream.rows == 0:
            raise DataError(f"cannot write {path}: no rows were produced")
