"""The partition executor: the code that runs on a site, the same under every runtime.

A site (federated worker j) loads its partition once — group ``workers/<j>`` of the Zarr store, read where the task
runs — into a per-process registry (`_REGISTRY`, keyed by run id and j) as a `LocalModel`, whose factorisation cache
then serves every later request. It answers two kinds of request:

- `answer(spec, p)`: L_j(p) of Eq. (13) (`algorithm.protocol.evaluate`), followed by the emulated slowdown wait;
- `call(spec, name, args)`: one of `SITE_CALLS`, the small functions prediction, the default domain and
  site-blocked CV need (kriging pieces, moments, bounding box, score sums), each returning arrays sized by the
  request, never by n_j.

The Dask runtime runs these inside tasks pinned to the Dask worker holding the partition; the virtual runtime and
in-process prediction run them here. Nothing else reads a partition.

Memory: a registered LocalModel keeps its partition and, between requests, only the latest θ's whitened data
(O(n_j (m + p)) numbers; model/local.py; for mpp/pp not even those: `answer` drops them, as they cost less to
rebuild than to keep), plus one factorisation of R_j once prediction asks for it; so a process
holding many sites needs their data plus the transient arrays of the one request it runs (`kept_bytes` reports
what the registry holds).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass

import numpy as np

from spatialfed.algorithm.protocol import Augmented, Quantity, evaluate
from spatialfed.data.space import Chordal, Linear
from spatialfed.model.blocked import blocked_scores
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.vecchia_order import VECCHIA_K
from spatialfed.runtime.heterogeneity import extra_wait

#: per-process registry of loaded partitions: "run_id/w<j>" -> LocalModel
_REGISTRY: dict[str, LocalModel] = {}
_REGISTRY_LOCK = threading.Lock()


@dataclass(frozen=True)
class SiteSpec:
    """How to build site j's LocalModel where it runs: run id, store path, index, knots, kernel, residual (and the
    Vecchia residual's neighbour count k). `space`: the map (data/space.py) to the coordinates the covariance is
    isotropic in — Linear(A) for a fitted anisotropy (prediction), Chordal for distances on the sphere (fit and
    prediction) — or None: the site's locations are mapped on load, the knots given mapped; what maps show (sites,
    hull) is mapped back."""

    run_id: str
    store: str
    worker: int
    knots: np.ndarray
    kernel: Matern
    residual: str
    vecchia_k: int = VECCHIA_K
    space: Linear | Chordal | None = None

    @property
    def key(self) -> str:
        return f"{self.run_id}/w{self.worker}"


def site_specs(run_id: str, store, n_workers: int, knots, kernel: Matern, residual: str,
               vecchia_k: int = VECCHIA_K, space=None) -> list[SiteSpec]:
    """One SiteSpec per federated worker of `store` (its absolute path: every site opens it itself); with a
    `space` the knots are given in the store's coordinates and mapped here."""
    store = os.path.abspath(os.fspath(store))
    knots = np.asarray(knots, dtype=float).reshape(-1, 2)
    if space is not None:
        knots = space.forward(knots)
    return [SiteSpec(run_id, store, j, knots, kernel, residual, int(vecchia_k), space) for j in range(int(n_workers))]


def local_model(spec: SiteSpec) -> LocalModel:
    """Site spec.worker's LocalModel in this process, loading its partition from the store on first use."""
    with _REGISTRY_LOCK:
        lm = _REGISTRY.get(spec.key)
    if lm is None:
        from spatialfed.data.store import load_worker

        locs, z, X = load_worker(spec.store, spec.worker)
        if spec.space is not None:
            locs = spec.space.forward(locs)
        lm = LocalModel(locs, z, X, spec.knots, spec.kernel, residual=spec.residual, vecchia_k=spec.vecchia_k)
        lm.space = spec.space  # what maps show is mapped back (_store_locs)
        with _REGISTRY_LOCK:
            lm = _REGISTRY.setdefault(spec.key, lm)
    return lm


def load(spec: SiteSpec) -> dict:
    """Load site j's partition into this process; returns only n_j, p and where it lives."""
    lm = local_model(spec)
    return {"worker": spec.worker, "n": int(lm.n), "p": int(lm.p), "host": socket.gethostname(), "pid": os.getpid()}


def answer(spec: SiteSpec, p: Augmented, slowdown: float = 1.0, delay_s: float = 0.0) -> Quantity:
    """L_j(p) (protocol.evaluate) on the partition held in this process, then the emulated slowdown wait.

    The task then takes s_j·c of wall time, c its CPU time (`time.thread_time`; BLAS is single-threaded on the
    workers): the wait (s_j − 1)·c, less what the host's load already added to the compute's wall time, is slept,
    not spun, so a slowed site emulates a machine s_j times slower without burning a core even when the host's
    cores are shared and busy (heterogeneity.extra_wait); `delay_s` (a drawn random delay, docs/delays.md) is slept
    after it."""
    lm = local_model(spec)
    tic, wall = time.thread_time(), time.perf_counter()  # CPU seconds of this task are not inflated by the load
    q = evaluate(lm, p, spec.worker)
    if not lm.strategy.keeps_whitened:
        # mpp/pp (vecchia): the whitened data cost O(n_j m²) (O(n_j k(k² + m))) to rebuild, less than keeping them
        # for every site (0.86 GB at 10⁶ points over 100 sites); the full residual keeps them (a rebuild is a
        # factorisation of R_j); the Vecchia neighbours (locations only) stay
        lm.clear_cache()
    wait = extra_wait(time.thread_time() - tic, slowdown, time.perf_counter() - wall) + delay_s
    if wait > 0:
        time.sleep(wait)
    return q


