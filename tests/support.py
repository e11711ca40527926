"""Test data and the centralized maximiser of ℓ_LR that the federated fits are checked against (shared by the test
modules of every layer: ``from support import simulate, LowRankReference``).

Data follow the paper's Section 6 design: covariates ~ N(0, 1) without an intercept (`intercept=True` for the joint
(μ, γ) step, docs/algorithm.md), an exactly simulated Matérn field plus noise, a regular knot grid.
"""

import asyncio
import errno

import numpy as np
import pytest
import zarr
from scipy import linalg, optimize
from scipy.spatial.distance import cdist

from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params


TRUTH = dict(gamma=np.array([1.0, 2.0, -1.0]), delta=4.0, sigma2=1.0, beta=0.1)


def one_site(n=240, m=9, residual="full", nu=0.5, seed=0, **kw):
    """(LocalModel, Params): n uniform points with X = [1, N(0,1)], z ~ 3 + N(0,1), a √m × √m knot grid and a
    generic φ (δ = 2, σ² = 1.3, β = 0.2); `kw` go to LocalModel (e.g. vecchia_k)."""
    rng = np.random.default_rng(seed)
    locs = rng.uniform(size=(n, 2))
    g = np.linspace(0.1, 0.9, int(np.sqrt(m)))
    knots = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    X = np.column_stack([np.ones(n), rng.standard_normal(n)])
    z = 3.0 + rng.standard_normal(n)
    A = rng.standard_normal((m, m))
    par = Params(0.3 * rng.standard_normal(m), A @ A.T / m + 0.1 * np.eye(m), np.array([2.9, 0.1]), 2.0, 1.3, 0.2)
    return LocalModel(locs, z, X, knots, Matern(nu), residual, **kw), par


def simulate(J=4, n=150, side=7, residual="full", nu=0.5, seed=0, intercept=False, gamma=TRUTH["gamma"]):
    """J LocalModels on n uniform points each, knots on a side×side grid; returns (models, knots, kernel).

    X ~ N(0, 1) with one column per entry of `gamma`; `intercept=True` makes the first column 1.
    """
    rng = np.random.default_rng(seed)
    N, kernel = J * n, Matern(nu)
    locs = rng.uniform(size=(N, 2))
    g = (np.arange(side) + 0.5) / side
    knots = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    C = kernel.cross(locs, locs, TRUTH["sigma2"], TRUTH["beta"]) + np.eye(N) / TRUTH["delta"]
    X = rng.standard_normal((N, len(gamma)))
    if intercept:
        X[:, 0] = 1.0
    z = X @ np.asarray(gamma) + np.linalg.cholesky(C) @ rng.standard_normal(N)
    blocks = np.split(np.arange(N), J)
    models = [LocalModel(locs[b], z[b], X[b], knots, kernel, residual) for b in blocks]
    return models, knots, kernel


class LowRankReference:
    """ℓ_LR with γ profiled out by GLS, from cached distances (dense N×N: small N only)."""

    def __init__(self, models, knots, kernel, residual):
        self.kernel, self.residual = kernel, residual
        self.parts = [(lm.locs, lm.z, lm.X) for lm in models]
        locs = np.vstack([lm.locs for lm in models])
        self.z = np.concatenate([lm.z for lm in models])
        self.X = np.vstack([lm.X for lm in models])
        owner = np.repeat(np.arange(len(models)), [lm.n for lm in models])
        self.same = owner[:, None] == owner[None, :]
        self.d_ss, self.d_sk, self.d_kk = cdist(locs, locs), cdist(locs, knots), cdist(knots, knots)
        self.knots = knots

    def covariance(self, delta, sigma2, beta):
        """B K Bᵀ + blockdiag R_j (Remark 3)."""
        rho = lambda d: self.kernel.correlation(d, beta)  # noqa: E731
        C = rho(self.d_sk)
        Q = C @ linalg.solve(rho(self.d_kk), C.T, assume_a="pos")
        if self.residual == "full":
            W = np.where(self.same, rho(self.d_ss) - Q, 0.0)
        elif self.residual == "mpp":
            W = np.diag(1.0 - np.diag(Q))
        else:
            W = 0.0
        return sigma2 * (Q + W) + np.eye(len(self.z)) / delta

    def profile(self, u):
        """(γ_GLS(u), ℓ_LR(γ_GLS, u)) at u = (log δ, log σ², log β)."""
        cf = linalg.cho_factor(self.covariance(*np.exp(u)), lower=True)
        ViX = linalg.cho_solve(cf, self.X)
        gamma = np.linalg.solve(self.X.T @ ViX, ViX.T @ self.z)
        r = self.z - self.X @ gamma
        ll = -0.5 * (len(r) * np.log(2 * np.pi) + 2 * np.sum(np.log(np.diag(cf[0]))) + r @ linalg.cho_solve(cf, r))
        return gamma, ll

    def maximise(self, u0):
        """(γ̂, (δ̂, σ̂², β̂), ℓ̂) by scipy.optimize.minimize of −ℓ_LR over u, γ by GLS."""
        res = optimize.minimize(lambda u: -self.profile(u)[1], u0, method="BFGS", options={"gtol": 1e-7})
        gamma, ll = self.profile(res.x)
        return gamma, np.exp(res.x), ll


