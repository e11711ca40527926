"""Small jobs stay small (issue 14): `spatialfed ingest` + `spatialfed fit` on the 155-point Meuse data, end to end.

    python benchmarks/bench_meuse.py [--repeats 3]

Runs the README's commands as a user would, each in a fresh process:

    spatialfed ingest data/meuse/meuse.csv meuse.zarr --x x --y y --value zinc --crs EPSG:28992 --workers 4
    spatialfed fit meuse.zarr --out meuse_fit/ --mode sync --knots 50 [--runtime dask]

with the default runtime (auto: in this process for a job this small) and with --runtime dask (an embedded
LocalCluster, TLS), plus the fit with every default (async, m = 100). Prints one JSON line per (setting, repeat):
{setting, runtime, ingest_s, fit_s, total_s, cpu_s, load_avg, loglik}. total_s is the wall time of both commands,
interpreter start-up included; cpu_s their CPU seconds (user + system, worker processes included): on an idle
machine the in-process wall time is about cpu_s, on a shared one the wall time grows with the load average.

Measured on the 2-core session machine on 2026-11-23 (shared: load average 8.1–13.5 from other jobs), --repeats 3:

    setting         total_s              cpu_s
    sync-50 auto    11.6, 15.3, 25.1     6.4, 6.4, 8.0
    sync-50 dask    28.6, 36.6, 47.0     16.3, 18.2, 18.1
    defaults auto   29.0, 34.4, 30.4     7.0, 8.8, 7.7

(docs/user-guide.md, "Small jobs run in this process").
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MEUSE = Path(__file__).resolve().parents[1] / "data" / "meuse" / "meuse.csv"
SETTINGS = {"sync-50 auto": ["--mode", "sync", "--knots", "50"],
            "sync-50 dask": ["--mode", "sync", "--knots", "50", "--runtime", "dask"],
            "defaults auto": []}


def timed(command: list[str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the process and its children, stdout) of one command."""
    before = os.times()
    tic = time.perf_counter()
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    wall = time.perf_counter() - tic
    after = os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system), \
        done.stdout


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated among {list(SETTINGS)}")
    args = ap.parse_args(argv)
    exe = [sys.executable, "-m", "spatialfed"]
    rows = []
    for _ in range(args.repeats):
        for name in args.settings.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                store, out = Path(tmp) / "meuse.zarr", Path(tmp) / "meuse_fit"
                load = os.getloadavg()[0]
                ingest_s, ingest_cpu, _ = timed(exe + ["ingest", str(MEUSE), str(store), "--x", "x", "--y", "y",
                                                       "--value", "zinc", "--crs", "EPSG:28992", "--workers", "4"])
                fit_s, fit_cpu, _ = timed(exe + ["fit", str(store), "--out", str(out), "--quiet"] + SETTINGS[name])
                fit = json.loads((out / "fit.json").read_text())
                row = {"setting": name, "ingest_s": round(ingest_s, 2), "fit_s": round(fit_s, 2),
                       "total_s": round(ingest_s + fit_s, 2), "cpu_s": round(ingest_cpu + fit_cpu, 2),
                       "load_avg": round(max(load, os.getloadavg()[0]), 1), "loglik": round(fit["loglik"], 4),
                       "iterations": fit["iterations"]}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


if __name__ == "__main__":
    main()
