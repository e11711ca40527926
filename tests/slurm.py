"""The tests' SLURM: a one-node one on this machine (.ci/slurm-up), and what its history says about a run's jobs.

`why_not()` is None when SLURM takes jobs here; the `slurm` fixture (conftest.py) skips a test with that reason, or
fails it when SPATIALFED_REQUIRE_SLURM=1 (.ci/run sets it: CI requires the batch-job path to be tested for real).
Finished jobs stay in `squeue -t all` for an hour (MinJobAge in .ci/slurm-up's slurm.conf).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime

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


@dataclass(frozen=True)
class Job:
    id: int
    name: str
    state: str
    start: datetime | None
    end: datetime | None


def _time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text)
    except ValueError:  # "N/A", "Unknown": not started / not ended
        return None


def last_job_id() -> int:
    """The highest job id SLURM lists (0 when none): jobs of a run are those after it."""
    return max((j.id for j in jobs()), default=0)


def jobs(after: int = 0, name: str | None = None) -> list[Job]:
    """Jobs with id > `after` (and this `name`), in id order, finished ones included."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i|%j|%T|%S|%e"], capture_output=True, text=True,
                         check=True, timeout=30).stdout
    found = []
    for line in out.splitlines():
        i, n, state, start, end = line.strip().split("|")
        if int(i) > after and (name is None or n == name):
            found.append(Job(int(i), n, state, _time(start), _time(end)))
    return sorted(found, key=lambda j: j.id)


def generations(found: list[Job]) -> int:
    """How many generations of jobs ran one after another: a job that started after another ended is of the next
    generation (1 + the largest generation of those that ended before it started); 0 without started jobs."""
    gen: dict[int, int] = {}
    for job in sorted((j for j in found if j.start is not None), key=lambda j: j.start):
        before = [gen[o.id] for o in found if o.id in gen and o.end is not None and o.end <= job.start]
        gen[job.id] = 1 + max(before, default=0)
    return max(gen.values(), default=0)
