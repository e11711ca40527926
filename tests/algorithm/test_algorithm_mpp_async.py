"""Issue 13, Done-when: the asynchronous statistics-scheme fit (preset "stats", SPEC §2b) with the modified predictive
process residual (residual="mpp", Remark 3) never diverges: it ends converged with the synchronous fit's ℓ_LR to
within 1e-3, and its parameters agree with the synchronous estimate.

Both fits run through the estimator (FederatedGP on the store, virtual clock), with its default Agg_threshold
⌈0.2·J⌉. The synchronous fit stops at an exact point whose Newton step is below tol = 1e-5 in every log-parameter;
the asynchronous one at an exact final pass with the same test, so both sit within ~1e-5 in u of the same maximiser:
the parameters agree to 1e-3 relative (the settling tolerance of benchmarks/bench_async_vs_sync.py) and ℓ to far
better than 1e-3. benchmarks/bench_mpp_async.py runs the same comparison over more data, seeds and both presets.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from spatialfed import Emulation
from spatialfed.api import FederatedGP

LOGLIK_TOL = 1e-3
PARAM_RTOL = 1e-3

#: Fixed: StatsServer (async) with Agg_threshold A ≥ 2 stopped with "the runtime ran out of work" when
#: every site was idle at the published u and fewer than A new answers had come (the estimator passed A = ⌈0.2·J⌉).
#: Now the statistics scheme's A defaults to 1 and an aggregation runs whenever no other answer can come.
#: Fixed: ozone 870715 by state with 25 knots, where the ℓ_LR surface is nearly flat along log δ (the mpp diagonal
#: term and the nugget trade off): the stale sites' models kept moving the surrogate's optimum by ~1e-2 (the trust
#: radius floor) and the fit stopped at max_iter 0.39 below the synchronous ℓ (δ 2.08 against 0.737). The epochs of
#: stats_server.py now take an exact step at every round trip of the slowest site.


def fit(store, mode, profile, knots, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return FederatedGP(mode=mode, residual="mpp", strategies="stats", knots=knots, cluster="simulated",
                           progress=False, max_iter=300, **kw, emulation=Emulation(profile=profile)).fit(str(store))


def check_matches(sync, asyn):
    assert sync.converged_ and sync.stop_reason_ == "tol"
    assert asyn.converged_, f"async stopped by {asyn.stop_reason_}"
    assert asyn.stop_reason_ == "tol"
    assert abs(asyn.loglik_ - sync.loglik_) <= LOGLIK_TOL, (asyn.loglik_, sync.loglik_)
    for name in ("delta", "sigma2", "beta"):
        assert asyn.params_[name] == pytest.approx(sync.params_[name], rel=PARAM_RTOL), name
    np.testing.assert_allclose(asyn.params_["gamma"], sync.params_["gamma"], rtol=PARAM_RTOL)
    # the reported ℓ is exact: it never exceeds the synchronous maximum by more than rounding
    assert asyn.loglik_ <= sync.loglik_ + 1e-8 * abs(sync.loglik_)


# --- a small simulated store: J = 6 sites × 80 points, 16 knots ------------------------------------------------
SIM_J, SIM_N, SIM_M = 6, 80, 16


@pytest.fixture(scope="module")
def sim_stores(tmp_path_factory):
    from spatialfed.data.simulate import simulate_store

    root = tmp_path_factory.mktemp("mpp_async")
    paths = {}
    for seed in (2, 4):
        paths[seed] = root / f"sim{seed}.zarr"
        simulate_store(paths[seed], SIM_J, SIM_N, seed=seed, test_size=0)
    return paths


@pytest.fixture(scope="module")
def sim_sync(sim_stores):
    return {seed: fit(path, "sync", "balanced", SIM_M) for seed, path in sim_stores.items()}


@pytest.mark.parametrize("seed,profile", [
    (2, "balanced"),
    (2, "straggler"),
    (2, "graded"),
    pytest.param(4, "graded", marks=pytest.mark.slow),
    pytest.param(4, "straggler"),  # deadlocked before the fix above
])
def test_async_stats_mpp_matches_sync_simulated(sim_stores, sim_sync, seed, profile):
    asyn = fit(sim_stores[seed], "async", profile, SIM_M)
    check_matches(sim_sync[seed], asyn)


def test_equal_sites_reproduce_sync(sim_stores, sim_sync):
    """Balanced compute on equal sites: every aggregation is exact, so async is the synchronous run (same ℓ to
    rounding)."""
    asyn = fit(sim_stores[2], "async", "balanced", SIM_M)
    assert asyn.loglik_ == pytest.approx(sim_sync[2].loglik_, abs=1e-9 * abs(sim_sync[2].loglik_))


# --- one ozone day: 870715, intercept only, projected lon/lat, one site per state (8) ----------------------------
OZONE_KNOTS = 60


@pytest.fixture(scope="module")
def ozone(tmp_path_factory):
    from spatialfed.data.datasets import ozone_store

    info, _ = ozone_store(tmp_path_factory.mktemp("mpp_ozone") / "oz.zarr", "870715")
    return info.path, fit(info.path, "sync", "balanced", OZONE_KNOTS)


@pytest.mark.slow
@pytest.mark.parametrize("profile", [
    "balanced",
    "straggler",
    pytest.param("graded"),  # deadlocked before the fix above
])
def test_async_stats_mpp_matches_sync_ozone(ozone, profile):
    path, sync = ozone
    check_matches(sync, fit(path, "async", profile, OZONE_KNOTS))


@pytest.mark.slow
def test_async_stats_mpp_matches_sync_ozone_few_knots(ozone):
    path, _ = ozone
    check_matches(fit(path, "sync", "balanced", 25), fit(path, "async", "straggler", 25))
