"""outputs.prediction's files: predict, predict_to_file and write_prediction write the predictor's numbers
(tests/outputs/test_outputs_predictor_reference.py checks those against dense references) with the domain flags of
the data's hull or a domain file; a locations file in another CRS gives the design matrix and the reprojected points
(checked against values written here and a pyproj transform). In-process and seconds: the mutation run's selection
(docs/contributing.md) includes this file."""

import dataclasses
import io
import json
import re
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
from pyproj import CRS, Transformer

from spatialfed.api import FederatedGP
from spatialfed.data.simulate import simulate_store
from spatialfed.data.store import Store, load_test, open_store, write_store
from spatialfed.errors import DataError, OutputError, StoreError
from spatialfed.model.vecchia_order import VECCHIA_K
from spatialfed.outputs import metrics
from spatialfed.outputs import prediction as pr
from spatialfed.outputs.results import FitResult, write_results
from spatialfed.runtime.factory import AUTO_THRESHOLD


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("predfiles")
    store = d / "s.zarr"
    simulate_store(store, 2, 30, test_size=12, seed=5)
    gp = FederatedGP(mode="sync", knots=9, max_iter=3, cluster="simulated", progress=False).fit(store)
    return d, store, gp.save(d / "fit")


@pytest.mark.parametrize("predictor", ["lowrank", "independent", "ols"])
def test_predict_table_holds_the_predictor_numbers_and_scores(fitted, predictor):
    d, store, fit = fitted
    frame, scores = pr.predict(fit, store, predictor=predictor, runtime="simulated")
    locs0, z0, X0 = load_test(store)
    model = pr.load_model(fit)
    with pr.open_workers(open_store(store), model, "simulated") as workers:
        ref = pr.predict_at(workers, model, locs0, X0, predictor)
    assert list(frame.columns) == ["x", "y", "mean", "sd", "observed", "sd_latent", "owner", "outside_domain"]
    np.testing.assert_array_equal(frame[["x", "y"]].to_numpy(), locs0)
    np.testing.assert_array_equal(frame["observed"], z0)
    for key in ("mean", "sd", "sd_latent", "owner"):
        np.testing.assert_allclose(frame[key], ref[key], rtol=1e-12, err_msg=key)
    assert not frame["outside_domain"].any()  # the data's own hull holds its test points
    assert scores == {"predictor": predictor, **metrics.scores(z0, ref["mean"], ref["sd"])}
    out, mpath = pr.write_prediction(frame, d / predictor / "pred.csv", scores)
    back = pd.read_csv(out)
    np.testing.assert_allclose(back[["mean", "sd", "sd_latent"]], frame[["mean", "sd", "sd_latent"]], rtol=1e-12)
    assert mpath == out.with_name("metrics.json") and json.loads(mpath.read_text()) == scores
    assert pr.write_prediction(frame, d / predictor / "bare.csv")[1] is None  # no scores: no metrics.json


def test_a_domain_file_flags_the_locations_outside_it(fitted, tmp_path):
    _, store, fit = fitted
    locs0 = load_test(store)[0]
    cut = float(np.median(locs0[:, 0]))
    polygon = {"type": "FeatureCollection", "features": [{"type": "Feature", "properties": {}, "geometry": {
        "type": "Polygon", "coordinates": [[[-1, -1], [cut, -1], [cut, 2], [-1, 2], [-1, -1]]]}}]}
    path = tmp_path / "half.geojson"
    path.write_text(json.dumps(polygon))
    with pytest.warns(UserWarning, match=r"\d+ of 12 prediction location\(s\) lie outside the domain"):
        frame, _ = pr.predict(fit, store, domain=path, runtime="simulated")
    np.testing.assert_array_equal(frame["outside_domain"], locs0[:, 0] > cut)
RD = "EPSG:28992"  # Dutch national grid (metres)
LONLAT = np.array([[5.10, 52.05], [5.30, 52.10], [4.90, 51.95]])


