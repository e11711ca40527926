"""Prediction at scale (issue 14): batches give the unbatched answer, site calls see one batch at a time, the
predict command streams batches to a staged file (atomic: Ctrl-C leaves the old file) with a tqdm bar."""

import dataclasses
import json

import geopandas as gpd
import numpy as np
import pandas as pd
import pytest
from support import simulated_fit

from spatialfed.cli import main
from spatialfed.data.store import load_test, open_store
from spatialfed.model.predict import federated_predict
from spatialfed.outputs import prediction as pr
from spatialfed.outputs.prediction import engine

KEYS = ("mean", "sd", "sd_latent")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A simulated store (3 workers × 40, 5 covariates, 30 test points) and a quick in-process full-residual fit."""
    return simulated_fit(tmp_path_factory.mktemp("batched"), seed=3, max_iter=8)


class Spy:
    """The real runtime, recording how many locations each site call carried (a spy, not a stand-in)."""

    def __init__(self, runtime):
        self.runtime, self.sizes = runtime, []

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def call(self, name, calls):
        self.sizes += [len(args[0]) for args in calls.values() if args and np.ndim(args[0]) == 2]
        return self.runtime.call(name, calls)


@pytest.mark.parametrize("residual", ["full", "mpp", "pp"])
@pytest.mark.parametrize("predictor", ["lowrank", "independent", "ols"])
def test_batched_equals_unbatched(fitted, residual, predictor):
    """Batches of 7 and of 1 give the one-batch prediction to rtol 1e-10, and no site call sees more than a batch."""
    _, store, fit = fitted
    model = dataclasses.replace(pr.load_model(fit), residual=residual)
    locs0, _, X0 = load_test(store)
    with pr.open_workers(open_store(store), model, "simulated") as workers:
        whole = pr.predict_at(workers, model, locs0, X0, predictor, chunk=len(locs0))
        spy = Spy(workers)
        sevens = pr.predict_at(spy, model, locs0, X0, predictor, chunk=7)
        ones = pr.predict_at(workers, model, locs0, X0, predictor, chunk=1)
        if predictor == "lowrank":
            ref = federated_predict(workers.models, locs0, X0, model.params, model.knots, model.kernel, residual)
    for got in (sevens, ones):
        for key in KEYS:
            np.testing.assert_allclose(got[key], whole[key], rtol=1e-10, atol=0, err_msg=key)
        np.testing.assert_array_equal(got["owner"], whole["owner"])
    if predictor != "ols":
        assert spy.sizes and max(spy.sizes) <= 7
    if predictor == "lowrank":
        for key in KEYS:
            np.testing.assert_allclose(whole[key], ref[key], rtol=1e-10, err_msg=key)


def test_batch_size_bounds_the_servers_largest_matrix():
    assert pr.batch_size(16) == pr.BATCH_RANGE[1]                # few knots: the largest batch
    assert pr.batch_size(100) == pr.BATCH_BUDGET // 100          # batch × m ≈ 4·2²⁰ entries
    assert pr.batch_size(10**5) == pr.BATCH_RANGE[0]             # never below 256
    assert pr.batch_size(100, batch=50) == 50
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            pr.batch_size(16, batch=bad)


def test_streamed_file_equals_in_memory_prediction_with_progress(fitted, capsys):
    """predict_to_file with batches of 4 (8 batches) writes the table predict() returns, in every format, plus the
    same metrics.json; its tqdm bar reaches 30 of 30 on stderr."""
    d, store, fit = fitted
    frame, scores = pr.predict(fit, store, runtime="simulated")
    capsys.readouterr()
    out = d / "stream" / "pred.csv"
    done = pr.predict_to_file(fit, store, out, runtime="simulated", batch=4, progress=True)
    err = capsys.readouterr().err
    assert "predict" in err and "30/30" in err
    assert done["n"] == 30 and done["batch"] == 4 and done["outside"] == 0
    got = pd.read_csv(out)
    assert list(got.columns) == list(frame.columns)
    for col in ("x", "y", "observed", "owner"):
        np.testing.assert_array_equal(got[col], frame[col])
    for col in KEYS:
        np.testing.assert_allclose(got[col], frame[col], rtol=1e-10)
    written = json.loads(done["metrics"].read_text())
    numbers = {k for k, v in scores.items() if isinstance(v, (int, float))}
    assert written.keys() == scores.keys() and numbers
    assert {k: written[k] for k in numbers} == pytest.approx({k: scores[k] for k in numbers}, rel=1e-10)
    assert {k: written[k] for k in scores.keys() - numbers} == {k: scores[k] for k in scores.keys() - numbers}
    for suffix in (".gpkg", ".parquet"):  # a directory each: metrics.json beside pred.csv is not replaced
        path = out.parent / suffix[1:] / f"pred{suffix}"
        pr.predict_to_file(fit, store, path, runtime="simulated", batch=4, progress=False)
        geo = gpd.read_parquet(path) if suffix == ".parquet" else gpd.read_file(path)
        assert len(geo) == 30 and geo.geom_type.eq("Point").all()
        np.testing.assert_allclose(geo["mean"], frame["mean"], rtol=1e-10)
        np.testing.assert_allclose(geo.geometry.x, frame["x"])
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(".")]  # no staged file left


def test_interrupted_stream_leaves_the_previous_file(fitted, monkeypatch):
    """Ctrl-C after two batches: the earlier complete output is untouched and no staged temporary is left."""
    d, store, fit = fitted
    out = d / "interrupt" / "pred.csv"
    pr.predict_to_file(fit, store, out, runtime="simulated", batch=10, progress=False)
    before = out.read_bytes()
    real, seen = engine._predict_block, []

    def interrupted(*args, **kw):
        seen.append(1)
        if len(seen) == 3:
            raise KeyboardInterrupt
        return real(*args, **kw)

    monkeypatch.setattr(engine, "_predict_block", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pr.predict_to_file(fit, store, out, runtime="simulated", batch=4, progress=False, overwrite=True)
    assert out.read_bytes() == before and len(seen) == 3
    assert sorted(p.name for p in out.parent.iterdir()) == ["metrics.json", "pred.csv"]


def test_cli_predict_and_map_take_batch(fitted, capsys):
    """`predict --batch` and `map --batch` run the streamed path; the map's grid.gpkg equals a one-batch map."""
    d, store, fit = fitted
    out = d / "cli" / "p.csv"
    assert main(["predict", str(fit), "--store", str(store), "--out", str(out), "--runtime", "simulated",
                 "--batch", "6"]) == 0
    captured = capsys.readouterr()
    assert "30 predictions" in captured.out and "batches of 6" in captured.out and "predict" in captured.err
    assert len(pd.read_csv(out)) == 30
    cov = d / "cov.csv"
    g = np.linspace(0.0, 1.0, 41)
    xx, yy = np.meshgrid(g, g)
    rng = np.random.default_rng(0)
    pd.DataFrame({"x": xx.ravel(), "y": yy.ravel(),
                  **{name: rng.standard_normal(xx.size) for name in open_store(store).covariate_names}}
                 ).to_csv(cov, index=False)
    maps = {}
    for batch in ("37", "100000"):
        target = d / f"map{batch}"
        assert main(["map", str(fit), "--store", str(store), "--out", str(target), "--runtime", "simulated",
                     "--resolution", "0.05", "--covariates", str(cov), "--no-sites", "--batch", batch]) == 0
        maps[batch] = gpd.read_file(target / "grid.gpkg")
    assert len(maps["37"]) == len(maps["100000"]) > 37 * 3
    for col in ("mean", "sd", "sd_latent"):
        np.testing.assert_allclose(maps["37"][col], maps["100000"][col], rtol=1e-10)
    assert "map" in capsys.readouterr().err
