"""The statistics server (SPEC §2b) for a MaternFamily: u = (log δ, log σ², κ) of any length q, sync or async.

Each site sends its statistics at the u it was asked (model/family_stats.py); the server keeps every site's latest,
models the stale ones at the current u by their second-order Taylor expansion (likelihood.taylor_statistics, exact at
their own u) and maximises the profile ℓ_LR of the sum by safeguarded Newton steps (likelihood.maximise). Synchronous:
all sites answer at each u and a step that lowers the exact ℓ is withdrawn (the trust radius shrinks). Asynchronous:
the server steps on each answer and sends that site the new u. Both stop at an exact round — every site's
statistics at one u — whose own Newton step is below tol in every coordinate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from spatialfed.algorithm.likelihood import (NotPositiveDefinite, Profile, default_bounds, distance, maximise, profile_loglik,
                                          sum_statistics, taylor_statistics, trust_region_step, updated_radius)
from spatialfed.algorithm.family_interval import likelihood_ratio_interval
from spatialfed.model.family import MaternFamily
from spatialfed.model.family_stats import family_statistics

#: largest move of u from the last exact round within one server step (the Taylor models' reach)
MAX_MOVE = 1.0
#: how far from its own u a stale site's Taylor model is used (asynchronous steps wait for answers beyond it)
REACH = 0.5
#: default predicted gain of ℓ below which a Newton step is not worth a round (along a flat direction the step can
#: be long; towards a vanishing nugget ℓ creeps up by ever smaller gains)
GAIN_TOL = 1e-10
#: relative change of ℓ below which an exact round neither lowers nor raises it (sums of n_j-term statistics)
ROUNDOFF = 1e-13


def family_bounds(family: MaternFamily, s2: float, diameter: float) -> tuple[np.ndarray, np.ndarray]:
    """Box on u: likelihood.default_bounds for (log δ, log σ², log β), then the family's own (family.bounds)."""
    lo, hi = default_bounds(s2, diameter)
    klo, khi = family.bounds()
    return np.concatenate([lo, klo]), np.concatenate([hi, khi])


def family_start(family: MaternFamily, s2: float, diameter: float) -> np.ndarray:
    """u₀: half the residual variance to the nugget and half to σ², β = D/10, ν = 1, ratio 1.5 at angle 0."""
    u = [np.log(2.0 / s2), np.log(0.5 * s2), np.log(0.1 * diameter)]
    if family.nu is None:
        u.append(0.0)
    if family.anisotropy:
        u += [np.log(1.5), 0.0]
    return np.array(u)


@dataclass
class FamilyServer:
    """Server state: the current u, every site's latest statistics, the last exact round and the trust radius."""

    knots: np.ndarray
    family: MaternFamily
    u: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    sites: int
    tol: float = 1e-7
    loglik_tol: float = GAIN_TOL
    radius: float = MAX_MOVE
    latest: dict = field(default_factory=dict)
    best: tuple | None = None  # (Profile, statistics by site) of the best exact round
    done: Profile | None = None
    stalled: bool = False  # stopped because the trust radius fell below tol, not by the Newton-step rule
    steps: int = 0

    def profile(self, u, derivatives: bool = True) -> Profile | None:
        """The profile ℓ_LR of the sum of the sites' latest statistics modelled at u (None where not PD)."""
        try:
            return profile_loglik(sum_statistics([taylor_statistics(st, u) for st in self.latest.values()]),
                                  self.knots, self.family, derivatives)
        except (NotPositiveDefinite, np.linalg.LinAlgError):
            return None

    def _exact(self) -> bool:
        return len(self.latest) == self.sites and all(np.array_equal(st["u"], self.u) for st in self.latest.values())

    def _settled(self, base: Profile) -> bool:
        """Whether the Newton step from base (at most MAX_MOVE long: never a step shortened by a small radius)
        is below tol in every coordinate, or its predicted gain below loglik_tol (a flat direction of ℓ)."""
        step = trust_region_step(base.u, base.grad, base.hess, MAX_MOVE, self.lower, self.upper)
        return float(np.max(np.abs(step.p))) <= self.tol or step.predicted <= self.loglik_tol

    def receive(self, site: int, stats: dict, synchronous: bool) -> np.ndarray:
        """Record a site's statistics and return the u the server asks for next (`done` is set when it stops)."""
        self.latest[site] = stats
        if len(self.latest) < self.sites or (synchronous and not self._exact()):
            return self.u
        self.steps += 1
        base = self.profile(self.u)
        if self._exact():
            if base is None and self.best is None:
                raise NotPositiveDefinite(f"the summed statistics are not positive definite at the start u = "
                                          f"{np.round(self.u, 3).tolist()}: give another start (u0)")
            lowered = self.best is not None and (base is None or base.loglik < self.best[0].loglik - ROUNDOFF * abs(
                self.best[0].loglik))
            if lowered and self._settled(self.best[0]):
                self.done, self.u = self.best[0], self.best[0].u
                return self.u
            if base is None or lowered:
                # the step lowered the exact ℓ: withdraw it and shrink the radius
                base, self.latest = self.best[0], dict(self.best[1])
                self.radius = 0.25 * float(np.linalg.norm(self.u - base.u))
                self.u = base.u
                if self.radius < self.tol:  # no ascent found within tol of the best point: stop there, flagged
                    self.done, self.stalled = base, True
                    return self.u
            else:
                if self.best is not None:
                    gained = base.loglik - self.best[0].loglik
                    self.radius = updated_radius(self.radius, 1.0 if gained >= 0 else 0.0,
                                                 float(np.linalg.norm(self.u - self.best[0].u)), MAX_MOVE)
                self.best = (base, dict(self.latest))
                if self._settled(base):
                    self.done = base
                    return self.u
        elif base is None or self._settled(base):  # wait for the stale sites to answer at this u
            return self.u
        # the stale models are trusted within REACH of the u they were computed at
        room = self.radius if self._exact() else REACH - max(distance(st["u"], self.u) for st in self.latest.values())
        if room <= 0.0:
            return self.u
        reached, _ = maximise(self.profile, base, max(room, 1e-6), self.lower, self.upper, steps=20,
                              floor=1e-10, tol=0.1 * self.tol)
        if reached is base and self._exact():  # no ascent of ℓ's model from an exact point: stop there, flagged
            self.done, self.stalled = base, True
        self.u = np.asarray(reached.u, dtype=float)
        return self.u


