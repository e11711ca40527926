"""Large gridded benchmark (issue 14): spatialfed against GPBoost's Vecchia GP on the simulated Heaton et al. (2019)
land-surface temperature field (105,569 training cells, 44,431 held-out cells; ../shared/data/heaton-simulated/).

For each J in --workers and each residual in --residual: ingest the training cells with area partitions
(``spatialfed.data.ingest.ingest_frame``, lon/lat projected by the library), fit ``spatialfed.api.FederatedGP``
(library defaults unless an option says otherwise), save, and predict the held-out cells with
``spatialfed.outputs.prediction.predict``. In the same run, the peer: GPBoost's Vecchia GP (20 neighbours,
exponential covariance, constant mean, centralized on the pooled training data in the same projected coordinates,
in km) fitted by its default optimiser and predicted with response variances.

One JSON row per method on stdout, GPBoost's first (it runs first), then spatialfed's for every J and residual
(default: J = 25, 50, 100, 200 and the library's residual "auto": the dense full residual on sites of ≤ 1,000 points,
the Vecchia residual above):
    {method, J, residual, residual_used, vecchia_k, ingest_s, fit_s, iterations, predict_s, peak_rss_mb, rmse, mae,
     crps, coverage95, time_vs_gpboost, ...}
``time_vs_gpboost``: (fit_s + predict_s) over GPBoost's in the same run (null with --no-gpboost).

--per-site times one site's statistics request instead (no fit, no GPBoost): the n training cells nearest the
field's centre for n in --sizes (default 10³ … 10⁵), one core, each --residual (full only up to --max-full points):
    {mode: "per_site", n, residual, used, k, m, plan_s, request_cpu_s, request_wall_s, peak_traced_mb, max_rss_mb,
     message_numbers}

    nice -n 19 python benchmarks/bench_large.py --per-site --residual full,vecchia
``ingest_s``: spatialfed: ingest_frame (validate, project, partition, write Zarr); gpboost: projecting the coordinates.
``fit_s``: wall seconds of ``FederatedGP.fit`` on an already running Dask cluster (its start-up is printed on stderr
and not counted), or of ``GPModel.fit``. ``predict_s``: ``predict`` (loads the partitions on the workers, kriges the
held-out cells) or ``GPModel.predict``. ``peak_rss_mb``: the largest sum of resident set sizes of this process and its
child processes (the Dask workers), sampled every 0.1 s during ingest + fit + predict of that method (RSS counts
shared pages once per process). ``crps``: mean Gaussian CRPS; ``coverage95``: share of held-out cells in the central
95 % predictive interval (sd of a new observation). Extra keys: n_train, n_test, converged, stop_reason, mode,
init_s (seconds into the fit when φ₀ was ready: the moments and variogram passes), pilot_rounds and pilot_s
(the pilot start's rounds and the seconds into the fit when the loop began, docs/algorithm.md), params; seam
(`metrics.seam_ratio` of the held-out cells' means, issue 30) and the owner predictor's owner_seam, owner_rmse,
owner_mae, owner_crps, owner_coverage95 and owner_predict_s (`predictor="lowrank"` on the same fit).

    pip install -e ".[bench]"        # gpboost
    nice -n 19 python benchmarks/bench_large.py --subsample 10000 --workers 50 --mode sync --max-iter 10
    nice -n 19 python benchmarks/bench_large.py                # the full field, J = 50 and 100, full residual
Progress goes to stderr; --out FILE also appends the rows to FILE (JSON lines).

The figure (the rows on stdout are the same with or without it): --figure PATH draws, after the runs, maps of the
training data and, on the held-out cells, the truth, spatialfed's and GPBoost's predicted means (one colour scale),
both predictive sds, spatialfed's errors and spatialfed − GPBoost (with the boundaries between the sites that own
the cells), and RMSE, CRPS, 95 % coverage and fit + predict seconds of every method (`plot_heaton`). The held-out
predictions are saved first, after each method, to --predictions NPZ (outside the repository: it holds the data's
held-out values), and --replot NPZ --figure PATH redraws the figure from that file without fitting:

    nice -n 19 python benchmarks/bench_large.py --subsample 5000 --all-test --workers 10 \
        --figure /tmp/heaton.png --predictions /tmp/heaton.npz      # ≈ 1-2 min: a cheap fit, dense maps
    python benchmarks/bench_large.py --replot /tmp/heaton.npz --figure /tmp/heaton.pdf

Measured 2026-11-23 on the 2-core development machine while other jobs kept its load average at 8–28 (so every
time below is several times what an idle machine gives; compare rows of one run, not with other reports); m = 100,
ν = 0.5, area partitions, sync unless noted, seed 0:

    cells (train/test)  method             J    residual   fit_s  iters  predict_s  peak MB  RMSE    CRPS    cov95
    10,000 / 4,209      spatialfed         50   full         94     10      15       1058   0.926   0.500   0.956
                        spatialfed async   50   full        390     50       7       1133   0.928   0.501   0.953
                        gpboost Vecchia20  —    —            48     12       2        526   0.930   0.499   0.955
    20,000 / 8,417      spatialfed         100  mpp         203     10      34       1152   1.324   0.735   0.935
                        spatialfed         100  pp          252     15      44       1187   1.368   0.748   0.929
    105,569 / 44,431    spatialfed         50   mpp        1077     15     470       1792   1.432   0.807   0.908
                        spatialfed         100  full       1514      9     150       7861   0.834   0.434   0.955
                        gpboost Vecchia20  —    —          2890     17     168        714   0.841   0.439   0.958
(full field: GPBoost ran 17:33–18:25 in a separate `--only-gpboost` process at load ≈ 20–28, spatialfed J = 100
18:14–18:47 as the load fell from ≈ 25 to ≈ 5: their times are not comparable; the scores are.)

2026-11-24, commit 2802ffd, every default (preset stats, async), one run, load ≈ 2–3 (a test suite alongside):
    105,569 / 44,431    spatialfed         100  full        378     11      45       2198   0.834   0.434   0.955
                        gpboost Vecchia20  —    —           183     17      10       1076   0.841   0.439   0.958
2026-11-24, commit 69e616e (worker malloc settings, k-d tree owners), every default, idle machine:
    105,569 / 44,431    spatialfed         100  full         95      7     9.5       2172   0.834   0.434   0.955
                        gpboost Vecchia20  —    —           136     17     6.4       1064   0.841   0.439   0.958

Convergence seen in these runs: at 10,000 cells the nugget is interior (sync δ 1.85 → 18.93, converged on the
parameter rule in 10 iterations; GPBoost's nugget 0.052 ⇔ δ = 19.2); async with the paper preset (the default
when measured; the default is now "stats") moves δ by ≈ 2 % per aggregation (1.85 → 7.64 in 50) and stops at max_iter with the
same predictions. On the full
field, full residual J = 50: δ 1.84 (φ₀) → 5.0 → 11.5 → 15.8 in the first three iterations (≈ 270 s each at load
≈ 20, 6.4 GB RSS per Dask worker process: stopped for memory); mpp J = 50: ℓ_LR flat to 0.01 from iteration 8
(−170753.42) while σ² creeps 7.358 → 7.385, so the relative-parameter rule never fires (stopped at max_iter 15);
full residual J = 100: δ 1.84 → 5.0 → 11.4 → 15.7 → 18.1 → 18.90 → 18.95, converged on the parameter rule after 9
iterations with δ = 18.95, σ² = 9.98, β = 82.5 km (GPBoost: nugget 0.0525 ⇔ δ = 19.06, σ² = 10.19, range 84.0 km):
on this simulated field the nugget is interior, not on its boundary. φ₀'s δ₀ = 1.84 is the variogram rule's clip
τ² = 0.05·s² in every full-field run (the WLS fit puts the nugget at ≈ 0).

Memory since (issue 14): the 6.4 GB per worker process and 7,861 MB peaks above came from every site keeping 7.5
n_j × n_j arrays between requests. A site now keeps O(n_j(m + p)) numbers; the full residual at J = 50 peaks at
1,176 MB (block scheme) and 1,124 MB (preset stats) in all processes together: benchmarks/bench_memory.py and
docs/results.md, "Large data: memory and 10⁶ points".
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import PeakRSS, emitter, say  # noqa: E402

from spatialfed.model.names import RESIDUAL_CHOICES  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DATA = REPO.parent / "shared" / "data" / "heaton-simulated"
LONLAT = "EPSG:4326"


def load(data: Path, subsample: int | None, seed: int, keep_test: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """train.csv and test.csv (Lon, Lat, temp); with --subsample N a seeded random N training cells and the same share
    of the held-out cells (all of them with keep_test)."""
    missing = [name for name in ("train.csv", "test.csv") if not (data / name).is_file()]
    if missing:
        raise SystemExit(f"{data} lacks {missing}: give the folder of the simulated Heaton field with --data DIR")
    train, test = pd.read_csv(data / "train.csv"), pd.read_csv(data / "test.csv")
    for name, frame in (("train.csv", train), ("test.csv", test)):
        if not {"Lon", "Lat", "temp"} <= set(frame.columns):
            raise SystemExit(f"{data / name} must have columns Lon, Lat, temp; found {list(frame.columns)}")
    if subsample is not None and subsample < len(train):
        rng = np.random.default_rng(seed)
        n_test = max(1, round(subsample * len(test) / len(train)))
        train = train.iloc[np.sort(rng.choice(len(train), subsample, replace=False))].reset_index(drop=True)
        if not keep_test:
            test = test.iloc[np.sort(rng.choice(len(test), n_test, replace=False))].reset_index(drop=True)
    return train, test


def scores(observed, mean, sd) -> dict:
    from spatialfed.outputs.metrics import scores as score

    s = score(observed, mean, sd)
    return {k: round(s[k], 4) for k in ("rmse", "mae", "crps", "coverage95")}


def seam(train, test, mean, owner) -> float | None:
    """metrics.seam_ratio of the held-out cells' means on the data's grid (None off a regular grid)."""
    from spatialfed.outputs.metrics import seam_ratio

    lonlat = test[["Lon", "Lat"]].to_numpy(float)
    grid = regular_grid(np.vstack([train[["Lon", "Lat"]].to_numpy(float), lonlat]))
    return None if grid is None else round(seam_ratio(rasterize(lonlat, np.asarray(mean, float), grid),
                                                      rasterize(lonlat, np.asarray(owner, float), grid)), 3)


def run_spatialfed(train, test, J, residual, args, client, work: Path, keep: dict | None = None) -> dict:
    """Ingest (area partition), fit, save and predict the held-out cells: one JSON row. With `keep`, also
    keep["mean", "sd", "owner"] = the held-out cells' predictions (in test's row order) for the figure."""
    from spatialfed.api import FederatedGP
    from spatialfed.data import geometry
    from spatialfed.data.ingest import ingest_frame
    from spatialfed.outputs.prediction import predict

    tag = f"J{J}-{residual}"
    store, fit_dir, targets = work / f"{tag}.zarr", work / f"fit-{tag}", work / f"test-{tag}.csv"
    settings = {k: v for k, v in {"mode": args.mode, "max_iter": args.max_iter, "tol": args.tol,
                                  "time_budget": args.time_budget, "preset": args.preset}.items() if v is not None}
    with PeakRSS() as mem:
        tic = time.perf_counter()
        info, _ = ingest_frame(train, store, value="temp", x="Lon", y="Lat", crs=LONLAT, partition="area",
                               n_workers=J, overwrite=True, seed=args.seed)
        ingest_s = time.perf_counter() - tic
        xy, _ = geometry.to_projected(test[["Lon", "Lat"]].to_numpy(float), LONLAT, info.crs)
        pd.DataFrame({"x": xy[:, 0], "y": xy[:, 1]}).to_csv(targets, index=False)
        say(f"[{tag}] ingested {len(train)} cells into {J} area sites in {ingest_s:.1f} s ({info.crs})")

        k = "" if args.vecchia_k is None or residual not in ("vecchia", "auto") else f":{args.vecchia_k}"
        gp = FederatedGP(residual=residual + k, knots=args.knots, nu=0.5, seed=args.seed,
                         cluster=args.runtime if client is None else client, progress=args.progress, **settings)
        tic = time.perf_counter()
        gp.fit(store)
        fit_s = time.perf_counter() - tic
        gp.save(fit_dir, overwrite=True)
        p = gp.params_
        say(f"[{tag}] fit {fit_s:.1f} s, {gp.n_iter_} iterations, converged={gp.converged_} ({gp.stop_reason_}); "
            f"delta={p['delta']:.4g} sigma2={p['sigma2']:.4g} beta={p['beta']:.4g} gamma={np.round(p['gamma'], 3)}")
        init_s = float(gp.trace_[0]["time_s"]) if gp.trace_ and gp.trace_[0].get("step") == "init" else None
        say(f"[{tag}] φ₀ (moments + variogram passes) ready after {init_s} s of the fit")
        pilot = [row for row in gp.trace_ if row.get("step") == "pilot"]
        pilot_s = float(pilot[-1]["time_s"]) if pilot else None
        say(f"[{tag}] pilot start: {len(pilot)} rounds, the loop started after {pilot_s} s of the fit")
        delta_trace = [row["delta"] for row in gp.trace_ if row.get("step") in ("init", "theta")]
        say(f"[{tag}] delta at init and after each theta step: {np.array2string(np.array(delta_trace), precision=4)}")

        tic = time.perf_counter()
        frame, _ = predict(fit_dir, store, locations=targets, runtime=args.runtime,
                           client=client if args.runtime == "dask" else None)
        predict_s = time.perf_counter() - tic
        tic = time.perf_counter()  # the owner predictor (issue 30), for the seam and the scores beside
        owner, _ = predict(fit_dir, store, locations=targets, runtime=args.runtime, predictor="lowrank",
                           client=client if args.runtime == "dask" else None)
        owner_s = time.perf_counter() - tic
    if keep is not None:
        keep.update(mean=frame["mean"].to_numpy(float), sd=frame["sd"].to_numpy(float),
                    owner=frame["owner"].to_numpy(np.int32))
    return {"method": "spatialfed", "J": J, "residual": residual, "residual_used": gp.residual_,
            "vecchia_k": gp.vecchia_k_, "ingest_s": round(ingest_s, 2),
            "fit_s": round(fit_s, 2), "iterations": int(gp.n_iter_), "predict_s": round(predict_s, 2),
            "peak_rss_mb": round(mem.mb, 1), **scores(test["temp"], frame["mean"], frame["sd"]),
            "n_train": len(train), "n_test": len(test), "converged": bool(gp.converged_),
            "stop_reason": gp.stop_reason_, "mode": gp.config_.mode, "init_s": init_s,
            "pilot_rounds": len(pilot), "pilot_s": pilot_s,
            "seam": seam(train, test, frame["mean"], frame["owner"]), "owner_predict_s": round(owner_s, 2),
            "owner_seam": seam(train, test, owner["mean"], owner["owner"]),
            **{f"owner_{k}": v for k, v in scores(test["temp"], owner["mean"], owner["sd"]).items()},
            "params": {"delta": p["delta"], "sigma2": p["sigma2"], "beta": p["beta"],
                       "gamma": [float(g) for g in p["gamma"]]}}


def with_ratio(row: dict, peer: dict | None) -> dict:
    """The row with "time_vs_gpboost": its fit + predict seconds over GPBoost's in the same run (None without it)."""
    ratio = None
    if peer is not None:
        ratio = round((row["fit_s"] + row["predict_s"]) / (peer["fit_s"] + peer["predict_s"]), 3)
    return {**row, "time_vs_gpboost": ratio}