def store_info(crs, names=("intercept", "elev")):
    """The fields of a Store that table_targets reads (no store on disk)."""
    return Store(Path("s.zarr"), 1, "random", crs, list(names), None, [3], False)


def test_design_matrix_adds_the_intercept_parses_numbers_and_keeps_the_order_of_the_fit():
    frame = pd.DataFrame({"kind": ["1.5", "-2", "0"], "elev": [3, 4, 5], "other": [9, 9, 9]})
    X = pr.design_matrix(frame, ["intercept", "elev", "kind"], "locs.csv")
    np.testing.assert_array_equal(X, [[1, 3, 1.5], [1, 4, -2], [1, 5, 0]])
    given = pr.design_matrix(frame.assign(intercept=[2.0, 2.0, 2.0]), ["elev", "intercept"], "locs.csv")
    np.testing.assert_array_equal(given, [[3, 2], [4, 2], [5, 2]])  # an intercept column given is used as given
    assert pr.design_matrix(frame, [], "locs.csv").shape == (3, 0)  # a fit without covariates


def test_design_matrix_counts_and_names_the_rows_with_bad_covariates():
    frame = pd.DataFrame({"elev": [1.0, np.nan, 2.0, 3.0, 4.0], "kind": ["1", "2", "3", "n/a", "5"]})
    with pytest.raises(DataError, match=r"^locs\.csv: 2 prediction location\(s\) .*\(first rows \[1, 3\]\)"):
        pr.design_matrix(frame, ["intercept", "elev", "kind"], "locs.csv")
    with pytest.raises(DataError, match=r"^locs\.csv lacks covariate column\(s\) \['slope'\]"):
        pr.design_matrix(frame, ["intercept", "slope", "elev"], "locs.csv")


def test_a_file_in_the_store_crs_gives_its_points_and_no_second_copy(tmp_path):
    xy = Transformer.from_crs("EPSG:4326", RD, always_xy=True).transform(LONLAT[:, 0], LONLAT[:, 1])
    path = tmp_path / "locs.csv"
    pd.DataFrame({"x": xy[0], "y": xy[1], "elev": [1.0, 2.0, 3.0]}).to_csv(path, index=False)
    t = pr.table_targets(path, store_info(RD))
    np.testing.assert_array_equal(t.locs, np.column_stack(xy))
    np.testing.assert_array_equal(t.X, [[1, 1], [1, 2], [1, 3]])
    assert t.given is None and t.observed is None


def test_named_coordinate_columns_are_kept_under_their_names(tmp_path):
    path = tmp_path / "locs.csv"
    pd.DataFrame({"E": [0.1, 0.5], "N": [0.2, 0.7], "elev": [1.0, 2.0]}).to_csv(path, index=False)
    t = pr.table_targets(path, store_info(None), x="E", y="N")
    np.testing.assert_array_equal(t.locs, [[0.1, 0.2], [0.5, 0.7]])
    pd.testing.assert_frame_equal(t.given, pd.DataFrame({"E": [0.1, 0.5], "N": [0.2, 0.7]}))


@pytest.mark.parametrize("columns", [("lon", "lat"), ("x", "y")])
def test_points_in_another_crs_are_reprojected_and_kept_as_given(tmp_path, columns):
    path = tmp_path / "locs.csv"
    pd.DataFrame({columns[0]: LONLAT[:, 0], columns[1]: LONLAT[:, 1], "elev": [1.0, 2.0, 3.0]}).to_csv(path,
                                                                                                     index=False)
    t = pr.table_targets(path, store_info(RD), x=columns[0], y=columns[1], crs="EPSG:4326")
    xy = Transformer.from_crs("EPSG:4326", RD, always_xy=True).transform(LONLAT[:, 0], LONLAT[:, 1])
    np.testing.assert_allclose(t.locs, np.column_stack(xy), atol=1e-3)  # mm
    np.testing.assert_array_equal(t.X, [[1, 1], [1, 2], [1, 3]])
    names = [f"{c}_input" if c in ("x", "y") else c for c in columns]  # the store's x, y are the reprojected ones
    pd.testing.assert_frame_equal(t.given, pd.DataFrame({names[0]: LONLAT[:, 0], names[1]: LONLAT[:, 1]}))


