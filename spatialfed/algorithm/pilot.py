"""A start near the optimum (docs/algorithm.md, "The pilot start"): before the loop, every site answers statistics
requests on a seeded uniform subsample of at most `points` of its observations (Step.PILOT, LocalModel.pilot), and
the server takes the loop's trust-region Newton steps on the subsamples' exact profile ℓ.

The subsample's likelihood is the model's exact marginal likelihood of those observations, so its maximiser u_s
estimates the same φ as the full one u*; they differ by about the subsample's sampling error, whose covariance is
≈ (−H_s)⁻¹(1 − N_s/N) (H_s the pilot's Hessian of ℓ in u; the variance of a nested subsample's estimate less the
full one's). The pilot stops when its Newton step is below half that standard error in every coordinate (later
steps would move u by less than the distance still left to u*) and the loop starts there — unless φ₀ is expected to
be nearer u*: E‖u_s − u*‖² ≈ tr C_s (C_s that covariance) while ‖φ₀ − u_s‖² − tr C_s estimates ‖φ₀ − u*‖², so the
loop starts at φ₀ when ‖φ₀ − u_s‖² ≤ 2 tr C_s (checked from the first round on, with the Newton step's estimate of
u_s). Distances are the loop's (Euclidean in u). A pilot round costs a site its subsample's request,
O(n_s m² + n_s³), so the pilot runs only when the subsamples hold at most `share` of the observations. Sites with
the mpp or pp residual end the pilot after its first round at φ₀: there σ² and β are identified mostly through the
knots, along a ridge on which a subsample's maximiser wanders farther than its Hessian says (docs/algorithm.md).
"""

from __future__ import annotations

import numpy as np

from spatialfed.algorithm.boundary import BoundaryProbe
from spatialfed.algorithm.likelihood import Profile, distance, sum_statistics, trust_region_step, updated_radius
from spatialfed.algorithm.protocol import PILOT_STEP, Augmented
from spatialfed.model.params import Params


def pilot_size(n_j: dict[int, int], points: int, share: float) -> int | None:
    """N_s = Σ_j min(n_j, points) when the subsamples hold at most `share` of the N observations, else None."""
    n_s = sum(min(int(n), int(points)) for n in n_j.values())
    return n_s if points > 0 and n_s <= share * sum(n_j.values()) else None


class Pilot:
    """The pilot's synchronous rounds: every site answers at `u`; then accept or reject on the exact ℓ, and either
    the next point or the end (`done`, the start `estimate`)."""

    def __init__(self, u0, bounds, policy, step_bound: float, tol: float, max_rounds: int, n_s: int, n: int):
        self.u = np.asarray(u0, dtype=float)  # the point every site answers in this round
        self.start = self.u.copy()  # φ₀
        self.bounds = bounds
        self.points, self.floor = int(policy.pilot_points), float(policy.eig_floor)
        self.cap, self.tol, self.max_rounds = policy.radius_growth * step_bound, float(tol), int(max_rounds)
        self.radius = float(step_bound)
        self.shrink = 1.0 - n_s / n  # (−H_s)⁻¹ less the full data's ≈ (−H_s)⁻¹ (1 − N_s/N)
        self.probe = BoundaryProbe(policy.probe_step)
        self.answers: dict[int, dict] = {}  # site -> its statistics at u in this round
        self.anchor: Profile | None = None  # the last accepted point
        self.step_len, self.predicted = 0.0, 0.0
        self.rounds = 0
        self.estimate: np.ndarray | None = None  # u where the loop starts, once the pilot is done

    @property
    def done(self) -> bool:
        return self.estimate is not None

    def task(self, params: Params, t: int, j: int) -> Augmented | None:
        """Site j's request in this round (None once it answered or the pilot is done)."""
        if self.done or j in self.answers:
            return None
        return Augmented(params.with_u(self.u), t, PILOT_STEP, extra={"points": self.points})

    def answered(self, j: int, xi: dict) -> None:
        if np.allclose(np.asarray(xi["u"], dtype=float), self.u, rtol=0.0, atol=1e-12):  # u read back as log(exp(u))
            self.answers[j] = xi

    def drop(self, j: int) -> None:
        """Site j left: its subsample leaves the sums, so ℓ is no longer comparable with the accepted point's."""
        self.answers.pop(j, None)
        self.anchor = None

    def complete(self, active: list[int], evaluate, expired: bool = False) -> bool:
        """Once every active site answered at u: take the round's step (`evaluate(stats)` → Profile or None) and
        return True; `u` is then the next point, or once `done` the estimate. `expired` (the fit's time budget is
        over) ends the pilot at the accepted point."""
        if self.done:
            return False
        if expired:
            self.u = self.estimate = self.u if self.anchor is None else self.anchor.u
            return True
        if any(j not in self.answers for j in active):
            return False
        if any(self.answers[j].get("diagonal", 0.0) for j in active):
            self.u, self.estimate, self.rounds = self.start, self.start, self.rounds + 1
            return True
        here = evaluate(sum_statistics([self.answers[j] for j in active]))
        self.answers, self.rounds = {}, self.rounds + 1
        anchor = self.anchor
        if anchor is not None and (here is None or here.loglik < anchor.loglik):
            self.radius = max(0.25 * self.step_len, 1e-6)  # rejected: a shorter step from the accepted point
        elif here is None:  # the first point is not positive definite: the loop starts from φ₀ as without a pilot
            self.estimate = self.u
            return True
        else:
            if anchor is not None and self.predicted > 0:
                self.radius = updated_radius(self.radius, (here.loglik - anchor.loglik) / self.predicted,
                                             self.step_len, self.cap)
            self.anchor = here
        base = self.anchor
        lower, upper = self.bounds
        step = trust_region_step(base.u, base.grad, base.hess, self.radius, lower, upper, floor=self.floor)
        target = np.clip(base.u + step.p, lower, upper)  # the pilot's estimate of its maximiser u_s
        if self.nearer_start(base, target):
            self.u = self.estimate = self.start
            return True
        if self.settled(base, step.p) or self.rounds >= self.max_rounds:
            self.u = self.estimate = target
            return True
        probe = self.probe.step(base, step, lower, upper)
        if probe is not None:
            step = probe
        self.u = base.u + step.p
        self.step_len, self.predicted = distance(self.u, base.u), step.predicted
        return True

    def _info(self, base: Profile) -> np.ndarray | None:
        """The inverse of the pilot's error covariance against the full data, −H_s/(1 − N_s/N); None where −H_s is
        not positive definite (not yet near a maximum: no standard error)."""
        info = -0.5 * (base.hess + base.hess.T)
        return info / self.shrink if np.all(np.linalg.eigvalsh(info) > 0) else None

    def nearer_start(self, base: Profile, target: np.ndarray) -> bool:
        """φ₀ is expected nearer u* than the pilot's estimate `target`: ‖φ₀ − target‖² ≤ 2 tr C_s."""
        info = self._info(base)
        return info is not None and distance(self.start, target) ** 2 <= 2.0 * float(np.trace(np.linalg.inv(info)))

    def settled(self, base: Profile, p: np.ndarray) -> bool:
        """The step is below tol, or below half the pilot's standard error against the full data in every u_i."""
        if float(np.max(np.abs(p))) <= self.tol:
            return True
        info = self._info(base)
        return info is not None and bool(np.all(np.abs(p) <= 0.5 * np.sqrt(np.diag(np.linalg.inv(info)))))
