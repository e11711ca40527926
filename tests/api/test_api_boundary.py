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
    # log δ has ≈ 11 to go from φ₀ to its bound in Newton steps of ≈ 1 (ℓ ≈ ℓ∞ − c/δ): after three such steps the
    # bound is probed and accepted, 7 round trips (16 walking there; 33 with the block scheme's eigenvalue floor)
    assert gp.n_iter_ <= 10
    assert gp.variogram_params_["nugget"] < 1e-5 * gp.variogram_params_["sill"]
    np.testing.assert_allclose(gp.params_["sigma2"], 1.0, rtol=0.2)  # the field itself is still estimated
    err = capsys.readouterr().err
    assert "on the boundary: nugget ≈ 0" in err
    gp.save(tmp_path / "fit")
    saved = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert saved["boundary"] == {"delta": "upper"}


def test_the_probe_of_the_bound_saves_the_walk_and_changes_nothing_else(noise_free):
    """Without the probe the fit walks to the same bound in steps of ≈ 1 in log δ: same estimate, twice the rounds."""
    fit = lambda policy=None: FederatedGP(knots=25, nu=1.5, mode="sync", runtime="simulated", progress=False,  # noqa: E731
                                          strategies=policy).fit(noise_free)
    probed = fit()
    walked = fit({"policy": {"probe_after": 10**6}})
    assert walked.boundary_ == probed.boundary_ == {"delta": "upper"}
    assert walked.n_iter_ >= 2 * probed.n_iter_
    for name in ("delta", "sigma2", "beta"):
        np.testing.assert_allclose(probed.params_[name], walked.params_[name], rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(probed.loglik_, walked.loglik_, rtol=1e-10)


def test_a_rejected_probe_costs_one_round_trip(tmp_path):
    """An interior estimate approached from far (δ₀ = 1e-4): after three free Newton steps up in log β the range is
    probed at its bound (100 × the study diameter), whose exact ℓ is lower: rejected like any step, one more round
    trip, and the fit ends where it ends without the probe."""
    simulate_store(tmp_path / "s.zarr", 2, 150, seed=2, noise_sd=2.0)
    fit = lambda policy=None: FederatedGP(knots=16, mode="sync", runtime="simulated", progress=False,  # noqa: E731
                                          start={"delta": 1e-4}, strategies=policy).fit(tmp_path / "s.zarr")
    probed = fit()
    walked = fit({"policy": {"probe_after": 10**6}})
    log_beta = lambda gp: np.log([row["beta"] for row in gp.trace_])  # noqa: E731
    assert log_beta(probed).max() > log_beta(probed)[-1] + 5  # the probe: β published at its bound ...
    assert log_beta(walked).max() < log_beta(walked)[-1] + 3  # ... which the walk never reaches
    assert probed.converged_ and walked.converged_ and probed.boundary_ == walked.boundary_ == {}
    assert probed.n_iter_ <= walked.n_iter_ + 1
    for name in ("delta", "sigma2", "beta"):
        np.testing.assert_allclose(probed.params_[name], walked.params_[name], rtol=1e-5, err_msg=name)


def test_an_interior_estimate_has_no_boundary(tmp_path):
    simulate_store(tmp_path / "s.zarr", 2, 100, seed=1)
    gp = FederatedGP(knots=16, mode="sync", runtime="simulated", progress=False).fit(tmp_path / "s.zarr")
    assert gp.converged_ and gp.boundary_ == {}


def test_every_bound_has_words():
    for name in ("delta", "sigma2", "beta"):
        for side in ("lower", "upper"):
            (phrase,) = on_bound({name: side})
            assert phrase and ("nugget" if name == "delta" else "sill" if name == "sigma2" else "range") in phrase