def test_a_locations_file_lacking_a_covariate_is_named(tmp_path):
    path = tmp_path / "bare.csv"
    pd.DataFrame({"x": [0.1], "y": [0.2]}).to_csv(path, index=False)
    with pytest.raises(DataError, match=rf"^{path} lacks covariate column\(s\) \['elev'\]"):
        pr.table_targets(path, store_info(None))


def test_the_rows_of_a_batch_are_those_rows_of_every_field():
    given = pd.DataFrame({"lon": [1.0, 2.0, 3.0, 4.0], "lat": [5.0, 6.0, 7.0, 8.0]})
    t = pr.Targets(np.arange(8.0).reshape(4, 2), np.arange(4.0)[:, None], np.array([9.0, 8.0, 7.0, 6.0]), given)
    part = t.rows(slice(1, 3))
    np.testing.assert_array_equal(part.locs, [[2, 3], [4, 5]])
    np.testing.assert_array_equal(part.X, [[1], [2]])
    np.testing.assert_array_equal(part.observed, [8, 7])
    pd.testing.assert_frame_equal(part.given, pd.DataFrame({"lon": [2.0, 3.0], "lat": [6.0, 7.0]}))
    bare = pr.Targets(t.locs, t.X).rows(slice(0, 1))
    assert bare.observed is None and bare.given is None


# --------------------------------------------------------------------------------------------------------------
# a store in a projected CRS without a test group, predicted at a lon/lat locations file
# --------------------------------------------------------------------------------------------------------------

TO_LONLAT = Transformer.from_crs(RD, "EPSG:4326", always_xy=True)
FAR = 20_000.0  # m east of the data: outside every site's hull


@pytest.fixture(scope="module")
def rd_fit(tmp_path_factory):
    """A store in EPSG:28992 (2 sites × 25 points side by side, covariates [intercept, elev], no truth, no test
    group), a quick fit of it, and a lon/lat locations file: a point of each site, one far east (row 2), two more."""
    d = tmp_path_factory.mktemp("rdfit")
    rng = np.random.default_rng(8)
    parts = []
    for j in range(2):
        locs = np.array([150_000.0 + 1000.0 * j, 400_000.0]) + 1000.0 * rng.uniform(size=(25, 2))
        X = np.column_stack([np.ones(25), rng.standard_normal(25)])
        parts.append((locs, X @ [1.0, 0.5] + np.sin(locs[:, 0] / 300) + 0.1 * rng.standard_normal(25), X))
    store = d / "rd.zarr"
    write_store(store, parts, partition="area", crs=RD, covariate_names=["intercept", "elev"])
    fit = FederatedGP(mode="sync", knots=9, max_iter=2, cluster="simulated", progress=False).fit(store).save(d / "f")
    rd = np.vstack([parts[0][0][3], parts[1][0][5], parts[0][0][7] + [FAR, 0.0], parts[1][0][9], parts[0][0][11]])
    lon, lat = TO_LONLAT.transform(rd[:, 0], rd[:, 1])
    elev = np.array([0.2, -1.0, 0.0, 1.5, 0.4])
    pd.DataFrame({"lon": lon, "lat": lat, "elev": elev}).to_csv(d / "locs.csv", index=False)
    return d, store, fit, rd, np.column_stack([np.ones(5), elev])


def personal_reference(store, fit, rd, X0, worker=1):
    model = pr.load_model(fit)
    with pr.open_workers(open_store(store), model, "simulated") as workers:
        return pr.predict_at(workers, model, rd, X0, "personal", worker)


