"""Settings of a federated fit (SPEC §4, Remark 8): synchronous or asynchronous, strategies, stopping rules."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from enum import StrEnum

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

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        object.__setattr__(self, "mode", Mode(self.mode))
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {SCHEMES}, got {self.scheme!r}")
        if self.scheme == "stats" and self.privacy is not None:
            raise ValueError("privacy noise is calibrated for the block scheme's messages; use preset 'tuned' or "
                             "'paper' (scheme='block') with privacy=, or name no preset (privacy then selects 'tuned')")
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
        if self.mode == "sync" and None not in (A, J) and A != J:
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
        elif name == "paper" or mode == "sync":
            config = cls(mode=mode, **settings)
        else:
            config = getattr(cls, name)(**settings)
        return config if config.n_workers is None else config.resolved(config.n_workers)

    def resolved(self, n_workers: int) -> "FitConfig":
        """Copy with concrete agg_threshold, alpha (0.5·A/J async, 1 sync) and strategy flags for J workers."""
        J = replace(self, n_workers=n_workers).n_workers  # the constructor checks J and agg_threshold against it
        A = self.agg_threshold
        if self.mode == "sync":
            A = J
        elif A is None:  # the statistics scheme aggregates every answer (each is a whole site's statistics)
            A = 1 if self.scheme == "stats" else max(1, math.ceil(0.2 * J))
        on = self.mode == "async"
        flags = {s: on if getattr(self, s) is None else bool(getattr(self, s)) for s in STRATEGIES}
        alpha = self.alpha if self.alpha is not None else (1.0 if self.mode == "sync" else 0.5 * A / J)
        return replace(self, agg_threshold=int(A), alpha=float(alpha), n_workers=int(J), **flags)

    def as_dict(self) -> dict:
        """Plain dict of the settings (for result files and checkpoints; `privacy` as its dict)."""
        settings = {f.name: getattr(self, f.name) for f in fields(self)}
        if self.privacy is not None:
            settings["privacy"] = asdict(self.privacy)
        return settings