def fit_serial(parts, knots, family: MaternFamily, residual: str, u0, lower, upper, synchronous: bool = True,
               tol: float = 1e-7, max_answers: int = 5000, loglik_tol: float = GAIN_TOL,
               give_up: bool = False) -> FamilyServer:
    """Run the server with the sites computed in this process: synchronous rounds, or (asynchronous) sites
    answering one at a time in turn, each at the u it was last sent. Returns the stopped server (`done`). After
    max_answers: RuntimeError, or with give_up the best exact round so far as `done`, flagged `stalled` (its ℓ is
    then a lower bound of the maximum)."""
    server = FamilyServer(np.asarray(knots, dtype=float), family, np.asarray(u0, dtype=float), lower, upper,
                          len(parts), tol=tol, loglik_tol=loglik_tol)
    asked = {j: server.u for j in range(len(parts))}
    for answer in range(max_answers):
        j = answer % len(parts)
        locs, z, X = parts[j]
        nxt = server.receive(j, family_statistics(locs, z, X, knots, family, residual, asked[j]), synchronous)
        if server.done is not None:
            return server
        asked[j] = nxt
        if synchronous and j == len(parts) - 1:
            asked = {i: nxt for i in asked}
    if give_up and server.best is not None:
        server.done, server.stalled = server.best[0], True
        return server
    raise RuntimeError(f"the family fit did not stop within {max_answers} site answers (tol={tol:g})")


#: index of log ν in u = (log δ, log σ², log β, log ν, ...) when ν is estimated
NU_INDEX = 3
#: rounds of one refit with ν fixed: a refit still climbing then (a nugget walking to its bound at a rough ν) gives
#: a lower bound of ℓ_p, which can only shorten the interval on that side where its drop already exceeds χ²/2
REFIT_ROUNDS = 100


def nu_interval(parts, knots, family: MaternFamily, residual: str, best, lower, upper, se: float,
                level: float = 0.95, tol: float = 1e-5, loglik_tol: float = 1e-6) -> tuple[float | None, float | None]:
    """The profile-likelihood interval of log ν (family_interval.likelihood_ratio_interval): ℓ_p(log ν) is the
    maximum of ℓ over the other coordinates with ν fixed, each a fit started from the nearest ν's, stopped at a
    looser `tol` and gain `loglik_tol` than the estimate's (the ends need ℓ_p to ~1e-4, the root's own precision)."""
    if family.nu is not None:
        raise ValueError("nu_interval needs a family with nu estimated (nu=None)")
    keep = [i for i in range(len(best.u)) if i != NU_INDEX]
    u_rest, lo_rest, hi_rest = np.asarray(best.u)[keep], np.asarray(lower)[keep], np.asarray(upper)[keep]

    starts = {float(best.u[NU_INDEX]): u_rest}  # each refit starts from the nearest ν's refit

    def profile(log_nu: float) -> float:
        fixed = MaternFamily(float(np.exp(log_nu)), family.anisotropy, family.distance)
        start = starts[min(starts, key=lambda v: abs(v - log_nu))]
        done = fit_serial(parts, knots, fixed, residual, start, lo_rest, hi_rest, tol=tol, loglik_tol=loglik_tol,
                          max_answers=REFIT_ROUNDS * len(parts), give_up=True).done
        starts[log_nu] = np.asarray(done.u, dtype=float)
        return float(done.loglik)

    return likelihood_ratio_interval(profile, float(best.u[NU_INDEX]), float(best.loglik), se,
                                     float(lower[NU_INDEX]), float(upper[NU_INDEX]), level)