def test_predict_to_file_reprojects_the_locations_and_streams_every_batch(rd_fit, capsys):
    d, store, fit, rd, X0 = rd_fit
    out = d / "personal.gpkg"
    with pytest.warns(UserWarning, match=r"^1 of 5 prediction location\(s\) lie outside the domain"):
        res = pr.predict_to_file(fit, store, out, locations=d / "locs.csv", x="lon", y="lat", crs="EPSG:4326",
                                 predictor="personal", worker=1, batch=2, progress=False)
    assert res == {"out": out, "metrics": None, "n": 5, "batch": 2, "outside": 1, "scores": None}
    assert capsys.readouterr().err == "" and not (d / "metrics.json").exists()
    back = gpd.read_file(out)
    assert back.crs == RD
    assert list(back.columns) == ["lon", "lat", "x", "y", "mean", "sd", "sd_latent", "owner", "outside_domain",
                                  "geometry"]
    np.testing.assert_allclose(back[["x", "y"]].to_numpy(), rd, atol=1e-3)  # mm
    np.testing.assert_allclose(np.column_stack(TO_LONLAT.transform(rd[:, 0], rd[:, 1])), back[["lon", "lat"]])
    ref = personal_reference(store, fit, back[["x", "y"]].to_numpy(), X0)  # at the points as reprojected
    for key in ("mean", "sd", "sd_latent"):
        np.testing.assert_allclose(back[key], ref[key], rtol=1e-12, err_msg=key)
    assert (back["owner"] == 1).all()
    np.testing.assert_array_equal(back["outside_domain"], [False, False, True, False, False])
    with pytest.raises(OutputError, match="already exists"):  # an existing table is kept unless overwrite=True
        pr.predict_to_file(fit, store, out, locations=d / "locs.csv", x="lon", y="lat", crs="EPSG:4326",
                           progress=False)


def test_predict_to_file_flags_by_a_domain_file_and_shows_its_progress(rd_fit, capsys):
    d, store, fit, rd, X0 = rd_fit
    lon = pd.read_csv(d / "locs.csv")["lon"].to_numpy()
    cut = 0.5 * (lon[0] + lon[1])  # site 0's point west of it, site 1's east
    west = {"type": "FeatureCollection", "features": [{"type": "Feature", "properties": {}, "geometry": {
        "type": "Polygon", "coordinates": [[[4.0, 51.0], [cut, 51.0], [cut, 53.0], [4.0, 53.0], [4.0, 51.0]]]}}]}
    (d / "west.geojson").write_text(json.dumps(west))
    out = d / "west.csv"
    out.write_text("old\n")
    with pytest.warns(UserWarning, match=r"^\d of 5 prediction location\(s\) lie outside"):
        res = pr.predict_to_file(fit, store, out, locations=d / "locs.csv", x="lon", y="lat", crs="EPSG:4326",
                                 domain=d / "west.geojson", predictor="personal", worker=1, batch=2, overwrite=True)
    err = capsys.readouterr().err
    assert "predict: 100%" in err and "5/5" in err  # progress=True is the default here
    back = pd.read_csv(out)
    np.testing.assert_array_equal(back["outside_domain"], lon > cut)
    assert res["outside"] == int((lon > cut).sum())
    np.testing.assert_allclose(back["mean"], personal_reference(store, fit, back[["x", "y"]].to_numpy(), X0)["mean"],
                               rtol=1e-12)


