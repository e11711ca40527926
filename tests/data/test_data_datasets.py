"""Shipped real datasets: Meuse and Midwest ozone loaders, accessors and licence notices."""

import numpy as np
import pytest

from spatialfed.data import datasets
from spatialfed.data.geometry import crs_name, jittered_knots, knots_in_domain
from spatialfed.data.store import load_worker
from spatialfed.errors import DataError


def test_meuse_store(tmp_path):
    info, report = datasets.meuse_store(tmp_path / "m.zarr")
    assert info.crs == "EPSG:28992" and info.partition == "area" and info.n_workers == 4
    assert info.covariate_names == ["intercept", "sqrt_dist"] and sum(info.sizes) == 155
    locs, z, X = load_worker(tmp_path / "m.zarr", 0)
    assert 4.5 < z.min() and z.max() < 8.0  # log(zinc): zinc ranges 113–1839 mg/kg
    assert np.all((X[:, 1] >= 0) & (X[:, 1] <= 1)) and report.n_dropped == 0


def test_ozone_store_one_worker_per_state(tmp_path):
    info, report = datasets.ozone_store(tmp_path / "o.zarr")
    assert info.partition == "column:state" and info.covariate_names == ["intercept"]
    assert crs_name(info.crs) == "WGS 84 / LAEA centred 40.62N 88.27W"   # 3 UTM zones: equal-area, not UTM 16
    assert info.n_workers == 8 and sum(info.sizes) == 146 and report.n_dropped == 7
    with pytest.raises(DataError, match="dates run from 870603 to 870831"):
        datasets.ozone_frame("880101")


def test_meuse_geometry_accessors():
    grid, river, domain = datasets.meuse_grid(), datasets.meuse_river(), datasets.meuse_domain()
    assert len(grid) == 3103 and grid.crs.to_epsg() == 28992
    assert river.geometry.iloc[0].is_valid and river.geometry.iloc[0].geom_type == "Polygon"
    assert domain.geometry.area == pytest.approx(3103 * 40 * 40)
    assert domain.contains(grid[["x", "y"]].to_numpy()).all()
    knots_in_domain(jittered_knots(domain, 50, seed=0), domain)


def test_licence_notices_are_shipped():
    for folder in ("meuse", "ozone2"):
        assert "GNU GPL (version 2 or later)" in (datasets.DATA_DIR / folder / "README.md").read_text()
    assert "GPL" in (datasets.DATA_DIR / "README.md").read_text()


def test_missing_data_file_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(datasets, "DATA_DIR", tmp_path)
    with pytest.raises(DataError, match="meuse.csv is missing"):
        datasets.meuse_frame()
