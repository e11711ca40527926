"""What crosses the network (SPEC §3–4): augmented parameters p (Eq. 11) and augmented quantities q (Eq. 14).

`evaluate` is the worker side of the algorithm: L_j(p) of Eq. (13), with G_j of Eq. (16) for the theta step.
It is a pure function of (partition, p); every runtime calls it where the partition lives.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from spatialfed.algorithm.privacy import GaussianMechanism, task_nonce
from spatialfed.model.names import BLOCK_STEPS, Step
from spatialfed.model.params import Params

#: Sub-steps of one iteration, in their cyclic order (Eq. 12).
STEPS = BLOCK_STEPS
#: Synchronous summaries collected once before Algorithm 1, to build φ₀ (SPEC §4 "Start φ₀ from data ...").
INIT_STEPS = (Step.MOMENTS, Step.VARIOGRAM)
#: Final synchronous evaluation of f_j at the reported estimate.
FINAL_STEP = Step.VALUE
#: FGPR's local update (algorithm/fgpr.py): E optimiser steps from the global parameters
FGPR_STEP = Step.FGPR
#: one round trip per iteration (algorithm/stats_server.py): sufficient statistics at u (SPEC §2b)
STATS_STEP = Step.STATS
#: the same statistics on a seeded subsample of at most p.extra["points"] observations (algorithm/pilot.py)
PILOT_STEP = Step.PILOT
ALL_STEPS = tuple(Step)


@dataclass(frozen=True)
class Augmented:
    """p = (φ, t, step) of Eq. (11); `extra` carries what the init summaries need instead of φ, or under
    `mean_step="joint"` the further sub-steps whose quantities the worker adds at the same φ ({"with": ("gamma",)}).
    """

    params: Params | None
    t: int
    step: str
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.step not in ALL_STEPS:
            raise ValueError(f"unknown step {self.step!r}; expected one of {[s.value for s in Step]}")
        object.__setattr__(self, "step", Step(self.step))


@dataclass(frozen=True)
class Quantity:
    """q = (ξ, t, step, j) of Eq. (14): the local quantity and the (t, step) of the p it was computed from."""

    xi: dict
    t: int
    step: str
    worker: int


def evaluate(lm, p: Augmented, worker: int) -> Quantity:
    """L_j(p) of Eq. (13) (with G_j of Eq. 16 for theta) computed by worker `worker` on its LocalModel `lm`; masked
    for secure aggregation when p.extra has "secagg" (algorithm/secagg.py: only the sum over the round decodes)."""
    if "secagg" in p.extra:
        from spatialfed.algorithm import secagg

        rest = Augmented(p.params, p.t, p.step, {k: v for k, v in p.extra.items() if k != "secagg"})
        xi = secagg.site_answer(lm, p.extra["secagg"], worker, lambda: evaluate(lm, rest, worker).xi)
        return Quantity(xi=xi, t=p.t, step=p.step, worker=worker)
    if p.step == "moments":
        xi = lm.moments()
    elif p.step == "variogram":
        xi = lm.variogram(p.extra["gamma"], p.extra["edges"])
    elif p.step == FGPR_STEP:
        from spatialfed.algorithm.fgpr_local import local_update

        xi = local_update(lm, p, worker)
    elif p.step in (STATS_STEP, PILOT_STEP):
        from spatialfed.model.stats import site_statistics

        if p.step == STATS_STEP:
            xi = site_statistics(lm, p.params)
        else:  # the subsample's statistics, and 1 if the site's residual is diagonal (mpp/pp: algorithm/pilot.py)
            xi = {**site_statistics(lm.pilot(p.extra["points"]), p.params),
                  "diagonal": float(lm.strategy.diagonal)}
    else:
        xi = lm.quantity(p.step, p.params)
        for step in p.extra.get("with", ()):
            xi = {**xi, **lm.quantity(step, p.params)}
    mechanism = p.extra.get("privacy")
    if mechanism is not None:  # docs/privacy.md: noised here, on the worker; which keys were clipped stays here
        if not isinstance(mechanism, GaussianMechanism):
            raise TypeError(f"p.extra['privacy'] must be a GaussianMechanism, got {type(mechanism).__name__}")
        xi, _ = mechanism.privatize(xi, n=lm.n, worker=worker, t=p.t, step=p.step, nonce=task_nonce(p.params, p.extra))
    return Quantity(xi=xi, t=p.t, step=p.step, worker=worker)
