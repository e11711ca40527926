"""A user's second hour, each friction replayed as it was met: lon/lat found and remembered by every command, a
typo's message naming only the missing column, covariate suggestions that are safe, dropped rows and other warnings
said once in one line, the estimator's word about points outside the study area, distances in km."""

import warnings

import numpy as np
import pandas as pd
import pytest

from spatialfed import Emulation
from spatialfed.api import FederatedGP
from spatialfed.api.units import describe
from spatialfed.cli import main
from spatialfed.data.datasets import ozone_frame
from spatialfed.data.store import open_store
from spatialfed.outputs.report import distance


@pytest.fixture(scope="module")
def lonlat(tmp_path_factory):
    """Ozone stations as a plain lon/lat CSV, ingested without --x/--y, fitted quickly."""
    d = tmp_path_factory.mktemp("lonlat")
    day = ozone_frame("870715").dropna(subset=["ozone"])[["lon", "lat", "ozone"]]
    day.to_csv(d / "ozone.csv", index=False)
    day.iloc[:10].to_csv(d / "new.csv", index=False)
    return d, day


def test_ingest_finds_lon_lat_by_name_and_predict_remembers_their_crs(lonlat, capsys):
    d, day = lonlat
    assert main(["ingest", str(d / "ozone.csv"), str(d / "s.zarr"), "--value", "ozone", "--crs", "EPSG:4326",
                 "--workers", "4"]) == 0
    err = capsys.readouterr().err
    assert "coordinates from columns lon, lat (found by name)" in err
    info = open_store(d / "s.zarr")
    assert info.attrs["input_crs"] == "EPSG:4326" and info.crs != "EPSG:4326"
    assert main(["fit", str(d / "s.zarr"), "--out", str(d / "fit"), "--mode", "sync", "--knots", "16",
                 "--runtime", "simulated", "--quiet", "--max-iter", "3"]) == 0
    assert main(["predict", str(d / "fit"), "--store", str(d / "s.zarr"), "--locations", str(d / "new.csv"),
                 "--observed", "ozone", "--out", str(d / "p" / "pred.csv"), "--runtime", "simulated", "--quiet"]) == 0
    pred = pd.read_csv(d / "p" / "pred.csv")   # no second --crs EPSG:4326: the store remembers it
    assert list(pred.columns[:4]) == ["lon", "lat", "x", "y"]
    np.testing.assert_allclose(pred[["lon", "lat"]], day.iloc[:10][["lon", "lat"]])
    assert np.abs(pred[["x", "y"]].to_numpy()).max() > 1000   # reprojected to the store's metres


