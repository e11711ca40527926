"""runtime="auto" (issue 14): small jobs run in this process, larger ones and anything asking for Dask on Dask; the
in-process fit writes the result files of a Dask fit (the same estimate to rtol 1e-8 for a synchronous fit)."""

import json

import numpy as np
import pytest

from spatialfed import Cluster, Emulation
from spatialfed.api import FederatedGP
from spatialfed.cli import main
from spatialfed.data.datasets import meuse_store
from spatialfed.data.store import open_store, write_store
from spatialfed.outputs.prediction import load_model, prediction_runtime
from spatialfed.outputs.results import load_fit
from spatialfed.runtime.factory import AUTO_THRESHOLD, choose_runtime, knot_count


@pytest.fixture(scope="module")
def meuse(tmp_path_factory):
    path = tmp_path_factory.mktemp("auto") / "meuse.zarr"
    meuse_store(path, 4)  # 155 points, area partition, covariates intercept + sqrt(dist)
    return path


def test_choice_follows_the_size_and_the_options():
    assert choose_runtime("auto", n_obs=155, n_knots=50)[0] == "simulated"
    assert choose_runtime("auto", n_obs=AUTO_THRESHOLD // 100, n_knots=100)[0] == "simulated"   # at the threshold
    name, why = choose_runtime("auto", n_obs=AUTO_THRESHOLD // 100 + 1, n_knots=100)
    assert name == "dask" and f"> {AUTO_THRESHOLD:,}" in why
    assert choose_runtime("auto", n_obs=4000, n_knots=0)[0] == "simulated"       # no knots: charged as 100
    assert choose_runtime("auto", n_obs=6000, n_knots=0)[0] == "dask"
    assert choose_runtime("auto", n_obs=155, n_knots=50, dask_options=["scheduler"]) == \
        ("dask", "runtime auto: scheduler needs Dask")
    assert choose_runtime("auto")[0] == "dask"                                   # size unknown
    for explicit in ("dask", "simulated"):
        assert choose_runtime(explicit, n_obs=155, n_knots=50)[0] == explicit
    assert choose_runtime("virtual", n_obs=10**7, n_knots=100)[0] == "simulated"
    with pytest.raises(ValueError, match="runtime must be one of"):
        choose_runtime("threads", n_obs=1, n_knots=1)
    assert (knot_count(50), knot_count(np.zeros((7, 2))), knot_count(None)) == (50, 7, 0)


def test_estimator_chooses_from_the_store_and_its_settings(meuse, tmp_path):
    info = open_store(meuse)
    assert FederatedGP()._choose_runtime(info)[0] == "simulated"             # the default is auto
    assert FederatedGP(cluster="dask")._choose_runtime(info)[0] == "dask"
    for settings in ({"cluster": "tcp://127.0.0.1:8786"}, {"cluster": Cluster(tls=True)}, {"progress": "live"},
                     {"emulation": Emulation(profile="straggler")}, {"emulation": Emulation(slowdown=[1, 1, 1, 4])},
                     {"cluster": Cluster(n_workers=2)}, {"cluster": Cluster(on_worker_error="drop")},
                     {"emulation": Emulation(delays="exponential:0.1")}):
        name, why = FederatedGP(**settings)._choose_runtime(info)
        assert name == "dask" and "needs Dask" in why, settings
    # a larger store (6,000 rows × 100 knots = 600,000 > the threshold) goes to Dask
    rng = np.random.default_rng(0)
    parts = [(rng.uniform(size=(600, 2)), rng.standard_normal(600), np.ones((600, 1))) for _ in range(10)]
    write_store(tmp_path / "big.zarr", parts, partition="random", crs=None, covariate_names=["intercept"])
    big = open_store(tmp_path / "big.zarr")
    assert FederatedGP(knots=100)._choose_runtime(big)[0] == "dask"
    assert FederatedGP(knots=50)._choose_runtime(big)[0] == "simulated"     # 300,000


def test_fit_says_which_runtime_and_why(meuse, tmp_path, capsys):
    out = tmp_path / "fit"
    assert main(["fit", str(meuse), "--out", str(out), "--mode", "sync", "--knots", "25", "--max-iter", "5"]) == 0
    err = capsys.readouterr().err
    assert "runtime auto: a small job runs in this process, 155 observations × 25 knots = 3,875" in err
    fit = load_fit(out)
    assert fit.extra["runtime"] == "simulated" and "small job" in fit.extra["runtime_reason"]
    model = load_model(out)
    assert prediction_runtime("auto", open_store(meuse), model) == "simulated"
    assert prediction_runtime("auto", open_store(meuse), model, scheduler="tcp://127.0.0.1:1") == "dask"


@pytest.mark.slow
def test_in_process_fit_equals_the_dask_fit(meuse, tmp_path):
    """Synchronous Meuse fit: auto (in this process) and an explicit Dask LocalCluster give the same φ, μ, Σ and
    log-likelihood to rtol 1e-8, and the same fit.json apart from the clocks (~25 s: the cluster's start-up)."""
    settings = dict(mode="sync", knots=36, max_iter=30, progress=False)
    auto = FederatedGP(**settings).fit(meuse)
    dask = FederatedGP(**settings, cluster="dask").fit(meuse)
    assert (auto.runtime_used_, dask.runtime_used_) == ("simulated", "dask")
    assert auto.n_iter_ == dask.n_iter_ and auto.converged_ and dask.converged_
    for name in ("delta", "sigma2", "beta"):
        assert auto.params_[name] == pytest.approx(dask.params_[name], rel=1e-8), name
    np.testing.assert_allclose(auto.params_["gamma"], dask.params_["gamma"], rtol=1e-8)
    np.testing.assert_allclose(auto.mu_, dask.mu_, rtol=1e-8, atol=1e-8 * np.abs(dask.mu_).max())
    np.testing.assert_allclose(auto.Sigma_, dask.Sigma_, rtol=1e-8, atol=1e-8 * np.abs(dask.Sigma_).max())
    assert auto.loglik_ == pytest.approx(dask.loglik_, rel=1e-10)
    docs = []
    for gp, name in ((auto, "auto"), (dask, "dask")):
        doc = json.loads((gp.save(tmp_path / name) / "fit.json").read_text())
        for key in ("wall_time_s", "trace"):
            doc.pop(key)
        docs.append(doc)
    assert docs[0].keys() == docs[1].keys()
    for key in docs[0]:
        if key == "params":
            continue  # compared above to 1e-8
        if isinstance(docs[0][key], float):
            assert docs[0][key] == pytest.approx(docs[1][key], rel=1e-8), key
        elif key != "variogram_params":
            assert docs[0][key] == docs[1][key], key
