"""spatialfed map: grid prediction written as GeoTIFFs in the store's CRS, a GeoPackage and a PNG; bad input."""

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import rasterio
import shapely

from spatialfed.api import FederatedGP
from spatialfed.cli import main
from spatialfed.data import geometry
from spatialfed.data.ingest import ingest_frame
from spatialfed.errors import DataError
from spatialfed.outputs import maps

CRS = "EPSG:28992"
X0, Y0 = 150000.0, 400000.0


def _store(path, covariates=()):
    """A small projected store (2 area workers) with an intercept and the given extra covariates, fitted quickly."""
    rng = np.random.default_rng(5)
    xy = rng.uniform(0, 1000, size=(70, 2)) + [X0, Y0]
    frame = pd.DataFrame({"x": xy[:, 0], "y": xy[:, 1], "elev": xy[:, 0] / 1000 - X0 / 1000})
    frame["z"] = 1 + np.cos(xy[:, 1] / 250) + 0.1 * rng.normal(size=70)
    ingest_frame(frame, path / "s.zarr", value="z", x="x", y="y", covariates=list(covariates), crs=CRS, n_workers=2,
                 partition="area")
    FederatedGP(mode="sync", knots=9, cluster="simulated", max_iter=5, progress=False).fit(path / "s.zarr") \
        .save(path / "fit")
    geometry.domain_from_bbox(X0, Y0, X0 + 1000, Y0 + 800, crs=CRS).to_geoseries().to_file(path / "dom.gpkg")
    return path / "fit", path / "s.zarr"


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    return _store(tmp_path_factory.mktemp("map"))


def test_map_cli_writes_georeferenced_rasters_png_and_gpkg(plain, tmp_path):
    fit, store = plain
    out = tmp_path / "m"
    assert main(["map", str(fit), "--store", str(store), "--out", str(out), "--domain",
                 str(store.parent / "dom.gpkg"), "--resolution", "50", "--units", "mg/kg",
                 "--runtime", "simulated"]) == 0
    grid = geometry.prediction_grid(geometry.domain_from_file(store.parent / "dom.gpkg"), 50)
    for name in ("mean.tif", "sd.tif"):
        with rasterio.open(out / name) as r:
            assert r.crs.to_epsg() == 28992
            assert r.transform.almost_equals(grid.transform) and r.shape == (16, 20)
            band = r.read(1)
    assert np.isfinite(band).all() and (band > 0).all()     # sd.tif: every cell inside the rectangle
    assert r.transform.c == X0 and r.transform.f == Y0 + 800 and r.transform.a == 50 and r.transform.e == -50
    png = (out / "map.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    cells = gpd.read_file(out / "grid.gpkg", layer="prediction")
    assert cells.crs.to_epsg() == 28992 and len(cells) == 320
    assert {"mean", "sd", "sd_latent", "owner"} <= set(cells.columns)
    np.testing.assert_allclose(cells.geometry.area, 2500.0)


def test_map_masks_cells_outside_a_polygon_domain(plain, tmp_path):
    fit, store = plain
    tri = geometry.Domain(shapely.Polygon([(X0, Y0), (X0 + 1000, Y0), (X0, Y0 + 1000)]), geometry.parse_crs(CRS))
    tri.to_geoseries().to_file(tmp_path / "tri.gpkg")
    maps.make_map(fit, store, tmp_path / "m", domain=tmp_path / "tri.gpkg", resolution=100, runtime="simulated",
                  sites=False)
    with rasterio.open(tmp_path / "m" / "mean.tif") as r:
        band = r.read(1)
    assert np.isnan(band[0, -1]) and np.isfinite(band[-1, 0]) and 0.4 < np.isfinite(band).mean() < 0.6


def test_domain_in_another_crs_is_reprojected_to_the_stores(plain, tmp_path):
    """A domain file in EPSG:4326 gives the same map as the same polygon in the store's EPSG:28992."""
    fit, store = plain
    native = geometry.domain_from_file(store.parent / "dom.gpkg")
    native.to_crs("EPSG:4326").to_geoseries().to_file(tmp_path / "ll.gpkg")
    from spatialfed.data.store import open_store
    from spatialfed.outputs.prediction import load_domain

    info = open_store(store)
    domain = load_domain(tmp_path / "ll.gpkg", info)
    assert geometry.crs_string(domain.crs) == "EPSG:28992"
    lost = domain.geometry.symmetric_difference(native.geometry).area
    assert lost < 1e-5 * native.geometry.area  # the round trip through lon/lat (and a datum shift) moves edges by mm
    paths = maps.make_map(fit, store, tmp_path / "m", domain=tmp_path / "ll.gpkg", resolution=100,
                          runtime="simulated")
    with rasterio.open(paths["mean"]) as raster:
        assert raster.crs.to_epsg() == 28992 and (~raster.read(1, masked=True).mask).sum() > 0


def test_covariates_on_the_grid(tmp_path):
    fit, store = _store(tmp_path, covariates=["elev"])
    dom = tmp_path / "dom.gpkg"
    with pytest.raises(DataError, match=r"uses covariate\(s\) \['elev'\]; give their values on the map"):
        maps.make_map(fit, store, tmp_path / "m", domain=dom, resolution=100, runtime="simulated")
    g = np.arange(25.0, 1000, 50)
    xx, yy = np.meshgrid(g + X0, g + Y0)
    table = pd.DataFrame({"x": xx.ravel(), "y": yy.ravel(), "elev": (xx.ravel() - X0) / 1000})
    table.to_csv(tmp_path / "cov.csv", index=False)
    maps.make_map(fit, store, tmp_path / "m", domain=dom, resolution=50, covariates=tmp_path / "cov.csv",
                  runtime="simulated")
    table[table.x < X0 + 500].to_csv(tmp_path / "half.csv", index=False)
    with pytest.raises(DataError, match="map cells have no covariate value"):
        maps.make_map(fit, store, tmp_path / "m2", domain=dom, resolution=50, covariates=tmp_path / "half.csv",
                      runtime="simulated")


def test_nice_resolution_is_round():
    dom = geometry.domain_from_bbox(0, 0, 3000, 1200)
    assert maps.nice_resolution(dom) == 20.0
    assert maps.nice_resolution(geometry.domain_from_bbox(0, 0, 1, 1)) == 0.005
