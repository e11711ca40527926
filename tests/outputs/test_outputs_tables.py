"""Point tables: inputs with a CRS reprojected to the store's, CSV/GeoPackage/GeoParquet read alike, and the output
format following the extension (refused otherwise), written atomically."""

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
from pyproj import Transformer

from spatialfed.errors import DataError
from spatialfed.outputs.tables import read_points, write_table

STORE = "EPSG:28992"          # RD New, metres


def rd_points(n=12, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"x": rng.uniform(179000, 181500, n), "y": rng.uniform(329500, 333500, n),
                         "dist": rng.uniform(0, 1, n), "name": [f"p{i}" for i in range(n)]})


def test_geopackage_in_4326_is_reprojected_to_the_stores_crs(tmp_path):
    frame = rd_points()
    lon, lat = Transformer.from_crs(STORE, 4326, always_xy=True).transform(frame.x, frame.y)
    geo = gpd.GeoDataFrame(frame.drop(columns=["x", "y"]), geometry=gpd.points_from_xy(lon, lat), crs="EPSG:4326")
    for name, write in (("p.gpkg", lambda p: geo.to_file(p)), ("p.parquet", lambda p: geo.to_parquet(p)),
                        ("p.geojson", lambda p: geo.to_file(p, driver="GeoJSON"))):
        write(tmp_path / name)
        points = read_points(tmp_path / name, STORE)
        np.testing.assert_allclose(points[["x", "y"]].to_numpy(), frame[["x", "y"]].to_numpy(), atol=1e-3)  # 1 mm
        assert list(points.columns) == ["dist", "name", "x", "y"] and list(points.name) == list(frame.name)


def test_csv_is_in_the_stores_crs_unless_told(tmp_path):
    frame = rd_points()
    frame.to_csv(tmp_path / "p.csv", index=False)
    np.testing.assert_array_equal(read_points(tmp_path / "p.csv", STORE)[["x", "y"]], frame[["x", "y"]])
    lon, lat = Transformer.from_crs(STORE, 4326, always_xy=True).transform(frame.x, frame.y)
    frame.assign(x=lon, y=lat).to_csv(tmp_path / "ll.csv", index=False)
    with pytest.raises(DataError, match=r"look like longitude/latitude but the store is in EPSG:28992.*crs='EPSG:43"):
        read_points(tmp_path / "ll.csv", STORE)
    back = read_points(tmp_path / "ll.csv", STORE, crs="EPSG:4326")
    np.testing.assert_allclose(back[["x", "y"]].to_numpy(), frame[["x", "y"]].to_numpy(), atol=1e-3)


def test_bad_point_inputs_give_one_line(tmp_path):
    frame = rd_points()
    with pytest.raises(DataError, match="does not exist"):
        read_points(tmp_path / "none.csv", STORE)
    frame.drop(columns="y").to_csv(tmp_path / "noy.csv", index=False)
    with pytest.raises(DataError, match=r"no coordinate columns .* name them with x='COL', y='COL'"):
        read_points(tmp_path / "noy.csv", STORE)
    frame.assign(x=frame.x * 1e300).to_csv(tmp_path / "huge.csv", index=False)
    with pytest.raises(DataError, match="beyond"):
        read_points(tmp_path / "huge.csv", STORE)
    (tmp_path / "p.xlsx").write_text("x")
    with pytest.raises(DataError, match=r"unknown extension \.xlsx; use one of \.csv"):
        read_points(tmp_path / "p.xlsx", STORE)
    geo = gpd.GeoDataFrame(frame, geometry=gpd.points_from_xy(frame.x, frame.y), crs=STORE)
    geo.buffer(5).to_frame("geometry").to_file(tmp_path / "poly.gpkg")
    with pytest.raises(DataError, match=r"must hold point geometries .*\['Polygon'\]"):
        read_points(tmp_path / "poly.gpkg", STORE)
    geo.to_file(tmp_path / "rd.gpkg")
    with pytest.raises(DataError, match="store has planar units"):
        read_points(tmp_path / "rd.gpkg", None)


@pytest.mark.parametrize("suffix", [".csv", ".gpkg", ".parquet"])
def test_output_format_follows_the_extension(tmp_path, suffix):
    frame = rd_points().assign(outside_domain=False, owner=np.arange(12) % 3)
    path = write_table(frame, tmp_path / f"pred{suffix}", crs=STORE)
    head = path.read_bytes()[:16]
    if suffix == ".csv":
        assert head.startswith(b"x,y,dist,name")
        back = pd.read_csv(path)
    elif suffix == ".gpkg":
        assert head.startswith(b"SQLite format 3")
        back = gpd.read_file(path, layer="pred")
    else:
        assert head.startswith(b"PAR1")
        back = gpd.read_parquet(path)
    if suffix != ".csv":
        assert back.crs.to_epsg() == 28992
        np.testing.assert_allclose(np.column_stack([back.geometry.x, back.geometry.y]), frame[["x", "y"]])
    np.testing.assert_allclose(back[["x", "y", "dist"]].to_numpy(float), frame[["x", "y", "dist"]])
    assert list(back["owner"]) == list(frame.owner)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"pred{suffix}"]     # no temporary left behind
    np.testing.assert_allclose(read_points(path, STORE)[["x", "y"]].to_numpy(), frame[["x", "y"]], atol=1e-6)


def test_other_extensions_are_refused_with_the_list(tmp_path):
    for name in ("pred.xlsx", "pred.shp", "pred"):
        with pytest.raises(DataError, match=r"the output format follows the extension .* not one of \.csv, \.gpkg, "
                                            r"\.parquet"):
            write_table(rd_points(), tmp_path / name)
    with pytest.raises(DataError, match=r"lacks column\(s\) \['x', 'y'\].*write \.csv"):
        write_table(pd.DataFrame({"a": [1.0]}), tmp_path / "t.gpkg")
    assert list(tmp_path.iterdir()) == []


def test_pyarrow_is_a_base_dependency_because_parquet_is_read_and_written():
    """`predict --out PRED.parquet`, `ingest T.parquet` and `--locations P.parquet` need pyarrow: a plain
    `pip install spatialfed` must bring it (it was only in the [test] extra: the output died after the work)."""
    import re
    import tomllib
    from pathlib import Path

    from spatialfed.data import ingest, points
    from spatialfed.outputs.tables import WRITERS

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[<>=!~ \[;]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    assert ".parquet" in WRITERS and ".parquet" in ingest.PARQUET_SUFFIXES and ".parquet" in points.PARQUET_SUFFIXES
    assert "pyarrow" in base, sorted(base)


def test_a_parquet_output_without_pyarrow_is_refused_before_any_work(tmp_path, monkeypatch, capsys):
    """An install that lacks pyarrow anyway: `spatialfed predict --out PRED.parquet` stops in one line naming the
    package before it reads the fit (the fit directory given here does not even exist) or starts a site."""
    import sys

    from spatialfed.cli import main
    from spatialfed.outputs.tables import check_writer

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` raises ImportError
    with pytest.raises(DataError, match=r"pred\.parquet: GeoParquet needs pyarrow, .* \(pip install pyarrow\) or "
                                        r"write \.csv or \.gpkg"):
        check_writer(tmp_path / "pred.parquet")
    assert check_writer(tmp_path / "pred.csv") == ".csv"
    argv = ["predict", str(tmp_path / "no_fit"), "--store", str(tmp_path / "no.zarr"), "--out",
            str(tmp_path / "pred.parquet"), "--quiet"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GeoParquet needs pyarrow" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
