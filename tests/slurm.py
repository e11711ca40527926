"""The tests' SLURM: a one-node one on this machine (.ci/slurm-up), and what its history says about a run's jobs.

`why_not()` is None when SLURM takes jobs here; the `slurm` fixture (conftest.py) skips a test with that reason, or
fails it when SPATIALFED_REQUIRE_SLURM=1 (.ci/run sets it: CI requires the batch-job path to be tested for real).
The job history helpers (`jobs`, `generations`, `last_job_id`) are benchmarks/slurm_jobs.py's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from slurm_jobs import Job, generations, jobs, last_job_id  # noqa: E402,F401 - the run's jobs, for the tests

REQUIRED = os.environ.get("SPATIALFED_REQUIRE_SLURM") == "1"
TAKING_JOBS = ("idle", "mix", "alloc", "completing")


def why_not() -> str | None:
    """None when a SLURM controller answers and a node takes jobs; else why not, and how to start one."""
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        return "no SLURM on this machine (sbatch, sinfo not on PATH); .ci/slurm-up installs and starts a one-node one"
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo did not answer ({exc}); start SLURM with .ci/slurm-up"
    states = done.stdout.split()
    if done.returncode != 0 or not any(s.rstrip("*~#").startswith(TAKING_JOBS) for s in states):
        said = done.stdout.strip() or done.stderr.strip() or "no node"
        return f"SLURM has no node taking jobs (sinfo: {said}); start it with .ci/slurm-up"
    return None
