"""A fit outlives its process: ``FederatedGP.load(dir)`` of what ``save`` wrote, in a new interpreter, and pickle /
joblib copies of a fit on in-memory data after its temporary store is gone (api/loading.py, api/inputs.py)."""

import gc
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import joblib
import numpy as np
import pandas as pd
import pytest

from spatialfed.api import FederatedGP
from spatialfed.cli import main
from spatialfed.data.simulate import simulate_store
from spatialfed.errors import DataError, StoreError

FAST = {"cluster": "simulated", "knots": 9, "max_iter": 4, "progress": False}
ROOT = Path(__file__).resolve().parents[2]


def _frame(n=90, seed=2):
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"x": rng.uniform(0, 1000, n), "y": rng.uniform(0, 1000, n),
                          "elev": rng.normal(size=n)})
    frame["z"] = np.sin(frame.x / 200) + 0.5 * frame.elev + 0.2 * rng.normal(size=n)
    return frame


NEW = _frame(8, seed=9)[["x", "y", "elev"]]  # prediction points


@pytest.fixture
def frame_fit():
    """A fit on a DataFrame (written to a temporary store) with settings other than the defaults."""
    frame = _frame()
    gp = FederatedGP(mode="sync", nu=1.5, seed=3, crs="planar", covariates=["elev"], **FAST)
    return gp.fit(frame[["x", "y", "elev"]], frame["z"]), frame


