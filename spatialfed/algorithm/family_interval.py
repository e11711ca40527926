"""Profile-likelihood intervals for one coordinate of u (docs/equations.md, "Covariance options").

The observed information's Wald interval v̂ ± 1.96·se assumes ℓ quadratic in the coordinate. For log ν it is not:
ℓ flattens towards smooth fields, so the Wald interval is too short on that side and misses the true ν of smooth
fields. The likelihood-ratio interval is the set {v : 2(ℓ̂ − ℓ_p(v)) ≤ χ²₁(level)}, with ℓ_p(v) the maximum of ℓ
with the coordinate fixed at v (the other parameters refitted): a refit per evaluation, warm-started at the
maximiser, and a root-finder on each side.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from scipy.optimize import brentq
from scipy.stats import chi2

#: root tolerance in the coordinate (log ν: 0.1 % in ν)
XTOL = 1e-3
#: bracketing steps: the first is the Wald half-width, each next one twice the last, none longer than MAX_STEP, so
#: that each refit starts near the last one's estimate (a far jump can leave the refit a long walk)
MAX_STEP = 0.5
#: at most this many bracketing steps per side before the side is reported open (None)
MAX_BRACKET = 12


def likelihood_ratio_interval(profile: Callable[[float], float], v_hat: float, loglik_hat: float, se: float,
                              lower: float, upper: float, level: float = 0.95) -> tuple[float | None, float | None]:
    """(lo, hi) with 2(ℓ̂ − ℓ_p(v)) = χ²₁(level) at each end; a side whose drop stays below it up to the box's
    bound is None (the data do not bound the coordinate there). `profile(v)` = ℓ_p(v), `se` the Wald standard error
    (only the first bracketing step: a nan or 0 se starts at 0.1). The calls to `profile` walk outward from v̂ on
    each side in turn, then between the bracket's ends."""
    drop = 0.5 * float(chi2.ppf(level, 1))

    def excess(v: float) -> float:
        return loglik_hat - profile(v) - drop

    width = min(1.96 * se if math.isfinite(se) and se > 0 else 0.1, MAX_STEP)
    ends = []
    for sign, bound in ((-1.0, lower), (1.0, upper)):
        inner, step, end = v_hat, width, None
        for _ in range(MAX_BRACKET):
            if sign * (inner - bound) >= 0.0:  # v̂ on this bound, or the last step reached it
                break
            outer = inner + sign * step
            if sign * (outer - bound) >= 0.0:
                outer = bound
            if excess(outer) > 0.0:
                end = brentq(excess, min(inner, outer), max(inner, outer), xtol=XTOL)
                break
            inner, step = outer, min(2.0 * step, MAX_STEP)
        ends.append(end)
    return ends[0], ends[1]
