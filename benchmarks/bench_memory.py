"""Peak memory of a federated fit at ~50 sites of ~2,100 points (issue 14: a full-residual fit within 3 GB).

Data: the simulated Heaton et al. (2019) field (105,569 training cells, ../shared/data/heaton-simulated/,
``--data``), ingested into J area sites (``--workers``, default 50: 2,111 points per site), or with ``--simulate N``
a simulated store of N points (``spatialfed.data.simulate``, area partition). Then, for each residual and each
scheme (``--scheme block``: preset="tuned", Section 3.1's sub-steps; ``stats``: preset="stats", one round trip
of sufficient statistics per iteration, SPEC §2b), a synchronous fit with m = 100 knots on a Dask LocalCluster of
``--dask-workers`` processes (1 thread each; restarted before every fit, so each starts from fresh processes) or on
the in-process simulated runtime.

One JSON row per fit on stdout: {J, n_per_site, residual, scheme, peak_rss_mb, fit_s, iterations, ...}.
``peak_rss_mb``: the largest sum of the resident set sizes of this process and its children (scheduler in this
process, the Dask workers), sampled every 0.1 s during the fit (benchmarks/harness.py's PeakRSS);
``base_rss_mb``: the same sum just before the fit (processes started, data not loaded). ``fit_s``: wall seconds of
``FederatedGP.fit``. Extra keys: converged, stop_reason, loglik, params, runtime, mode.

``--per-site N``: instead, the tracemalloc account of one site's requests at n_j = N (what a LocalModel keeps
between requests and the peak of each request), the measurement that shows where the memory goes.

    nice -n 10 python benchmarks/bench_memory.py                      # J = 50 Heaton sites, full, block + stats
    nice -n 10 python benchmarks/bench_memory.py --per-site 2111      # one site's account
    nice -n 10 python benchmarks/bench_memory.py --simulate 20000 --workers 10 --max-iter 3   # quick

Measured 2026-11-23 (2-core machine shared with other sessions; m = 100, ν = 0.5, sync, 2 Dask worker
processes): see docs/results.md, "Large data: memory and 10⁶ points".
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_large import DATA, LONLAT, load  # noqa: E402
from harness import PeakRSS, emitter, say  # noqa: E402


def per_site(n: int, m: int, residual: str, seed: int) -> list[dict]:
    """tracemalloc of one LocalModel at n_j = n: MB kept after each request and the peak during it."""
    from spatialfed.model.local import LocalModel
    from spatialfed.model.matern import Matern
    from spatialfed.model.params import Params
    from spatialfed.model.stats import site_statistics
    from spatialfed.runtime.blas import limit_blas_threads

    rng = np.random.default_rng(seed)
    locs = rng.uniform(size=(n, 2))
    side = int(np.ceil(np.sqrt(m)))
    g = (np.arange(side) + 0.5) / side
    knots = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)[:m]
    X = np.column_stack([np.ones(n), rng.standard_normal((n, 4))])
    z = rng.standard_normal(n)
    params = Params(np.zeros(m), 0.1 * np.eye(m), np.zeros(X.shape[1]), delta=4.0, sigma2=1.0, beta=0.1)
    rows = []
    with limit_blas_threads(1):
        tracemalloc.start()
        lm = LocalModel(locs, z, X, knots, Matern(0.5), residual)
        for step in ("mu_sigma", "gamma", "theta", "value", "stats"):
            tracemalloc.reset_peak()
            tic = time.perf_counter()
            if step == "stats":
                site_statistics(lm, params.with_u(params.u + 0.1))
            else:
                lm.quantity(step, params)
            seconds = time.perf_counter() - tic
            kept, peak = tracemalloc.get_traced_memory()
            rows.append({"n": n, "m": m, "residual": residual, "request": step, "seconds": round(seconds, 3),
                         "kept_mb": round(kept / 2**20, 2), "peak_mb": round(peak / 2**20, 2),
                         "n_by_n_mb": round(8 * n * n / 2**20, 2)})
        tracemalloc.stop()
    return rows


def memory_store(args, work: Path) -> tuple[Path, int, list[int]]:
    """The store to fit: Heaton cells ingested into J area sites, or a simulated store; (path, N, sizes)."""
    store = work / "memory.zarr"
    tic = time.perf_counter()
    if args.simulate:
        from spatialfed.data.simulate import simulate_store

        info = simulate_store(store, sizes=None, n_workers=args.workers, n_per_worker=args.simulate // args.workers,
                              partition="area", beta=0.1, seed=args.seed, overwrite=True)
    else:
        from spatialfed.data.ingest import ingest_frame

        train, _ = load(args.data, args.subsample, args.seed)
        info, _ = ingest_frame(train, store, value="temp", x="Lon", y="Lat", crs=LONLAT, partition="area",
                               n_workers=args.workers, overwrite=True, seed=args.seed)
    sizes = [int(s) for s in info.sizes]
    say(f"store: {sum(sizes)} points in {len(sizes)} sites (n_j {min(sizes)}–{max(sizes)}) "
        f"in {time.perf_counter() - tic:.1f} s")
    return store, sum(sizes), sizes


def fit_row(store: Path, sizes: list[int], residual: str, scheme: str, args, client) -> dict:
    from spatialfed.api import FederatedGP

    settings = {"mode": "sync", "max_iter": args.max_iter, "preset": "stats" if scheme == "stats" else "tuned"}
    gp = FederatedGP(residual=residual, knots=args.knots, nu=0.5, cluster=args.runtime, seed=args.seed,
                     client=client, progress=args.progress, **settings)
    tracker = PeakRSS(children=args.runtime == "dask")
    base = tracker.sample() / 2**20
    with tracker as mem:
        tic = time.perf_counter()
        gp.fit(str(store))
        fit_s = time.perf_counter() - tic
    p = gp.params_
    say(f"[{residual}/{scheme}] fit {fit_s:.1f} s, {gp.n_iter_} iterations ({gp.stop_reason_}), "
        f"peak {mem.mb:.0f} MB (base {base:.0f} MB)")
    return {"J": len(sizes), "n_per_site": round(float(np.mean(sizes)), 1), "residual": residual, "scheme": scheme,
            "peak_rss_mb": round(mem.mb, 1), "fit_s": round(fit_s, 2), "iterations": int(gp.n_iter_),
            "base_rss_mb": round(base, 1), "converged": bool(gp.converged_), "stop_reason": gp.stop_reason_,
            "loglik": float(gp.loglik_) if getattr(gp, "loglik_", None) is not None else None,
            "params": {"delta": p["delta"], "sigma2": p["sigma2"], "beta": p["beta"]},
            "runtime": args.runtime, "mode": "sync", "n_obs": int(sum(sizes))}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA, help=f"folder with train.csv (default {DATA})")
    ap.add_argument("--simulate", type=int, default=None, metavar="N", help="fit a simulated store of N points")
    ap.add_argument("--subsample", type=int, default=None, metavar="N", help="a seeded random N Heaton cells")
    ap.add_argument("--workers", type=int, default=50, help="J area sites (default 50)")
    ap.add_argument("--residual", default="full", help="comma list of full, mpp, pp (default full)")
    ap.add_argument("--scheme", default="block,stats", help="comma list of block, stats (default both)")
    ap.add_argument("--knots", type=int, default=100)
    ap.add_argument("--max-iter", type=int, default=50)
    ap.add_argument("--runtime", choices=("dask", "simulated"), default="dask")
    ap.add_argument("--dask-workers", type=int, default=2)
    ap.add_argument("--per-site", type=int, default=None, metavar="N", help="one site's tracemalloc account")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also append the JSON rows to this file")
    args = ap.parse_args(argv)
    residuals = [r for r in args.residual.split(",") if r]
    schemes = [s for s in args.scheme.split(",") if s]
    if set(residuals) - {"full", "mpp", "pp"} or set(schemes) - {"block", "stats"}:
        ap.error("--residual takes full, mpp, pp; --scheme takes block, stats")

    emit = emitter(args.out)

    if args.per_site:
        for residual in residuals:
            for row in per_site(args.per_site, args.knots, residual, args.seed):
                emit(row)
        return

    handle = None
    if args.runtime == "dask":
        from spatialfed.runtime.cluster import local_cluster

        handle = local_cluster(args.dask_workers)
    try:
        with tempfile.TemporaryDirectory(prefix="bench_memory-") as tmp:
            store, _, sizes = memory_store(args, Path(tmp))
            for k, (residual, scheme) in enumerate((r, s) for r in residuals for s in schemes):
                if handle is not None and k:  # every later fit starts from fresh worker processes
                    handle.client.restart(timeout=900)
                emit(fit_row(store, sizes, residual, scheme, args, None if handle is None else handle.client))
    finally:
        if handle is not None:
            handle.close()


if __name__ == "__main__":
    main()