def test_a_table_without_coordinates_lists_its_columns(tmp_path, capsys):
    pd.DataFrame({"east": [1.0, 2.0], "north": [3.0, 4.0], "z": [1.0, 2.0]}).to_csv(tmp_path / "t.csv", index=False)
    assert main(["ingest", str(tmp_path / "t.csv"), str(tmp_path / "s.zarr"), "--value", "z"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "name them with --x and --y; its columns: east, north, z" in err[0]


def test_a_mistyped_coordinate_column_is_named_alone(lonlat, capsys):
    d, _ = lonlat
    pd.DataFrame({"x": [1.0], "y": [2.0]}).to_csv(d / "xy.csv", index=False)
    rc = main(["predict", str(d / "fit"), "--store", str(d / "s.zarr"), "--locations", str(d / "xy.csv"),
               "--x", "xx", "--y", "y", "--out", str(d / "q.csv"), "--runtime", "simulated", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1
    assert "has no column 'xx' among ['x', 'y']" in err[0] and "'y'" not in err[0].split("among")[0]


def test_dropped_rows_are_a_warning_with_the_count(tmp_path, capsys):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.uniform(0, 1000, 60), "y": rng.uniform(0, 1000, 60), "z": rng.normal(size=60),
                          "U": np.where(np.arange(60) % 5 == 0, np.nan, 1.0) * rng.normal(size=60)})
    frame.to_csv(tmp_path / "t.csv", index=False)
    assert main(["ingest", str(tmp_path / "t.csv"), str(tmp_path / "s.zarr"), "--value", "z", "--covariates", "U",
                 "--workers", "2"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "spatialfed ingest: warning: dropped 12 rows with missing values (U: 12)" in err


def test_covariate_suggestions_leave_out_copies_of_y_and_columns_with_gaps():
    rng = np.random.default_rng(1)
    n = 120
    z = rng.normal(size=n)
    frame = pd.DataFrame({"x": rng.uniform(0, 1000, n), "y": rng.uniform(0, 1000, n), "target": z,
                          "id": np.arange(n), "joker": z + 0.1 * rng.normal(size=n),
                          "U": np.where(rng.random(n) < 0.41, np.nan, rng.normal(size=n)),
                          "elev": rng.normal(size=n)})
    with pytest.raises(ValueError) as info:
        FederatedGP(cluster="simulated", progress=False).fit(frame, "target")
    msg = str(info.value)
    assert "X's column 'id' is named like an identifier" in msg and "pass covariates=['elev']" in msg
    assert "'joker' differs from y by 0.1" in msg and "a second measurement of y?" in msg
    assert "'U' is missing in" in msg and "\n" not in msg


def test_fit_without_x_and_with_covariates_names_the_cause():
    with pytest.raises(ValueError, match=r"^covariates= names columns of a DataFrame X; X is None \(no covariates: an "
                                         r"intercept-only model\): drop covariates="):
        FederatedGP(covariates=["elev"], cluster="simulated").fit(None, np.arange(5.0),
                                                                   coords=np.random.default_rng(0).random((5, 2)))


def test_a_warning_is_said_once_across_folds_in_one_line_without_a_path():
    from sklearn.model_selection import KFold, cross_val_score

    day = ozone_frame("870715").dropna(subset=["ozone"])
    gp = FederatedGP(crs="EPSG:4326", mode="sync", knots=9, cluster="simulated", progress=False, emulation=Emulation(n_sites=8),
                     max_iter=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cross_val_score(gp, day[["lon", "lat"]], day["ozone"], cv=KFold(3, shuffle=True, random_state=0))
    small = [w for w in caught if "sites have fewer than" in str(w.message)]
    texts = {str(w.message) for w in small}
    assert len(small) == len(texts) >= 1   # each text once, however many folds repeat it
    assert all(w.filename == "spatialfed" and "\n" not in str(w.message) for w in small)
    shown = warnings.formatwarning(small[0].message, small[0].category, small[0].filename, small[0].lineno)
    assert shown.count("\n") == 1 and ".py" not in shown


def test_the_estimators_predict_says_how_many_points_lie_outside_the_study_area():
    rng = np.random.default_rng(2)
    xy = rng.uniform(0, 1000, size=(80, 2))
    frame = pd.DataFrame({"x": xy[:, 0], "y": xy[:, 1], "z": np.sin(xy[:, 0] / 200) + 0.1 * rng.normal(size=80)})
    gp = FederatedGP(cluster="simulated", progress=False, knots=9, max_iter=3, crs="EPSG:28992",
                     emulation=Emulation(n_sites=2)).fit(frame, "z")
    new = pd.DataFrame({"x": [500.0, 5000.0, 6000.0], "y": [500.0, 500.0, 500.0]})
    with pytest.warns(UserWarning, match=r"^2 of 3 prediction location\(s\) lie outside the domain \(extrapolation; "
                                         r"the study area is the convex hull of the sites' hulls\)$"):
        gp.predict(new)


def test_distances_read_in_km_at_continental_scale():
    assert distance(8.063e6, "metre") == "8,063 km" and distance(40.0, "metre") == "40 m"
    assert distance(2.5, None) == "2.5 (planar units)" and distance(12_345.0, "metre") == "12.35 km"
    vp = {"nugget": 1.0, "partial_sill": 2.0, "sill": 3.0, "range": 8.063e6, "practical_range": 2.4e7,
          "distance_unit": "metre"}
    assert "range β = 8,063 km, practical range (ρ = 0.05) = 24,000 km" in describe(vp)


def test_map_titles_read_well():
    from spatialfed.data import geometry
    from spatialfed.outputs.maps import map_title

    planar = geometry.prediction_grid(geometry.domain_from_bbox(0, 0, 300, 250), 1.0)
    assert map_title("seamless", planar, None) == "seamless prediction on 75,000 cells of side 1 (planar units)"
    rd = geometry.prediction_grid(geometry.domain_from_bbox(0, 0, 400, 400, crs="EPSG:28992"), 40.0)
    assert map_title("lowrank", rd, "EPSG:28992") == "lowrank prediction on 100 cells of side 40 m, EPSG:28992"


def test_points_without_a_crs_take_the_stores_input_crs_only_when_they_look_like_it():
    from spatialfed.data.points import PointTable

    lonlat = PointTable(np.array([[-88.0, 40.0], [-87.0, 41.0]]), None, ("lon", "lat"), pd.DataFrame(), "t.csv")
    assert lonlat.arrived_in("EPSG:4326").crs.to_epsg() == 4326
    metres = PointTable(np.array([[181000.0, 333000.0], [179000.0, 330000.0]]), None, ("x", "y"), pd.DataFrame(),
                        "t.csv")
    assert metres.arrived_in("EPSG:4326").crs is None            # already in the store's CRS
    assert lonlat.arrived_in(None).crs.to_epsg() == 4326          # kept: it was set above
    fresh = PointTable(np.array([[-88.0, 40.0], [-87.0, 41.0]]), None, ("lon", "lat"), pd.DataFrame(), "t.csv")
    assert fresh.arrived_in(None).crs is None and fresh.arrived_in("EPSG:28992").crs is None  # projected: not lon/lat