def test_predict_returns_the_table_in_the_store_crs_flagged_by_the_data_hull(rd_fit, capsys):
    d, store, fit, rd, X0 = rd_fit
    with pytest.warns(UserWarning, match=r"^1 of 5 prediction location\(s\) lie outside the domain"):
        frame, scores = pr.predict(fit, store, locations=d / "locs.csv", x="lon", y="lat", crs="EPSG:4326",
                                   predictor="personal", worker=1, batch=2)
    assert scores is None and frame.attrs["crs"] == RD and capsys.readouterr().err == ""  # no bar unless asked
    assert list(frame.columns) == ["lon", "lat", "x", "y", "mean", "sd", "sd_latent", "owner", "outside_domain"]
    np.testing.assert_allclose(frame[["x", "y"]].to_numpy(), rd, atol=1e-3)
    ref = personal_reference(store, fit, frame[["x", "y"]].to_numpy(), X0)
    for key in ("mean", "sd", "sd_latent", "owner"):
        np.testing.assert_allclose(frame[key], ref[key], rtol=1e-12, err_msg=key)
    np.testing.assert_array_equal(frame["outside_domain"], [False, False, True, False, False])
    with pytest.raises(DataError, match="has no test group; give prediction locations"):
        pr.predict(fit, store)


def test_the_default_predictor_is_seamless_for_low_rank_fits_and_independent_for_the_baselines(rd_fit, capsys):
    d, store, fit, rd, X0 = rd_fit
    model = pr.load_model(fit)
    with pytest.warns(UserWarning, match="outside the domain"):
        frame, _ = pr.predict(fit, store, locations=d / "locs.csv", x="lon", y="lat", crs="EPSG:4326",
                              progress=True)
    err = capsys.readouterr().err
    assert "predict: 100%" in err and "5/5" in err
    with pr.open_workers(open_store(store), model, "simulated") as workers:
        ref = pr.predict_at(workers, model, frame[["x", "y"]].to_numpy(), X0, "seamless")
    np.testing.assert_allclose(frame["mean"], ref["mean"], rtol=1e-12)
    np.testing.assert_allclose(frame["sd"], ref["sd"], rtol=1e-12)
    assert pr.default_predictor(dataclasses.replace(model, method="independent")) == "independent"
    assert pr.default_predictor(model) == "seamless"


def test_a_fit_is_refused_with_another_store_or_other_covariates(rd_fit, tmp_path):
    d, store, fit, rd, X0 = rd_fit
    model, info = pr.load_model(fit), open_store(store)
    pr.check_store(model, info)
    parts = [info.load_worker(j) for j in range(info.n_workers)]
    other = write_store(tmp_path / "other.zarr", [(p[0], p[1] + 1.0, p[2]) for p in parts], partition="area",
                        crs=RD, covariate_names=["intercept", "elev"])
    with pytest.raises(StoreError, match=rf"made on store {re.escape(str(store))} \(fingerprint"):
        pr.check_store(model, other)
    renamed = dataclasses.replace(info, covariate_names=["intercept", "slope"])
    with pytest.raises(DataError, match=r"has covariates \['intercept', 'slope'\], but the fit used"):
        pr.check_store(model, renamed)


def test_load_domain_reprojects_a_domain_file_to_the_store_crs(rd_fit):
    d, store, fit, rd, X0 = rd_fit
    lon, lat = TO_LONLAT.transform(rd[:, 0], rd[:, 1])
    box = {"type": "FeatureCollection", "features": [{"type": "Feature", "properties": {}, "geometry": {
        "type": "Polygon", "coordinates": [[[4.0, 51.0], [lon[0] + 1e-3, 51.0], [lon[0] + 1e-3, 53.0], [4.0, 53.0],
                                            [4.0, 51.0]]]}}]}
    (d / "box.geojson").write_text(json.dumps(box))
    dom = pr.load_domain(d / "box.geojson", open_store(store))
    assert dom.crs == CRS.from_user_input(RD)
    np.testing.assert_array_equal(dom.contains(rd), lon <= lon[0] + 1e-3)


def written_fit(d, method="lowrank", m=4, mu=True, Sigma=True, **extra):
    """A fit directory written by results.write_results from values chosen here."""
    knots = np.arange(2.0 * m).reshape(m, 2) / (2 * m)
    res = FitResult(method, "sync", "full", 1.5, 2, 50, {"gamma": [0.5, -1.0], "delta": 4.0, "sigma2": 1.3,
                                                         "beta": 0.2}, -10.0, knots, 3, 1.0, True,
                    mu=np.linspace(-1, 1, m) if mu else None, Sigma=np.eye(m) * 0.1 if Sigma else None,
                    extra=extra, store_fingerprint="sha256:abc")
    return write_results(d, res)


