"""FederatedGP as a scikit-learn estimator: clone/get_params, NotFittedError, DataFrame/GeoDataFrame/array input,
cross_val_score with GroupKFold on the shipped ozone data, and predict(return_std=True) equal to `spatialfed predict`."""

import gc
import json
import pickle
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone, is_regressor
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GroupKFold, cross_val_score
from sklearn.utils.validation import check_is_fitted

from conftest import grid_knots, simulate_parts
from spatialfed import Emulation
from spatialfed import FederatedGP
from spatialfed.cli import main
from spatialfed.data.datasets import ozone_frame
from spatialfed.data.store import write_store
from spatialfed.errors import DataError, SpatialFedError

FAST = dict(cluster="simulated", mode="sync", knots=9, max_iter=4, progress=False)


@pytest.fixture(scope="module")
def ozone():
    """One day of Midwest ozone (lon/lat, EPSG:4326), stations with a value; Iowa's 6 stations join Missouri's site
    (a site needs partition.MIN_PRIVATE_ROWS rows)."""
    frame = ozone_frame("870715").dropna(subset=["ozone"]).reset_index(drop=True)
    return frame.assign(state=frame["state"].replace({"IA": "MO"}))


@pytest.fixture(scope="module")
def ozone_gp(ozone):
    """A fit on the ozone DataFrame, one site per state (groups names the column)."""
    return FederatedGP(crs="EPSG:4326", **FAST).fit(ozone[["lon", "lat", "state"]], ozone["ozone"], groups="state")


def test_clone_get_params_round_trip():
    client = object()  # stands for a live distributed.Client: shared by clones, never deep-copied
    gp = FederatedGP(mode="sync", knots=25, crs="EPSG:28992", strategies={"correction": False}, cluster=client)
    twin = clone(gp)
    assert twin is not gp and twin.get_params() == gp.get_params()
    assert twin.cluster is client and twin.strategies is not gp.strategies  # settings copied, the client shared
    assert twin.set_params(knots=16) is twin and (twin.knots, gp.knots) == (16, 25)
    assert FederatedGP(**gp.get_params()).get_params() == gp.get_params()
    assert repr(gp).startswith("FederatedGP(") and "knots=25" in repr(gp) and "crs='EPSG:28992'" in repr(gp)
    assert is_regressor(gp)


def test_methods_before_fit_raise_not_fitted():
    gp = FederatedGP(**FAST)
    with pytest.raises(NotFittedError):
        check_is_fitted(gp)
    for call in (lambda: gp.predict(None, coords=np.zeros((1, 2))), lambda: gp.score(None, [1.0], coords=[[0, 0]]),
                 lambda: gp.save("unused"), lambda: gp.result_):
        with pytest.raises(NotFittedError, match="not fitted yet; call fit") as info:
            call()
        assert isinstance(info.value, SpatialFedError)  # spatialfed's base class too


def test_fitted_estimator_and_its_clone(ozone_gp):
    check_is_fitted(ozone_gp)
    assert ozone_gp.n_workers_ == 7 and ozone_gp.covariate_names_ == ["intercept"]  # one site per state
    twin = clone(ozone_gp)
    with pytest.raises(NotFittedError):
        check_is_fitted(twin)


def test_variogram_params_in_crs_units(ozone_gp):
    vp, p = ozone_gp.variogram_params_, ozone_gp.params_
    assert vp["nugget"] == pytest.approx(1 / p["delta"], rel=1e-12)
    assert vp["partial_sill"] == pytest.approx(p["sigma2"], rel=1e-12)
    assert vp["sill"] == pytest.approx(1 / p["delta"] + p["sigma2"], rel=1e-12)
    assert vp["range"] == pytest.approx(p["beta"], rel=1e-12)
    assert vp["practical_range"] / vp["range"] == pytest.approx(2.9957, abs=1e-4)  # SPEC §1, ν = 0.5
    assert vp["distance_unit"] == "metre" and "LAEA" in vp["crs"]  # lon/lat projected to an equal-area CRS
    assert 1e4 < vp["practical_range"] < 1e7  # metres: a regional field, not degrees


