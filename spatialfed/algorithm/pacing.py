"""Pacing of the asynchronous statistics loop (docs/algorithm.md, "Work between epochs"): what the sites' measured
round trips say about when the current epoch ends and whether an idle site may take extra work without delaying the
next.

An epoch is one synchronous round: every site answers at the epoch's u, as in a synchronous iteration, so an epoch
lasts what a synchronous iteration lasts (the slowest site's round trip). A site done with the epoch may take extra
work (answers at other points that improve the stale models) only if it can still answer the next epoch's u within
that epoch: with r_j its round trip, due the time the current epoch is expected to end and T the slowest round trip,
now + 2·r_j ≤ due + T (it finishes the extra task by now + r_j and the next epoch's task by now + 2·r_j). Round trips
that jitter are taken at the safe end of what each site has shown: its longest for r_j, the shortest for `due` and
T. There is no setting: every quantity is a measured round trip.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from spatialfed.algorithm.protocol import STATS_STEP


class Pacing:
    """Round trips measured per site and kind of task (`sent`, `arrived`), and the predictions made from them."""

    def __init__(self):
        self.sent_at: dict[int, float] = {}  # site -> when its task in flight was handed out
        self.durations: dict[str, dict[int, float]] = {}  # kind of task -> site -> its last round trip
        self.spread: dict[int, tuple[float, float]] = {}  # site -> (shortest, longest) statistics round trip
        self._memo: dict = {}  # what the round trips give (slowness, median, slowest): kept until a task arrives
        self.version = 0  # counts the changes (a task sent, arrived, a site dropped): a key for what depends on them

    def sent(self, j: int, now: float) -> None:
        self.sent_at[j] = float(now)
        self.version += 1

    def arrived(self, j: int, step: str, now: float) -> None:
        if j in self.sent_at:
            r = float(now) - self.sent_at.pop(j)
            self._memo, self.version = {}, self.version + 1
            self.durations.setdefault(step, {})[j] = r
            if step == STATS_STEP:
                lo, hi = self.spread.get(j, (r, r))
                self.spread[j] = (min(lo, r), max(hi, r))

    def drop(self, j: int) -> None:
        self._memo, self.version = {}, self.version + 1
        self.sent_at.pop(j, None)
        self.spread.pop(j, None)
        for kind in self.durations.values():
            kind.pop(j, None)

    def slowness(self, k: int, active: Iterable[int]) -> float | None:
        """How much slower than the median site k was in the initialisation, in the kind of task where that ratio
        is smallest (those tasks are tiny and a network delay can inflate any one); None before any. Kept until
        a task arrives (each is O(J))."""
        if ("slowness", k) not in self._memo:
            active = list(active)
            ratios = [kind[k] / float(np.median([kind[j] for j in active if j in kind]))
                      for step, kind in self.durations.items() if step != STATS_STEP and kind.get(k, 0.0) > 0]
            self._memo["slowness", k] = min(ratios) if ratios else None
        return self._memo["slowness", k]

    def round_trip(self, k: int, active: Iterable[int], end: int | None = None) -> float | None:
        """Site k's expected statistics round trip: its last one (`end` 0 / 1: the shortest / longest it took).
        Before it has one: its slowness times the median statistics round trip of the sites that have one; None
        when nothing is known."""
        stats = self.durations.get(STATS_STEP, {})
        if k in stats:
            return stats[k] if end is None else self.spread[k][end]
        ratio = self.slowness(k, active)
        median = self._median_stats(active)
        return None if median is None or ratio is None else ratio * median

    def _median_stats(self, active) -> float | None:
        """The median statistics round trip of the sites that have one (None: none has), kept until one arrives."""
        if "median" not in self._memo:
            stats = self.durations.get(STATS_STEP, {})
            known = [stats[j] for j in active if j in stats]
            self._memo["median"] = float(np.median(known)) if known else None
        return self._memo["median"]

    def epoch_due(self, owed: Iterable[int], active: list[int], busy_elsewhere: Mapping[int, bool],
                  now: float) -> float | None:
        """The earliest the last site owing the epoch's answer may deliver it (None: some round trip unknown).
        `busy_elsewhere[k]`: k computes another task first (it then needs two round trips from that task's start)."""
        due = -np.inf
        for k in owed:
            r = self.round_trip(k, active, end=0)
            if r is None:
                return None
            start = self.sent_at.get(k, now)
            due = max(due, start + (2 * r if busy_elsewhere.get(k, False) else r))
        return due

    def may_work(self, j: int, now: float, due: float | None, active: list[int]) -> bool:
        """Whether site j, done with the epoch, may start a task now and surely answer the next epoch's u in time."""
        if due is None:
            return True
        r = self.round_trip(j, active, end=1)
        slowest = self.slowest(active)
        if r is None or slowest is None:
            return False
        return now + 2 * r <= due + slowest

    def slowest(self, active: list[int]) -> float | None:
        """T: the largest of the sites' shortest expected round trips (None: none known); computed once between
        arrivals, not once per site asked (O(J) each)."""
        if "slowest" not in self._memo:
            known = [t for t in (self.round_trip(k, active, end=0) for k in active) if t is not None]
            self._memo["slowest"] = max(known) if known else None
        return self._memo["slowest"]
