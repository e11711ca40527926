"""spatialfed predict: federated prediction driver end to end on a small simulated store, predictors, bad input."""

import json

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
from support import simulated_fit

from spatialfed.cli import main
from spatialfed.data.store import load_test, load_worker, open_store
from spatialfed.errors import DataError
from spatialfed.model.predict import federated_predict
from spatialfed.outputs import prediction as pr


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A simulated store (3 workers, 5 covariates, 30 test points) and a quick in-process fit of it."""
    return simulated_fit(tmp_path_factory.mktemp("pred"), seed=0, max_iter=10)


def test_predict_cli_at_test_group_writes_table_and_metrics(fitted, capsys):
    d, store, fit = fitted
    out = d / "pred" / "PRED.csv"
    assert main(["predict", str(fit), "--store", str(store), "--out", str(out), "--runtime", "simulated"]) == 0
    frame = pd.read_csv(out)
    assert list(frame.columns[:5]) == ["x", "y", "mean", "sd", "observed"]
    assert {"outside_domain", "owner", "sd_latent"} <= set(frame.columns) and len(frame) == 30
    np.testing.assert_array_equal(frame["observed"], load_test(store)[1])
    assert (frame["sd"] > frame["sd_latent"]).all() and not frame["outside_domain"].any()
    scores = json.loads((out.parent / "metrics.json").read_text())
    assert set(scores) == {"predictor", "n", "rmse", "mae", "crps", "coverage95"} and scores["n"] == 30
    assert 0.7 <= scores["coverage95"] <= 1.0
    assert "held-out scores" in capsys.readouterr().out


def test_driver_equals_in_process_protocol(fitted):
    """The driver's owner-rule federated prediction is model.predict.federated_predict."""
    _, store, fit = fitted
    model, info = pr.load_model(fit), open_store(store)
    locs0, _, X0 = load_test(store)
    with pr.open_workers(info, model, "simulated") as workers:
        got = pr.predict_at(workers, model, locs0, X0, "lowrank")
        chunked = pr.predict_at(workers, model, locs0, X0, "lowrank", chunk=7)
        ref = federated_predict(workers.models, locs0, X0, model.params, model.knots, model.kernel, model.residual)
        with pytest.raises(DataError, match=r"must have shape \(30, 5\)"):
            pr.predict_at(workers, model, locs0, X0[:, :4])
    np.testing.assert_allclose(got["mean"], ref["mean"])
    np.testing.assert_allclose(got["sd"], ref["sd"])
    for key in got:
        np.testing.assert_allclose(chunked[key], got[key], err_msg=key)


def test_dask_runtime_matches_in_process(fitted):
    from distributed import Client

    _, store, fit = fitted
    with Client(processes=False, n_workers=2, threads_per_worker=1, dashboard_address=None) as client:
        f_dask, s_dask = pr.predict(fit, store, client=client)
        leftover = client.run(lambda: __import__("spatialfed.runtime.site", fromlist=["x"]).registry_keys())
    f_local, s_local = pr.predict(fit, store, runtime="simulated")
    pd.testing.assert_frame_equal(f_dask, f_local)
    assert s_dask == s_local
    assert not any(k.startswith("predict-") for keys in leftover.values() for k in keys)  # partitions released


def test_ols_and_baseline_predictors(fitted):
    _, store, fit = fitted
    model, info = pr.load_model(fit), open_store(store)
    locs0, _, X0 = load_test(store)
    parts = [load_worker(store, j) for j in range(3)]
    X, z = np.vstack([p[2] for p in parts]), np.concatenate([p[1] for p in parts])
    with pr.open_workers(info, model, "simulated") as workers:
        ols = pr.predict_at(workers, model, locs0, X0, "ols")
        ind = pr.predict_at(workers, model, locs0, X0, "independent")
        own = pr.predict_at(workers, model, locs0, X0, "personal", worker=1)
        with pytest.raises(ValueError, match="worker index 0..2"):
            pr.predict_at(workers, model, locs0, X0, "personal")
    np.testing.assert_allclose(ols["mean"], X0 @ np.linalg.lstsq(X, z, rcond=None)[0])
    assert (own["owner"] == 1).all() and set(ind["owner"]) <= {0, 1, 2}
    assert np.all(ind["sd"] > 0) and np.all(np.isfinite(own["mean"]))


