"""Ingest: tables to stores, with clear errors and no partial store for every bad input."""

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
import zarr

from spatialfed.data.ingest import ingest, ingest_frame, read_table
from spatialfed.data.store import load_test, load_worker, open_store
from spatialfed.errors import DataError


def table(n=40, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"lon": rng.uniform(-90, -85, n), "lat": rng.uniform(38, 43, n),
                         "ozone": rng.uniform(20, 80, n), "elev": rng.uniform(0, 300, n),
                         "agency": rng.choice(["IL", "IN", "WI"], n)})


@pytest.fixture
def out(tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    return folder / "s.zarr"


def assert_no_store(out):
    assert list(out.parent.iterdir()) == []


def test_csv_lonlat_is_projected_to_utm(tmp_path, out):
    frame = table()
    frame.to_csv(tmp_path / "t.csv", index=False)
    info, report = ingest(tmp_path / "t.csv", out, x="lon", y="lat", value="ozone", covariates=["elev"],
                          crs="EPSG:4326", n_workers=3, partition="area")
    assert info.crs == "EPSG:32616" and info.covariate_names == ["intercept", "elev"] and sum(info.sizes) == 40
    locs, z, X = load_worker(out, 0)
    assert locs[:, 0].min() > 1e5 and locs[:, 1].min() > 4e6  # metres
    np.testing.assert_array_equal(X[:, 0], 1.0)
    assert "projected coordinates from EPSG:4326 to EPSG:32616" in report.lines()
    assert zarr.open_group(out, mode="r").attrs["crs"] == "EPSG:32616"


def test_planar_coordinates_need_crs_planar_when_they_look_like_lonlat(out):
    frame = table()
    with pytest.raises(DataError, match=r"look like longitude/latitude but no CRS was given; pass crs='EPSG:4326'"):
        ingest_frame(frame, out, x="lon", y="lat", value="ozone", n_workers=2)
    assert_no_store(out)
    info, _ = ingest_frame(frame, out, x="lon", y="lat", value="ozone", n_workers=2, intercept=False,
                           covariates=["elev"], crs="planar")
    assert info.crs is None and info.covariate_names == ["elev"]
    locs = np.vstack([load_worker(out, j)[0] for j in range(2)])
    assert set(map(tuple, locs)) == set(map(tuple, frame[["lon", "lat"]].to_numpy()))


def test_degrees_labelled_with_a_projected_crs_are_refused(out):
    """Lon/lat called EPSG:28992 (metres) fitted a range of 11 m: points outside the CRS's area of use are refused."""
    frame = table()
    frame["lon"], frame["lat"] = frame["lon"] + 95, frame["lat"] + 12  # in the Netherlands, as degrees
    with pytest.raises(DataError, match=r"look like longitude/latitude and lie outside the area of use of EPSG:28992, "
                                        r"a projected CRS: they are not in its units; pass crs='EPSG:4326'"):
        ingest_frame(frame, out, x="lon", y="lat", value="ozone", n_workers=2, crs="EPSG:28992")
    assert_no_store(out)
    rd = frame.assign(lon=155_000 + 1e4 * (frame["lon"] - 5), lat=463_000 + 1e4 * (frame["lat"] - 50))  # metres
    assert ingest_frame(rd, out, x="lon", y="lat", value="ozone", n_workers=2, crs="EPSG:28992")[0].crs == "EPSG:28992"


def test_missing_values_are_reported_and_dropped(out):
    frame = table()
    frame.loc[[1, 5], "ozone"] = np.nan
    frame.loc[7, "elev"] = np.nan
    info, report = ingest_frame(frame, out, x="lon", y="lat", value="ozone", covariates=["elev"], n_workers=2,
                                crs="EPSG:4326")
    assert sum(info.sizes) == 37 and report.n_dropped == 3
    assert "dropped 3 rows with missing values (ozone: 2, elev: 1)" in report.lines()


def test_column_partition_and_test_fraction(out):
    frame = table(80)  # about 20 training rows per agency: every site above partition.MIN_PRIVATE_ROWS
    info, report = ingest_frame(frame, out, x="lon", y="lat", value="ozone", crs="EPSG:4326",
                                partition="column:agency", test_fraction=0.25, seed=3)
    assert info.partition == "column:agency" and info.n_workers == 3 and info.has_test
    assert sum(info.sizes) == 60 and len(load_test(out)[1]) == 20
    assert zarr.open_group(out, mode="r").attrs["worker_labels"] == ["IL", "IN", "WI"]
    assert report.n_test == 20


def test_duplicates_merge_and_keep(tmp_path):
    frame = table(12)  # one site of 11 or 12 rows, above partition.MIN_PRIVATE_ROWS
    frame.loc[3, ["lon", "lat"]] = frame.loc[0, ["lon", "lat"]]
    info, report = ingest_frame(frame, tmp_path / "m.zarr", x="lon", y="lat", value="ozone", n_workers=1,
                                duplicates="merge", crs="planar")
    assert sum(info.sizes) == 11 and report.n_duplicates == 2
    locs, z, _ = load_worker(tmp_path / "m.zarr", 0)
    row = np.flatnonzero((locs == frame.loc[0, ["lon", "lat"]].to_numpy(dtype=float)).all(axis=1))
    assert z[row] == pytest.approx((frame.ozone[0] + frame.ozone[3]) / 2)
    info, _ = ingest_frame(frame, tmp_path / "k.zarr", x="lon", y="lat", value="ozone", n_workers=1,
                           duplicates="keep", crs="planar")
    assert sum(info.sizes) == 12


def test_geopackage_and_geoparquet_points_use_the_files_crs(tmp_path):
    frame = table()
    geo = gpd.GeoDataFrame(frame.drop(columns=["lon", "lat"]),
                           geometry=gpd.points_from_xy(frame.lon, frame.lat), crs="EPSG:4326")
    geo.to_file(tmp_path / "t.gpkg")
    geo.to_parquet(tmp_path / "t.parquet")
    for name in ("t.gpkg", "t.parquet"):
        assert isinstance(read_table(tmp_path / name), gpd.GeoDataFrame)
        info, _ = ingest(tmp_path / name, tmp_path / f"{name}.zarr", value="ozone", n_workers=2)
        assert info.crs == "EPSG:32616" and sum(info.sizes) == 40
    with pytest.raises(DataError, match="the file is in EPSG:4326 but crs= says EPSG:28992"):
        ingest(tmp_path / "t.gpkg", tmp_path / "x.zarr", value="ozone", crs="EPSG:28992")


def test_existing_output_refused_unless_overwrite(out):
    ingest_frame(table(), out, x="lon", y="lat", value="ozone", n_workers=2, crs="EPSG:4326")
    with pytest.raises(DataError, match="already exists.*overwrite=True"):
        ingest_frame(table(), out, x="lon", y="lat", value="ozone", n_workers=3, crs="EPSG:4326")
    assert open_store(out).n_workers == 2
    assert ingest_frame(table(), out, x="lon", y="lat", value="ozone", n_workers=3, overwrite=True,
                        crs="EPSG:4326")[0].n_workers == 3


def bad_frames():
    nonnum = table().astype({"ozone": object})
    nonnum.loc[4, "ozone"] = "n/a?"
    allmissing = table()
    allmissing["elev"] = np.nan
    holes = table(4)
    holes.loc[[0, 1], "ozone"] = np.nan
    holes.loc[[2, 3], "elev"] = np.nan
    dup = table()
    dup.loc[9, ["lon", "lat"]] = dup.loc[2, ["lon", "lat"]]
    far = table()
    far.loc[0, "lat"] = 95.0
    return [
        (table(), dict(value="pm25", covariates=["elev", "rain"]), r"\['pm25', 'rain'\] not in the table"),
        (nonnum, {}, r"column 'ozone' has 1 non-numeric value\(s\) \(row 4: 'n/a\?'\)"),
        (allmissing, {}, "column 'elev' has no values at all"),
        (holes, {}, "every row has a missing value"),
        (table(6), dict(n_workers=7), "only 6 rows remain for 7 workers"),
        (table(4), {}, r"only 4 distinct location\(s\) among 4 coordinates \(lon, lat\), fewer than the 6 needed"),
        (table(), dict(n_workers=0), "n_workers must be a positive integer"),
        (table(), dict(n_workers=-1), "n_workers must be a positive integer"),
        (dup, {}, r"2 rows share their coordinates with another row \(e.g. rows \[2, 9\]"),
        (far, dict(crs="EPSG:4326"), "outside lon"),
        (table(), dict(crs="EPSG:999999"), "unknown CRS 'EPSG:999999'"),
        (table(), dict(partition="column:agency", n_workers=2), "has 3 groups but n_workers is 2"),
        (table(), dict(partition="column:agency", sizes=[20, 20]), "sizes cannot be used"),
        (table(), dict(partition="zones"), "unknown partition 'zones'"),
        (table(), dict(test_fraction=1.0), "test_fraction must be in"),
        (table(), dict(duplicates="drop"), "duplicates must be one of"),
        (table(), dict(covariates=[], intercept=False), "no columns"),
    ]


@pytest.mark.parametrize("frame, options, message", bad_frames())
def test_bad_input_gives_clear_error_and_no_store(out, frame, options, message):
    options = dict(x="lon", y="lat", value="ozone", covariates=["elev"], n_workers=2, crs="planar") | options
    with pytest.raises(DataError, match=message):
        ingest_frame(frame, out, **options)
    assert_no_store(out)


def test_unreadable_or_missing_table(tmp_path, out):
    with pytest.raises(DataError, match="does not exist"):
        ingest(tmp_path / "nope.csv", out, value="ozone")
    (tmp_path / "bad.gpkg").write_text("not a geopackage")
    with pytest.raises(DataError, match="cannot read"):
        ingest(tmp_path / "bad.gpkg", out, value="ozone")
    with pytest.raises(DataError, match=r"no coordinate columns found by name .*name them with x= and y=; its "
                                        r"columns: east, north, ozone"):
        ingest_frame(table().rename(columns={"lon": "east", "lat": "north"}), out, value="ozone")
    assert_no_store(out)


def test_a_site_under_the_minimum_is_refused_and_a_chosen_minimum_is_recorded(tmp_path):
    from spatialfed.data.partition import MIN_PRIVATE_ROWS, check_site_sizes, store_minimum

    frame = table(60)
    frame.loc[:4, "agency"] = "MI"  # a 5-row agency
    with pytest.raises(DataError, match=rf"1 of 4 sites have fewer than {MIN_PRIVATE_ROWS} rows \('MI' has 5\)"):
        ingest_frame(frame, tmp_path / "a.zarr", x="lon", y="lat", value="ozone", crs="EPSG:4326",
                     partition="column:agency")
    assert not (tmp_path / "a.zarr").exists()
    info, _ = ingest_frame(frame, tmp_path / "b.zarr", x="lon", y="lat", value="ozone", crs="EPSG:4326",
                           partition="column:agency", min_site_rows=5)
    attrs = open_store(tmp_path / "b.zarr").attrs
    assert attrs["min_site_rows"] == 5 and store_minimum(attrs) == 5 and min(info.sizes) == 5
    check_site_sizes(info.sizes, info.worker_labels, store_minimum(attrs))  # what fit checks: the owners' choice
    with pytest.raises(DataError, match="must be a positive integer"):
        ingest_frame(frame, tmp_path / "c.zarr", x="lon", y="lat", value="ozone", crs="EPSG:4326", min_site_rows=0)
