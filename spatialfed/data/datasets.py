"""The real datasets shipped in `data/` (GPL ≥ 2, see data/README.md): Meuse soil zinc and Midwest ozone."""

from __future__ import annotations

from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely

from spatialfed.data.geometry import Domain
from spatialfed.data.ingest import IngestReport, ingest_frame
from spatialfed.data.store import StoreInfo
from spatialfed.errors import DataError

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
MEUSE_CRS = "EPSG:28992"
MEUSE_CELL = 40.0
STATE_FIPS = {"17": "IL", "18": "IN", "19": "IA", "21": "KY", "26": "MI", "29": "MO", "39": "OH", "55": "WI"}


def data_file(*parts: str) -> Path:
    """Path of a shipped data file, or DataError saying where it was expected."""
    path = DATA_DIR.joinpath(*parts)
    if not path.is_file():
        raise DataError(f"data file {path} is missing; the repository's data/ folder ships it "
                        "(restore it from version control)")
    return path


def _points(frame: pd.DataFrame, crs: str) -> gpd.GeoDataFrame:
    """GeoDataFrame of points from the frame's x/y columns."""
    return gpd.GeoDataFrame(frame, geometry=gpd.points_from_xy(frame["x"], frame["y"]), crs=crs)


def meuse_frame() -> gpd.GeoDataFrame:
    """The 155 Meuse topsoil samples (EPSG:28992, metres) with all original columns."""
    return _points(pd.read_csv(data_file("meuse", "meuse.csv")), MEUSE_CRS)


def meuse_grid() -> gpd.GeoDataFrame:
    """Centres of the 3103 cells (40 m) of the Meuse prediction grid, with `dist`, `soil`, `ffreq`."""
    return _points(pd.read_csv(data_file("meuse", "meuse_grid.csv")), MEUSE_CRS)


def meuse_river() -> gpd.GeoDataFrame:
    """The river Meuse outline as one polygon (EPSG:28992)."""
    ring = pd.read_csv(data_file("meuse", "meuse_riv.csv"))[["x", "y"]].to_numpy()
    return gpd.GeoDataFrame({"name": ["Meuse"]}, geometry=[shapely.Polygon(ring)], crs=MEUSE_CRS)


def meuse_domain() -> Domain:
    """The study area: union of the 40 m prediction-grid cells."""
    xy = meuse_grid()[["x", "y"]].to_numpy()
    half = MEUSE_CELL / 2
    cells = shapely.box(xy[:, 0] - half, xy[:, 1] - half, xy[:, 0] + half, xy[:, 1] + half)
    return Domain(shapely.union_all(cells), meuse_grid().crs)


def meuse_store(path, n_workers: int = 4, *, partition: str = "area", test_fraction: float = 0.0, seed=0,
                overwrite: bool = False) -> tuple[StoreInfo, IngestReport]:
    """Store of log(zinc) with covariates intercept + sqrt(dist), EPSG:28992, split by `partition`."""
    frame = pd.read_csv(data_file("meuse", "meuse.csv"))
    frame["log_zinc"] = np.log(frame["zinc"])
    frame["sqrt_dist"] = np.sqrt(frame["dist"])
    return ingest_frame(frame, path, value="log_zinc", x="x", y="y", covariates=["sqrt_dist"], crs=MEUSE_CRS,
                        partition=partition, n_workers=n_workers, test_fraction=test_fraction, seed=seed,
                        overwrite=overwrite, extra_attrs={"dataset": "meuse"})


def ozone_frame(date: str | None = None) -> pd.DataFrame:
    """Midwest ozone rows (station, lon, lat, date, ozone, state), all 89 days or one YYMMDD date."""
    frame = pd.read_csv(data_file("ozone2", "ozone2_long.csv"), dtype={"station": str, "date": str})
    frame["state"] = frame["station"].str[:2].map(STATE_FIPS).fillna(frame["station"].str[:2])
    if date is None:
        return frame
    day = frame[frame["date"] == str(date)]
    if day.empty:
        raise DataError(f"no ozone data for date {date!r}; dates run from {frame['date'].min()} to "
                        f"{frame['date'].max()} (YYMMDD)")
    return day.reset_index(drop=True)


#: every state of the ozone data is a site (Iowa has 6 stations on 870715, 3 on some days): the readings are
#: public, so the ozone stores record this minimum instead of the default a private site needs
OZONE_MIN_SITE_ROWS = 3


def ozone_store(path, date: str = "870715", *, target_crs=None, partition: str = "column:state",
                n_workers: int | None = None, test_fraction: float = 0.0, seed=0,
                overwrite: bool = False) -> tuple[StoreInfo, IngestReport]:
    """Store of one day's ozone (intercept only), one worker per state, projected from lon/lat (default: an
    equal-area projection centred on the stations, which span three UTM zones). The readings are public, so the
    store admits small states as sites (`OZONE_MIN_SITE_ROWS`, below the default a private site needs)."""
    frame = ozone_frame(date)
    return ingest_frame(frame, path, value="ozone", x="lon", y="lat", crs="EPSG:4326", target_crs=target_crs,
                        partition=partition, n_workers=n_workers, test_fraction=test_fraction, seed=seed,
                        overwrite=overwrite, extra_attrs={"dataset": "ozone2", "date": str(date)},
                        min_site_rows=OZONE_MIN_SITE_ROWS)