def test_locations_file_with_intercept_and_outside_points(tmp_path):
    """Intercept added automatically, outside points warned and flagged, missing covariates named."""
    from spatialfed.data.ingest import ingest_frame
    from spatialfed.api import FederatedGP

    rng = np.random.default_rng(3)
    xy = rng.uniform(0, 1000, size=(80, 2)) + [150000, 400000]
    frame = pd.DataFrame({"x": xy[:, 0], "y": xy[:, 1], "elev": rng.normal(size=80)})
    frame["z"] = 2 + 0.5 * frame["elev"] + np.sin(xy[:, 0] / 300) + 0.1 * rng.normal(size=80)
    store = tmp_path / "s.zarr"
    ingest_frame(frame, store, value="z", x="x", y="y", covariates=["elev"], crs="EPSG:28992", n_workers=2,
                 partition="area")
    FederatedGP(mode="sync", knots=9, cluster="simulated", max_iter=5, progress=False).fit(store).save(tmp_path / "f")
    locs = pd.DataFrame({"x": [150500.0, 160000.0], "y": [400500.0, 400500.0], "elev": [0.0, 1.0]})
    locs.to_csv(tmp_path / "locs.csv", index=False)
    with pytest.warns(UserWarning, match="1 of 2 prediction location"):
        out, scores = pr.predict(tmp_path / "f", store, locations=tmp_path / "locs.csv", runtime="simulated")
    assert out["outside_domain"].tolist() == [False, True] and scores is None and "observed" not in out
    locs.drop(columns="elev").to_csv(tmp_path / "bare.csv", index=False)
    with pytest.raises(DataError, match=r"lacks covariate column\(s\) \['elev'\]"):
        pr.predict(tmp_path / "f", store, locations=tmp_path / "bare.csv", runtime="simulated")
    locs.assign(elev=[0.0, np.nan]).to_csv(tmp_path / "nan.csv", index=False)
    with pytest.raises(DataError, match="missing or non-numeric covariates"):
        pr.predict(tmp_path / "f", store, locations=tmp_path / "nan.csv", runtime="simulated")
    pts = gpd.GeoDataFrame(locs, geometry=gpd.points_from_xy(locs.x, locs.y), crs="EPSG:28992").to_crs(4326)
    pts.to_file(tmp_path / "lonlat.gpkg")
    with pytest.warns(UserWarning, match="1 of 2 prediction location"):  # reprojected to the store's CRS
        again, _ = pr.predict(tmp_path / "f", store, locations=tmp_path / "lonlat.gpkg", runtime="simulated")
    np.testing.assert_allclose(again[["x", "y"]].to_numpy(), out[["x", "y"]].to_numpy(), atol=1e-3)  # mm
    np.testing.assert_allclose(again["mean"], out["mean"], rtol=1e-6)
    with pytest.raises(DataError, match="no test group"):
        pr.predict(tmp_path / "f", store, runtime="simulated")


def test_cli_reports_bad_input_cleanly(fitted, tmp_path, capsys):
    _, store, fit = fitted
    pd.DataFrame({"x": [0.5], "y": [0.5]}).to_csv(tmp_path / "l.csv", index=False)
    code = main(["predict", str(fit), "--store", str(store), "--locations", str(tmp_path / "l.csv"),
                 "--out", str(tmp_path / "p.csv"), "--runtime", "simulated"])
    assert code == 1 and "lacks covariate column(s) ['x1', 'x2', 'x3', 'x4', 'x5']" in capsys.readouterr().err
    assert not (tmp_path / "p.csv").exists()
    assert main(["predict", str(tmp_path / "nofit"), "--store", str(store), "--out", str(tmp_path / "p.csv")]) == 1
    assert "give the --out directory of `spatialfed fit`" in capsys.readouterr().err


def test_fitted_model_from_an_estimator_equals_the_one_its_saved_directory_loads(fitted, tmp_path):
    """FittedModel.from_estimator (predicting from memory) and load_model (from the directory FederatedGP.save
    writes) hold the same φ, knots, ν, residual and covariates."""
    from spatialfed.api import FederatedGP

    _, store, _ = fitted
    gp = FederatedGP(mode="sync", knots=9, cluster="simulated", max_iter=3, progress=False).fit(store)
    mine, saved = pr.FittedModel.from_estimator(gp), pr.load_model(gp.save(tmp_path / "fit"))
    for name in ("mu", "Sigma", "gamma", "delta", "sigma2", "beta"):
        np.testing.assert_array_equal(getattr(mine.params, name), getattr(saved.params, name), err_msg=name)
    np.testing.assert_array_equal(mine.knots, saved.knots)
    assert (mine.nu, mine.residual, mine.method, mine.covariate_names, mine.vecchia_k, mine.transform) == \
        (saved.nu, saved.residual, saved.method, saved.covariate_names, saved.vecchia_k, saved.transform)
