"""A parameter the fit leaves on a bound of its box (issue 14): the estimator reports it (``boundary_``, the summary
line, fit.json) and the fit ends converged instead of running to max_iter."""

import json

import numpy as np
import pytest

from spatialfed.api import FederatedGP
from spatialfed.api.units import on_bound
from spatialfed.data.simulate import simulate_store


@pytest.fixture(scope="module")
def noise_free(tmp_path_factory):
    """400 points of a smooth (ν = 1.5) Matérn field sampled exactly, noise sd 1e-4: the nugget's MLE is ≈ 0."""
    path = tmp_path_factory.mktemp("nugget0") / "s.zarr"
    simulate_store(path, 1, 400, noise_sd=1e-4, beta=0.1, nu=1.5, seed=0)
    return path


def test_a_nugget_that_runs_to_zero_is_reported_on_its_boundary(noise_free, tmp_path, capsys):
    gp = FederatedGP(knots=25, nu=1.5, mode="sync", runtime="simulated", progress=True).fit(noise_free)
    assert gp.converged_ and gp.stop_reason_ == "tol"
    assert gp.boundary_ == {"delta": "upper"}
    # log δ walks ≈ 11 from φ₀ to its bound in Newton steps of ≈ 1 (ℓ ≈ ℓ∞ − c/δ): 16 round trips; with the block
    # scheme's eigenvalue floor (1e-6 · max|λ|) the steps shrank to 0.03 once ℓ flattened: 33
    assert gp.n_iter_ <= 20
    assert gp.variogram_params_["nugget"] < 1e-5 * gp.variogram_params_["sill"]
    np.testing.assert_allclose(gp.params_["sigma2"], 1.0, rtol=0.2)  # the field itself is still estimated
    err = capsys.readouterr().err
    assert "on the boundary: nugget ≈ 0" in err
    gp.save(tmp_path / "fit")
    saved = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert saved["boundary"] == {"delta": "upper"}


def test_an_interior_estimate_has_no_boundary(tmp_path):
    simulate_store(tmp_path / "s.zarr", 2, 100, seed=1)
    gp = FederatedGP(knots=16, mode="sync", runtime="simulated", progress=False).fit(tmp_path / "s.zarr")
    assert gp.converged_ and gp.boundary_ == {}


def test_every_bound_has_words():
    for name in ("delta", "sigma2", "beta"):
        for side in ("lower", "upper"):
            (phrase,) = on_bound({name: side})
            assert phrase and ("nugget" if name == "delta" else "sill" if name == "sigma2" else "range") in phrase
