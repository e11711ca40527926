"""A log-parameter heading for a bound of the box (docs/algorithm.md, "Boundaries"): near a vanishing nugget
ℓ ≈ ℓ∞ − c/δ, so each Newton step moves log δ by ≈ 1 and free steps never settle. After `after` consecutive Newton
steps of at least `size` toward one side, none cut short by the trust radius (a step the radius cut is a far start,
not a direction), the parameter is tried once at its bound; the exact ℓ there accepts or rejects it like any step.
"""

from __future__ import annotations

import numpy as np

from spatialfed.algorithm.profile import Step, at_bound


class BoundaryProbe:
    """Counts each log-parameter's consecutive free Newton steps toward one side and proposes its bound once."""

    def __init__(self, after: int, size: float):
        self.after, self.size = int(after), float(size)
        self.toward = [0, 0, 0]  # consecutive steps of ≥ size per log-parameter, signed
        self.probed: list[int] = []  # log-parameters already tried at a bound (once each)

    def step(self, u: np.ndarray, step: Step, radius: float, lower, upper) -> Step | None:
        """The step with one log-parameter moved to its bound, or None."""
        free = float(np.linalg.norm(step.p)) < 0.99 * radius
        probe = None
        for i, d in enumerate(step.p):
            sign = 0 if not free else 1 if d >= self.size else -1 if d <= -self.size else 0
            k = self.toward[i]
            self.toward[i] = k + sign if sign and np.sign(k) == sign else sign
            if probe is None and abs(self.toward[i]) >= self.after and i not in self.probed:
                p = step.p.copy()
                p[i] = (upper[i] if sign > 0 else lower[i]) - u[i]
                self.probed.append(i)
                probe = Step(p=p, predicted=0.0, at_bound=at_bound(u + p, lower, upper))
        return probe
