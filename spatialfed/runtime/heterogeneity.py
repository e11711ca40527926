"""Compute and network heterogeneity of workers (SPEC §7, Section 6.2): slowdown factors, delays, named profiles.

A worker with slowdown s_j that computed a task in c seconds finishes after s_j·c seconds, i.e. waits (s_j − 1)·c more.
Profiles follow the paper's imbalance by cores per worker (3 to 62 cores): slowdown = 62 / cores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_CORES, MIN_CORES = 62, 3
PROFILES = ("balanced", "straggler", "graded")


def profile_slowdowns(name: str, n_workers: int) -> np.ndarray:
    """Slowdown factors s_j ≥ 1 of a named profile: balanced (all 1), straggler (last worker 62/3), graded (cores
    spread evenly from 62 down to 3) or graded:<min cores> (down to that many instead: graded:12 is the paper's
    moderate imbalance of Figure 6, s_j from 1 to 5.2)."""
    J = int(n_workers)
    if J < 1:
        raise ValueError(f"need at least one worker, got n_workers={n_workers!r}")
    if name == "balanced":
        return np.ones(J)
    if name == "straggler":
        s = np.ones(J)
        s[-1] = MAX_CORES / MIN_CORES
        return s
    if name == "graded" or name.startswith("graded:"):
        low = MIN_CORES if name == "graded" else _min_cores(name)
        cores = np.linspace(MAX_CORES, low, J) if J > 1 else np.array([float(MAX_CORES)])
        return MAX_CORES / cores
    raise ValueError(f"unknown heterogeneity profile {name!r}; choose one of {PROFILES}, graded:<min cores> or "
                     f"give explicit slowdowns")


def _min_cores(name: str) -> float:
    """The <min cores> of a 'graded:<min cores>' profile name: a number in (0, 62]."""
    try:
        low = float(name.split(":", 1)[1])
    except ValueError:
        low = float("nan")
    if not 0 < low <= MAX_CORES:
        raise ValueError(f"profile {name!r}: the minimum cores must be a number in (0, {MAX_CORES}], e.g. graded:12")
    return low


def resolve_slowdowns(profile_or_list, n_workers: int) -> np.ndarray:
    """Slowdowns from a profile name or an explicit list of J factors ≥ 1."""
    if isinstance(profile_or_list, str):
        return profile_slowdowns(profile_or_list, n_workers)
    s = np.asarray(profile_or_list, dtype=float).ravel()
    if s.size != n_workers:
        raise ValueError(f"got {s.size} slowdown factors for {n_workers} workers; give exactly one per worker")
    if not np.all(np.isfinite(s)) or np.any(s < 1):
        raise ValueError(f"slowdown factors must be finite numbers ≥ 1 (1 = full speed), got {s.tolist()}")
    return s


def extra_wait(compute_s: float, slowdown: float, elapsed_s: float | None = None) -> float:
    """How long a worker with slowdown s_j waits after computing for c = `compute_s` CPU seconds in `elapsed_s` wall
    seconds (default c): until its task has taken s_j·c, as on a machine s_j times slower — (s_j − 1)·c on an idle
    host. On a busy host the compute's own wall time counts towards it, so the sites' round trips keep the ratios
    s_j of the profile (the virtual clock's) instead of each adding the contention to (s_j − 1)·c."""
    elapsed = compute_s if elapsed_s is None else elapsed_s
    return max(slowdown * compute_s - elapsed, 0.0)


@dataclass(frozen=True)
class NetworkDelay:
    """One-way message delay: latency + size / bandwidth."""

    latency_s: float = 0.0
    bandwidth_bytes_s: float = math.inf

    def __post_init__(self):
        if not self.latency_s >= 0 or not self.bandwidth_bytes_s > 0:
            raise ValueError("network latency must be ≥ 0 seconds and bandwidth > 0 bytes/s")

    def seconds(self, nbytes: int) -> float:
        """Delay of a message of `nbytes` bytes."""
        return self.latency_s + nbytes / self.bandwidth_bytes_s
