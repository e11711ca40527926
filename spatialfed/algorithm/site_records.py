"""What the statistics server knows of each site (SPEC §2b): its latest statistics, the sums of the answers given at
one u, its earlier answers that make its model third order, and the surrogate Σ_j T_j(u) built from them.

State only, no pacing: `SiteRecords` is told of answers and asked for models (algorithm/stats_server.py drives it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np

from spatialfed.algorithm import stale
from spatialfed.algorithm.config import StatsPolicy
from spatialfed.algorithm.likelihood import THIRD, distance


class Surrogate(NamedTuple):
    at: Callable
    radius: float
    staleness: int
    used: list
    exact_for: list | None


class SiteRecords:
    """Per-site records of the statistics scheme.

    stats {site: its latest statistics, with "t" of its request}; epoch {site: its answer at the last epoch point
    it answered, the point every site shares}; rounds {u key: summed exact statistics of the sites that answered at
    that u, and which} (stale.remember); earlier {site: its two answers before its latest}; secant {site: its latest
    statistics with third derivatives from those (stale.secant), or None, once asked for}.
    """

    def __init__(self, policy: StatsPolicy):
        self.policy = policy
        self.stats: dict[int, dict] = {}
        self.epoch: dict[int, dict] = {}
        self.rounds: dict[str, dict] = {}
        self.keys: dict[int, str] = {}  # site -> the u key of its latest statistics, and of its epoch answer:
        self.epoch_keys: dict[int, str] = {}  # the sums `rounds` keeps (computed once per answer, not per site)
        self.earlier: dict[int, list[dict]] = {}
        self.secant: dict[int, dict] = {}

    def answered(self, j: int, xi: dict, t: int, live: Iterable, epoch: bool = False) -> None:
        """Site j's statistics at the u it was asked (request of iteration t; `epoch`: at the epoch's point);
        `live`: the u of tasks in flight."""
        previous = self.stats.get(j)
        self.stats[j] = {**xi, "t": int(t)}
        self.keys[j] = stale.u_key(xi["u"])
        if epoch:
            self.epoch[j], self.epoch_keys[j] = self.stats[j], self.keys[j]
        self._keep_earlier(j, previous)
        stale.remember(self.rounds, self.stats, j, live, [*self.keys.values(), *self.epoch_keys.values()])

    def _keep_earlier(self, j: int, previous: dict | None) -> None:
        """Site j's two answers before its latest (its secant model is computed again when next asked for)."""
        earlier = self.earlier.setdefault(j, [])
        if previous is not None:
            earlier.append({key: value for key, value in previous.items() if key not in THIRD})
            del earlier[:-2]
        self.secant.pop(j, None)

    def secant_model(self, j: int) -> dict | None:
        """Site j's latest statistics with third derivatives from its two answers before, if within secant_reach
        (stale.secant; None otherwise), kept apart from its statistics. Computed when first asked for: only the
        asynchronous surrogate uses it."""
        if j not in self.secant:
            st = self.stats[j]
            near = [x for x in self.earlier.get(j, [])
                    if 1e-4 <= distance(x["u"], st["u"]) <= self.policy.secant_reach]
            # third derivatives are modelled for u = (log δ, log σ², log β) only: a family's κ has none
            third = len(near) == 2 and len(st["u"]) == 3
            self.secant[j] = {**stale.secant(st, near), "t": st["t"]} if third else None
        return self.secant[j]

    def answered_at(self, j: int, u) -> bool:
        return j in self.stats and np.array_equal(self.stats[j]["u"], u)

    def surrogate(self, u_at, active, n_obs: int, t: int, radius: float) -> Surrogate | None:
        """The surrogate at u_at (Surrogate: u ↦ summed statistics, the largest move allowed, its staleness in
        iterations, the sites used, and those sites again when all answered at u_at) or None while the usable sites
        hold less than min_coverage of the observations.

        Sites within taylor_radius of u_at enter through their models (stale.site_models: a secant model where its
        earlier answers give one); the others are stood in for by the used ones scaled by N / Σ n_j used. The move is
        limited so that no used model is evaluated farther than taylor_radius from its u_j."""
        pol = self.policy
        models = self.nearest(u_at, active)
        have = {j: distance(u_at, st["u"]) for j, st in models.items()}
        used = sorted(j for j, du in have.items() if self._reaches(du))
        n_used = sum(int(models[j]["n"]) for j in used)
        if n_used < pol.min_coverage * n_obs:
            return None
        stalest = max(have[j] for j in used)
        stale_t = t + 1 if len(used) < len(active) else max(t - models[j]["t"] for j in used)
        at = stale.site_models(models, self.rounds, used, n_obs / n_used, pol.control_variates, u_at)
        return Surrogate(at, max(min(radius, pol.taylor_radius - stalest), 0.0), stale_t, used,
                         used if stalest == 0 else None)

    def nearest(self, u, active) -> dict[int, dict]:
        """Each active site's model nearest to u: around its latest answer (with third derivatives where it has
        them) or around its answer at the last epoch point, whichever u_j is nearer (an exploration that went
        astray then leaves the model at the shared point in charge)."""
        models = {}
        for j, st in self.stats.items():
            if j in active:
                secant = self.secant_model(j)
                latest = st if secant is None else secant
                at_epoch = self.epoch.get(j)
                models[j] = (at_epoch if at_epoch is not None and distance(u, at_epoch["u"]) < distance(u, st["u"])
                             else latest)
        return models

    def spread(self, u, u_at, active) -> float:
        """Σ_j (n_j/N)·|u − u_j|² over the models nearest to u_at: the mean square distance from u of the answers an
        estimate at u rests on (a second-order model's error at u grows as |u − u_j|²)."""
        models = self.nearest(u_at, active)
        n = np.array([float(st["n"]) for st in models.values()])
        d = np.array([distance(u, st["u"]) for st in models.values()])
        return float(n @ d ** 2 / n.sum())

    def _reaches(self, du: float) -> bool:
        """A model is used this far from its u_j (taylor_radius; rounding allowed at a full step's end)."""
        return du <= self.policy.taylor_radius * (1 + 1e-9)

    def drop(self, j: int) -> None:
        """Forget site j (a lost worker); the sums at one u are rebuilt without it."""
        for records in (self.stats, self.epoch, self.earlier, self.secant, self.keys, self.epoch_keys):
            records.pop(j, None)
        for key, entry in list(self.rounds.items()):
            if j in entry["sites"]:
                del self.rounds[key]
        for k in self.stats:
            stale.remember(self.rounds, self.stats, k, [], [*self.keys.values(), *self.epoch_keys.values()])
