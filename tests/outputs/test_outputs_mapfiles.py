"""Map outputs for GIS users (issue 17): the CRS's short name on the axes, colour bars "mean (units)" and
"sd (units)", a georeferenced NetCDF matching the GeoTIFFs, overlays and covariate points in another CRS reprojected."""

import json
from types import SimpleNamespace

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import rasterio
import shapely
import xarray as xr

from spatialfed.data import geometry
from spatialfed.outputs import maps

pytestmark = pytest.mark.filterwarnings("ignore:Use `@` matmul:PendingDeprecationWarning")  # rioxarray reading

CRS = "EPSG:28992"
X0, Y0 = 150000.0, 400000.0


@pytest.fixture(scope="module")
def grid():
    """A 20 × 16 grid of 50 m cells over a triangle (cells outside are NaN)."""
    tri = geometry.Domain(shapely.Polygon([(X0, Y0), (X0 + 1000, Y0), (X0, Y0 + 800)]), geometry.parse_crs(CRS))
    return tri, geometry.prediction_grid(tri, 50)


def fields(grid):
    pts = grid.points
    return 10 + (pts[:, 0] - X0) / 100, 0.5 + (pts[:, 1] - Y0) / 1000      # distinct mean and sd surfaces


def test_axes_name_the_crs_and_colour_bars_say_mean_and_sd(grid):
    domain, g = grid
    mean, sd = fields(g)
    fig = maps.build_map_figure(g, mean, sd, domain, units="mg/kg", sites=g.points[:5])
    panels, bars = fig.axes[:2], fig.axes[2:]
    assert [b.get_ylabel() for b in bars] == ["mean (mg/kg)", "sd (mg/kg)"]
    for ax in panels:
        assert ax.get_xlabel() == "Easting (m), EPSG:28992" and ax.get_ylabel() == "Northing (m), EPSG:28992"
    # the sd colour bar belongs to the sd image: its limits are the sd's range, not the mean's
    for ax, bar, values in zip(panels, bars, (mean, sd)):
        image = ax.get_images()[0]
        np.testing.assert_allclose(image.get_clim(), (values.min(), values.max()))
        np.testing.assert_allclose(bar.get_ylim(), (values.min(), values.max()))
    planar = geometry.prediction_grid(geometry.domain_from_bbox(0, 0, 1, 1), 0.1)
    fig = maps.build_map_figure(planar, np.zeros(100), np.ones(100), geometry.domain_from_bbox(0, 0, 1, 1))
    assert fig.axes[0].get_xlabel() == "x (planar units, no CRS)"
    assert [b.get_ylabel() for b in fig.axes[2:]] == ["mean (data units)", "sd (data units)"]


def test_axes_of_a_wide_metre_crs_are_in_km_with_the_crs_name():
    laea = geometry.laea_crs(-88.27, 40.62)
    dom = geometry.domain_from_bbox(-500e3, -400e3, 500e3, 400e3, crs=laea)
    g = geometry.prediction_grid(dom, 20e3)
    fig = maps.build_map_figure(g, np.zeros(g.mask.sum()), np.ones(g.mask.sum()), dom)
    assert fig.axes[0].get_xlabel() == "Easting (km), WGS 84 / LAEA centred 40.62N 88.27W"


def test_netcdf_is_written_whatever_dask_scheduler_a_gone_client_left(grid, tmp_path):
    """xarray (2025+) asks Dask for its scheduler even for in-memory arrays: the "dask.distributed" default that a
    Client of this process left behind (closed, or lost with its scheduler) raised "no Client active"."""
    import dask

    _, g = grid
    mean, sd = fields(g)
    with dask.config.set(scheduler="dask.distributed"):
        nc = maps.write_netcdf(tmp_path / "map.nc", g, mean, sd, CRS)
    with xr.open_dataset(nc) as ds:
        np.testing.assert_allclose(ds["mean"].values, g.to_raster(mean), rtol=1e-6)


