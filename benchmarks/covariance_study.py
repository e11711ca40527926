"""Shared pieces of the covariance-option benchmarks (bench_covariance_recovery.py, bench_covariance_options.py):
fit a MaternFamily by the statistics server (algorithm/family_fit.py), its 95 % intervals from the observed
information of the profile ℓ, kriging under the fitted low-rank model (model/reference.py: dense, N ≤ a few
thousand) and site-blocked cross-validation (each site's points predicted from the other sites' data)."""

from __future__ import annotations

import numpy as np

from spatialfed.algorithm.family_fit import NU_INDEX, family_bounds, family_start, fit_serial, nu_interval
from spatialfed.model.family import MaternFamily
from spatialfed.model.reference import lowrank_kriging
from spatialfed.outputs.metrics import scores

Z95 = 1.959963984540054


def grid_knots(locs, side: int) -> np.ndarray:
    """side×side grid over the bounding box of locs, inset by half a cell."""
    lo, hi = locs.min(0), locs.max(0)
    t = (np.arange(side) + 0.5) / side
    gx, gy = lo[0] + t * (hi[0] - lo[0]), lo[1] + t * (hi[1] - lo[1])
    return np.stack(np.meshgrid(gx, gy), -1).reshape(-1, 2)


def fit(parts, knots, family: MaternFamily, synchronous: bool = True, residual: str = "full",
        loglik_tol: float = 1e-10, profile_nu: bool = False) -> dict:
    """The fitted u, ℓ, γ̂, and each parameter's estimate with its 95 % interval (from −H⁻¹ of the profile ℓ);
    with profile_nu, log ν's profile-likelihood interval besides (`nu_profile`: an open side is None)."""
    locs = np.vstack([p[0] for p in parts])
    z = np.concatenate([p[1] for p in parts])
    diameter = float(np.linalg.norm(locs.max(0) - locs.min(0)))
    if family.distance == "chordal":
        diameter = 2.0 * 6371.0
    s2 = float(np.var(z))
    lower, upper = family_bounds(family, s2, diameter)
    server = fit_serial(parts, knots, family, residual, family_start(family, s2, diameter), lower, upper,
                        synchronous=synchronous, loglik_tol=loglik_tol)
    best = server.done
    try:
        cov = np.linalg.inv(-best.hess)
        se = np.sqrt(np.maximum(np.diag(cov), 0.0))
    except np.linalg.LinAlgError:
        se = np.full(best.u.size, np.nan)
    names = ("log_delta", "log_sigma2") + family.names
    bound = [n for i, n in enumerate(names) if best.u[i] <= lower[i] + 1e-6 or best.u[i] >= upper[i] - 1e-6]
    # no interval for a parameter on its bound: the observed information there does not describe it
    interval = {n: None if n in bound else (float(best.u[i] - Z95 * se[i]), float(best.u[i] + Z95 * se[i]))
                for i, n in enumerate(names)}
    out = {"u": best.u, "loglik": best.loglik, "gamma": best.gamma, "steps": server.steps, "interval": interval,
           "at_bound": bound, "stalled": server.stalled}
    if profile_nu and family.nu is None:
        out["nu_profile"] = nu_interval(parts, knots, family, residual, best, lower, upper, float(se[NU_INDEX]))
    return out


def predict(parts, knots, family: MaternFamily, fitted: dict, locs0, X0, owners) -> tuple[np.ndarray, np.ndarray]:
    """Kriging mean and predictive sd (latent variance + nugget) of y at locs0 (owners: the site sharing each
    point's residual, −1 for none)."""
    u = fitted["u"]
    delta, sigma2 = float(np.exp(u[0])), float(np.exp(u[1]))
    mean, var = lowrank_kriging(parts, owners, locs0, X0, knots, family, "full", fitted["gamma"], delta, sigma2, u[2:])
    return mean, np.sqrt(np.maximum(var, 0.0) + 1.0 / delta)


def site_blocked_cv(parts, knots, family: MaternFamily, fitted: dict) -> dict:
    """RMSE/CRPS of every site's points predicted from the other sites' data at the fitted parameters."""
    ys, means, sds = [], [], []
    for j, (locs, z, X) in enumerate(parts):
        others = [p for i, p in enumerate(parts) if i != j]
        m, s = predict(others, knots, family, fitted, locs, X, np.full(len(z), -1))
        ys.append(z)
        means.append(m)
        sds.append(s)
    return scores(np.concatenate(ys), np.concatenate(means), np.concatenate(sds))


def held_out(parts, knots, family, fitted, locs0, y0, X0) -> dict:
    """Scores on held-out points, each sharing the residual of the site of its nearest training point."""
    owner_of = np.concatenate([np.full(len(p[1]), j) for j, p in enumerate(parts)])
    train = np.vstack([p[0] for p in parts])
    from scipy.spatial import cKDTree

    _, nearest = cKDTree(train).query(locs0)
    m, s = predict(parts, knots, family, fitted, locs0, X0, owner_of[nearest])
    return scores(y0, m, s)


def simulate(locs, family: MaternFamily, kappa, sigma2: float, nugget: float, rng) -> np.ndarray:
    """An exact draw of the family's field with noise at locs."""
    C = family.cross(locs, locs, sigma2, kappa) + 1e-10 * np.eye(len(locs))
    return np.linalg.cholesky(C) @ rng.standard_normal(len(locs)) + np.sqrt(nugget) * rng.standard_normal(len(locs))


def strips(locs, J: int) -> list[np.ndarray]:
    """Indices of J sites: vertical strips of equal counts (by x, or by longitude)."""
    order = np.argsort(locs[:, 0], kind="stable")
    return np.array_split(order, J)
