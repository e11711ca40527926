"""Tables of points come in as `ingest` takes them (issue 28, items 2 and 9): `predict --locations`, `map
--covariates` and `fit --knots FILE` accept --x/--y/--crs, detect coordinate columns in any case, and reproject to
the store's CRS; the prediction table keeps the coordinates as given beside the store's x, y."""

import json

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
from pyproj import Transformer

from spatialfed.cli import main
from spatialfed.data.datasets import ozone_frame, ozone_store
from spatialfed.data.store import open_store


@pytest.fixture(scope="module")
def ozone(tmp_path_factory):
    """The shipped ozone day (lon/lat stations, stored in a centred LAEA projection) fitted with 16 knots."""
    root = tmp_path_factory.mktemp("ozone")
    info, _ = ozone_store(root / "o.zarr")
    assert main(["fit", str(root / "o.zarr"), "--out", str(root / "fit"), "--knots", "16", "--max-iter", "6",
                 "--quiet"]) == 0
    return root, info


def _stations(k=12):
    day = ozone_frame("870715").drop_duplicates("station").iloc[::7][:k]
    return day[["station", "lon", "lat"]].reset_index(drop=True)


def test_lonlat_locations_predict_as_the_same_points_in_the_stores_crs(ozone, tmp_path):
    root, info = ozone
    stations = _stations()
    x, y = Transformer.from_crs("EPSG:4326", open_store(info.path).crs, always_xy=True).transform(
        stations.lon, stations.lat)
    stations.rename(columns={"lon": "Longitude", "lat": "LATITUDE"}).to_csv(tmp_path / "ll.csv", index=False)
    stations.assign(x=x, y=y).drop(columns=["lon", "lat"]).to_csv(tmp_path / "xy.csv", index=False)
    common = [str(root / "fit"), "--store", str(info.path), "--quiet"]
    assert main(["predict", *common, "--locations", str(tmp_path / "ll.csv"), "--crs", "EPSG:4326",
                 "--out", str(tmp_path / "ll_pred.csv")]) == 0
    assert main(["predict", *common, "--locations", str(tmp_path / "xy.csv"), "--out", str(tmp_path / "xy_pred.csv")]) == 0
    ll, xy = pd.read_csv(tmp_path / "ll_pred.csv"), pd.read_csv(tmp_path / "xy_pred.csv")
    np.testing.assert_allclose(ll[["mean", "sd"]], xy[["mean", "sd"]], rtol=1e-9)
    np.testing.assert_allclose(ll[["x", "y"]], np.column_stack([x, y]), atol=1e-6)
    # the user's own coordinates come back under their own names, before the store's x, y
    assert list(ll.columns[:4]) == ["Longitude", "LATITUDE", "x", "y"]
    np.testing.assert_allclose(ll[["Longitude", "LATITUDE"]], stations[["lon", "lat"]], atol=1e-9)
    assert list(xy.columns[:2]) == ["x", "y"]   # already in the store's CRS: nothing to add


def test_a_geopackage_in_lonlat_and_named_columns_give_the_same_predictions(ozone, tmp_path):
    root, info = ozone
    stations = _stations()
    geo = gpd.GeoDataFrame(stations[["station"]], geometry=gpd.points_from_xy(stations.lon, stations.lat),
                           crs="EPSG:4326")
    geo.to_file(tmp_path / "st.gpkg")
    stations.rename(columns={"lon": "east_deg", "lat": "north_deg"}).to_csv(tmp_path / "named.csv", index=False)
    common = [str(root / "fit"), "--store", str(info.path), "--quiet"]
    assert main(["predict", *common, "--locations", str(tmp_path / "st.gpkg"), "--out", str(tmp_path / "g.csv")]) == 0
    assert main(["predict", *common, "--locations", str(tmp_path / "named.csv"), "--x", "east_deg", "--y",
                 "north_deg", "--crs", "EPSG:4326", "--out", str(tmp_path / "n.csv")]) == 0
    g, n = pd.read_csv(tmp_path / "g.csv"), pd.read_csv(tmp_path / "n.csv")
    np.testing.assert_allclose(g[["x", "y", "mean", "sd"]], n[["x", "y", "mean", "sd"]], rtol=1e-9)
    np.testing.assert_allclose(g[["x_input", "y_input"]], stations[["lon", "lat"]], atol=1e-9)
    assert list(n.columns[:2]) == ["east_deg", "north_deg"]


def test_upper_case_x_y_columns_are_found(ozone, tmp_path):
    root, info = ozone
    stations = _stations()
    x, y = Transformer.from_crs("EPSG:4326", open_store(info.path).crs, always_xy=True).transform(
        stations.lon, stations.lat)
    pd.DataFrame({"X": x, "Y": y}).to_csv(tmp_path / "XY.csv", index=False)
    assert main(["predict", str(root / "fit"), "--store", str(info.path), "--quiet", "--locations",
                 str(tmp_path / "XY.csv"), "--out", str(tmp_path / "p.csv")]) == 0
    np.testing.assert_allclose(pd.read_csv(tmp_path / "p.csv")[["x", "y"]], np.column_stack([x, y]), atol=1e-9)


def _knot_stations(k=9):
    return ozone_frame("870715").drop_duplicates("station").iloc[3::13][:k].reset_index(drop=True)


@pytest.mark.parametrize("kind", ["csv", "gpkg"])
def test_fit_takes_its_knots_from_a_file_in_another_crs(ozone, tmp_path, kind):
    root, info = ozone
    stations = _knot_stations()
    if kind == "csv":
        stations[["station", "lon", "lat"]].to_csv(tmp_path / "knots.csv", index=False)
        extra = ["--knots", str(tmp_path / "knots.csv"), "--crs", "EPSG:4326"]
    else:
        gpd.GeoDataFrame(stations[["station"]], geometry=gpd.points_from_xy(stations.lon, stations.lat),
                         crs="EPSG:4326").to_file(tmp_path / "knots.gpkg")
        extra = ["--knots", str(tmp_path / "knots.gpkg")]
    assert main(["fit", str(info.path), "--out", str(tmp_path / "fit"), "--max-iter", "2", "--quiet", *extra]) == 0
    knots = np.asarray(json.loads((tmp_path / "fit" / "fit.json").read_text())["knots"])
    x, y = Transformer.from_crs("EPSG:4326", open_store(info.path).crs, always_xy=True).transform(
        stations.lon, stations.lat)
    np.testing.assert_allclose(knots, np.column_stack([x, y]), atol=1e-6)   # metres, after reprojection
