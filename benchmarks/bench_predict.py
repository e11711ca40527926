"""Prediction at 10⁵–10⁶ grid cells from a fit: wall time and peak memory of `spatialfed predict` (issue 14).

    nice -n 10 python benchmarks/bench_predict.py --cells 100000,1000000 --residual full

Simulates a small store (J sites × n_j points on [0,1]², SPEC §7 covariates, area partition), fits it in-process
(sync, m knots), writes a regular grid of the requested number of cells over [0,1]² with random covariates as a
Parquet locations file, and runs `outputs.prediction.predict_to_file` (what `spatialfed predict --locations` runs:
batches streamed to a staged CSV, predictive mean and sd, tqdm bar) in a fresh child process per size, so that
peak_rss_mb is the prediction's own (resource.getrusage of the child and, for --runtime dask, the largest of its
worker processes). Prints one JSON line per size: {n_cells, residual, runtime, predict_s, peak_rss_mb,
worker_peak_rss_mb, batch, rows_written, sites, n_per_site, knots, fit_s, predictor, seam}. `seam` is
`metrics.seam_ratio` of the predicted spatial part (mean − x₀ᵀγ) on the grid (issue 30). predict_s is the wall time of
predict_to_file (loading the fit, the locations file, the sites, predicting, writing), not the interpreter's
start-up; predict_cpu_s its CPU seconds (what the wall time is on an idle machine: the in-process runtime uses one
core) and load_avg the 1-minute load average around it (other jobs on the machine stretch the wall time).

Measured on the 2-core session machine (shared with other jobs, load average 4–10) on 2026-11-23, J = 10 sites of
500 points, m = 100 knots, in-process runtime, CSV output:

    cells  residual  runtime     batch  predict_s  predict_cpu_s  peak_rss_mb  load_avg
    10⁵    full      in-process  8388    27.8       8.1            432          11.5
    10⁶    full      in-process  8388   232.8      76.9            542          13.9
    10⁶    full      in-process  1024   108.3      68.7            468          10.5
    10⁵    pp        in-process  8388    25.2       5.6            433          15.4
    10⁶    pp        in-process  8388   178.3      53.0            491          15.4
    10⁵    full      dask (2)    8388    29.0      19.8 (all)      433 (workers 293)  9.6
2026-11-24, commit 03bef5b (k-d tree owners, batch sized by m), idle machine:
    10⁵    full      in-process  41943    5.8       5.7            495           2.5
    10⁶    full      in-process  41943   51.0      50.8            688           2.4

(docs/results.md, "Prediction at scale").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def grid_locations(path: Path, n_cells: int, covariates: list[str], seed: int = 0) -> int:
    """A near-square regular grid of about n_cells cell centres over [0,1]² with N(0,1) covariates, as Parquet."""
    import pandas as pd

    nx = int(np.ceil(np.sqrt(n_cells)))
    ny = int(np.ceil(n_cells / nx))
    x = (np.arange(nx) + 0.5) / nx
    y = (np.arange(ny) + 0.5) / ny
    xx, yy = np.meshgrid(x, y)
    xy = np.column_stack([xx.ravel(), yy.ravel()])[:n_cells]
    rng = np.random.default_rng(seed)
    cols = {name: (np.ones(len(xy)) if name == "intercept" else rng.standard_normal(len(xy))) for name in covariates}
    pd.DataFrame({"x": xy[:, 0], "y": xy[:, 1], **cols}).to_parquet(path, index=False)
    return len(xy)


def grid_seam(pred_csv: Path, locations: Path, fit: Path) -> float:
    """metrics.seam_ratio of mean − x₀ᵀγ on the grid of `grid_locations` (rows of nx cells, x fastest)."""
    import pandas as pd

    from spatialfed.outputs.metrics import seam_ratio
    from spatialfed.outputs.results import load_fit

    pred, locs = pd.read_csv(pred_csv), pd.read_parquet(locations)
    gamma = np.asarray(load_fit(fit).params["gamma"], dtype=float)
    surface = pred["mean"].to_numpy() - locs[list(locs.columns[2:])].to_numpy(float) @ gamma
    nx = len(np.unique(locs["x"]))
    ny = -(-len(surface) // nx)
    pad = np.full(nx * ny - len(surface), np.nan)
    return seam_ratio(np.r_[surface, pad].reshape(ny, nx), np.r_[pred["owner"].to_numpy(float), pad].reshape(ny, nx))


def _cpu() -> float:
    """CPU seconds (user + system) of this process and its finished children: the wall time on an idle machine."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def child(args) -> None:
    """Run one prediction in this (fresh) process and print its JSON measurements."""
    from spatialfed.outputs.prediction import predict_to_file

    tic, cpu0, load0 = time.perf_counter(), _cpu(), os.getloadavg()[0]
    done = predict_to_file(args.fit, args.store, args.out, locations=args.locations, runtime=args.runtime,
                           batch=args.batch, progress=not args.quiet, predictor=args.predictor,
                           overwrite=True)
    seconds = time.perf_counter() - tic
    me = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024          # KiB on Linux
    workers = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest finished child
    print(json.dumps({"predict_s": round(seconds, 2), "predict_cpu_s": round(_cpu() - cpu0, 2),
                      "load_avg": round(max(load0, os.getloadavg()[0]), 1), "peak_rss_mb": round(me, 1),
                      "worker_peak_rss_mb": round(workers, 1) if workers else None, "batch": done["batch"],
                      "rows_written": done["n"]}))


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="100000,1000000", help="comma-separated numbers of grid cells")
    ap.add_argument("--residual", default="full", choices=["full", "mpp", "pp"])
    ap.add_argument("--runtime", default="simulated", choices=["simulated", "dask"],
                    help="where the sites run during prediction (simulated: this machine's one process)")
    ap.add_argument("--sites", type=int, default=10)
    ap.add_argument("--n-per-site", type=int, default=500)
    ap.add_argument("--knots", type=int, default=100)
    ap.add_argument("--batch", type=int, default=None, help="prediction batch (default: predict's own choice)")
    ap.add_argument("--predictor", default="seamless", choices=["seamless", "lowrank"],
                    help="seamless (the default) or lowrank (the owner predictor)")
    ap.add_argument("--out-dir", default=None, help="keep the files here (default: a temporary directory)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for name in ("fit", "store", "out", "locations"):
        ap.add_argument(f"--{name}", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args)
        return []

    from spatialfed.cli import main as cli
    from spatialfed.data.simulate import simulate_store

    rows = []
    with tempfile.TemporaryDirectory(dir=args.out_dir) as tmp:
        d = Path(tmp)
        store, fit = d / "sim.zarr", d / "fit"
        info = simulate_store(store, args.sites, args.n_per_site, partition="area", seed=1)
        tic = time.perf_counter()
        code = cli(["fit", str(store), "--out", str(fit), "--runtime", "simulated", "--mode", "sync", "--residual",
                    args.residual, "--knots", str(args.knots), "--max-iter", "30", "--quiet"])
        if code != 0:
            raise SystemExit(f"the fit failed (exit status {code})")
        fit_s = time.perf_counter() - tic
        for n_cells in (int(c) for c in args.cells.split(",")):
            locations = d / f"grid{n_cells}.parquet"
            n = grid_locations(locations, n_cells, list(info.covariate_names))
            command = [sys.executable, os.path.abspath(__file__), "--child", "--fit", str(fit), "--store", str(store),
                       "--out", str(d / f"pred{n_cells}.csv"), "--locations", str(locations), "--runtime",
                       args.runtime, "--predictor", args.predictor] + \
                (["--batch", str(args.batch)] if args.batch else []) + \
                (["--quiet"] if args.quiet else [])
            result = subprocess.run(command, check=True, stdout=subprocess.PIPE, text=True)
            row = {"n_cells": n, "residual": args.residual, "runtime": args.runtime,
                   **json.loads(result.stdout.strip().splitlines()[-1]), "sites": args.sites,
                   "n_per_site": args.n_per_site, "knots": args.knots, "fit_s": round(fit_s, 1),
                   "predictor": args.predictor, "seam": round(grid_seam(d / f"pred{n_cells}.csv", locations, fit), 3)}
            print(json.dumps(row), flush=True)
            rows.append(row)
            locations.unlink()
            (d / f"pred{n_cells}.csv").unlink()
    return rows


if __name__ == "__main__":
    main()
