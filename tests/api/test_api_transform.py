"""transform="log" end to end on Meuse zinc: ingest --transform log, fit, predict and map on zinc's own scale (the
lognormal mean, sd and quantiles), the estimator's own, save/load, scores of a file's observed column, refusals."""

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from spatialfed import Emulation
from spatialfed.api import FederatedGP
from spatialfed.cli import main
from spatialfed.data import datasets
from spatialfed.data.ingest import ingest_frame
from spatialfed.data.store import load_test, open_store
from spatialfed.model import transform as T
from spatialfed.outputs import metrics
from spatialfed.outputs import prediction as pr

MEUSE = datasets.data_file("meuse", "meuse.csv")


@pytest.fixture(scope="module")
def cli_fit(tmp_path_factory):
    d = tmp_path_factory.mktemp("logfit")
    assert main(["ingest", str(MEUSE), str(d / "s.zarr"), "--x", "x", "--y", "y", "--value", "zinc",
                 "--crs", "EPSG:28992", "--workers", "4", "--test-fraction", "0.2", "--transform", "log"]) == 0
    assert main(["fit", str(d / "s.zarr"), "--out", str(d / "fit"), "--mode", "sync", "--knots", "30",
                 "--runtime", "simulated", "--quiet"]) == 0
    return d


def test_ingest_writes_log_values_and_records_the_transform(cli_fit):
    info = open_store(cli_fit / "s.zarr")
    assert T.of_store(info) == "log"
    z = pd.read_csv(MEUSE)["zinc"].to_numpy(float)
    test_z = load_test(cli_fit / "s.zarr")[1]
    assert np.all(np.isin(np.round(np.exp(test_z), 6), np.round(z, 6)))  # the store holds log(zinc)
    assert json.loads((cli_fit / "fit" / "fit.json").read_text())["method"] == "lowrank"


def test_predict_on_the_test_group_is_on_zincs_scale_with_lognormal_columns(cli_fit, capsys):
    d = cli_fit
    assert main(["predict", str(d / "fit"), "--store", str(d / "s.zarr"), "--out", str(d / "pred.csv"),
                 "--runtime", "simulated", "--quiet"]) == 0
    frame = pd.read_csv(d / "pred.csv")
    assert {"median", "q025", "q975", "mean_log", "sd_log"} <= set(frame.columns)
    zinc = pd.read_csv(MEUSE)["zinc"]
    assert frame["observed"].min() >= zinc.min() - 1e-6 and frame["observed"].max() <= zinc.max() + 1e-6
    m, s = frame["mean_log"].to_numpy(), frame["sd_log"].to_numpy()
    dist = stats.lognorm(s=s, scale=np.exp(m))
    np.testing.assert_allclose(frame["mean"], dist.mean(), rtol=1e-9)
    np.testing.assert_allclose(frame["q025"], dist.ppf(0.025), rtol=1e-9)
    assert (frame["q025"] > 0).all() and (frame["mean"] > 0).all()   # never a negative concentration
    scores = json.loads((d / "metrics.json").read_text())
    expect = metrics.prediction_scores(frame["observed"], {k: frame[k].to_numpy() for k in frame.columns})
    for key in ("rmse", "mae", "crps", "coverage95"):
        assert scores[key] == pytest.approx(expect[key], rel=1e-9)
    assert scores["crps"] == pytest.approx(np.mean(T.crps_lognormal(frame["observed"], m, s)), rel=1e-9)


def test_predict_scores_a_locations_files_observed_column(cli_fit):
    d = cli_fit
    locs, z, _ = load_test(d / "s.zarr")
    pd.DataFrame({"x": locs[:, 0], "y": locs[:, 1], "zinc": np.exp(z)}).to_csv(d / "test.csv", index=False)
    assert main(["predict", str(d / "fit"), "--store", str(d / "s.zarr"), "--locations", str(d / "test.csv"),
                 "--observed", "zinc", "--out", str(d / "sub" / "file.csv"), "--runtime", "simulated",
                 "--quiet"]) == 0
    own, heldout = (json.loads(p.read_text()) for p in (d / "sub" / "metrics.json", d / "metrics.json"))
    for key in ("n", "rmse", "crps", "coverage95"):   # the same points scored from the file as from the store
        assert own[key] == pytest.approx(heldout[key], rel=1e-9)
    np.testing.assert_allclose(pd.read_csv(d / "sub" / "file.csv")["observed"], np.exp(z))