def test_load_model_reads_every_field_a_prediction_uses(tmp_path):
    fit = written_fit(tmp_path / "f", covariate_names=["intercept", "elev"], store="/data/s.zarr", vecchia_k=7)
    model = pr.load_model(fit)
    np.testing.assert_array_equal(model.knots, np.arange(8.0).reshape(4, 2) / 8)
    np.testing.assert_array_equal(model.params.mu, np.linspace(-1, 1, 4))
    np.testing.assert_array_equal(model.params.Sigma, np.eye(4) * 0.1)
    np.testing.assert_array_equal(model.params.gamma, [0.5, -1.0])
    assert (model.params.delta, model.params.sigma2, model.params.beta) == (4.0, 1.3, 0.2)
    assert (model.nu, model.residual, model.method, model.covariate_names) == (1.5, "full", "lowrank",
                                                                               ["intercept", "elev"])
    assert (model.store, model.store_fingerprint, model.vecchia_k) == ("/data/s.zarr", "sha256:abc", 7)
    assert pr.load_model(written_fit(tmp_path / "one", m=1)).knots.shape == (1, 2)  # one knot is a model too


def test_load_model_of_a_baseline_fit_has_no_low_rank_part(tmp_path):
    model = pr.load_model(written_fit(tmp_path / "f", method="independent", m=0, mu=False, Sigma=False))
    assert model.params.mu.shape == (0,) and model.params.Sigma.shape == (0, 0) and model.method == "independent"
    assert model.covariate_names is None and model.store is None and model.vecchia_k == VECCHIA_K


@pytest.mark.parametrize("missing", ["mu", "Sigma", "knots"])
def test_load_model_refuses_a_low_rank_fit_without_its_low_rank_part(tmp_path, missing):
    fit = written_fit(tmp_path / "f", m=0 if missing == "knots" else 4, mu=missing != "mu", Sigma=missing != "Sigma")
    with pytest.raises(DataError, match="has no μ, Σ or knots"):
        pr.load_model(fit)
    with pytest.raises(DataError, match="give the directory FederatedGP.save wrote"):
        pr.load_model(tmp_path / "nofit")


def test_write_prediction_georeferences_by_the_store_crs_and_keeps_an_existing_file(rd_fit, tmp_path):
    d, store, fit, rd, X0 = rd_fit
    with pytest.warns(UserWarning, match="outside the domain"):
        frame, _ = pr.predict(fit, store, locations=d / "locs.csv", x="lon", y="lat", crs="EPSG:4326",
                              predictor="personal", worker=1)
    out, mpath = pr.write_prediction(frame, tmp_path / "p.gpkg")  # the CRS the frame carries (the store's)
    assert gpd.read_file(out).crs == RD and mpath is None
    plain = frame.copy()
    plain.attrs = {}
    assert gpd.read_file(pr.write_prediction(plain, tmp_path / "q.gpkg", crs=RD)[0]).crs == RD  # crs= given
    with pytest.raises(OutputError, match="already exists"):
        pr.write_prediction(frame, out)
    pr.write_prediction(frame.iloc[:2], out, overwrite=True)
    assert len(gpd.read_file(out)) == 2


