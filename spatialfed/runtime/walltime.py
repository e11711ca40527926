"""Fits that outlive their batch jobs: Dask workers retire before the walltime, and the cluster replaces them.

A batch job ends at its walltime, and its Dask worker with it. So that a fit may run longer than one job:

- each worker is started with ``--lifetime L --lifetime-stagger S`` (distributed's worker options,
  dask-jobqueue's advice for walltimes): it retires gracefully between L − S and L + S seconds after it started,
  before the batch system kills it. L = W − margin and S = margin/2, margin = W/10 held to [10 s, 10 min] and to at
  most W/2, so every worker leaves between 1.5 and 0.5 margins before the walltime W, the workers of one generation
  spread over a margin;
- the cluster is adaptive with ``minimum_jobs = maximum_jobs = jobs``: a job whose worker retired (or that ended
  otherwise) is replaced by a new submission (`keep_jobs`);
- the Dask runtime moves a departed worker's sites to the live workers (they reload their partitions from the store)
  and, once every worker has left, waits `QUEUE_WAIT_S` for the queue to start a replacement before it stops with the
  checkpoint's one line (runtime.dask_runtime, ``worker_wait_s``).

A retiring worker's running task is sent again to the site's new worker: the site's answers are functions of the
parameters sent and of its partition only (SPEC §3), so the fit's path and estimate are those of an uninterrupted fit.
"""

from __future__ import annotations

#: how long a fit on a batch system waits for the queue to start a job once every worker has left (seconds)
QUEUE_WAIT_S = 600.0
#: the retirement margin before the walltime: this fraction of it, held to [MARGIN_MIN_S, MARGIN_MAX_S]
MARGIN_FRACTION, MARGIN_MIN_S, MARGIN_MAX_S = 0.1, 10.0, 600.0


def walltime_seconds(walltime) -> float | None:
    """Seconds of a batch walltime: "[D-]HH:MM:SS", "MM:SS", "MM" (SLURM's forms; PBS/SGE use HH:MM:SS) or a
    number of seconds; None when not given. ValueError naming the forms otherwise."""
    if walltime is None or walltime == "":
        return None
    if isinstance(walltime, (int, float)) and not isinstance(walltime, bool):
        return float(walltime)
    text = str(walltime).strip()
    days, dash, clock = text.rpartition("-")
    try:
        parts = [float(p) for p in clock.split(":")]
        d = float(days) if dash else 0.0
    except ValueError:
        parts, d = [], 0.0
    if not parts or len(parts) > 3 or any(p < 0 for p in parts) or d < 0:
        raise ValueError(f"walltime must be [D-]HH:MM:SS, MM:SS or minutes, got {walltime!r}")
    if len(parts) == 1:  # SLURM: a bare number is minutes
        parts = [0.0, parts[0], 0.0]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    h, m, s = parts
    return d * 86400 + h * 3600 + m * 60 + s


def lifetime(walltime) -> tuple[float, float] | None:
    """(L, S) seconds: the worker lifetime and its stagger for a job of `walltime` (module docstring); None without
    a walltime."""
    w = walltime_seconds(walltime)
    if w is None:
        return None
    margin = min(max(MARGIN_FRACTION * w, MARGIN_MIN_S), MARGIN_MAX_S, w / 2)  # (short tests: half of it)
    return w - margin, margin / 2


def with_lifetime(job_kwargs: dict, walltime) -> dict:
    """`job_kwargs` with the worker options ``--lifetime L --lifetime-stagger S`` for `walltime` added to
    ``worker_extra_args``; a ``--lifetime`` the user gave there wins."""
    life = lifetime(walltime)
    extra = [str(a) for a in (job_kwargs.get("worker_extra_args") or [])]
    if life is None or any(a.split("=", 1)[0] == "--lifetime" for a in extra):
        return dict(job_kwargs)
    seconds, stagger = life
    return {**job_kwargs, "worker_extra_args": [*extra, "--lifetime", f"{seconds:g}s",
                                                 "--lifetime-stagger", f"{stagger:g}s"]}


def keep_jobs(cluster, jobs: int) -> None:
    """Hold `cluster` (a dask-jobqueue cluster) at `jobs` jobs: adaptive with minimum = maximum, so a job whose
    worker retired or ended is submitted again (dask-jobqueue's answer to walltimes)."""
    cluster.adapt(minimum_jobs=int(jobs), maximum_jobs=int(jobs))