def test_cross_val_score_with_group_kfold(ozone):
    """Spatial block cross-validation: whole states held out (GroupKFold), each training set partitioned by state.
    Coordinates in CONUS Albers (EPSG:5070, metres), as a user with projected data gives them."""
    xy = gpd.GeoSeries(gpd.points_from_xy(ozone.lon, ozone.lat), crs="EPSG:4326").to_crs("EPSG:5070")
    X = pd.DataFrame({"x": xy.x, "y": xy.y})
    y, states = ozone["ozone"].to_numpy(), ozone["state"].to_numpy()
    cv = GroupKFold(3)
    gp = FederatedGP(crs="EPSG:5070", **FAST)
    scores = cross_val_score(gp, X, y, groups=states, cv=cv, params={"groups": states}, error_score="raise")
    assert scores.shape == (3,) and np.all(np.isfinite(scores)) and np.all(scores < 1)
    train, test = next(cv.split(X, y, states))  # the first fold by hand: the same fit and R²
    one = clone(gp).fit(X.iloc[train], y[train], groups=states[train])
    assert one.n_workers_ == len(set(states[train])) and not set(states[test]) & set(states[train])
    assert scores[0] == pytest.approx(one.score(X.iloc[test], y[test]), rel=1e-8, abs=1e-10)


def test_predict_return_std_equals_the_cli(ozone_gp, ozone, tmp_path):
    """gp.predict(X, return_std=True) = `spatialfed predict` on the saved fit at the same locations (a GeoPackage in
    EPSG:4326, reprojected by the CLI to the store's CRS)."""
    lon, lat = np.meshgrid(np.linspace(-92, -84, 5), np.linspace(37.5, 44, 4))
    points = gpd.GeoDataFrame(geometry=gpd.points_from_xy(lon.ravel(), lat.ravel()), crs="EPSG:4326")
    points = pd.concat([points, gpd.GeoDataFrame(geometry=gpd.points_from_xy(ozone.lon[:5], ozone.lat[:5]),
                                                 crs="EPSG:4326")], ignore_index=True)
    mean, sd = ozone_gp.predict(points, return_std=True)
    out = ozone_gp.save(tmp_path / "fit")
    points.to_file(tmp_path / "points.gpkg", driver="GPKG")
    main(["predict", str(out), "--store", str(ozone_gp.store_), "--locations", str(tmp_path / "points.gpkg"),
          "--out", str(tmp_path / "pred.csv"), "--runtime", "simulated"])
    cli = pd.read_csv(tmp_path / "pred.csv")
    np.testing.assert_allclose(mean, cli["mean"], rtol=1e-8)
    np.testing.assert_allclose(sd, cli["sd"], rtol=1e-8)
    assert np.all(sd > np.sqrt(ozone_gp.variogram_params_["nugget"]))  # a new observation: at least the nugget
    lonlat = pd.DataFrame({"lon": points.geometry.x, "lat": points.geometry.y})  # columns in crs= (EPSG:4326)
    np.testing.assert_allclose(ozone_gp.predict(lonlat), mean, rtol=1e-10)
    doc = json.loads((out / "fit.json").read_text())
    assert doc["variogram_params"] == pytest.approx(ozone_gp.variogram_params_)


def test_geodataframe_fit_equals_dataframe_fit(ozone, ozone_gp):
    geo = gpd.GeoDataFrame(ozone[["state"]], geometry=gpd.points_from_xy(ozone.lon, ozone.lat), crs="EPSG:4326")
    gp = FederatedGP(**FAST).fit(geo, ozone["ozone"], groups="state")  # the CRS comes from the GeoDataFrame
    for key in ("delta", "sigma2", "beta"):
        assert gp.params_[key] == pytest.approx(ozone_gp.params_[key], rel=1e-9)


