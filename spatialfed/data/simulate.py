"""The paper's simulation setting (SPEC §7): z = Xγ + w + ε on jittered-grid locations in [0,1]².

Locations: `geometry.jittered_unit_grid`; X: p = 5 covariates ~ N(0,1), γ = (−1, 2, 1, 1, 1);
w: zero-mean Matérn field (σ², β, ν); ε ~ N(0, noise_sd²), so δ = 1/noise_sd². The field is sampled
exactly (Cholesky) up to `field.EXACT_MAX_POINTS` points and by circulant embedding beyond
(method='auto'); test points are drawn from the same field and held out before partitioning.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

import numpy as np

from spatialfed.data import field, partition as partitions
from spatialfed.data.geometry import jittered_unit_grid
from spatialfed.data.store import StoreInfo, write_store
from spatialfed.atomic import refuse_existing
from spatialfed.errors import DataError, check_positive, option
from spatialfed.model.matern import Matern

GAMMA = (-1.0, 2.0, 1.0, 1.0, 1.0)
METHODS = ("auto", "exact", "circulant")


@dataclass(frozen=True)
class Simulation:
    """A simulated dataset: rows with their worker labels, the held-out test rows and the true parameters."""

    locs: np.ndarray
    z: np.ndarray
    X: np.ndarray
    labels: np.ndarray
    test: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    truth: dict
    partition: str
    method: str

    @property
    def covariate_names(self) -> list[str]:
        """x1..xp."""
        return [f"x{k + 1}" for k in range(self.X.shape[1])]

    def parts(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per-worker (locs, z, X) triples in worker order."""
        return [(self.locs[i], self.z[i], self.X[i]) for i in partitions.split(self.labels, self.labels.max() + 1)]


def _reporter(progress: bool):
    """A function printing timestamped progress lines to stderr, or doing nothing."""
    start = time.perf_counter()

    def say(message: str) -> None:
        if progress:
            print(f"[simulate {time.perf_counter() - start:7.1f}s] {message}", file=sys.stderr, flush=True)

    return say


def sample_field(model: Matern, locs, sigma2: float, beta: float, rng, method: str = "auto", say=None):
    """One draw of the Matérn field at locs; returns (values, method used)."""
    if method not in METHODS:
        raise DataError(f"method must be one of {METHODS}, got {method!r}")
    if method == "auto":
        method = "exact" if len(locs) <= field.EXACT_MAX_POINTS else "circulant"
    if method == "exact":
        if say is not None:
            say(f"exact Cholesky of the {len(locs)}×{len(locs)} covariance ({8e-9 * len(locs) ** 2:.2f} GB)")
        return field.sample_exact(model, locs, sigma2, beta, rng)[:, 0], method
    bounds = (*locs.min(axis=0), *locs.max(axis=0))
    embedding = field.CirculantEmbedding(model, sigma2, beta, bounds)
    if say is not None:
        say(f"circulant embedding: grid {embedding.shape[1]}×{embedding.shape[0]} step {embedding.step:.3g} "
            f"(β/step = {beta / embedding.step:.0f}), torus {embedding.torus_shape[1]}×{embedding.torus_shape[0]}")
    grid_field, _ = embedding.sample_grid(rng)
    return embedding.interpolate(grid_field, locs, rng), method


def simulate(n_workers: int | None = None, n_per_worker: int | None = None, *, sizes=None, nu: float = 0.5,
             beta: float = 0.1, sigma2: float = 1.0, noise_sd: float = 2.0, gamma=GAMMA, partition: str = "random",
             test_size: int = 0, seed=0, method: str = "auto", progress=False) -> Simulation:
    """Simulate the SPEC §7 setting with sizes (or n_workers × n_per_worker) rows split by `partition`."""
    say = progress if callable(progress) else _reporter(progress)
    if sizes is None:
        if n_workers is None or n_per_worker is None:
            raise DataError("give " + option("n_workers and n_per_worker, or sizes",
                                             "--workers and --n-per-worker, or --sizes"))
        if int(n_per_worker) != n_per_worker or n_per_worker < 1:
            raise DataError(f"n_per_worker must be a positive integer, got {n_per_worker!r}")
        sizes = partitions.worker_sizes(int(n_workers) * int(n_per_worker), n_workers)
    sizes = partitions.worker_sizes(int(np.sum(sizes)), n_workers, np.asarray(sizes))
    kind, _ = partitions.parse_scheme(partition)
    if kind == "column":
        raise DataError("simulated data have no grouping column; use partition random, area or neighbor")
    for value, name in ((beta, "beta"), (sigma2, "sigma2"), (noise_sd, "noise_sd")):
        check_positive(value, name)
    if int(test_size) != test_size or test_size < 0:
        raise DataError(f"test_size must be a non-negative integer, got {test_size!r}")
    model = Matern(nu)
    n, n_all = int(sizes.sum()), int(sizes.sum()) + int(test_size)
    seeds = np.random.SeedSequence(seed).spawn(6)
    rng_locs, rng_x, rng_field, rng_noise, rng_test, rng_part = (np.random.default_rng(s) for s in seeds)

    say(f"{n_all} locations on a jittered grid in [0,1]²")
    locs = jittered_unit_grid(n_all, seed=rng_locs)
    gamma = np.asarray(gamma, dtype=float)
    X = rng_x.standard_normal((n_all, gamma.size))
    say(f"Matérn field (ν={nu}, σ²={sigma2}, β={beta}) at {n_all} points")
    w, used = sample_field(model, locs, sigma2, beta, rng_field, method, say)
    z = X @ gamma + w + noise_sd * rng_noise.standard_normal(n_all)

    held = np.zeros(n_all, dtype=bool)
    held[rng_test.choice(n_all, size=int(test_size), replace=False)] = True
    test = (locs[held], z[held], X[held]) if test_size else None
    locs, z, X = locs[~held], z[~held], X[~held]
    say(f"{partition} partition of {n} rows over {sizes.size} workers")
    labels = partitions.partition(locs, partition, sizes=sizes, seed=rng_part)
    truth = {"gamma": gamma.tolist(), "delta": 1.0 / noise_sd**2, "sigma2": float(sigma2), "beta": float(beta),
             "nu": float(nu)}
    return Simulation(locs, z, X, labels, test, truth, partition, used)


def simulate_store(path, n_workers: int | None = None, n_per_worker: int | None = None, *, overwrite: bool = False,
                   progress: bool = False, **settings) -> StoreInfo:
    """Simulate (see `simulate` for settings) and write the SPEC §5 store with its truth and test group."""
    refuse_existing(path, overwrite, error=DataError)
    say = _reporter(progress)
    sim = simulate(n_workers, n_per_worker, progress=say, **settings)
    say(f"writing {path}")
    seed = settings.get("seed", 0)
    info = write_store(path, sim.parts(), partition=sim.partition, crs=None, covariate_names=sim.covariate_names,
                       truth=sim.truth, test=sim.test, overwrite=overwrite,
                       extra_attrs={"simulation": {"method": sim.method, "seed": seed if isinstance(seed, int) else None}})
    say(f"done: {sum(info.sizes)} rows in {info.n_workers} workers")
    return info
