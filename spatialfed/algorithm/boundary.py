"""A log-parameter heading for a bound of the box (docs/algorithm.md, "Boundaries"). Near a vanishing nugget
ℓ ≈ ℓ∞ − c·e^(−a·v) in v = log δ, so the Newton step −g/h = 1/a never shrinks: its target v + 1/a recedes as far as
the fit moves toward it, while an interior maximum's target stays put. When the Newton target of a parameter recedes
by at least half the step just taken toward it (a step the trust radius cut counts alike) and the Newton step there
is still ≥ `size`, the parameter is tried once at its bound; the exact ℓ there accepts or rejects it like any step.
"""

from __future__ import annotations

import numpy as np

from spatialfed.algorithm.likelihood import Profile, TrustStep, at_bound, pushing_out


def newton_step(base: Profile, lower, upper) -> np.ndarray | None:
    """−H⁻¹g over the parameters free to move (0 on an active bound), or None where −H is not positive definite."""
    g = np.asarray(base.grad, dtype=float)
    free = ~pushing_out(base.u, g, lower, upper, atol=1e-10)
    H = 0.5 * (base.hess + base.hess.T)[np.ix_(free, free)]
    if not free.any() or np.linalg.eigvalsh(H).max() >= 0:
        return None
    step = np.zeros(len(g))
    step[free] = -np.linalg.solve(H, g[free])
    return step


class BoundaryProbe:
    """Compares each log-parameter's Newton target at consecutive bases and proposes its bound once."""

    def __init__(self, size: float | None):
        self.size = None if size is None else float(size)  # None: never probe
        self.last: tuple[np.ndarray, np.ndarray | None] | None = None  # the previous base's u and Newton step
        self.probed: list[int] = []  # log-parameters already tried at a bound (once each)

    def step(self, base: Profile, step: TrustStep, lower, upper) -> TrustStep | None:
        """`step` with one log-parameter moved to its bound, or None."""
        newton = newton_step(base, lower, upper)
        last, self.last = self.last, (np.array(base.u, dtype=float), newton)
        if self.size is None or newton is None or last is None or last[1] is None:
            return None
        (u0, n0), moved = last, base.u - last[0]
        for i, side in enumerate(np.sign(newton)):
            toward = side != 0 and np.sign(n0[i]) == side and np.sign(moved[i]) == side
            if i in self.probed or not toward or min(abs(n0[i]), abs(newton[i])) < self.size:
                continue
            receded = side * ((base.u[i] + newton[i]) - (u0[i] + n0[i]))
            if receded >= 0.5 * abs(moved[i]):
                p = step.p.copy()
                p[i] = (upper[i] if side > 0 else lower[i]) - base.u[i]
                self.probed.append(i)
                return TrustStep(p=p, predicted=0.0, at_bound=at_bound(base.u + p, lower, upper))
        return None