def test_lonlat_without_crs_is_refused(ozone):
    with pytest.raises(DataError, match=r"look like longitude/latitude.*crs='EPSG:4326'"):
        FederatedGP(**FAST).fit(ozone[["lon", "lat"]], ozone["ozone"])


def test_store_path_takes_no_in_memory_arguments(tmp_path):
    with pytest.raises(DataError, match="apply to in-memory data only"):
        FederatedGP(**FAST).fit(str(tmp_path / "s.zarr"), [1.0, 2.0])


def _arrays():
    parts = simulate_parts(J=3, n=40, p=2, nu=0.5, seed=7)
    locs = np.vstack([p[0] for p in parts])
    z = np.concatenate([p[1] for p in parts])
    X = np.vstack([p[2] for p in parts])[:, 1:]  # the covariate without the intercept (fit adds it)
    return parts, locs, z, X, np.repeat(["a", "b", "c"], 40)


def test_arrays_with_groups_fit_like_the_store(tmp_path):
    """Arrays with site labels fit exactly as the store holding the same partitions."""
    parts, locs, z, X, groups = _arrays()
    settings = dict(FAST, knots=grid_knots(3))
    gp = FederatedGP(**settings).fit(X, z, coords=locs, groups=groups)
    write_store(tmp_path / "same.zarr", parts, partition="column:site", crs=None, covariate_names=["intercept", "x0"])
    ref = FederatedGP(**settings).fit(str(tmp_path / "same.zarr"))
    assert gp.n_workers_ == 3 and gp.covariate_names_ == ["intercept", "x0"]
    for key in ("delta", "sigma2", "beta"):
        assert gp.params_[key] == pytest.approx(ref.params_[key], rel=1e-8)
    np.testing.assert_allclose(gp.params_["gamma"], ref.params_["gamma"], rtol=1e-8)
    assert gp.loglik_ == pytest.approx(ref.loglik_, rel=1e-10)


def test_arrays_without_groups_are_partitioned_into_areas():
    _, locs, z, X, _ = _arrays()
    gp = FederatedGP(**FAST).fit(X, z, coords=locs)
    assert gp.n_workers_ == 4  # 120 rows: partition.default_sites (4 to 64 sites of about 500 rows, none under 20)
    three = FederatedGP(**FAST, emulation=Emulation(n_sites=3)).fit(X, z, coords=locs)
    assert three.n_workers_ == 3
    mean, sd = three.predict(X[:4], coords=locs[:4], return_std=True)
    assert mean.shape == sd.shape == (4,) and np.all(sd > 0)
    assert three.score(X, z, coords=locs) > 0.5  # in-sample R² of kriging with a nugget
    scores = three.predictive_scores(X, z, coords=locs)
    assert set(scores) >= {"rmse", "crps", "mlpd"} and scores["rmse"] > 0
    with pytest.raises(DataError, match="covariate column"):
        three.predict(np.column_stack([X, X])[:4], coords=locs[:4])
    with pytest.raises(DataError, match="coords="):
        three.predict(X[:4])


def test_the_temporary_store_lives_as_long_as_the_estimator():
    _, locs, z, X, groups = _arrays()
    gp = FederatedGP(**FAST).fit(X, z, coords=locs, groups=groups)
    first = Path(gp.store_)
    assert first.is_dir()
    twin = pickle.loads(pickle.dumps(gp))  # a copy (joblib, multiprocessing) has a store of its own (api.inputs)
    np.testing.assert_allclose(twin.predict(X[:3], coords=locs[:3]), gp.predict(X[:3], coords=locs[:3]), rtol=1e-12)
    assert Path(twin.store_) != first
    del twin
    gc.collect()
    assert first.is_dir()  # removing the copy's store leaves the original's
    gp.fit(X, z, coords=locs)  # a new fit replaces (and removes) the previous temporary store
    second = Path(gp.store_)
    assert not first.exists() and second.is_dir()
    del gp
    gc.collect()
    assert not second.exists()
