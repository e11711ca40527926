"""Fit ↔ store identity: fit.json records the store's fingerprint; check_same_store refuses another store."""

from __future__ import annotations

import json

import numpy as np
import pytest

from spatialfed.data.store import open_store, write_store
from spatialfed.errors import StoreError
from spatialfed.outputs.results import FIT_KEYS, FitResult, check_same_store, load_fit, write_results


def make_store(path, seed=0):
    rng = np.random.default_rng(seed)
    parts = [(rng.random((n, 2)), rng.standard_normal(n), np.ones((n, 1))) for n in (6, 7)]
    return write_store(path, parts, partition="random", crs=None, covariate_names=["intercept"])


def make_result(fingerprint=None, store=None):
    return FitResult(method="lowrank", mode="sync", residual="full", nu=0.5, n_workers=2, n_obs=13,
                     params={"gamma": [0.1], "delta": 1.0, "sigma2": 1.0, "beta": 0.2}, loglik=-3.0,
                     knots=np.zeros((1, 2)), iterations=1, wall_time_s=0.1, converged=True,
                     extra={"store": store} if store else {}, store_fingerprint=fingerprint)


def test_fit_json_records_the_store_fingerprint(tmp_path):
    st = make_store(tmp_path / "a.zarr")
    out = write_results(tmp_path / "fit", make_result(st.fingerprint, str(st.path)))
    doc = json.loads((out / "fit.json").read_text())
    assert list(doc)[: len(FIT_KEYS)] == list(FIT_KEYS) and doc["store_fingerprint"] == st.fingerprint
    back = load_fit(out)
    assert back.store_fingerprint == st.fingerprint
    import zarr

    assert zarr.open_group(out / "model.zarr", mode="r").attrs["store_fingerprint"] == st.fingerprint
    assert "store_fingerprint" not in make_result().to_json()  # unknown: key absent, SPEC §6 keys exactly


def test_same_store_passes_another_is_refused_naming_both(tmp_path):
    a, b = make_store(tmp_path / "a.zarr"), make_store(tmp_path / "b.zarr", seed=1)
    check_same_store(a.fingerprint, a)
    check_same_store(a.fingerprint, str(a.path))
    check_same_store(make_result(a.fingerprint), tmp_path / "a.zarr")
    with pytest.raises(StoreError, match=r"was made on store .*a\.zarr \(fingerprint [0-9a-f]{12}\), but .*b\.zarr "
                                         r"is a different store .*pass store='.*a\.zarr', or fit again on .*b\.zarr"):
        check_same_store(make_result(a.fingerprint, str(a.path)), b)
    with pytest.raises(StoreError, match=r"checkpoint was made on the store with fingerprint [0-9a-f]{12}, but"):
        check_same_store(a.fingerprint, b, what="the checkpoint")
    with pytest.raises(StoreError) as info:
        check_same_store(a.fingerprint, b)
    assert "\n" not in str(info.value)


def test_same_data_rewritten_is_the_same_store(tmp_path):
    a = make_store(tmp_path / "a.zarr")
    again = make_store(tmp_path / "copy.zarr")  # same data and attributes at another path: same fingerprint
    assert again.fingerprint == a.fingerprint
    check_same_store(a.fingerprint, again)


def test_unrecorded_fingerprint_warns(tmp_path):
    a = make_store(tmp_path / "a.zarr")
    with pytest.warns(UserWarning, match="no store fingerprint"):
        check_same_store(None, a)
    legacy = "legacy-sha256:" + "0" * 64
    with pytest.raises(StoreError, match="written before stores recorded checksums"):
        check_same_store(legacy, open_store(a.path))
