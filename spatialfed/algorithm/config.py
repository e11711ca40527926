"""Settings of a federated fit (SPEC §4, Remark 8): synchronous or asynchronous, strategies, stopping rules."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum

import numpy as np

from spatialfed.errors import option


class Mode(StrEnum):
    """Synchronous (Agg_threshold = J, Section 3.1) or asynchronous (Section 4) aggregation."""

    SYNC = "sync"
    ASYNC = "async"


MODES = tuple(m.value for m in Mode)
HESSIANS = ("profile", "block")
MEAN_STEPS = ("joint", "block")
ALPHA_RULES = ("fixed", "staleness", "section5")
STRATEGIES = ("correction", "adaptive_weights", "moving_average")
#: how an iteration reaches the sites: "block" (Algorithms 1–3: μ,Σ → γ → θ sub-steps) or "stats" (one round trip
#: of sufficient statistics per iteration, SPEC §2b, algorithm/stats_server.py)
SCHEMES = ("block", "stats")
#: presets: "stats" (the default: one round trip of sufficient statistics per iteration, SPEC §2b; the fastest that
#: settles in every measured profile, docs/algorithm.md), "tuned" (the block scheme's fastest; the one with privacy
#: noise), "paper" (the paper's strategies and Remark 8's values, for the reproduction pipelines), then
#: FitConfig.<name>() for the block scheme's others
PRESETS = ("stats", "tuned", "paper", "basic", "section5")
DEFAULT_PRESET = "stats"
#: FitConfig fields only the block scheme uses (preset "stats" refuses any value but the field's default)
BLOCK_ONLY = ("alpha", "alpha_rule", "correction", "adaptive_weights", "moving_average", "dominance",
              "staleness_bound", "a", "T_c", "omega", "t_M", "hessian", "mean_step")
#: the preset when privacy noise is asked for and no preset is named: the noise is calibrated for the block scheme
PRIVACY_PRESET = "tuned"
TUNED = "preset='tuned'"  # how Python asks for the block scheme's strategies (spatialfed.errors.option)


def preset_name(name: str | None, privacy=None) -> str:
    """The preset in effect: `name`, or when None DEFAULT_PRESET (PRIVACY_PRESET with privacy noise)."""
    if name is not None:
        return name
    return PRIVACY_PRESET if privacy is not None else DEFAULT_PRESET


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


@dataclass(frozen=True)
class FitConfig:
    """Settings of Algorithms 1–3; `None` fields take mode-dependent defaults in `resolved(J)`."""

    mode: str = "sync"
    agg_threshold: int | None = None
    alpha: float | None = None
    alpha_rule: str = "fixed"  # "staleness": α/(1 + τ̄_t); "section5": α/((1 + τ̄_t)(1 + τ_t)) (Lemma 11)
    correction: bool | None = None
    adaptive_weights: bool | None = None
    moving_average: bool | None = None
    dominance: bool = False  # AsyncManifold's arrival-frequency correction of the weights while some t_j ≤ T_c
    staleness_bound: int | None = None  # VAFL's D: quantities older than D iterations are discarded and re-asked
    privacy: object | None = None  # a privacy.GaussianMechanism (or a dict of its settings): noise on every release
    a: float = 1.0
    T_c: int = 3
    omega: float = 0.7
    t_M: int = 8
    hessian: str = "profile"
    mean_step: str = "joint"  # "joint": (μ, Σ, γ) given θ at the mu_sigma step; "block": Section 3.1's μ,Σ then γ
    step_bound: float = 1.0
    eig_floor: float = 1e-6
    max_iter: int = 50
    tol: float = 1e-5
    patience: int = 3
    time_budget: float | None = None
    n_workers: int | None = None  # J, once known (resolved): the constructor then checks agg_threshold against it
    scheme: str = "block"  # "block" (Algorithms 1–3) | "stats" (one round trip per iteration, SPEC §2b)
    policy: StatsPolicy | None = None  # the statistics scheme's settings (None: StatsPolicy()); a dict is accepted
    secure_aggregation: bool = False  # sync statistics scheme: the server decodes only Σ_j (algorithm/secagg.py)

    def __post_init__(self):
        if isinstance(self.policy, dict):
            object.__setattr__(self, "policy", StatsPolicy(**retire(self.policy)))
        elif self.policy is None and self.scheme == "stats":
            object.__setattr__(self, "policy", StatsPolicy())
        elif self.policy is not None and not isinstance(self.policy, StatsPolicy):
            raise ValueError(f"policy must be a StatsPolicy or a dict of its settings, got {type(self.policy).__name__}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        object.__setattr__(self, "mode", Mode(self.mode))
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {self.scheme!r}")
        if self.scheme == "stats" and self.privacy is not None:
            raise ValueError("privacy noise is calibrated for the block scheme's messages; use preset 'tuned' or "
                             "'paper' (scheme='block') with privacy=, or name no preset (privacy then selects 'tuned')")
        if self.secure_aggregation and self.mode != "sync":
            raise ValueError("secure aggregation sums the statistics over every site, which mode='async' never waits "
                             f"for (it keeps per-site models): use {option('mode=' + repr('sync'), '--mode sync')}")
        if self.secure_aggregation and self.n_workers is not None and self.n_workers < 3:
            raise ValueError(f"secure aggregation needs at least 3 sites (with {self.n_workers} the sum reveals the "
                             "others' statistics): add sites or fit without secure aggregation")
        if self.hessian not in HESSIANS:
            raise ValueError(f"hessian must be one of {HESSIANS}, got {self.hessian!r}")
        if self.alpha_rule not in ALPHA_RULES:
            raise ValueError(f"alpha_rule must be one of {ALPHA_RULES}, got {self.alpha_rule!r}")
        if self.mean_step not in MEAN_STEPS:
            raise ValueError(f"mean_step must be one of {MEAN_STEPS}, got {self.mean_step!r}")
        A, J = self.agg_threshold, self.n_workers
        if J is not None and (isinstance(J, bool) or int(J) != J or J < 1):
            raise ValueError(f"need at least one worker, got n_workers={J!r}")
        if A is not None and (isinstance(A, bool) or not isinstance(A, (int, float)) or int(A) != A or A < 1
                              or (J is not None and A > J)):
            where = "1..J" if J is None else f"1..J = 1..{J} (the store has {J} workers)"
            raise ValueError(f"agg_threshold must be an integer in {where}, got {A!r}")
        if self.mode is Mode.SYNC and None not in (A, J) and A != J:
            raise ValueError(f"mode='sync' aggregates all J = {J} workers; agg_threshold={A} needs mode='async' "
                             "(or leave agg_threshold unset)")
        if self.alpha is not None and not 0 < self.alpha <= 1:
            raise ValueError(f"alpha (Newton step size) must be in (0, 1], got {self.alpha!r}")
        if not 0 < self.omega < 1:
            raise ValueError(f"omega (moving-average decay, Eq. 19) must be in (0, 1), got {self.omega!r}")
        positive = {"a": self.a, "step_bound": self.step_bound, "eig_floor": self.eig_floor, "tol": self.tol}
        for name, value in positive.items():
            if not value > 0:
                raise ValueError(f"{name} must be > 0, got {value!r}")
        for name in ("T_c", "t_M", "max_iter", "patience"):
            value = getattr(self, name)
            if int(value) != value or value < (0 if name == "T_c" else 1):
                raise ValueError(f"{name} must be an integer ≥ {0 if name == 'T_c' else 1}, got {value!r}")
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
            if self.n_workers is not None:
                from spatialfed.algorithm.privacy import check_noise_for_fit

                check_noise_for_fit(self.privacy, self.n_workers)
        if self.time_budget is not None and not self.time_budget > 0:
            raise ValueError(f"time_budget must be a number of seconds > 0 (or None), got {self.time_budget!r}")

    @classmethod
    def basic(cls, **changes) -> "FitConfig":
        """Asynchronous aggregation with every strategy off: the 'none' arm of the ablation (Fig. 5)."""
        return cls(**{"mode": "async", **dict.fromkeys(STRATEGIES, False), **changes})

    @classmethod
    def section5(cls, **changes) -> "FitConfig":
        """The basic asynchronous algorithm analysed in Section 5: no strategy, α_t = α(τ̄_t + 1)⁻¹(τ_t + 1)⁻¹
        (Lemma 11, Theorem 12) with α = 1 and τ_t the largest staleness aggregated."""
        return cls.basic(**{"alpha": 1.0, "alpha_rule": "section5", **changes})

    @classmethod
    def tuned(cls, **changes) -> "FitConfig":
        """Asynchronous settings tuned for the profile Hessian (docs/algorithm.md, "Tuning"): gradient correction
        (Eq. 15) on, uniform weights, no moving average, α_t = 1/(1 + τ̄_t) with τ̄_t the mean staleness of the theta
        quantities aggregated."""
        return cls(**{"mode": "async", "correction": True, "adaptive_weights": False, "moving_average": False,
                      "alpha": 1.0, "alpha_rule": "staleness", **changes})

    @classmethod
    def stats(cls, **changes) -> "FitConfig":
        """One round trip per iteration (SPEC §2b): sites send sufficient statistics and their u-derivatives; the
        server steps on the exact profile likelihood (sync) or on stale sites' second-order Taylor models (async)."""
        return cls(**{"scheme": "stats", **changes})

    @classmethod
    def preset(cls, name: str | None = None, mode: str = "async", **settings) -> "FitConfig":
        """The settings of preset `name` in `mode`, `settings` overriding it (with n_workers=J: resolved for J).
        None: DEFAULT_PRESET, or PRIVACY_PRESET when settings carry privacy noise. In sync mode every quantity is
        fresh, so the block scheme's asynchronous presets do not apply."""
        name = preset_name(name, settings.get("privacy"))
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {list(PRESETS)}, got {name!r}")
        unknown = sorted(set(settings) - {f.name for f in fields(cls)})
        if unknown:  # the constructor would raise a TypeError
            raise ValueError(f"unknown fit setting(s) {unknown}; valid: {', '.join(f.name for f in fields(cls))}")
        if name == "stats":
            cls(mode=mode, **settings)  # the values' own errors first (e.g. a negative staleness bound)
            inert = {f.name: f.default for f in fields(cls)}
            block = sorted(k for k in BLOCK_ONLY if k in settings and settings[k] != inert[k])
            if block:
                raise ValueError(f"{', '.join(block)} set(s) the block scheme's strategies, which preset 'stats' does "
                                 f"not use: add {option(TUNED, '--preset tuned')} or drop them")
            config = cls.stats(mode=mode, **settings)
        elif name == "paper" or mode == Mode.SYNC:
            config = cls(mode=mode, **settings)
        else:
            config = getattr(cls, name)(**settings)
        return config if config.n_workers is None else config.resolved(config.n_workers)

    def resolved(self, n_workers: int) -> "FitConfig":
        """Copy with concrete agg_threshold, alpha (0.5·A/J async, 1 sync) and strategy flags for J workers."""
        J = replace(self, n_workers=n_workers).n_workers  # the constructor checks J and agg_threshold against it
        A = self.agg_threshold
        if self.mode is Mode.SYNC:
            A = J
        elif A is None:  # the statistics scheme aggregates every answer (each is a whole site's statistics)
            A = 1 if self.scheme == "stats" else max(1, math.ceil(0.2 * J))
        on = self.mode is Mode.ASYNC
        flags = {s: on if getattr(self, s) is None else bool(getattr(self, s)) for s in STRATEGIES}
        alpha = self.alpha if self.alpha is not None else (1.0 if self.mode is Mode.SYNC else 0.5 * A / J)
        return replace(self, agg_threshold=int(A), alpha=float(alpha), n_workers=int(J), **flags)

    def as_dict(self) -> dict:
        """Plain dict of the settings (for result files and checkpoints; `privacy` as its dict)."""
        settings = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.privacy is not None:
            settings["privacy"] = asdict(self.privacy)
        if self.policy is not None:  # the statistics scheme's policy, for fit.json and checkpoints
            settings["policy"] = asdict(self.policy)
        return settings

    @property
    def stats_policy(self) -> StatsPolicy:
        """The statistics scheme's policy in effect."""
        return self.policy if self.policy is not None else StatsPolicy()