def test_observed_refusals_are_one_line(cli_fit, capsys):
    d = cli_fit
    rc = main(["predict", str(d / "fit"), "--store", str(d / "s.zarr"), "--locations", str(d / "test.csv"),
               "--observed", "zinq", "--out", str(d / "x.csv"), "--runtime", "simulated", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1
    assert "has no column 'zinq' to score against (--observed); its columns: x, y, zinc" in err[0]
    rc = main(["predict", str(d / "fit"), "--store", str(d / "s.zarr"), "--observed", "zinc",
               "--out", str(d / "y.csv"), "--runtime", "simulated", "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "--observed names a column of the locations file; give --locations" in err[0]
    assert not (d / "x.csv").exists() and not (d / "y.csv").exists()


def test_the_estimator_fits_on_the_log_scale_and_predicts_on_zincs(tmp_path):
    frame = pd.read_csv(MEUSE)[["x", "y", "zinc"]]
    train, test = frame.iloc[:120], frame.iloc[120:]
    gp = FederatedGP(mode="sync", knots=30, cluster="simulated", progress=False, transform="log",
                     crs="EPSG:28992", emulation=Emulation(n_sites=4)).fit(train, "zinc")
    assert gp.transform_ == "log"
    mean, sd = gp.predict(test[["x", "y"]], return_std=True)
    assert (mean > 0).all() and (sd > 0).all() and 100 < np.median(mean) < 1500
    scores = gp.predictive_scores(test, "zinc")  # y as a column name, as in fit
    assert scores["n"] == 35 and scores == gp.predictive_scores(test[["x", "y"]], test["zinc"].to_numpy())
    gp.save(tmp_path / "fit")
    back = FederatedGP.load(tmp_path / "fit")
    assert back.transform_ == "log" and back.get_params()["transform"] == "log"
    np.testing.assert_allclose(back.predict(test[["x", "y"]]), mean, rtol=1e-10)


def test_transform_refusals_name_the_fix(tmp_path):
    frame = pd.read_csv(MEUSE)[["x", "y", "zinc"]]
    ingest_frame(frame, tmp_path / "plain.zarr", value="zinc", x="x", y="y", crs="EPSG:28992", n_workers=4)
    gp = FederatedGP(mode="sync", knots=9, cluster="simulated", progress=False, transform="log")
    with pytest.raises(ValueError, match=r"^transform='log', but the store .*plain\.zarr holds untransformed "
                                         r"values; drop transform= .*`spatialfed ingest --transform log`"):
        gp.fit(tmp_path / "plain.zarr")
    bad = frame.assign(zinc=frame["zinc"].where(frame.index % 50 != 0, 0.0))
    with pytest.raises(ValueError, match=r"^transform='log' needs positive values, but 4 of 155 of column"):
        gp.set_params(crs="EPSG:28992").fit(bad, "zinc")
    with pytest.raises(ValueError, match=r"^transform must be None or 'log'"):
        FederatedGP(transform="sqrt").fit(frame, "zinc")
    with pytest.raises(SystemExit) as usage:  # argparse's usage error lists the choices
        main(["ingest", str(MEUSE), str(tmp_path / "x.zarr"), "--x", "x", "--y", "y", "--value", "zinc",
              "--transform", "log1p"])
    assert usage.value.code == 2


def test_predictive_scores_with_a_mistyped_column_lists_the_columns():
    frame = pd.read_csv(MEUSE)[["x", "y", "zinc", "dist"]]
    gp = FederatedGP(mode="sync", knots=9, cluster="simulated", progress=False, crs="EPSG:28992",
                     covariates=[], max_iter=3).fit(frame, "zinc")
    with pytest.raises(ValueError, match=r"^y='zinq' is not a column of X; did you mean 'zinc'\? X's columns: x, y, "
                                         r"zinc, dist$"):
        gp.predictive_scores(frame, "zinq")
    with pytest.raises(ValueError, match=r"^y='zinq' is not a column of X; did you mean 'zinc'"):
        FederatedGP(cluster="simulated").fit(frame, "zinq")