def wake(wait_s: float) -> float:
    """Sleep until the site's next Poisson activation (VAFL §2.3), `wait_s` seconds away; returns the wait."""
    time.sleep(max(float(wait_s), 0.0))
    return wait_s


def _box(locs: np.ndarray) -> tuple[float, ...]:
    """The bounding box of points: lows, then highs."""
    return (*locs.min(axis=0).tolist(), *locs.max(axis=0).tolist())


def _bounds(lm: LocalModel) -> tuple[float, ...]:
    """The bounding box of the site's locations as it holds them (mapped by its space)."""
    return _box(lm.locs)


def _store_bounds(lm: LocalModel) -> tuple[float, float, float, float]:
    """The bounding box of the site's locations in the store's coordinates: x₀, y₀, x₁, y₁."""
    return _box(_store_locs(lm))


def _spacing(lm: LocalModel) -> float:
    """The site's sampling spacing (geometry.spacing: median nearest-neighbour distance), NaN below 2 points."""
    from spatialfed.data.geometry import spacing

    return spacing(lm.locs) if len(np.unique(lm.locs, axis=0)) >= 2 else float("nan")


def _store_locs(lm: LocalModel) -> np.ndarray:
    """The site's locations in the store's coordinates (a site with a `space` holds them mapped)."""
    space = getattr(lm, "space", None)
    return lm.locs if space is None else space.back(lm.locs)


def _hull(lm: LocalModel) -> bytes:
    """The region the site's observations sample (geometry.points_hull), as WKB: a polygon, not the points."""
    import shapely

    from spatialfed.data.geometry import points_hull

    return shapely.to_wkb(points_hull(_store_locs(lm)))


#: what a site computes for prediction, the default domain and site-blocked CV (each returns request-sized arrays
#: only)
SITE_CALLS = {
    "nearest_distance": LocalModel.nearest_distance,          # n₀ distances
    "residual_kriging": LocalModel.residual_kriging,          # n₀-sized mean, n₀×m BRk, n₀ kRk (n₀×|U_j| cross)
    "anchor_posterior": LocalModel.anchor_posterior,          # |U_j| mean, |U_j|×m BRk, |U_j|² cov
    "independent_kriging": LocalModel.independent_kriging,    # n₀ mean and variance
    "moments": LocalModel.moments,                            # p×p, p, 1, 1
    "bounds": _bounds,                                        # 4 numbers (6 Earth-centred)
    "store_bounds": _store_bounds,                            # 4 numbers (the exchange grid of a chordal fit)
    "spacing": _spacing,                                      # 1 number (the seamless predictor's band)
    "hull": _hull,                                            # one polygon (the default map domain)
    "sites": _store_locs,                                     # observation sites (for maps only; --no-sites omits)
    "blocked_scores": blocked_scores,                         # 4 sums: site-blocked CV (api/blocked_cv.py)
}


def run_call(lm: LocalModel, name: str, args: tuple = ()):
    """SITE_CALLS[name] on the LocalModel `lm`."""
    if name not in SITE_CALLS:
        raise ValueError(f"unknown site call {name!r}; allowed: {sorted(SITE_CALLS)}")
    return SITE_CALLS[name](lm, *args)


def call(spec: SiteSpec, name: str, args: tuple = ()):
    """Run SITE_CALLS[name] on site spec.worker's partition (loaded and kept in this process)."""
    return run_call(local_model(spec), name, args)


def release(run_id: str) -> int:
    """Drop this process's partitions of run `run_id` (run on every Dask worker at the end of a run)."""
    prefix = f"{run_id}/"
    with _REGISTRY_LOCK:
        keys = [k for k in _REGISTRY if k.startswith(prefix)]
        for k in keys:
            del _REGISTRY[k]
    return len(keys)


def kept_bytes(run_id: str | None = None) -> dict[str, int]:
    """Bytes this process's registered LocalModels (of run `run_id`, or all) hold between requests: their data
    (locations, z, X) and their caches (LocalModel.cached_nbytes), per key "run_id/w<j>"."""
    with _REGISTRY_LOCK:
        items = [(k, lm) for k, lm in _REGISTRY.items() if run_id is None or k.startswith(f"{run_id}/")]
    return {k: int(lm.locs.nbytes + lm.z.nbytes + lm.X.nbytes + lm.cached_nbytes()) for k, lm in sorted(items)}


def registry_keys() -> list[str]:
    """Keys of the partitions held by this process (for tests and diagnostics)."""
    with _REGISTRY_LOCK:
        return sorted(_REGISTRY)
