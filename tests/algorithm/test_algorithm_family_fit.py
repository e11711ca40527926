"""The statistics server for the Matérn family (algorithm/family_fit.py) reaches the centralized optimum of the same
model: ℓ within 1e-6 of the dense reference's maximum (model/reference.py), synchronously and asynchronously, with
the full and the Vecchia residual."""

import numpy as np
import pytest
from scipy import optimize

from spatialfed.algorithm.family_fit import family_bounds, family_start, fit_serial
from spatialfed.model.family import MaternFamily
from spatialfed.model.reference import profile_lowrank_loglik
from tests.conftest import grid_knots, simulate_parts

CASES = {
    "nu": (MaternFamily(None), 1.0),
    "anisotropy": (MaternFamily(0.5, True), 1.0),
    "nu+anisotropy": (MaternFamily(None, True), 1.0),
    "chordal": (MaternFamily(None, distance="chordal"), 111.0),  # the unit square as 1°×1°: km
}


def _centralized_optimum(parts, knots, family, residual, u0, lower, upper):
    """max over u of the dense profile ℓ (L-BFGS-B, then Nelder–Mead to polish), from u0."""
    f = lambda u: -profile_lowrank_loglik(parts, knots, family, residual, u)[0]  # noqa: E731
    res = optimize.minimize(f, u0, method="L-BFGS-B", bounds=list(zip(lower, upper)),
                            options={"ftol": 1e-15, "gtol": 1e-10, "maxiter": 2000})
    res = optimize.minimize(f, res.x, method="Nelder-Mead", bounds=list(zip(lower, upper)), options={"xatol": 1e-9, "fatol": 1e-12, "maxiter": 5000})
    return -res.fun


def _slow_unless(name: str, residual: str, n: int) -> list:
    fast = (("anisotropy", "full", 40), ("anisotropy", "vecchia", 25))
    return [] if (name, residual, n) in fast else [pytest.mark.slow]


@pytest.mark.parametrize("name, residual, n", [pytest.param(name, residual, n, marks=_slow_unless(name, residual, n))
                                               for residual in ("full", "vecchia") for name in CASES
                                               for n in ((40, 25) if residual == "vecchia" and name == "anisotropy"
                                                         else (40,))])
def test_federated_fit_reaches_the_centralized_optimum(name, residual, n):
    """vecchia: the sites' Vecchia residuals (VECCHIA_K = 15 neighbours of n points), the optimum of the dense ℓ of
    the same approximation (reference.vecchia_covariance); its fast form on 25 points a site."""
    family, km = CASES[name]
    parts = simulate_parts(J=3, n=n, nu=1.5, beta=0.2, seed=3)
    knots = grid_knots(3)
    lower, upper = family_bounds(family, 1.0, 1.4 * km)
    u0 = family_start(family, 1.0, 1.4 * km)
    fits = {sync: fit_serial(parts, knots, family, residual, u0, lower, upper, synchronous=sync).done
            for sync in (True, False)}
    best = _centralized_optimum(parts, knots, family, residual, fits[True].u, lower, upper)
    for sync, fit in fits.items():
        exact = profile_lowrank_loglik(parts, knots, family, residual, fit.u)[0]
        assert fit.loglik == pytest.approx(exact, abs=1e-9)
        assert abs(fit.loglik - best) <= 1e-6, (sync, fit.loglik, best)
    np.testing.assert_allclose(fits[True].u, fits[False].u, atol=1e-4)
    if residual == "vecchia":  # an approximated model, not the full one
        assert abs(best - profile_lowrank_loglik(parts, knots, family, "full", fits[True].u)[0]) > 1e-3


@pytest.mark.slow
def test_the_dask_driver_reaches_the_same_optimum_sync_and_async():
    """On a real (in-process) Dask cluster, answers arriving as they finish: the same optimum as in this process."""
    from distributed import Client, LocalCluster

    from spatialfed.runtime.family_driver import fit_dask

    family = MaternFamily(0.5, True)
    parts = simulate_parts(J=3, n=40, nu=1.5, beta=0.2, seed=3)
    knots = grid_knots(3)
    lower, upper = family_bounds(family, 1.0, 1.4)
    u0 = family_start(family, 1.0, 1.4)
    here = fit_serial(parts, knots, family, "full", u0, lower, upper).done
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,  # inproc: no network listener
                      dashboard_address=None) as cluster, Client(cluster) as client:
        for sync in (True, False):
            done = fit_dask(client, parts, knots, family, "full", u0, lower, upper, synchronous=sync).done
            assert abs(done.loglik - here.loglik) <= 1e-6
