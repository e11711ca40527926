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
    gp = FederatedGP(knots=25, nu=1.5, mode="sync", cluster="simulated", progress=True).fit(noise_free)
    assert gp.converged_ and gp.stop_reason_ == "tol"
    assert gp.boundary_ == {"delta": "upper"}
    # log δ has ≈ 11 to go from φ₀ to its bound in Newton steps of ≈ 1 (ℓ ≈ ℓ∞ − c/δ): once two rounds show the
    # Newton target receding, the bound is probed and accepted (16 round trips walking there)
    assert gp.n_iter_ <= 5
    assert gp.variogram_params_["nugget"] < 1e-5 * gp.variogram_params_["sill"]
    np.testing.assert_allclose(gp.params_["sigma2"], 1.0, rtol=0.2)  # the field itself is still estimated
    err = capsys.readouterr().err
    assert "on the boundary: nugget ≈ 0" in err
    gp.save(tmp_path / "fit")
    saved = json.loads((tmp_path / "fit" / "fit.json").read_text())
    assert saved["boundary"] == {"delta": "upper"}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_bound_is_settled_three_round_trips_after_the_direction_is_clear(noise_free, mode):
    """Issue 29: the walk (no probe) moves log δ up at every step from φ₀ in Newton steps of ≈ 1 that never settle.
    One round's answers give one gradient; the second round's are the first that can confirm a direction, so the
    direction is clear after round 2, and the fit has settled on the bound three round trips later."""
    fit = lambda policy=None: FederatedGP(knots=25, nu=1.5, mode=mode, cluster="simulated", progress=False,  # noqa: E731
                                          strategies=policy).fit(noise_free)
    walked = fit({"policy": {"probe_step": None}})
    log_delta = np.log([row["delta"] for row in walked.trace_])
    steps = np.diff(log_delta)
    assert len(steps) >= 10 and np.all(steps[:-2] > 0.5)  # the walk: up by ≥ 0.5 a round until the bound cuts it
    probed = fit()
    assert probed.converged_ and probed.boundary_ == walked.boundary_ == {"delta": "upper"}
    assert probed.n_iter_ <= 2 + 3 < walked.n_iter_


def test_the_probe_of_the_bound_saves_the_walk_and_changes_nothing_else(noise_free):
    """Without the probe the fit walks to the same bound in steps of ≈ 1 in log δ: same estimate, three times the
    rounds (both to tol 1e-8, so that the estimates agree to rounding)."""
    fit = lambda policy=None: FederatedGP(knots=25, nu=1.5, mode="sync", cluster="simulated", progress=False,  # noqa: E731
                                          tol=1e-8, strategies=policy).fit(noise_free)
    probed = fit()
    walked = fit({"policy": {"probe_step": None}})
    assert walked.boundary_ == probed.boundary_ == {"delta": "upper"}
    assert walked.n_iter_ >= 3 * probed.n_iter_ - 3
    for name in ("delta", "sigma2", "beta"):
        np.testing.assert_allclose(probed.params_[name], walked.params_[name], rtol=1e-6, err_msg=name)
    np.testing.assert_allclose(probed.loglik_, walked.loglik_, rtol=1e-10)


def test_a_rejected_probe_costs_one_round_trip(tmp_path):
    """An interior estimate on the σ²/β ridge (range 30 × the study area, ν = 0.5): the first two steps look like a
    walk to a bound (the Newton target recedes as far as the fit moved), so the sill is probed at its bound, whose
    exact ℓ is lower: rejected like any step, one more round trip, and the fit ends where it ends without it. The
    start is the variogram's before its bins followed the sites' extents (σ² 0.31, β 13.9, far out on the ridge)."""
    simulate_store(tmp_path / "s.zarr", 2, 200, noise_sd=0.3, beta=30, nu=0.5, seed=1)
    start = {"delta": 10.846765953873293, "sigma2": 0.3130976723153005, "beta": 13.882290339021711}
    fit = lambda policy=None: FederatedGP(knots=25, nu=0.5, mode="sync", cluster="simulated", progress=False,  # noqa: E731
                                          start=start, strategies=policy).fit(tmp_path / "s.zarr")
    probed = fit()
    walked = fit({"policy": {"probe_step": None}})
    log_s2 = lambda gp: np.log([row["sigma2"] for row in gp.trace_])  # noqa: E731
    assert log_s2(probed).max() > log_s2(probed)[-1] + 5  # the probe: σ² published at its bound ...
    assert log_s2(walked).max() <= log_s2(walked)[-1] + 1e-9  # ... which the walk never goes near
    assert probed.converged_ and walked.converged_ and probed.boundary_ == walked.boundary_ == {}
    assert probed.n_iter_ == walked.n_iter_ + 1
    for name in ("delta", "sigma2", "beta"):
        np.testing.assert_allclose(probed.params_[name], walked.params_[name], rtol=1e-5, err_msg=name)


def test_a_far_start_toward_an_interior_estimate_is_not_probed(tmp_path):
    """δ₀ = 1e-4, far below the estimate: the first steps are cut by the trust radius, but −H is not positive definite
    there (no Newton target) and once it is, the target stays put as the fit approaches: no probe, the same rounds."""
    simulate_store(tmp_path / "s.zarr", 2, 150, seed=2, noise_sd=2.0)
    fit = lambda policy=None: FederatedGP(knots=16, mode="sync", cluster="simulated", progress=False,  # noqa: E731
                                          start={"delta": 1e-4}, strategies=policy).fit(tmp_path / "s.zarr")
    probed, walked = fit(), fit({"policy": {"probe_step": None}})
    assert probed.converged_ and probed.boundary_ == {}
    assert [row["beta"] for row in probed.trace_] == [row["beta"] for row in walked.trace_]


def test_an_interior_estimate_has_no_boundary(tmp_path):
    simulate_store(tmp_path / "s.zarr", 2, 100, seed=1)
    gp = FederatedGP(knots=16, mode="sync", cluster="simulated", progress=False).fit(tmp_path / "s.zarr")
    assert gp.converged_ and gp.boundary_ == {}


def test_every_bound_has_words():
    for name in ("delta", "sigma2", "beta"):
        for side in ("lower", "upper"):
            (phrase,) = on_bound({name: side})
            assert phrase and ("nugget" if name == "delta" else "sill" if name == "sigma2" else "range") in phrase
