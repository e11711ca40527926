"""What SLURM's job list says about a run's batch jobs: the jobs after a given id, and how many generations ran one
after another. Finished jobs stay in `squeue -t all` for MinJobAge (an hour in .ci/slurm-up's slurm.conf); no
slurmdbd there, so no sacct. Used by benchmarks/bench_walltime_slurm.py and the tests (tests/slurm.py)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from datetime import datetime


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
