"""The Vecchia residual through the estimator and the result files (issue 29): residual="vecchia" fits and predicts
like the full residual on a small store, "auto" picks the structure by site size, the block scheme refuses it."""

import json

import numpy as np
import pytest

from spatialfed.api import FederatedGP
from spatialfed.data.simulate import simulate_store
from spatialfed.model import vecchia_order


@pytest.fixture(scope="module")
def vecchia_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("vecchia") / "s.zarr"
    simulate_store(path, 3, 200, seed=1, test_size=60)
    return path


def fit(vecchia_store, **kw):
    return FederatedGP(knots=16, mode="sync", cluster="simulated", progress=False, **kw).fit(vecchia_store)


def test_vecchia_fit_and_prediction_follow_the_full_residual(vecchia_store, tmp_path):
    full, vec = fit(vecchia_store, residual="full"), fit(vecchia_store, residual="vecchia:15")
    assert vec.residual_ == "vecchia" and vec.converged_
    for name in ("delta", "sigma2", "beta"):
        np.testing.assert_allclose(vec.params_[name], full.params_[name], rtol=0.1, err_msg=name)
    rng = np.random.default_rng(0)
    locs0, X0 = rng.uniform(size=(40, 2)), rng.standard_normal((40, 5))
    (m0, s0), (m1, s1) = (gp.predict(X0, return_std=True, coords=locs0) for gp in (full, vec))
    assert np.max(np.abs(m1 - m0)) < 0.1 * np.std(m0) and np.max(np.abs(s1 / s0 - 1)) < 0.05
    vec.save(tmp_path / "fit")
    saved = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert saved["residual"] == "vecchia" and saved["vecchia_k"] == 15


def test_auto_uses_the_full_residual_on_small_sites_and_vecchia_on_large(vecchia_store, monkeypatch):
    assert fit(vecchia_store).residual_ == "full"  # 200 points per site ≤ VECCHIA_AUTO_N
    from spatialfed.model import local, residuals

    for module in (vecchia_order, local, residuals):  # each holds the name it imported
        if hasattr(module, "VECCHIA_AUTO_N"):
            monkeypatch.setattr(module, "VECCHIA_AUTO_N", 100)
    assert fit(vecchia_store).residual_ == "vecchia"
    assert fit(vecchia_store, strategies="tuned").residual_ == "full"  # the block scheme has no Vecchia theta step


def test_vecchia_with_the_block_scheme_is_refused(vecchia_store):
    with pytest.raises(ValueError, match="residual='vecchia' needs the statistics scheme"):
        fit(vecchia_store, residual="vecchia", strategies="tuned")
    for bad in ("vecchia:0", "vecchia:x", "auto:-2"):
        with pytest.raises(ValueError, match=r"K \(neighbours per point of the Vecchia residual\) must be an integer"):
            fit(vecchia_store, residual=bad)
    with pytest.raises(ValueError, match="only vecchia:K and auto:K take a neighbour count"):
        fit(vecchia_store, residual="full:5")