def test_a_saved_fit_predicts_in_a_new_process_after_its_store_is_deleted(frame_fit, tmp_path):
    gp, frame = frame_fit
    mean, sd = gp.predict(NEW, return_std=True)
    r2 = gp.score(frame[["x", "y", "elev"]], frame["z"])
    gp.save(tmp_path / "fit")
    temporary = Path(gp.store_)
    gp._temporary_store.cleanup()
    assert not temporary.exists()
    NEW.to_csv(tmp_path / "new.csv", index=False)
    frame.to_csv(tmp_path / "frame.csv", index=False)
    script = f"""
import json, numpy as np, pandas as pd
from spatialfed.api import FederatedGP
from spatialfed.cli import main
gp = FederatedGP.load({str(tmp_path / "fit")!r})
new, frame = pd.read_csv({str(tmp_path / "new.csv")!r}), pd.read_csv({str(tmp_path / "frame.csv")!r})
mean, sd = gp.predict(new, return_std=True)
print(json.dumps({{"mean": mean.tolist(), "sd": sd.tolist(), "loglik": gp.loglik_, "store": gp.store_,
                  "score": gp.score(frame[["x", "y", "elev"]], frame["z"]),
                  "params": {{k: np.ravel(v).tolist() for k, v in gp.params_.items()}},
                  "variogram": gp.variogram_params_, "settings": {{k: repr(v) for k, v in gp.get_params().items()}}}}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    np.testing.assert_allclose(got["mean"], mean, rtol=0, atol=1e-10)
    np.testing.assert_allclose(got["sd"], sd, rtol=0, atol=1e-10)
    assert got["score"] == pytest.approx(r2, abs=1e-10) and got["loglik"] == pytest.approx(gp.loglik_, abs=1e-10)
    assert got["params"] == {k: np.ravel(v).tolist() for k, v in gp.params_.items()}
    assert got["variogram"] == pytest.approx(gp.variogram_params_)
    assert got["settings"] == {k: repr(v) for k, v in gp.get_params().items()}
    assert got["store"] == str(tmp_path / "fit" / "data.zarr")  # the copy save() kept of the in-memory data


def test_a_loaded_fit_has_the_fits_settings_attributes_and_saves_again(frame_fit, tmp_path, monkeypatch):
    gp, _ = frame_fit
    gp.save(tmp_path / "fit")
    monkeypatch.chdir(tmp_path)
    back = FederatedGP.load("fit")  # a relative path: the loaded fit keeps predicting from elsewhere
    monkeypatch.chdir(tmp_path.parent)
    assert back.get_params() == gp.get_params()
    assert back.get_params()["mode"] == "sync" and back.nu == 1.5 and back.covariates == ["elev"]
    for name in ("n_obs_", "n_workers_", "covariate_names_", "residual_", "n_iter_", "converged_", "store_crs_",
                 "boundary_", "stop_reason_", "runtime_used_"):
        assert getattr(back, name) == getattr(gp, name), name
    for name in ("knots_", "mu_", "Sigma_", "slowdowns_"):
        np.testing.assert_array_equal(getattr(back, name), getattr(gp, name), err_msg=name)
    assert [row["iter"] for row in back.trace_] == [row["iter"] for row in gp.trace_]
    NEW.to_csv(tmp_path / "new.csv", index=False)  # the command line predicts from the saved copy as well
    assert main(["predict", str(tmp_path / "fit"), "--store", str(tmp_path / "fit" / "data.zarr"), "--locations",
                 str(tmp_path / "new.csv"), "--out", str(tmp_path / "pred.csv"), "--quiet"]) == 0
    np.testing.assert_allclose(pd.read_csv(tmp_path / "pred.csv")["mean"], gp.predict(NEW), rtol=0, atol=1e-10)
    again = back.save(tmp_path / "again")  # the loaded fit's data.zarr goes along
    np.testing.assert_allclose(FederatedGP.load(again).predict(NEW), gp.predict(NEW), rtol=0, atol=1e-10)
    assert json.loads((again / "fit.json").read_text())["params"] == json.loads(
        (tmp_path / "fit" / "fit.json").read_text())["params"]


def test_a_store_fit_loads_without_its_store_and_names_it_to_predict(tmp_path):
    """The store is the federated contract: the saved fit points at it; params_, loglik_ and variogram_params_
    need no store, prediction does and says so in one line; load(dir, store=) gives its new place."""
    store = tmp_path / "s.zarr"
    simulate_store(store, 3, 30, test_size=5, seed=5)
    gp = FederatedGP(**FAST).fit(store)
    X, coords = np.zeros((4, 5)), np.random.default_rng(1).uniform(size=(4, 2))
    mean = gp.predict(X, coords=coords)
    gp.save(tmp_path / "fit")
    assert not (tmp_path / "fit" / "data.zarr").exists()  # the sites' data stay in their store
    shutil.move(store, tmp_path / "moved.zarr")
    back = FederatedGP.load(tmp_path / "fit")
    assert back.loglik_ == gp.loglik_ and back.variogram_params_ == gp.variogram_params_
    assert back.params_["delta"] == gp.params_["delta"]
    with pytest.raises(StoreError) as info:
        back.predict(X, coords=coords)
    assert str(info.value) == (f"prediction needs the sites' data in the store {store} (each site kriges the residual "
                               "part from its own partition), which is not there; put it back, or give its new "
                               f"place: FederatedGP.load({str(tmp_path / 'fit')!r}, store='NEW_PATH')")
    moved = FederatedGP.load(tmp_path / "fit", store=tmp_path / "moved.zarr")
    np.testing.assert_allclose(moved.predict(X, coords=coords), mean, rtol=0, atol=1e-10)
    simulate_store(tmp_path / "other.zarr", 3, 30, seed=6)
    with pytest.raises(StoreError, match=r"other\.zarr is a different store"):
        FederatedGP.load(tmp_path / "fit", store=tmp_path / "other.zarr")


@pytest.mark.parametrize("dump", ["pickle", "joblib"])
def test_a_copy_predicts_after_the_temporary_store_is_gone(frame_fit, tmp_path, dump):
    gp, _ = frame_fit
    mean, sd = gp.predict(NEW, return_std=True)
    if dump == "pickle":
        blob = pickle.dumps(gp)
    else:
        joblib.dump(gp, tmp_path / "gp.joblib")
    first = Path(gp.store_)
    gp._temporary_store.cleanup()  # what garbage collection of the original, or its process's exit, does
    assert not first.exists()
    twin = pickle.loads(blob) if dump == "pickle" else joblib.load(tmp_path / "gp.joblib")
    own = Path(twin.store_)
    assert own != first and own.is_dir()
    got_mean, got_sd = twin.predict(NEW, return_std=True)
    np.testing.assert_allclose(got_mean, mean, rtol=0, atol=1e-10)
    np.testing.assert_allclose(got_sd, sd, rtol=0, atol=1e-10)
    del twin
    gc.collect()
    assert not own.exists()  # the copy's own store goes with the copy


def _damaged(tmp_path, fit, how):
    d = tmp_path / how
    shutil.copytree(fit, d)
    if how == "no-model":
        shutil.rmtree(d / "model.zarr")
    elif how == "garbled-model":
        (d / "model.zarr" / "zarr.json").write_text("not json")
    elif how == "truncated-fit-json":
        (d / "fit.json").write_text('{"method": ')
    elif how == "fit-json-keys":
        (d / "fit.json").write_text('{"method": "lowrank"}')
    return d


@pytest.mark.parametrize("how, pattern", [pytest.param(how, pattern, id=how) for how, pattern in (
    ("missing", r"there is no fit directory; give a directory written by FederatedGP\.save\(DIR\)"),
    ("file", r"it is a file, not a fit directory"),
    ("no-model", r"has no μ, Σ or knots \(model\.zarr missing or damaged\); run `spatialfed fit` again"),
    ("garbled-model", r"its model\.zarr is damaged \(.*\); save the fit again"),
    ("truncated-fit-json", r"fit\.json is not valid JSON .*run the fit again"),
    ("fit-json-keys", r"fit\.json lacks keys \['mode', .*run the fit again"),
)])
def test_loading_a_missing_or_damaged_directory_is_one_line(frame_fit, tmp_path, how, pattern):
    gp, _ = frame_fit
    fit = gp.save(tmp_path / "fit")
    if how == "missing":
        d = tmp_path / "nope"
    elif how == "file":
        d = tmp_path / "f.txt"
        d.write_text("x\n")
    else:
        d = _damaged(tmp_path, fit, how)
    with pytest.raises(DataError) as info:
        FederatedGP.load(d)
    message = str(info.value)
    assert message.startswith(f"cannot load {d}: ") and "\n" not in message
    assert re.search(pattern, message), message


def test_a_fit_directory_written_before_load_existed_still_loads(tmp_path):
    """model.zarr without the settings save() now adds: the settings fit.json implies, the CRS from the store."""
    import zarr

    store = tmp_path / "s.zarr"
    simulate_store(store, 3, 30, seed=5)
    gp = FederatedGP(mode="sync", nu=1.5, **FAST).fit(store)
    gp.save(tmp_path / "fit")
    group = zarr.open_group(str(tmp_path / "fit" / "model.zarr"), mode="r+")
    settings = dict(group.attrs["settings"])
    for key in ("estimator", "store_crs", "groups_column", "covariates_inferred", "data"):
        settings.pop(key)
    group.attrs["settings"] = settings
    back = FederatedGP.load(tmp_path / "fit")
    assert (back.method, back.mode, back.nu, back.knots, back.seed) == ("lowrank", "sync", 1.5, 9, 0)
    assert back.store_crs_ == gp.store_crs_ and back.variogram_params_ == gp.variogram_params_
    X, coords = np.zeros((3, 5)), np.full((3, 2), 0.4)
    np.testing.assert_allclose(back.predict(X, coords=coords), gp.predict(X, coords=coords), rtol=0, atol=1e-10)


def test_a_fit_directory_and_a_checkpoint_of_earlier_versions_hold_the_old_flat_names(tmp_path):
    """vecchia_k, agg_threshold, checkpoint_every (earlier constructor parameters) in model.zarr's settings or a
    checkpoint's meta land in residual, strategies and checkpoint, silently (the files are data, not a call)."""
    import warnings

    import zarr

    from spatialfed import Checkpoint
    from spatialfed.algorithm.checkpoint import read_checkpoint, write_checkpoint

    store = tmp_path / "s.zarr"
    simulate_store(store, 3, 30, seed=5)
    path = tmp_path / "fit" / "checkpoint.zip"
    gp = FederatedGP(mode="sync", checkpoint=Checkpoint(path, every=1), **FAST).fit(store)
    gp.save(tmp_path / "fit")
    old = {"residual": "vecchia", "vecchia_k": 7, "strategies": None, "agg_threshold": 3,
           "checkpoint": str(path), "checkpoint_every": 2}
    group = zarr.open_group(str(tmp_path / "fit" / "model.zarr"), mode="r+")
    settings = dict(group.attrs["settings"])
    settings["estimator"] = {**settings["estimator"], **old}
    group.attrs["settings"] = settings
    snap = read_checkpoint(path)
    snap["meta"]["params"] = {**snap["meta"]["params"], **old}
    write_checkpoint(path, snap)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        back, resumed = FederatedGP.load(tmp_path / "fit"), FederatedGP.resume(path)
    for gp_ in (back, resumed):
        assert gp_.residual == "vecchia:7" and gp_.vecchia_k_ == 7 and gp_.strategies == {"agg_threshold": 3}
        assert gp_.checkpoint == Checkpoint(str(path), every=2)
    assert resumed.n_iter_ == back.n_iter_  # the finished fit the checkpoint holds
    with pytest.warns(FutureWarning, match=r"checkpoint_every=\.\.\.\) is now checkpoint=Checkpoint"):
        again = FederatedGP.resume(path, checkpoint_every=5)
    assert again.checkpoint == Checkpoint(str(path), every=5)
    assert FederatedGP.resume(path, checkpoint=str(tmp_path / "c2.zip")).checkpoint == Checkpoint(
        str(tmp_path / "c2.zip"), every=2)  # a path alone keeps how often the fit checkpointed
