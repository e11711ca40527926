"""A synchronous fit of several walltimes on SLURM: it finishes by itself on the uninterrupted estimate.

    python benchmarks/bench_walltime_slurm.py [--walltime 00:01:00] [--slowdown 100] [--out DIR]

Simulates 4 sites × 900 points (seed 1), fits them with `spatialfed fit --mode sync --tol 1e-8 --slowdown S,S,S,S
--jobqueue slurm --jobs 2 --cores 1 --walltime W` (workers retire before W and are replaced: runtime.walltime), then
the same fit uninterrupted (`--walltime 00:30:00`, no slowdown: it changes the wall time of a synchronous fit, not its
path), and prints one JSON object: the fit's wall time (fit.json) and the command's, its iterations, the worker jobs
it ran (states) and their generations (SLURM's job list: a job that started after another ended is of the next
one), and Δℓ against the uninterrupted fit. Needs a SLURM that takes jobs here (.ci/slurm-up).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from slurm_jobs import generations, jobs, last_job_id  # noqa: E402

JOBS = ["--jobqueue", "slurm", "--jobs", "2", "--cores", "1", "--memory", "2GB"]


def spatialfed(*args: str, cwd: Path) -> float:
    """Run `spatialfed ARGS` with this interpreter in `cwd`; its wall seconds (CalledProcessError with its output)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "spatialfed", *args, "--quiet"], cwd=cwd, check=True,
                   capture_output=True, text=True)
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--walltime", default="00:01:00")
    p.add_argument("--slowdown", type=float, default=100.0)
    p.add_argument("--out", type=Path, default=None, help="working directory (default: a new temporary one)")
    a = p.parse_args(argv)
    work = a.out or Path(tempfile.mkdtemp(prefix="bench-walltime-"))
    work.mkdir(parents=True, exist_ok=True)
    spatialfed("simulate", "s900.zarr", "--workers", "4", "--n-per-worker", "900", "--seed", "1", "--overwrite",
               cwd=work)
    fit = ["fit", "s900.zarr", "--mode", "sync", "--tol", "1e-8", "--overwrite"]
    before = last_job_id()
    command_s = spatialfed(*fit, "--out", "long", "--slowdown", ",".join([f"{a.slowdown:g}"] * 4), *JOBS,
                           "--walltime", a.walltime, cwd=work)
    ran = jobs(after=before, name="dask-worker")
    spatialfed(*fit, "--out", "reference", *JOBS, "--walltime", "00:30:00", cwd=work)
    long, ref = (json.loads((work / d / "fit.json").read_text()) for d in ("long", "reference"))
    row = {"walltime": a.walltime, "slowdown": a.slowdown, "fit_wall_time_s": round(long["wall_time_s"], 1),
           "command_s": round(command_s, 1), "iterations": long["iterations"], "converged": long["converged"],
           "worker_jobs": len(ran), "job_states": dict(Counter(j.state for j in ran)),
           "generations": generations(ran), "loglik": long["loglik"], "reference_loglik": ref["loglik"],
           "dloglik": long["loglik"] - ref["loglik"], "work": str(work)}
    print(json.dumps(row))
    return row


if __name__ == "__main__":
    main()