@pytest.mark.parametrize("crs", [CRS, "laea", None])
def test_netcdf_opens_with_the_crs_transform_and_values_of_the_geotiffs(grid, tmp_path, crs):
    domain, g = grid
    crs = geometry.laea_crs(-88.27, 40.62) if crs == "laea" else crs
    g = geometry.PredictionGrid(g.x, g.y, g.mask, g.resolution, geometry.parse_crs(crs))
    mean, sd = fields(g)
    nc = maps.write_netcdf(tmp_path / "map.nc", g, mean, sd, crs, "mg/kg")
    maps.write_geotiff(tmp_path / "sd.tif", g, sd, crs, "sd")
    ds = xr.open_dataset(nc, decode_coords="all")
    try:
        assert ds["mean"].dims == ("y", "x") and ds["sd"].attrs["units"] == "mg/kg"
        assert ds.rio.transform().almost_equals(g.transform)
        np.testing.assert_allclose(ds["sd"].values, g.to_raster(sd), rtol=1e-6)      # float32, NaN outside
        with rasterio.open(tmp_path / "sd.tif") as tif:
            assert tif.transform.almost_equals(ds.rio.transform())
            np.testing.assert_allclose(tif.read(1), ds["sd"].values)
            if crs is None:
                assert ds.rio.crs is None and tif.crs is None
            else:
                assert ds.rio.crs == tif.crs and geometry.parse_crs(ds.rio.crs.to_wkt()) == geometry.parse_crs(crs)
        assert ds.attrs["crs_name"] == (geometry.crs_name(crs) or "planar units (no CRS)")
    finally:
        ds.close()
    with rasterio.open(f"netcdf:{nc}:mean") as band:                 # GDAL (QGIS) reads it georeferenced too
        assert band.transform.almost_equals(g.transform) and (band.crs is None) == (crs is None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.nc", "sd.tif"]


def test_overlay_and_covariate_points_in_another_crs_are_reprojected(grid, tmp_path):
    domain, g = grid
    river = gpd.GeoSeries([shapely.LineString([(X0, Y0 + 100), (X0 + 900, Y0 + 700)]).buffer(20)], crs=CRS)
    river.to_crs("EPSG:4326").to_file(tmp_path / "river.gpkg")
    info = SimpleNamespace(crs=CRS, covariate_names=["intercept", "elev"])
    back = maps.read_overlay(tmp_path / "river.gpkg", info)
    assert back.crs.to_epsg() == 28992
    assert back.geometry.iloc[0].symmetric_difference(river.iloc[0]).area < 1e-3 * river.iloc[0].area
    pts = g.points
    cov = gpd.GeoDataFrame({"elev": (pts[:, 0] - X0) / 1000}, geometry=gpd.points_from_xy(pts[:, 0], pts[:, 1]),
                           crs=CRS).to_crs("EPSG:4326")
    cov.to_file(tmp_path / "cov.gpkg")
    X = maps.map_design(g, info, tmp_path / "cov.gpkg")
    np.testing.assert_allclose(X, np.column_stack([np.ones(len(pts)), (pts[:, 0] - X0) / 1000]))
    with pytest.raises(Exception, match="planar units"):
        maps.read_overlay(tmp_path / "river.gpkg", SimpleNamespace(crs=None))


def test_make_map_writes_map_nc_beside_the_geotiffs_on_a_hull_domain(tmp_path):
    from spatialfed.api import FederatedGP
    from spatialfed.data.ingest import ingest_frame

    rng = np.random.default_rng(5)
    xy = rng.uniform(0, 1000, size=(120, 2))
    xy = xy[~((xy[:, 0] > 500) & (xy[:, 1] > 500))] + [X0, Y0]          # an L: the upper-right quarter is empty
    z = 1 + np.cos(xy[:, 1] / 250) + 0.1 * rng.normal(size=len(xy))
    frame = pd.DataFrame({"x": xy[:, 0], "y": xy[:, 1], "z": z})
    ingest_frame(frame, tmp_path / "s.zarr", value="z", x="x", y="y", crs=CRS, n_workers=2, partition="area")
    FederatedGP(mode="sync", knots=9, cluster="simulated", max_iter=5, progress=False).fit(tmp_path / "s.zarr") \
        .save(tmp_path / "fit")
    hull = geometry.hull_domain(xy, CRS)
    hull.to_geoseries().to_file(tmp_path / "hull.gpkg")
    paths = maps.make_map(tmp_path / "fit", tmp_path / "s.zarr", tmp_path / "m", domain=tmp_path / "hull.gpkg",
                          resolution=50, units="ppb", runtime="simulated", sites=False)
    assert paths["netcdf"] == tmp_path / "m" / "map.nc"
    with xr.open_dataset(paths["netcdf"], decode_coords="all") as ds, rasterio.open(paths["mean"]) as tif:
        assert ds.rio.crs.to_epsg() == 28992 and ds.rio.transform().almost_equals(tif.transform)
        np.testing.assert_allclose(ds["mean"].values, tif.read(1))
        inside = np.isfinite(ds["mean"].values)
        to_cell = ~tif.transform
    for x, y, expected in ((X0 + 850, Y0 + 850, False), (X0 + 250, Y0 + 250, True)):   # the empty quarter is left out
        col, row = to_cell * (x, y)
        assert inside[int(row), int(col)] == expected
    summary = json.loads(paths["json"].read_text())
    assert summary["crs"] == "EPSG:28992" and summary["crs_name"] == "EPSG:28992" and summary["units"] == "ppb"


def test_a_map_in_lonlat_lays_its_cells_in_degrees_and_predicts_their_centres_in_the_stores_crs(tmp_path):
    """map_crs="EPSG:4326": mean.tif, map.nc and grid.gpkg in lon/lat, each cell the store's prediction at its centre
    taken into the store's CRS; the axes say longitude and latitude."""
    from pyproj import Transformer

    from spatialfed.api import FederatedGP
    from spatialfed.data.ingest import ingest_frame
    from spatialfed.data.store import open_store
    from spatialfed.outputs.prediction import load_model, open_workers, predict_at

    rng = np.random.default_rng(6)
    lon, lat = rng.uniform(5.0, 7.0, 150), rng.uniform(51.0, 52.5, 150)
    frame = pd.DataFrame({"lon": lon, "lat": lat, "z": np.sin(lon * 3) + 0.1 * rng.normal(size=150)})
    ingest_frame(frame, tmp_path / "s.zarr", value="z", x="lon", y="lat", crs="EPSG:4326", n_workers=2,
                 partition="area")
    FederatedGP(mode="sync", knots=9, cluster="simulated", max_iter=5, progress=False).fit(tmp_path / "s.zarr") \
        .save(tmp_path / "fit")
    paths = maps.make_map(tmp_path / "fit", tmp_path / "s.zarr", tmp_path / "m", resolution=0.1,
                          runtime="simulated", map_crs="EPSG:4326")
    with rasterio.open(paths["mean"]) as tif:
        assert tif.crs.to_epsg() == 4326 and tif.transform.a == pytest.approx(0.1)
        mean, transform = tif.read(1), tif.transform
    rows, cols = np.nonzero(np.isfinite(mean))
    centres = np.column_stack([transform * (c + 0.5, r + 0.5) for r, c in zip(rows[:10], cols[:10])])
    info = open_store(tmp_path / "s.zarr")
    at = np.column_stack(Transformer.from_crs("EPSG:4326", info.crs, always_xy=True).transform(*centres))
    model = load_model(tmp_path / "fit")
    with open_workers(info, model, "simulated") as workers:
        expected = predict_at(workers, model, at, np.ones((10, 1)), "seamless")["mean"]
    np.testing.assert_allclose(mean[rows[:10], cols[:10]], expected, rtol=1e-5)  # float32 rasters
    assert json.loads(paths["json"].read_text())["crs"] == "EPSG:4326"
    assert gpd.read_file(paths["gpkg"]).crs.to_epsg() == 4326
    assert maps._axis_labels("EPSG:4326", 2.0)[0].startswith("Longitude (°)")
