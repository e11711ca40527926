"""Seamless against owner prediction on simulated area partitions (issue 30): accuracy, calibration, seams, cost.

    nice -n 10 python benchmarks/bench_seams.py --workers 4,16 --seeds 0,1,2

For each J and seed: simulate a store (SPEC §7 setting, `--partition area`, N = --n-total points split over J
sites, --test-size held-out points), fit it in-process (sync, m knots, full residual), then predict the held-out
points and a --cells × --cells map grid over [0,1]² with both predictors (`seamless`, the default, and `lowrank`,
the owner predictor) on one in-process runtime. One JSON row per (J, seed, predictor):
{J, seed, predictor, rmse, crps, coverage95, seam, predict_cpu_s, ...}. `seam` is `metrics.seam_ratio` of the
map's spatial part (mean − x₀ᵀγ at intercept 1 and the other covariates 0: the surface a map shows); predict_cpu_s
is the CPU seconds of the held-out and the grid predictions (one process: the wall time on an idle machine).
A last row per J summarises the seeds: the mean and the worst of every score, and the time ratio seamless/owner.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import emitter  # noqa: E402

PREDICTORS = ("seamless", "lowrank")


def grid_points(cells: int) -> np.ndarray:
    """Centres of a cells × cells grid over [0,1]², row by row (row 0 at the top)."""
    c = (np.arange(cells) + 0.5) / cells
    xx, yy = np.meshgrid(c, c[::-1])
    return np.column_stack([xx.ravel(), yy.ravel()])


def run(J: int, seed: int, args, work: Path) -> list[dict]:
    from spatialfed.cli import main as cli
    from spatialfed.data.simulate import simulate_store
    from spatialfed.data.store import open_store
    from spatialfed.outputs import metrics
    from spatialfed.outputs.prediction import heldout_targets, load_model, open_workers, predict_at

    store, fit = work / f"J{J}-s{seed}.zarr", work / f"fit-J{J}-s{seed}"
    simulate_store(store, J, args.n_total // J, partition="area", test_size=args.test_size, seed=seed,
                   nu=args.nu, beta=args.beta, noise_sd=args.noise_sd)
    code = cli(["fit", str(store), "--out", str(fit), "--runtime", "simulated", "--mode", "sync", "--residual",
                args.residual, "--knots", str(args.knots), "--nu", str(args.nu), "--max-iter", "30", "--quiet"])
    if code != 0:
        raise SystemExit(f"the fit of J={J} seed={seed} failed (exit status {code})")
    model, info = load_model(fit), open_store(store)
    targets = heldout_targets(info)
    pts = grid_points(args.cells)
    X0 = np.zeros((len(pts), model.params.gamma.size))
    X0[:, 0] = 1.0
    rows = []
    with open_workers(info, model, "simulated") as workers:
        for predictor in PREDICTORS:
            tic = time.process_time()
            held = predict_at(workers, model, targets.locs, targets.X, predictor)
            grid = predict_at(workers, model, pts, X0, predictor)
            cpu = time.process_time() - tic
            s = metrics.scores(targets.observed, held["mean"], held["sd"])
            surface = (grid["mean"] - X0 @ model.params.gamma).reshape(args.cells, args.cells)
            seam = metrics.seam_ratio(surface, grid["owner"].reshape(args.cells, args.cells))
            rows.append({"J": J, "seed": seed, "predictor": predictor, "rmse": round(s["rmse"], 5),
                         "crps": round(s["crps"], 5), "coverage95": round(s["coverage95"], 4),
                         "seam": round(seam, 3), "predict_cpu_s": round(cpu, 2), "n_test": len(targets.locs),
                         "cells": len(pts), "n_total": args.n_total, "residual": args.residual,
                         "params": {k: round(float(getattr(model.params, k)), 4) for k in ("delta", "sigma2", "beta")}})
    return rows


def summary(J: int, rows: list[dict]) -> dict:
    """Mean and worst over the seeds of J: seam (largest), RMSE and CRPS relative to the owner's (largest), coverage
    (farthest from 0.95), and the CPU time ratio seamless / owner."""
    by = {(r["seed"], r["predictor"]): r for r in rows if r["J"] == J}
    seeds = sorted({s for s, _ in by})
    sl, ow = [by[s, "seamless"] for s in seeds], [by[s, "lowrank"] for s in seeds]
    rel = {k: np.array([a[k] / b[k] for a, b in zip(sl, ow)]) for k in ("rmse", "crps", "predict_cpu_s")}
    cov = np.array([a["coverage95"] for a in sl])
    seam, seam_owner = np.array([a["seam"] for a in sl]), np.array([b["seam"] for b in ow])
    return {"J": J, "summary": True, "seeds": seeds,
            "seam_mean": round(float(seam.mean()), 3), "seam_worst": round(float(seam.max()), 3),
            "owner_seam_mean": round(float(seam_owner.mean()), 3),
            **{f"{k}_ratio_{name}": round(float(f(rel[k])), 4) for k in ("rmse", "crps")
               for name, f in (("mean", np.mean), ("worst", np.max))},
            "coverage_mean": round(float(cov.mean()), 4),
            "coverage_worst": round(float(cov[np.argmax(np.abs(cov - 0.95))]), 4),
            "time_ratio_mean": round(float(rel["predict_cpu_s"].mean()), 3),
            "time_ratio_worst": round(float(rel["predict_cpu_s"].max()), 3)}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="4,16", help="comma list of J (area sites)")
    ap.add_argument("--seeds", default="0,1,2", help="comma list of simulation seeds")
    ap.add_argument("--n-total", type=int, default=1600, help="observations over all sites (default 1600)")
    ap.add_argument("--test-size", type=int, default=1000, help="held-out points (default 1000)")
    ap.add_argument("--cells", type=int, default=120, help="map grid cells per side (default 120)")
    ap.add_argument("--knots", type=int, default=100)
    ap.add_argument("--residual", default="full", choices=["full", "mpp"])
    ap.add_argument("--nu", type=float, default=0.5)
    ap.add_argument("--beta", type=float, default=0.1)
    ap.add_argument("--noise-sd", type=float, default=2.0)
    ap.add_argument("--out", type=Path, default=None, help="also append the JSON rows to this file")
    args = ap.parse_args(argv)
    emit = emitter(args.out)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench_seams-") as tmp:
        for J in (int(j) for j in args.workers.split(",")):
            for seed in (int(s) for s in args.seeds.split(",")):
                for row in run(J, seed, args, Path(tmp)):
                    emit(row)
                    rows.append(row)
            row = summary(J, rows)
            emit(row)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