def test_predict_to_file_with_ols_writes_each_location_once(rd_fit):
    d, store, fit, rd, X0 = rd_fit
    info = open_store(store)
    parts = [info.load_worker(j) for j in range(info.n_workers)]
    z, X = np.concatenate([p[1] for p in parts]), np.vstack([p[2] for p in parts])
    with pytest.warns(UserWarning, match="outside the domain"):
        pr.predict_to_file(fit, store, d / "ols.csv", locations=d / "locs.csv", x="lon", y="lat", crs="EPSG:4326",
                           predictor="ols", batch=2, progress=False)
    back = pd.read_csv(d / "ols.csv")
    assert len(back) == 5 and (back["owner"] == -1).all() and back["owner"].dtype == np.int64
    np.testing.assert_allclose(back["mean"], X0 @ np.linalg.lstsq(X, z, rcond=None)[0], rtol=1e-10)


def test_seamless_is_continuous_where_the_owner_changes_and_lowrank_is_not(rd_fit):
    """Along a line across the two sites' boundary the owner predictor jumps where the owner changes; the seamless
    one (predict_at's default) blends the residual parts and moves by no more than its neighbours' steps."""
    d, store, fit, rd, X0 = rd_fit
    model = pr.load_model(fit)
    line = np.column_stack([np.linspace(150_600.0, 151_400.0, 801), np.full(801, 400_500.0)])
    X = np.column_stack([np.ones(len(line)), np.zeros(len(line))])
    with pr.open_workers(open_store(store), model, "simulated") as workers:
        owner = pr.predict_at(workers, model, line, X, "lowrank")
        smooth = pr.predict_at(workers, model, line, X)
        batches = list(pr.predict_batches(workers, model, line, X, batch=500))  # seamless by default too
        with pytest.raises(ValueError, match=r"worker index 0\.\.1"):
            pr.predict_at(workers, model, line, X, "personal", worker=2)
    assert [i for i, _ in batches] == [0, 500]
    np.testing.assert_allclose(np.concatenate([b["mean"] for _, b in batches]), smooth["mean"], rtol=1e-12)
    change = np.flatnonzero(np.diff(owner["owner"]) != 0)
    assert change.size >= 1
    step = lambda p: np.abs(np.diff(p["mean"]))  # noqa: E731
    typical = np.median(step(smooth))
    assert step(owner)[change].max() > 5 * typical  # a seam (here 11×): the residual part of the other site's data
    assert step(smooth)[change].max() < 2 * typical  # no seam (here 1.25×)


def test_predict_at_checks_its_targets_and_shows_progress_only_when_asked(rd_fit, capsys):
    d, store, fit, rd, X0 = rd_fit
    model = pr.load_model(fit)
    with pr.open_workers(open_store(store), model, "simulated") as workers:
        one = pr.predict_at(workers, model, rd[:1], X0[:1], "lowrank")
        assert capsys.readouterr().err == ""
        every = pr.predict_at(workers, model, rd, X0, "lowrank", chunk=2, progress=True)
        err = capsys.readouterr().err
        with pytest.raises(DataError, match="there are no prediction locations"):
            pr.predict_at(workers, model, rd[:0], X0[:0], "lowrank")
    assert "predict: 100%" in err and "5/5" in err
    assert one["owner"].dtype == np.int64 and every["owner"].dtype == np.int64
    for key in ("mean", "sd", "sd_latent", "owner"):
        np.testing.assert_allclose(one[key], every[key][:1], rtol=1e-12, err_msg=key)


@pytest.mark.parametrize("batch, size", [(1, 1), (7, 7), (None, 65_536)])
def test_batch_size_is_the_given_positive_integer_or_the_budget_over_m(batch, size):
    assert pr.batch_size(9, batch) == size  # 4·2²⁰ / 9 > 65 536: clipped


def test_batch_size_from_the_budget_is_clipped_to_its_range():
    assert pr.batch_size(100) == 4 * 2**20 // 100
    assert pr.batch_size(10**6) == 256
    for bad in (0, -3, 1.5, True):
        with pytest.raises(ValueError, match="must be a positive integer"):
            pr.batch_size(9, bad)


