"""The two schemes of a fit, each its own type (docs/algorithm.md): `BlockScheme` holds the settings of the paper's
block-wise Algorithms 1–3 (μ,Σ → γ → θ sub-steps, SPEC §4, Remark 8), `StatsPolicy` those of the statistics scheme
(one round trip of sufficient statistics per iteration, SPEC §2b, algorithm/stats_server.py). A FitConfig holds one
of them: the scheme follows from the type."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

HESSIANS = ("profile", "block")
MEAN_STEPS = ("joint", "block")
ALPHA_RULES = ("fixed", "staleness", "section5")
#: the block scheme's strategies (Section 4): None takes "on" in async mode and "off" in sync mode (resolved)
STRATEGIES = ("correction", "adaptive_weights", "moving_average")


@dataclass(frozen=True)
class BlockScheme:
    """Settings of Algorithms 1–3; `None` fields take mode-dependent defaults in `resolved`.

    alpha — Newton step size (None: 0.5·A/J async, 1 sync); alpha_rule — "fixed", "staleness" (α/(1 + τ̄_t)) or
    "section5" (α/((1 + τ̄_t)(1 + τ_t)), Lemma 11); correction (Eq. 15), adaptive_weights (Eqs. 16–17),
    moving_average (Eq. 19, decay omega over t_M updates); dominance — AsyncManifold's arrival-frequency correction of
    the weights while some t_j ≤ T_c; a, T_c — Eq. 16's weights; staleness_bound — VAFL's D: quantities older than
    D iterations are discarded and re-asked; privacy — a privacy.GaussianMechanism (or a dict of its settings): noise
    on every release; hessian — "profile" or "block"; mean_step — "joint" ((μ, Σ, γ) given θ at the mu_sigma step) or
    "block" (Section 3.1's μ,Σ then γ); eig_floor — floor of the Newton step's eigenvalues.
    """

    alpha: float | None = None
    alpha_rule: str = "fixed"
    correction: bool | None = None
    adaptive_weights: bool | None = None
    moving_average: bool | None = None
    dominance: bool = False
    staleness_bound: int | None = None
    privacy: object | None = None
    a: float = 1.0
    T_c: int = 3
    omega: float = 0.7
    t_M: int = 8
    hessian: str = "profile"
    mean_step: str = "joint"
    eig_floor: float = 1e-6

    def __post_init__(self):
        for name, value, allowed in (("hessian", self.hessian, HESSIANS), ("alpha_rule", self.alpha_rule, ALPHA_RULES),
                                     ("mean_step", self.mean_step, MEAN_STEPS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if self.alpha is not None and not 0 < self.alpha <= 1:
            raise ValueError(f"alpha (Newton step size) must be in (0, 1], got {self.alpha!r}")
        if not 0 < self.omega < 1:
            raise ValueError(f"omega (moving-average decay, Eq. 19) must be in (0, 1), got {self.omega!r}")
        for name in ("a", "eig_floor"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        for name, least in (("T_c", 0), ("t_M", 1)):
            value = getattr(self, name)
            if int(value) != value or value < least:
                raise ValueError(f"{name} must be an integer ≥ {least}, got {value!r}")
        D = self.staleness_bound
        if D is not None and (isinstance(D, bool) or int(D) != D or D < 0):
            raise ValueError(f"staleness_bound (D, in iterations) must be an integer ≥ 0 or None, got {D!r}")
        if self.privacy is not None:
            from spatialfed.algorithm.privacy import GaussianMechanism

            if isinstance(self.privacy, dict):
                object.__setattr__(self, "privacy", GaussianMechanism(**self.privacy))
            elif not isinstance(self.privacy, GaussianMechanism):
                raise ValueError("privacy must be a spatialfed.algorithm.privacy.GaussianMechanism or a dict of its "
                                 f"settings (noise_multiplier, clip, delta, seed), got {type(self.privacy).__name__}")

    def resolved(self, asynchronous: bool, A: int, J: int) -> "BlockScheme":
        """Copy with concrete alpha (0.5·A/J async, 1 sync) and strategy flags (on async, off sync)."""
        flags = {s: asynchronous if getattr(self, s) is None else bool(getattr(self, s)) for s in STRATEGIES}
        alpha = self.alpha if self.alpha is not None else (0.5 * A / J if asynchronous else 1.0)
        return replace(self, alpha=float(alpha), **flags)


@dataclass(frozen=True)
class StatsPolicy:
    """Every setting of the statistics scheme's loop (algorithm/stats_server.py, docs/algorithm.md), by mechanism.
    Distances in u = (log δ, log σ², log β) are Euclidean throughout (profile.distance), as the trust region's.

    Trust region (sync and async):
      radius_growth — the radius may grow to this multiple of FitConfig.step_bound after confirmed steps: a far start
        then takes few round trips, and the cap keeps one step from crossing the box;
      eig_floor — floor of mod(−H)'s eigenvalues relative to the largest: only has to keep mod(−H) invertible,
        since the radius bounds every step (a larger floor shortens steps where ℓ flattens, e.g. a vanishing nugget);
      loglik_tol — an increase of ℓ below this is rounding: a step predicting less is not judged, and ends a fit.
    Stale models (async):
      taylor_radius — a site's model is used within this distance of the u_j it answered at (a farther site is
        stood in for); the largest move of an aggregation keeps every used model inside it;
      secant_reach — earlier answers within this distance give a site's model third derivatives (stale.secant);
      settle_tol — a surrogate step shorter than this is not judged by the trust region (it cannot exploit model
        error);
      stale_tol — None: min(settle_tol, max(√tol, 10·tol)); a model nearer than this to u counts as fresh;
      min_coverage — share of the observations whose statistics must be usable before a surrogate step;
      control_variates — model a stale site through the sites that answered at its u_j (stale.site_models);
      inner_steps — safeguarded Newton steps per surrogate maximisation.
    Boundary:
      probe_step — a log-parameter whose Newton target recedes by at least half the step just taken toward it,
        with a Newton step still ≥ probe_step, is tried once at its bound (ℓ ≈ ℓ∞ − c/δ never settles in free
        steps; None: never): below it a fit is converging, not walking to a bound.
    Start (algorithm/pilot.py):
      pilot_points — each site's subsample for the pilot fit that moves φ₀ near the optimum (0: no pilot): 2m at the
        default m = 100, where the subsample's request costs about what the knot terms of any request cost;
      pilot_share — the pilot runs only when the subsamples hold at most this share of the observations: a pilot
        takes about as many rounds as the walk it replaces, so each must cost a small part of a full round.
    Pacing has no setting: every decision follows the sites' measured round trips (algorithm/pacing.py).
    `explore=False` keeps asynchronous sites to the synchronous epochs (the ablation of docs/algorithm.md).
    """

    radius_growth: float = 3.0
    eig_floor: float = 1e-12
    loglik_tol: float = 1e-6
    taylor_radius: float = 0.5
    secant_reach: float = 0.2
    settle_tol: float = 1e-2
    stale_tol: float | None = None
    min_coverage: float = 0.5
    control_variates: bool = True
    inner_steps: int = 10
    probe_step: float | None = 0.5
    explore: bool = True
    pilot_points: int = 200
    pilot_share: float = 0.25

    def __post_init__(self):
        for name in ("radius_growth", "eig_floor", "loglik_tol", "taylor_radius", "secant_reach", "settle_tol"):
            if not getattr(self, name) > 0:
                raise ValueError(f"policy {name} must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.pilot_share <= 1:
            raise ValueError(f"policy pilot_share must be in (0, 1], got {self.pilot_share!r}")
        if int(self.pilot_points) != self.pilot_points or self.pilot_points < 0:
            raise ValueError(f"policy pilot_points must be an integer ≥ 0 (0: no pilot), got {self.pilot_points!r}")
        if not 0 < self.min_coverage <= 1:
            raise ValueError(f"policy min_coverage must be in (0, 1], got {self.min_coverage!r}")
        if int(self.inner_steps) != self.inner_steps or self.inner_steps < 1:
            raise ValueError(f"policy inner_steps must be an integer ≥ 1, got {self.inner_steps!r}")
        if self.probe_step is not None and not self.probe_step > 0:
            raise ValueError(f"policy probe_step must be > 0 (None: never probe a bound), got {self.probe_step!r}")
        ladder = [("stale_tol", self.stale_tol), ("settle_tol", self.settle_tol), ("secant_reach", self.secant_reach),
                  ("taylor_radius", self.taylor_radius)]
        ladder = [(name, value) for name, value in ladder if value is not None]
        for (a, x), (b, y) in zip(ladder, ladder[1:]):  # each reach inside the next: models are used where valid
            if not x < y and not (a == "stale_tol" and x <= y):
                raise ValueError(f"policy needs stale_tol ≤ settle_tol < secant_reach < taylor_radius;"
                                 f" got {a}={x!r}, {b}={y!r}")

    def stale_tol_for(self, tol: float) -> float:
        """stale_tol, or its default for the fit's tolerance."""
        return self.stale_tol if self.stale_tol is not None else min(self.settle_tol, max(float(np.sqrt(tol)),
                                                                                          10 * tol))


#: StatsPolicy settings of earlier versions, and why each went (a checkpoint that names one still restores)
RETIRED = {"hold_share": "slow sites are no longer held back before the first epoch (docs/algorithm.md)",
           "refine_step": "idle sites no longer answer near their last point for third derivatives: removing it "
                          "changed the charged-clock ratios by less than 0.01 (docs/results.md)"}


def retire(policy: dict, refuse: bool = True) -> dict:
    """A policy dict without RETIRED settings: those at their no-op value (0, None) are dropped, any other is refused
    with the reason it went (`refuse=False`, a checkpoint of an earlier version: dropped too)."""
    for name, why in RETIRED.items():
        if refuse and name in policy and policy[name] not in (0, 0.0, None):
            raise ValueError(f"policy {name} was removed: {why}; leave it out")
    return {name: value for name, value in policy.items() if name not in RETIRED}
