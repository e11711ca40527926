"""outputs.prediction.predict and write_prediction: the table and metrics a user reads are the predictor's numbers
(tests/outputs/test_outputs_predictor_reference.py checks those against dense references), with the domain flags
of a domain file. In-process and seconds: the mutation run's selection (docs/contributing.md) includes it."""

import json

import numpy as np
import pandas as pd
import pytest

from spatialfed.api import FederatedGP
from spatialfed.data.simulate import simulate_store
from spatialfed.data.store import load_test, open_store
from spatialfed.outputs import metrics
from spatialfed.outputs import prediction as pr


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    d = tmp_path_factory.mktemp("predfiles")
    store = d / "s.zarr"
    simulate_store(store, 2, 30, test_size=12, seed=5)
    gp = FederatedGP(mode="sync", knots=9, max_iter=3, runtime="simulated", progress=False).fit(store)
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