def test_prediction_runtime_runs_small_jobs_here_unless_dask_is_asked_for(rd_fit):
    d, store, fit, rd, X0 = rd_fit
    model, info = pr.load_model(fit), open_store(store)
    limit = AUTO_THRESHOLD // len(model.knots)  # observations × knots at most AUTO_THRESHOLD: in this process
    assert pr.prediction_runtime("auto", dataclasses.replace(info, sizes=[limit]), model) == "simulated"
    assert pr.prediction_runtime("auto", dataclasses.replace(info, sizes=[limit, 1]), model) == "dask"
    assert pr.prediction_runtime("dask", info, model) == "dask"
    assert pr.prediction_runtime("simulated", info, model, n_dask_workers=2) == "simulated"
    for given in ({"client": object()}, {"scheduler": "tcp://127.0.0.1:8786"}, {"n_dask_workers": 2}):
        assert pr.prediction_runtime("auto", info, model, **given) == "dask", given


@pytest.mark.parametrize("options, message", [
    ({"runtime": "no-such-runtime"}, "runtime must be one of"),
    ({"runtime": "simulated", "client": object()}, "runs in this process"),
    ({"runtime": "simulated", "scheduler": "tcp://127.0.0.1:8786"}, "runs in this process"),
    ({"n_dask_workers": 0}, r"n_workers=\) must be a positive integer"),
])
def test_predict_and_predict_to_file_pass_the_runtime_and_its_dask_options_on(fitted, tmp_path, options, message):
    """The runtime, client, scheduler and Dask worker count reach the sites' runtime: each value here is refused
    there (dropped, the small store would be predicted in this process), before any site starts or any file is
    written."""
    _, store, fit = fitted
    with pytest.raises(ValueError, match=message):
        pr.predict(fit, store, **options)
    with pytest.raises(ValueError, match=message):
        pr.predict_to_file(fit, store, tmp_path / "pred.csv", progress=False, **options)
    assert not any(tmp_path.iterdir())


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_counts_locations_on_the_stream_given_refreshing_slower_in_logs():
    """In a log the bar waits 15 s before it first shows and refreshes every 15 s; a run that finishes shows its
    final count there too, one that fails leaves no bar lines (its one error line stands alone); on a terminal the
    bar shows at once."""
    log = io.StringIO()
    with pr.counting(12, stream=log) as bar:
        assert (bar.total, bar.mininterval, bar.delay) == (12, 15.0, 15.0)
        bar.update(12)
    assert log.getvalue().split("\r")[-1].startswith("predict: 100%|##########| 12/12 ")
    failed = io.StringIO()
    with pytest.raises(OSError, match="disk full"), pr.counting(12, stream=failed) as bar:
        bar.update(5)
        raise OSError("disk full")
    assert failed.getvalue() == ""
    screen = Terminal()
    with pr.counting(3, stream=screen) as live:
        assert (live.mininterval, live.delay) == (0.5, 0.0)
        live.update(3)
    assert screen.getvalue().split("\r")[-1].startswith("predict: 100%|##########| 3/3 ")
    assert pr.progress_bar(3, enabled=False) is None
    with pr.counting(3, enabled=False) as none:
        assert none is None


def test_predict_to_file_whose_metrics_cannot_be_written_leaves_neither_file(fitted, tmp_path, monkeypatch):
    """metrics.json is written before the table is renamed into place: a full disk there leaves no pred.csv
    without its metrics.json (the disk is full for metrics.json alone: EFBIG on its staged file)."""
    import errno

    from spatialfed import atomic
    from spatialfed.outputs.prediction import files

    _, store, fit = fitted
    real = atomic.write_text

    def full(path, text, **kw):
        if Path(path).name == "metrics.json":
            raise atomic.output_error(Path(path), OSError(errno.ENOSPC, "No space left on device"))
        return real(path, text, **kw)

    monkeypatch.setattr(files, "write_text", full)
    with pytest.raises(OutputError, match=r"metrics\.json.*no space left on the device"):
        pr.predict_to_file(fit, store, tmp_path / "pred.csv", runtime="simulated", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
