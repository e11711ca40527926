"""Small jobs stay small (issue 14): `spatialfed ingest` + `spatialfed fit` on the 155-point Meuse data, end to end.

    python benchmarks/bench_meuse.py [--repeats 3]

Runs the README's commands as a user would, each in a fresh process:

    spatialfed ingest data/meuse/meuse.csv meuse.zarr --x x --y y --value zinc --crs EPSG:28992 --workers 4
    spatialfed fit meuse.zarr --out meuse_fit/ --mode sync --knots 50 [--runtime dask]

with the default runtime (auto: in this process for a job this small) and with --runtime dask (an embedded
LocalCluster, TLS), plus the fit with every default (async, m = 100). Prints one JSON line per (setting, repeat):
{setting, ingest_s, fit_s, ingest_cpu_s, fit_cpu_s, total_s, cpu_s, load_avg, loglik, iterations}: wall and CPU
seconds of each command; total_s is the wall time of both commands, interpreter start-up included; cpu_s their CPU
seconds (user + system, worker processes included): on an idle machine the in-process wall time is about cpu_s, on
a shared one the wall time grows with the load average. `--pycache DIR` lets the commands cache bytecode in DIR (an
installed package has it; with PYTHONDONTWRITEBYTECODE=1, as in the session environment, every process recompiles
spatialfed's own modules: 0.1-0.3 s of the fit).

Measured on the 2-core session machine on 2026-11-23 (shared: load average 8.1–13.5 from other jobs), --repeats 3:

    setting         total_s              cpu_s
    sync-50 auto    11.6, 15.3, 25.1     6.4, 6.4, 8.0
    sync-50 dask    28.6, 36.6, 47.0     16.3, 18.2, 18.1
    defaults auto   29.0, 34.4, 30.4     7.0, 8.8, 7.7

(docs/user-guide.md, "Small jobs run in this process").

After the lazy imports of 2026-11-23 (Bokeh only when report.html is drawn, affine only for rasters), sync-50 auto,
5 runs alternating with the code before them, load average 6.3-8.8: ingest 1.61 CPU s (median; before 1.71), fit
4.26 (before 4.61), both 6.09 (before 6.32; min 5.44 vs 5.71): within the run-to-run spread, because this path uses
everything it imports: the fit process still imports scikit-learn (FederatedGP's base class: 0.7-0.9 CPU s with
scipy.stats, joblib, narwhals) and Bokeh (0.6 s, then 0.5 s to draw report.html, which every fit writes); and
interpreter shut-down runs the garbage collector over every object left (~210,000 in the fit): calling
gc.freeze() at exit saved a median 0.25 CPU s of the ingest and 0.6 of the fit in 4 alternating runs.

2026-11-24, with gc.freeze as the CLI's last exit handler (spatialfed/cli/__init__.py) and the default preset stats,
``--settings "defaults auto" --pycache DIR``, 2 runs × 2 repeats alternating with the code before it, load 1.8-2.4:
total wall 4.28, 4.14, 4.69, 4.57 s (before 4.76, 4.80, 5.69, 5.17); ingest 1.15-1.24 s, fit 2.99-3.46 s.
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
INGEST = ["ingest", str(MEUSE), "--x", "x", "--y", "y", "--value", "zinc", "--crs", "EPSG:28992", "--workers", "4"]


def timed(command: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the process and its children, stdout) of one command."""
    before = os.times()
    tic = time.perf_counter()
    done = subprocess.run(command, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          env=env)
    wall = time.perf_counter() - tic
    after = os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system), \
        done.stdout


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated among {list(SETTINGS)}")
    ap.add_argument("--pycache", metavar="DIR", default=None,
                    help="let the commands cache bytecode in DIR (PYTHONPYCACHEPREFIX), as an installed package does; "
                         "by default the environment decides (PYTHONDONTWRITEBYTECODE=1 recompiles spatialfed's "
                         "sources in every process)")
    args = ap.parse_args(argv)
    exe = [sys.executable, "-m", "spatialfed"]
    env = None
    if args.pycache:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPYCACHEPREFIX"] = str(Path(args.pycache).resolve())
        with tempfile.TemporaryDirectory() as tmp:  # one untimed run fills the cache
            timed(exe + INGEST + [str(Path(tmp) / "m.zarr")], env)
            timed(exe + ["fit", str(Path(tmp) / "m.zarr"), "--out", str(Path(tmp) / "f"), "--quiet"], env)
    rows = []
    for _ in range(args.repeats):
        for name in args.settings.split(","):
            with tempfile.TemporaryDirectory() as tmp:
                store, out = Path(tmp) / "meuse.zarr", Path(tmp) / "meuse_fit"
                load = os.getloadavg()[0]
                ingest_s, ingest_cpu, _ = timed(exe + INGEST + [str(store)], env)
                fit_s, fit_cpu, _ = timed(exe + ["fit", str(store), "--out", str(out), "--quiet"] + SETTINGS[name],
                                          env)
                fit = json.loads((out / "fit.json").read_text())
                row = {"setting": name, "ingest_s": round(ingest_s, 2), "fit_s": round(fit_s, 2),
                       "ingest_cpu_s": round(ingest_cpu, 2), "fit_cpu_s": round(fit_cpu, 2),
                       "total_s": round(ingest_s + fit_s, 2), "cpu_s": round(ingest_cpu + fit_cpu, 2),
                       "load_avg": round(max(load, os.getloadavg()[0]), 1), "loglik": round(fit["loglik"], 4),
                       "iterations": fit["iterations"]}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


if __name__ == "__main__":
    main()