def per_site(args, residuals) -> None:
    """--per-site: one site's statistics request (model.stats.site_statistics) on the `n` training cells nearest the
    field's centre (a compact area site), n from --sizes, on one core (threadpoolctl), at the issue-14 estimate
    (δ = 19, σ² = 10, β = 82 km), m = --knots on a grid over the site: one JSON row per (n, residual) with the
    request's CPU and wall seconds (the first request of a Vecchia site also orders its points and finds their
    neighbours: plan_s), the tracemalloc peak of a second, traced request and the process's peak RSS."""
    import resource
    import tracemalloc

    from scipy.spatial import cKDTree
    from threadpoolctl import threadpool_limits

    from spatialfed.data import geometry
    from spatialfed.model.local import LocalModel
    from spatialfed.model.matern import Matern
    from spatialfed.model.stats import message_size, site_statistics

    train, _ = load(args.data, None, args.seed)
    xy, crs = geometry.to_projected(train[["Lon", "Lat"]].to_numpy(float), LONLAT)
    order = cKDTree(xy).query(np.median(xy, axis=0), k=len(xy))[1]
    emit = emitter(args.out)
    u = np.log([19.0, 10.0, 82_000.0])
    side = int(round(np.sqrt(args.knots)))
    for n in (int(v) for v in args.sizes.split(",") if v):
        idx = np.sort(order[:n])
        locs, z = xy[idx], train["temp"].to_numpy(float)[idx]
        lo, hi = locs.min(axis=0), locs.max(axis=0)
        g = [lo[i] + (np.arange(side) + 0.5) / side * (hi[i] - lo[i]) for i in (0, 1)]
        knots = np.stack(np.meshgrid(*g), -1).reshape(-1, 2)
        for residual in residuals:
            if residual == "full" and n > args.max_full:
                continue
            kw = {} if args.vecchia_k is None else {"vecchia_k": args.vecchia_k}
            with threadpool_limits(1):
                lm = LocalModel(locs, z, np.ones((n, 1)), knots, Matern(0.5), residual, **kw)
                tic = time.perf_counter()
                if lm.residual == "vecchia":
                    lm.vecchia_plan
                plan_s = time.perf_counter() - tic
                tic, cpu = time.perf_counter(), time.process_time()
                stats = site_statistics(lm, u)
                wall, cpu = time.perf_counter() - tic, time.process_time() - cpu
                tracemalloc.start()  # a second request for the memory: tracing slows every allocation
                site_statistics(lm, u)
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            emit({"mode": "per_site", "n": n, "residual": residual, "used": str(lm.residual),
                  "k": lm.vecchia_k if lm.residual == "vecchia" else None, "m": len(knots),
                  "plan_s": round(plan_s, 3), "request_cpu_s": round(cpu, 3), "request_wall_s": round(wall, 3),
                  "peak_traced_mb": round(peak / 2**20, 1),
                  "max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                  "message_numbers": message_size(stats), "crs": str(crs)})


def run_gpboost(train, test, args, keep: dict | None = None) -> dict:
    """GPBoost's Vecchia GP (20 neighbours, exponential, constant mean) on the pooled cells: one JSON row. With
    `keep`, also keep["mean", "sd"] = its held-out predictions (sd of a new observation)."""
    try:
        import gpboost as gpb
    except ImportError:
        raise SystemExit('gpboost is not installed: pip install -e ".[bench]" (or pass --no-gpboost)') from None
    from spatialfed.data import geometry

    with PeakRSS(children=False) as mem:
        tic = time.perf_counter()
        both = np.vstack([train[["Lon", "Lat"]].to_numpy(float), test[["Lon", "Lat"]].to_numpy(float)])
        xy, crs = geometry.to_projected(both, LONLAT)
        xy = xy / 1000.0  # km: a range parameter of order one for the optimiser
        coords, coords0 = xy[: len(train)], xy[len(train):]
        ingest_s = time.perf_counter() - tic
        model = gpb.GPModel(gp_coords=coords, cov_function="exponential", gp_approx="vecchia", num_neighbors=20,
                            likelihood="gaussian", num_parallel_threads=args.gpboost_threads, seed=args.seed)
        tic = time.perf_counter()
        model.fit(y=train["temp"].to_numpy(float), X=np.ones((len(train), 1)))
        fit_s = time.perf_counter() - tic
        cov = model.get_cov_pars()
        cov = np.asarray(cov.to_numpy() if hasattr(cov, "to_numpy") else cov, dtype=float).ravel()
        say(f"[gpboost] fit {fit_s:.1f} s; cov pars (nugget, sigma2, range km) = {np.round(cov, 4)} ({crs})")
        tic = time.perf_counter()
        pred = model.predict(gp_coords_pred=coords0, X_pred=np.ones((len(test), 1)), predict_var=True,
                             predict_response=True)
        predict_s = time.perf_counter() - tic
    try:
        iterations = int(model._get_num_optim_iter())
    except Exception:
        iterations = None
    mean, var = np.asarray(pred["mu"], dtype=float), np.asarray(pred["var"], dtype=float)
    if keep is not None:
        keep.update(mean=mean, sd=np.sqrt(var))
    return {"method": "gpboost_vecchia20", "J": None, "residual": None, "ingest_s": round(ingest_s, 2),
            "fit_s": round(fit_s, 2), "iterations": iterations, "predict_s": round(predict_s, 2),
            "peak_rss_mb": round(mem.mb, 1), **scores(test["temp"], mean, np.sqrt(var)),
            "n_train": len(train), "n_test": len(test),
            "params": {"nugget": cov[0], "sigma2": cov[1], "range_km": cov[2]}}


# ---------------------------------------------------------------------------------------------------------------
# The figure (--figure PATH, --replot NPZ): the held-out predictions of one run are saved as an .npz (outside the
# repository: it holds the data's held-out truth) and the figure is drawn from that file alone, so it can be redrawn
# without refitting.
# ---------------------------------------------------------------------------------------------------------------

GPBOOST_KEY = "gpboost_vecchia20"


def method_key(row: dict) -> str:
    """The .npz key prefix of a method's predictions: spatialfed_J100_full, gpboost_vecchia20."""
    return f"spatialfed_J{row['J']}_{row['residual']}" if row["method"] == "spatialfed" else row["method"]


def method_label(row: dict) -> str:
    if row["method"] == "spatialfed":
        return f"spatialfed J={row['J']} {row['residual']}"
    return "GPBoost Vecchia-20" if row["method"] == GPBOOST_KEY else str(row["method"])


def _git_commit() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None
    except Exception:
        return None


def check_outside_repo(path: Path, what: str) -> Path:
    """Refuse an .npz inside the repository: it holds the held-out truth of ../shared/data (not ours to ship)."""
    path = Path(path)
    if path.resolve().is_relative_to(REPO):
        raise SystemExit(f"{what} {path} is inside the repository, but it holds the held-out values of "
                         f"{DATA.name} (no licence to ship): choose a path outside {REPO}")
    return path


def save_predictions(path: Path, train: pd.DataFrame, test: pd.DataFrame, runs: list[tuple[dict, dict]],
                     meta: dict) -> Path:
    """Write the training cells, the held-out truth and each method's held-out mean and sd (spatialfed: also the
    owner site of each cell) with the methods' JSON rows, as one .npz, atomically (spatialfed.atomic)."""
    import json

    from spatialfed.atomic import write_atomic

    arrays = {"train_lonlat": train[["Lon", "Lat"]].to_numpy(float), "train_z": train["temp"].to_numpy(float),
              "test_lonlat": test[["Lon", "Lat"]].to_numpy(float), "test_z": test["temp"].to_numpy(float)}
    for row, kept in runs:
        for name, values in kept.items():
            arrays[f"{method_key(row)}__{name}"] = np.asarray(values)
    arrays["rows"] = np.array(json.dumps([row for row, _ in runs]))
    arrays["meta"] = np.array(json.dumps(meta))

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez_compressed(fh, **arrays)

    return write_atomic(path, write)


def load_predictions(path: Path) -> dict:
    """{train_lonlat, train_z, test_lonlat, test_z, rows, meta, methods: {key: {mean, sd[, owner]}}} from an .npz
    written by save_predictions; one line naming what is wrong otherwise."""
    import json
    import zipfile

    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise SystemExit(f"cannot read predictions {path}: {exc}; give an .npz written by bench_large.py "
                         "--figure/--predictions") from None
    need = ("train_lonlat", "train_z", "test_lonlat", "test_z", "rows", "meta")
    missing = [k for k in need if k not in data]
    if missing:
        raise SystemExit(f"{path} lacks {missing}: it was not written by bench_large.py --figure/--predictions")
    out = {k: data[k] for k in need[:4]}
    out["rows"], out["meta"] = json.loads(str(data["rows"])), json.loads(str(data["meta"]))
    n = len(out["test_z"])
    out["methods"] = {}
    for row in out["rows"]:
        key = method_key(row)
        kept = {name.split("__", 1)[1]: data[name] for name in data if name.startswith(key + "__")}
        if "mean" not in kept or "sd" not in kept:
            raise SystemExit(f"{path} has a row for {key} but not its predictions ({key}__mean, {key}__sd)")
        bad = [name for name, v in kept.items() if len(v) != n]
        if bad:
            raise SystemExit(f"{path}: {key}'s {bad} have a length other than the {n} held-out cells")
        out["methods"][key] = kept
    return out


def regular_grid(lonlat: np.ndarray, max_cells: int = 25_000_000):
    """(x0, y0, dx, dy, nx, ny) when every point lies on one regular grid (to 1e-3 of a step), else None."""
    spec = []
    for col in lonlat.T:
        u = np.unique(col)
        if len(u) < 2:
            return None
        step = float(np.diff(u).min())
        k = (u - u[0]) / step
        if step <= 0 or np.abs(k - np.round(k)).max() > 1e-3:
            return None
        spec.append((float(u[0]), step, int(np.round(k[-1])) + 1))
    (x0, dx, nx), (y0, dy, ny) = spec
    return None if nx * ny > max_cells else (x0, y0, dx, dy, nx, ny)


def rasterize(lonlat: np.ndarray, values: np.ndarray, grid, fill=np.nan) -> np.ndarray:
    """values on the (ny, nx) grid (row 0 = lowest y), `fill` where no point lies."""
    x0, y0, dx, dy, nx, ny = grid
    i = np.round((lonlat[:, 0] - x0) / dx).astype(int)
    j = np.round((lonlat[:, 1] - y0) / dy).astype(int)
    out = np.full((ny, nx), fill, dtype=np.result_type(values, type(fill)))
    out[j, i] = values
    return out


def owner_edges(owner: np.ndarray, grid) -> np.ndarray:
    """Segments ((x, y), (x, y)) on the cell edges between neighbouring cells owned by different sites (-1: none)."""
    x0, y0, dx, dy, nx, ny = grid
    segs = []
    j, i = np.nonzero((owner[:, :-1] != owner[:, 1:]) & (owner[:, :-1] >= 0) & (owner[:, 1:] >= 0))
    x, y = x0 + (i + 0.5) * dx, y0 + j * dy
    segs.append(np.stack([np.c_[x, y - dy / 2], np.c_[x, y + dy / 2]], 1))
    j, i = np.nonzero((owner[:-1] != owner[1:]) & (owner[:-1] >= 0) & (owner[1:] >= 0))
    x, y = x0 + i * dx, y0 + (j + 0.5) * dy
    segs.append(np.stack([np.c_[x - dx / 2, y], np.c_[x + dx / 2, y]], 1))
    return np.concatenate(segs)


def heaton_figure(pred: dict, fit: str | None = None):
    """The benchmark figure (a matplotlib Figure, Agg canvas) from load_predictions' dict.

    Maps (lon/lat, aspect 1/cos(latitude)) of the training data and, on the held-out cells, the truth, the
    spatialfed run `fit` (e.g. "J100-full"; default the first) and GPBoost: predicted means on one colour scale,
    predictive sds (of a new observation) on one scale, errors (mean − truth) on one symmetric scale; the spatialfed
    panels also draw the boundaries between the sites that own the held-out cells (the site whose residual krigs a
    cell). Bars: RMSE, CRPS, 95 % coverage and fit + predict wall seconds of every method in the run."""
    from matplotlib.collections import LineCollection
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure  # no pyplot: the Agg canvas, no global state

    rows = pred["rows"]
    sf_rows = [r for r in rows if r["method"] == "spatialfed"]
    if fit is not None:
        sf_rows = [r for r in sf_rows if f"J{r['J']}-{r['residual']}" == fit]
        if not sf_rows:
            have = [f"J{r['J']}-{r['residual']}" for r in rows if r["method"] == "spatialfed"]
            raise SystemExit(f"no spatialfed run {fit} in the predictions (have {have}): pass one of them to "
                             "--figure-fit")
    sf = sf_rows[0] if sf_rows else None
    gp = next((r for r in rows if r["method"] == GPBOOST_KEY), None)
    if sf is None and gp is None:
        raise SystemExit("the predictions hold no spatialfed or GPBoost run: nothing to plot")
    tr_xy, tr_z, te_xy, te_z = pred["train_lonlat"], pred["train_z"], pred["test_lonlat"], pred["test_z"]
    mets = pred["methods"]

    grid = regular_grid(np.vstack([tr_xy, te_xy]))
    lat_mid = np.deg2rad(0.5 * (te_xy[:, 1].min() + te_xy[:, 1].max()))
    aspect = 1.0 / max(np.cos(lat_mid), 0.1)
    train_mask = None if grid is None else np.where(np.isnan(rasterize(tr_xy, np.ones(len(tr_z)), grid)), np.nan,
                                                     1.0)

    def draw(ax, xy, values, title, cmap, vmin, vmax, background=True):
        ax.set_title(title, fontsize=9)
        ax.set_aspect(aspect)
        ax.tick_params(labelsize=7)
        if grid is None:  # scattered points: one dot per cell
            return ax.scatter(xy[:, 0], xy[:, 1], c=values, s=1, marker="s", linewidths=0, cmap=cmap, vmin=vmin,
                              vmax=vmax, rasterized=True)
        x0, y0, dx, dy, nx, ny = grid
        extent = (x0 - dx / 2, x0 + (nx - 0.5) * dx, y0 - dy / 2, y0 + (ny - 0.5) * dy)
        if background and train_mask is not None:
            ax.imshow(train_mask, origin="lower", extent=extent, cmap=ListedColormap(["0.88"]), aspect=aspect,
                      interpolation="nearest")
        return ax.imshow(rasterize(xy, values, grid), origin="lower", extent=extent, cmap=cmap, vmin=vmin, vmax=vmax,
                         aspect=aspect, interpolation="nearest")

    def boundaries(ax, key):
        if grid is None or "owner" not in mets.get(key, {}):
            return
        owner = rasterize(te_xy, mets[key]["owner"].astype(np.int64), grid, fill=-1)
        ax.add_collection(LineCollection(owner_edges(owner, grid), colors="k", linewidths=0.5, alpha=0.8))

    def missing(ax, what):
        ax.set_axis_off()
        ax.text(0.5, 0.5, f"{what}\nnot in this run", ha="center", va="center", transform=ax.transAxes)

    shown = [(r, None, None) if r is None else (r, method_key(r), method_label(r)) for r in (sf, gp)]
    means = [mets[k]["mean"] for r, k, _ in shown if r is not None]
    sds = [mets[k]["sd"] for r, k, _ in shown if r is not None]
    lo, hi = np.nanpercentile(np.concatenate([tr_z, te_z, *means]), [0.5, 99.5])
    sd_hi = float(np.nanpercentile(np.concatenate(sds), 99.5))

    def sym(values) -> float:  # a symmetric colour limit: the 99.5th percentile of |values|
        return max(float(np.nanpercentile(np.abs(values), 99.5)), 1e-12)

    fig = Figure(figsize=(17, 11.5), layout="constrained")
    gs = fig.add_gridspec(3, 4, height_ratios=[1, 1, 0.7])
    ax = [[fig.add_subplot(gs[i, j]) for j in range(4)] for i in range(3)]
    n_tr, n_te = len(tr_z), len(te_z)
    im_t = draw(ax[0][0], tr_xy, tr_z, f"training data ({n_tr:,} cells; white: held out)", "viridis", lo, hi,
                background=False)
    draw(ax[0][1], te_xy, te_z, f"held-out truth ({n_te:,} cells; grey: training)", "viridis", lo, hi)
    im_sd = None
    for col, (r, key, label) in enumerate(shown):
        if r is None:
            missing(ax[0][2 + col], "spatialfed" if col == 0 else "GPBoost")
            missing(ax[1][col], "spatialfed" if col == 0 else "GPBoost")
            continue
        draw(ax[0][2 + col], te_xy, mets[key]["mean"],
             f"{label}: predicted mean\nRMSE {r['rmse']:.3f}, CRPS {r['crps']:.3f}", "viridis", lo, hi)
        im_sd = draw(ax[1][col], te_xy, mets[key]["sd"], f"{label}: predictive sd (new obs.)\n95 % coverage "
                     f"{r['coverage95']:.3f}" + ("; lines: owner sites" if col == 0 else ""), "magma", 0.0, sd_hi)
    bar = dict(location="bottom", shrink=0.5, aspect=40, pad=0.01)  # below the row: no gap between its columns
    fig.colorbar(im_t, ax=ax[0], label="temperature (°C)", **bar)
    if im_sd is not None:
        fig.colorbar(im_sd, ax=ax[1][:2], label="sd of a new observation (°C)", **{**bar, "shrink": 0.7})
    # the errors of the method on the maps, and where the federated fit departs from the centralized one
    first = shown[0] if sf is not None else shown[1]
    err = mets[first[1]]["mean"] - te_z
    im = draw(ax[1][2], te_xy, err, f"{first[2]}: mean − truth\nMAE {first[0]['mae']:.3f}", "RdBu_r",
              -sym(err), sym(err))
    fig.colorbar(im, ax=ax[1][2], label="mean − truth (°C)", **{**bar, "shrink": 0.9, "aspect": 25})
    if sf is not None and gp is not None:
        diff = mets[shown[0][1]]["mean"] - mets[shown[1][1]]["mean"]
        im = draw(ax[1][3], te_xy, diff, f"{shown[0][2]} − GPBoost: means\nRMS {np.sqrt(np.mean(diff ** 2)):.3f};"
                  " lines: owner sites", "PuOr_r", -sym(diff), sym(diff))
        fig.colorbar(im, ax=ax[1][3], label="difference of the means (°C)", **{**bar, "shrink": 0.9, "aspect": 25})
    else:
        missing(ax[1][3], "the other method")
    if sf is not None:
        for a in (ax[1][0], ax[1][2], ax[1][3]):
            boundaries(a, shown[0][1])
    for row in ax[:2]:
        for a in row:
            if a.axison:
                a.set_xlabel("longitude", fontsize=7)
                a.set_ylabel("latitude", fontsize=7)

    labels = [method_label(r) for r in rows]
    colors = ["tab:blue" if r["method"] == "spatialfed" else "tab:orange" for r in rows]
    yy = np.arange(len(rows))

    def dots(a, values, title, fmt, band=None):
        """One point per method on an axis zoomed to the values (the differences are a few %; the numbers are
        printed beside the points)."""
        values = np.asarray(values, dtype=float)
        if band is not None:
            a.axvspan(*band[:2], color="0.9", zorder=0)
            a.axvline(band[2], color="k", lw=0.8)
        a.hlines(yy, 0, values, color="0.8", lw=0.8, zorder=1)
        a.scatter(values, yy, c=colors, s=45, zorder=3)
        for y, v in zip(yy, values):
            a.annotate(fmt.format(v), (v, y), xytext=(0, 7), textcoords="offset points", ha="center", fontsize=8)
        span = [values.min(), values.max()] + (list(band[:2]) if band is not None else [])
        pad = max(0.15 * (max(span) - min(span)), 0.02 * max(abs(v) for v in span), 1e-3)
        a.set_xlim(min(span) - pad, max(span) + pad)
        a.set_yticks(yy, labels, fontsize=8)
        a.set_ylim(len(rows) - 0.5, -0.8)
        a.set_title(title, fontsize=9)
        a.tick_params(labelsize=7)

    dots(ax[2][0], [r["rmse"] for r in rows], "RMSE (°C) on the held-out cells, lower is better", "{:.4f}")
    dots(ax[2][1], [r["crps"] for r in rows], "CRPS (°C) on the held-out cells, lower is better", "{:.4f}")
    dots(ax[2][2], [r["coverage95"] for r in rows], "coverage of the central 95 % intervals (band 0.93–0.97)",
         "{:.3f}", band=(0.93, 0.97, 0.95))
    a = ax[2][3]
    fit_s, pred_s = np.array([r["fit_s"] for r in rows]), np.array([r["predict_s"] for r in rows])
    a.barh(yy, fit_s, color=colors, label="fit")
    a.barh(yy, pred_s, left=fit_s, color=colors, alpha=0.45, label="predict")
    for y, f, p in zip(yy, fit_s, pred_s):
        a.text(f + p, y, f" {f + p:.0f} s\n ({f:.0f} + {p:.0f})", va="center", fontsize=8)
    a.set_yticks(yy, labels, fontsize=8)
    a.invert_yaxis()
    a.set_xlim(0, 1.4 * max(fit_s + pred_s))
    a.set_title("wall seconds: fit + predict (light)", fontsize=9)
    a.tick_params(labelsize=7)

    meta = pred["meta"]
    sub = "" if not meta.get("subsample") else f", subsample {meta['subsample']:,} of the training cells"
    fig.suptitle(f"Simulated Heaton et al. (2019) field: {n_tr:,} training / {n_te:,} held-out cells{sub}; "
                 f"commit {meta.get('commit') or '?'}, {meta.get('date', '')}", fontsize=11)
    return fig


def plot_heaton(pred: dict, out: Path, fit: str | None = None, dpi: int = 120) -> Path:
    """Draw heaton_figure(pred, fit) and write it atomically (spatialfed.atomic) to `out`, in the format of its suffix
    (png, pdf, svg, ...)."""
    from spatialfed.atomic import write_atomic

    out = Path(out)
    fmt = out.suffix.lstrip(".").lower() or "png"
    fig = heaton_figure(pred, fit)
    if fmt not in fig.canvas.get_supported_filetypes():
        raise SystemExit(f"cannot draw {out}: matplotlib writes {sorted(fig.canvas.get_supported_filetypes())}; "
                         "give --figure one of these suffixes")

    def write(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            fig.savefig(fh, format=fmt, dpi=dpi)

    return write_atomic(out, write)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=DATA, help=f"folder with train.csv and test.csv (default {DATA})")
    ap.add_argument("--workers", default="25,50,100,200", help="comma list of J (area sites); default 25,50,100,200")
    ap.add_argument("--residual", default="auto",
                    help=f"comma list of {', '.join(RESIDUAL_CHOICES)}; default auto (the library's)")
    ap.add_argument("--vecchia-k", type=int, default=None, help="neighbours of the Vecchia residual (default: the "
                    "library's)")
    ap.add_argument("--per-site", action="store_true",
                    help="time one site's statistics request instead (--sizes points, one core), no fits")
    ap.add_argument("--sizes", default="1000,3000,10000,30000,100000",
                    help="--per-site: comma list of site sizes (default 1000,3000,10000,30000,100000)")
    ap.add_argument("--max-full", type=int, default=10000,
                    help="--per-site: largest site given the dense full residual (O(n³); default 10000)")
    ap.add_argument("--knots", type=int, default=100, help="m knots (default 100, the library default)")
    ap.add_argument("--mode", choices=("sync", "async"), default=None, help="default: the library's (async)")
    ap.add_argument("--preset", choices=("stats", "paper", "tuned", "basic"), default=None,
                    help="default: the library's (stats)")
    ap.add_argument("--max-iter", type=int, default=None, help="default: the library's (50)")
    ap.add_argument("--tol", type=float, default=None, help="default: the library's (1e-5)")
    ap.add_argument("--time-budget", type=float, default=None, help="seconds per fit (default none)")
    ap.add_argument("--subsample", type=int, default=None, metavar="N",
                    help="a seeded random N training cells (and the same share of held-out cells): for development")
    ap.add_argument("--all-test", action="store_true",
                    help="with --subsample, still predict all 44,431 held-out cells (dense maps from a cheap fit)")
    ap.add_argument("--runtime", choices=("dask", "simulated"), default="dask")
    ap.add_argument("--dask-workers", type=int, default=2, help="processes of the LocalCluster (default 2)")
    ap.add_argument("--gpboost-threads", type=int, default=2)
    ap.add_argument("--no-gpboost", action="store_true", help="skip the GPBoost peer")
    ap.add_argument("--only-gpboost", action="store_true", help="run only the GPBoost peer")
    ap.add_argument("--progress", action="store_true", help="show the fit's progress line on stderr")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also append the JSON rows to this file")
    ap.add_argument("--figure", type=Path, default=None, metavar="PATH",
                    help="after the runs, draw the maps and scores figure to PATH (.png, .pdf, .svg); the "
                         "predictions are saved to --predictions first")
    ap.add_argument("--predictions", type=Path, default=None, metavar="NPZ",
                    help="save the held-out predictions (and the data) to NPZ after each method, outside the "
                         "repository (default with --figure: <temp dir>/bench_large-<figure name>.npz)")
    ap.add_argument("--replot", type=Path, default=None, metavar="NPZ",
                    help="fit nothing: redraw --figure from an NPZ saved by an earlier run")
    ap.add_argument("--figure-fit", default=None, metavar="TAG",
                    help="the spatialfed run the maps show, e.g. J100-full (default: the first)")
    ap.add_argument("--dpi", type=int, default=120, help="resolution of a raster --figure (default 120)")
    args = ap.parse_args(argv)
    if args.replot is not None:
        if args.figure is None:
            ap.error("--replot NPZ needs --figure PATH (where to draw)")
        out = plot_heaton(load_predictions(args.replot), args.figure, fit=args.figure_fit, dpi=args.dpi)
        say(f"figure written to {out} from {args.replot}")
        return
    if args.figure is not None and args.predictions is None:
        args.predictions = Path(tempfile.gettempdir()) / f"bench_large-{args.figure.stem}.npz"
    if args.predictions is not None:
        check_outside_repo(args.predictions, "--predictions")
    Js = [int(j) for j in args.workers.split(",") if j]
    residuals = [r for r in args.residual.split(",") if r]
    bad = [r for r in residuals if r not in RESIDUAL_CHOICES]
    if bad:
        ap.error(f"--residual must be a comma list of {', '.join(RESIDUAL_CHOICES)}; got {bad}")
    if args.per_site:
        per_site(args, residuals)
        return

    tic = time.perf_counter()
    train, test = load(args.data, args.subsample, args.seed, keep_test=args.all_test)
    say(f"read {len(train)} training and {len(test)} held-out cells from {args.data} in "
        f"{time.perf_counter() - tic:.1f} s")

    emit = emitter(args.out)
    runs: list[tuple[dict, dict]] = []  # (JSON row, kept predictions) of every method, for --predictions
    meta = {"data": str(args.data), "subsample": args.subsample, "all_test": args.all_test, "seed": args.seed,
            "commit": _git_commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "argv": sys.argv[1:] if argv is None else list(argv)}

    def record(row: dict, kept: dict) -> None:
        emit(row)
        if args.predictions is not None:
            runs.append((row, kept))
            save_predictions(args.predictions, train, test, runs, meta)
            say(f"predictions of {len(runs)} method(s) saved to {args.predictions}")

    peer = None
    if not args.no_gpboost:  # first, so that every spatialfed row carries its time ratio to the peer
        kept = {}
        peer = run_gpboost(train, test, args, keep=kept)
        record(peer, kept)
    if not args.only_gpboost:
        handle = None
        if args.runtime == "dask":
            from spatialfed.runtime.cluster import local_cluster

            tic = time.perf_counter()
            handle = local_cluster(args.dask_workers)
            say(f"Dask LocalCluster with {args.dask_workers} worker processes started in "
                f"{time.perf_counter() - tic:.1f} s (not counted in fit_s)")
        try:
            with tempfile.TemporaryDirectory(prefix="bench_large-") as tmp:
                for k, (J, residual) in enumerate((J, r) for J in Js for r in residuals):
                    if handle is not None and k:  # each later fit starts from fresh worker processes (memory)
                        handle.client.restart(timeout=900)
                    kept: dict = {}
                    row = run_spatialfed(train, test, J, residual, args, None if handle is None else handle.client,
                                         Path(tmp), keep=kept)
                    record(with_ratio(row, peer), kept)
        finally:
            if handle is not None:
                handle.close()
    if args.figure is not None:
        out = plot_heaton(load_predictions(args.predictions), args.figure, fit=args.figure_fit, dpi=args.dpi)
        say(f"figure written to {out} (redraw: python benchmarks/bench_large.py --replot {args.predictions} "
            f"--figure {args.figure})")


if __name__ == "__main__":
    main()
