"""10⁶ simulated points over J = 100 area sites (issues 14 and 29): simulate, write the store with 10⁵ held-out
cells, fit with the library's defaults (residual "auto": Vecchia on these 10⁴-point sites; asynchronous; the
statistics scheme) or the --residual / --preset / --mode given, and predict the held-out cells, recording wall time,
peak memory and the held-out scores.

Simulation (``spatialfed.data.simulate.simulate``): N points on a jittered grid in [0,1]², SPEC §7's covariates and
noise (p = 5, γ = (−1, 2, 1, 1, 1), noise sd 2), an exponential Matérn field (σ² = 1, β = 0.1) drawn by circulant
embedding on a regular grid of step β/100 (O(M log M) for the M torus cells, whatever N) and interpolated to the
points, area partition into J sites. ``simulate_s``: locations, field and partition in memory; ``ingest_s``:
writing the Zarr store (``data.store.write_store``).

Each fit (m = 100 knots, ν = 0.5, the library's mode unless ``--mode`` says otherwise) runs on a Dask LocalCluster of
``--dask-workers`` processes (1 thread each, BLAS single-threaded; restarted before every fit after the first) with
the library's progress lines on stderr. ``fit_s``: wall seconds of ``FederatedGP.fit`` (the cluster's start is not
counted); ``peak_rss_mb``: the largest sum of resident set sizes of this process and its children (the Dask workers),
sampled every 0.1 s during the fit (benchmarks/harness.py's PeakRSS); ``sim_peak_rss_mb`` the same during simulate
+ ingest. Extra keys: mode, stop_reason, init_s (seconds into the fit when φ₀ was ready), first_output_s and
longest_silence_s (seconds from the call to the fit's first progress line on stderr, and the longest stretch without
one: benchmarks/harness.py's Gaps), loglik, params, truth; with a test group, predict_s
(outputs.prediction.predict of the held-out cells from the saved fit, on the same cluster), n_test, rmse, crps,
coverage95.

    nice -n 10 python benchmarks/bench_million.py --n 100000 --test 10000 --max-iter 5     # quick
    nice -n 10 python benchmarks/bench_million.py                        # 10⁶ points, every default, 10⁵ predicted
    nice -n 10 python benchmarks/bench_million.py --residual mpp,pp --preset default,stats --mode sync --test 0
    nice -n 10 python benchmarks/bench_million.py --profile 100000      # cProfile of one fit (top 25 on stderr)

One JSON row per fit on stdout (and appended to --out FILE). Measured 2026-11-23 on the shared 2-core machine:
docs/results.md, "Large data: memory and 10⁶ points".
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Gaps, PeakRSS, emitter, make_store, say  # noqa: E402


def fit(store: Path, residual: str, preset: str, args, client) -> tuple[dict, object]:
    from spatialfed.api import FederatedGP

    settings = {"max_iter": args.max_iter}
    if args.mode != "default":
        settings["mode"] = args.mode
    if preset != "default":
        settings["preset"] = preset
    gp = FederatedGP(residual=residual, knots=args.knots, nu=0.5, cluster=args.runtime, seed=args.seed,
                     client=client, progress=True, **settings)
    gaps = Gaps(sys.stderr)  # the progress display's stream: when its lines came (docs/user-guide.md, Progress)
    sys.stderr = gaps
    try:
        with PeakRSS(children=args.runtime == "dask") as mem:
            tic = time.perf_counter()
            gaps.start()
            gp.fit(str(store))
            fit_s = time.perf_counter() - tic
            shown = gaps.stop()
    finally:
        sys.stderr = gaps.stream
    p = gp.params_
    init_s = float(gp.trace_[0]["time_s"]) if gp.trace_ and gp.trace_[0].get("step") == "init" else None
    say(f"[{residual}/{preset}] fit {fit_s:.1f} s, {gp.n_iter_} iterations, converged={gp.converged_} "
        f"({gp.stop_reason_}), peak {mem.mb:.0f} MB")
    return {"residual": residual, "preset": preset, "fit_s": round(fit_s, 2), "iterations": int(gp.n_iter_),
            "converged": bool(gp.converged_), "peak_rss_mb": round(mem.mb, 1), "mode": gp.config_.mode,
            "stop_reason": gp.stop_reason_, "init_s": init_s, **shown,
            "loglik": None if gp.loglik_ is None else float(gp.loglik_),
            "params": {"delta": p["delta"], "sigma2": p["sigma2"], "beta": p["beta"],
                       "gamma": [round(float(g), 4) for g in p["gamma"]]}}, gp


def predict_held_out(store: Path, gp, args, client) -> dict:
    """Save the fit and predict the store's test group (outputs.prediction.predict, the default predictor): seconds
    from the saved fit to the table in memory, and the held-out scores."""
    from spatialfed.outputs.prediction import predict

    fit_dir = Path(tempfile.mkdtemp(prefix="bench_million-fit-"))
    try:
        gp.save(fit_dir / "fit")
        tic = time.perf_counter()
        frame, scores = predict(fit_dir / "fit", str(store), runtime=args.runtime, client=client)
        predict_s = time.perf_counter() - tic
    finally:
        shutil.rmtree(fit_dir, ignore_errors=True)
    say(f"predicted {len(frame)} held-out cells in {predict_s:.1f} s: RMSE {scores['rmse']:.4f}, "
        f"CRPS {scores['crps']:.4f}, 95 % cover {scores['coverage95']:.3f}")
    return {"predict_s": round(predict_s, 2), "n_test": scores["n"], "rmse": round(scores["rmse"], 4),
            "crps": round(scores["crps"], 4), "coverage95": round(scores["coverage95"], 4)}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=float, default=1e6, help="points (default 10⁶)")
    ap.add_argument("--workers", type=int, default=100, help="J area sites (default 100)")
    ap.add_argument("--residual", default="auto",
                    help="comma list of auto (the library's default), vecchia, full, mpp, pp (default auto)")
    ap.add_argument("--preset", default="default", help="comma list: default (the library's), stats, tuned, ...")
    ap.add_argument("--mode", choices=("default", "sync", "async"), default="default",
                    help="default: the library's (async)")
    ap.add_argument("--test", type=float, default=1e5,
                    help="held-out cells simulated with the field and predicted after each fit (default 10⁵; 0: none)")
    ap.add_argument("--knots", type=int, default=100)
    ap.add_argument("--max-iter", type=int, default=50)
    ap.add_argument("--runtime", choices=("dask", "simulated"), default="dask")
    ap.add_argument("--dask-workers", type=int, default=2)
    ap.add_argument("--store", type=Path, default=None,
                    help="write (or, with --reuse, read) the store here instead of a temporary folder")
    ap.add_argument("--reuse", action="store_true", help="fit the existing --store instead of simulating")
    ap.add_argument("--profile", type=float, default=None, metavar="N",
                    help="cProfile one in-process (simulated runtime) fit of the first residual/preset at N points")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    n, J = int(args.n if args.profile is None else args.profile), args.workers
    residuals = [r for r in args.residual.split(",") if r]
    presets = [p for p in args.preset.split(",") if p]

    emit = emitter(args.out)

    tmp = None
    if args.store is None:
        tmp = tempfile.mkdtemp(prefix="bench_million-")
        store = Path(tmp) / "million.zarr"
    else:
        store = args.store
    try:
        if args.reuse:
            made = {"simulate_s": None, "ingest_s": None, "sim_peak_rss_mb": None, "truth": None}
        else:
            made = make_store(store, n, J, args.seed, int(args.test))
        if args.profile is not None:
            import cProfile
            import pstats

            args.runtime = "simulated"
            prof = cProfile.Profile()
            prof.enable()
            row, _ = fit(store, residuals[0], presets[0], args, None)
            prof.disable()
            pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
            pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(15)
            emit({"n": n, "J": J, **made, **row, "runtime": "simulated (profiled)"})
            return
        from spatialfed.data.store import open_store

        has_test = open_store(store).has_test  # simulated with --test, or a --reuse store's own
        handle = None
        if args.runtime == "dask":
            from spatialfed.runtime.cluster import local_cluster

            tic = time.perf_counter()
            handle = local_cluster(args.dask_workers)
            say(f"Dask LocalCluster with {args.dask_workers} worker processes in {time.perf_counter() - tic:.1f} s")
        try:
            for k, (residual, preset) in enumerate((r, p) for r in residuals for p in presets):
                if handle is not None and k:
                    handle.client.restart(timeout=900)
                client = None if handle is None else handle.client
                row, gp = fit(store, residual, preset, args, client)
                if has_test:
                    row.update(predict_held_out(store, gp, args, client))
                emit({"n": n, "J": J, **{key: made[key] for key in ("simulate_s", "ingest_s")}, **row,
                      "sim_peak_rss_mb": made["sim_peak_rss_mb"], "truth": made["truth"],
                      "runtime": args.runtime, "dask_workers": args.dask_workers})
        finally:
            if handle is not None:
                handle.close()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