def poor_start(theta_hat):
    """The maximiser's δ with β × 5 and σ² ÷ 4 (γ from the data-driven OLS start)."""
    delta, sigma2, beta = theta_hat
    return {"delta": delta, "sigma2": sigma2 / 4, "beta": beta * 5}


def assert_at_maximiser(server, gamma_hat, theta_hat, ll_hat):
    phi = server.params
    fitted = np.array([phi.delta, phi.sigma2, phi.beta])
    assert server.loglik == pytest.approx(ll_hat, abs=1e-3)
    assert np.max(np.abs(fitted / theta_hat - 1)) < 1e-2
    assert np.max(np.abs(phi.gamma - gamma_hat)) < 1e-2 * np.max(np.abs(gamma_hat))


def simulated_fit(d, seed: int, max_iter: int):
    """`spatialfed simulate` (3 workers × 40, 5 covariates, 30 test points) into d/sim.zarr and a quick in-process
    synchronous full-residual fit (16 knots) into d/fit; returns (d, store, fit)."""
    from spatialfed.cli import main

    store, fit = d / "sim.zarr", d / "fit"
    assert main(["simulate", str(store), "--workers", "3", "--n-per-worker", "40", "--test-size", "30",
                 "--seed", str(seed), "--quiet"]) == 0
    assert main(["fit", str(store), "--out", str(fit), "--runtime", "simulated", "--knots", "16", "--mode", "sync",
                 "--max-iter", str(max_iter), "--quiet"]) == 0
    return d, store, fit


def full_disk_beside_slow_parent_writes(monkeypatch, key_suffix: str, delay: float = 0.3) -> None:
    """Make zarr's LocalStore fail writing a key ending in `key_suffix` as a full disk does (EFBIG) while the parent
    groups' metadata, which zarr writes beside it (asyncio.gather), arrives `delay` s late: a writer that cleans up
    without waiting for zarr finds that metadata recreating its staged directory."""
    local = zarr.storage.LocalStore
    real_set, real_if_absent = local.set, local.set_if_not_exists

    async def full_disk(self, key, value):
        if key.endswith(key_suffix):
            raise OSError(errno.EFBIG, "File too large")
        return await real_set(self, key, value)

    async def late(self, key, value):
        await asyncio.sleep(delay)
        return await real_if_absent(self, key, value)

    monkeypatch.setattr(local, "set", full_disk)
    monkeypatch.setattr(local, "set_if_not_exists", late)


def third_order(lm, st, h, reach=3.0):
    """Site statistics `st` (of LocalModel lm, at st["u"]) with third derivatives from answers h along each axis of u
    (stale.secant): the third-order model the asynchronous surrogate uses, d3_radius = reach · h."""
    from spatialfed.algorithm import stale
    from spatialfed.model.stats import site_statistics

    u = np.asarray(st["u"], dtype=float)
    return stale.secant(st, [site_statistics(lm, u + h * e) for e in np.eye(3)], reach=reach)

