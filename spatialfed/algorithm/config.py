"""Settings of a federated fit (SPEC §4, Remark 8): the mode, the scheme (a BlockScheme or a StatsPolicy,
algorithm/schemes.py), the stopping rules shared by both, and the presets that name common combinations."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from enum import StrEnum

from spatialfed.algorithm.schemes import (ALPHA_RULES, HESSIANS, MEAN_STEPS, RETIRED, STRATEGIES,  # noqa: F401
                                          BlockScheme, StatsPolicy, retire)
from spatialfed.errors import option


class Mode(StrEnum):
    """Synchronous (Agg_threshold = J, Section 3.1) or asynchronous (Section 4) aggregation."""

    SYNC = "sync"
    ASYNC = "async"


MODES = tuple(m.value for m in Mode)
#: a scheme's name (fit.json "scheme") and its settings' type
SCHEMES = {"block": BlockScheme, "stats": StatsPolicy}
#: presets: "stats" (the default: one round trip of sufficient statistics per iteration, SPEC §2b; the fastest that
#: settles in every measured profile, docs/algorithm.md), "tuned" (the block scheme's fastest; the one with privacy
#: noise), "paper" (the paper's strategies and Remark 8's values, for the reproduction pipelines), then
#: FitConfig.<name>() for the block scheme's others
PRESETS = ("stats", "tuned", "paper", "basic", "section5")
DEFAULT_PRESET = "stats"
#: the preset when privacy noise is asked for and no preset is named: the noise is calibrated for the block scheme
PRIVACY_PRESET = "tuned"
TUNED = "strategies='tuned'"  # how Python asks for the block scheme's strategies (spatialfed.errors.option)


def preset_name(name: str | None, privacy=None) -> str:
    """The preset in effect: `name`, or when None DEFAULT_PRESET (PRIVACY_PRESET with privacy noise)."""
    if name is not None:
        return name
    return PRIVACY_PRESET if privacy is not None else DEFAULT_PRESET


def scheme_name(scheme) -> str:
    """"block" or "stats": the name of a scheme's settings type."""
    return "stats" if isinstance(scheme, StatsPolicy) else "block"


@dataclass(frozen=True)
class Stopping:
    """Stopping rules of every scheme: at most max_iter iterations; converged after `patience` iterations whose
    relative parameter change is below tol (the statistics scheme: a Newton step below tol); time_budget seconds of
    the runtime's clock."""

    max_iter: int = 50
    tol: float = 1e-5
    patience: int = 3
    time_budget: float | None = None

    def __post_init__(self):
        if not self.tol > 0:
            raise ValueError(f"tol must be > 0, got {self.tol!r}")
        for name in ("max_iter", "patience"):
            value = getattr(self, name)
            if isinstance(value, bool) or int(value) != value or value < 1:
                raise ValueError(f"{name} must be an integer ≥ 1, got {value!r}")
        if self.time_budget is not None and not self.time_budget > 0:
            raise ValueError(f"time_budget must be a number of seconds > 0 (or None), got {self.time_budget!r}")


def _names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


@dataclass(frozen=True)
class FitConfig:
    """A fit's settings: `mode`, the `scheme` (BlockScheme: Algorithms 1–3; StatsPolicy: the statistics scheme),
    the `stopping` rules, Agg_threshold A (None: mode- and scheme-dependent, `resolved(J)`), the trust region's or
    Newton step's `step_bound` in u, J = `n_workers` once known, and `secure_aggregation` (sync statistics scheme:
    the server decodes only Σ_j, algorithm/secagg.py). `FitConfig.of(**settings)` sorts flat settings into these."""

    mode: Mode = Mode.SYNC
    scheme: BlockScheme | StatsPolicy = field(default_factory=BlockScheme)
    stopping: Stopping = field(default_factory=Stopping)
    agg_threshold: int | None = None
    step_bound: float = 1.0
    n_workers: int | None = None
    secure_aggregation: bool = False

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        object.__setattr__(self, "mode", Mode(self.mode))
        if not isinstance(self.scheme, (BlockScheme, StatsPolicy)):
            raise ValueError(f"scheme must be a BlockScheme or a StatsPolicy, got {type(self.scheme).__name__}")
        if not isinstance(self.stopping, Stopping):
            raise ValueError(f"stopping must be a Stopping, got {type(self.stopping).__name__}")
        if not self.step_bound > 0:
            raise ValueError(f"step_bound must be > 0, got {self.step_bound!r}")
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
        if self.secure_aggregation:
            if not isinstance(self.scheme, StatsPolicy):
                raise ValueError("secure aggregation sums the statistics scheme's messages: use the default preset "
                                 "'stats', not a block-scheme preset")
            if self.mode is not Mode.SYNC:
                raise ValueError("secure aggregation sums the statistics over every site, which mode='async' never "
                                 f"waits for (it keeps per-site models): use {option('mode=' + repr('sync'), '--mode sync')}")
            if J is not None and J < 3:
                raise ValueError(f"secure aggregation needs at least 3 sites (with {J} the sum reveals the "
                                 "others' statistics): add sites or fit without secure aggregation")
        privacy = getattr(self.scheme, "privacy", None)
        if privacy is not None and J is not None:
            from spatialfed.algorithm.privacy import check_noise_for_fit

            check_noise_for_fit(privacy, J)

    # --- views -----------------------------------------------------------------------------------------------
    @property
    def scheme_name(self) -> str:
        """"block" or "stats" (fit.json "scheme")."""
        return scheme_name(self.scheme)

    @property
    def block(self) -> BlockScheme:
        """The block scheme's settings (an error for a statistics-scheme config)."""
        if not isinstance(self.scheme, BlockScheme):
            raise TypeError("this fit uses the statistics scheme, which has no block settings")
        return self.scheme

    @property
    def policy(self) -> StatsPolicy | None:
        """The statistics scheme's settings, None for the block scheme."""
        return self.scheme if isinstance(self.scheme, StatsPolicy) else None

    @property
    def privacy(self):
        """The block scheme's Gaussian mechanism, or None."""
        return getattr(self.scheme, "privacy", None)

    # --- construction ----------------------------------------------------------------------------------------
    @classmethod
    def of(cls, scheme: str | None = None, **settings) -> "FitConfig":
        """A FitConfig from flat settings: FitConfig's own fields, Stopping's, and the scheme's (`policy=` a
        StatsPolicy or a dict of its settings). `scheme` "block" | "stats"; None: "stats" when a policy is given,
        else "block". A setting of the other scheme is refused in one line naming the preset that has it."""
        if scheme is None:
            scheme = "stats" if "policy" in settings else "block"
        if scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {tuple(SCHEMES)}, got {scheme!r}")
        kind = SCHEMES[scheme]
        own, stop, mine = _names(cls), _names(Stopping), _names(kind)
        unknown = sorted(set(settings) - set(own) - set(stop) - set(mine) - {"policy"})
        if unknown:
            other = SCHEMES["block" if scheme == "stats" else "stats"]
            theirs = {k: settings[k] for k in unknown if k in _names(other)}
            if theirs:
                other(**theirs)  # the values' own errors first (e.g. a negative staleness bound)
            raise ValueError(_misplaced(scheme, unknown))
        policy = settings.pop("policy", None)
        if scheme == "block" and policy is not None:
            raise ValueError("policy= holds the statistics scheme's settings: use FitConfig.of('stats', ...)")
        if isinstance(policy, dict):
            policy = StatsPolicy(**retire(policy))
        elif policy is not None and not isinstance(policy, StatsPolicy):
            raise ValueError(f"policy must be a StatsPolicy or a dict of its settings, got {type(policy).__name__}")
        base = policy if policy is not None else kind()
        changes = {k: settings[k] for k in mine if k in settings}
        top = {k: settings[k] for k in own if k in settings and k not in ("scheme", "stopping")}
        return cls(scheme=replace(base, **changes), stopping=Stopping(**{k: settings[k] for k in stop if k in settings}),
                   **top)

    @classmethod
    def basic(cls, **changes) -> "FitConfig":
        """Asynchronous aggregation with every strategy off: the 'none' arm of the ablation (Fig. 5)."""
        return cls.of("block", **{"mode": "async", **dict.fromkeys(STRATEGIES, False), **changes})

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
        return cls.of("block", **{"mode": "async", "correction": True, "adaptive_weights": False,
                                  "moving_average": False, "alpha": 1.0, "alpha_rule": "staleness", **changes})

    @classmethod
    def stats(cls, **changes) -> "FitConfig":
        """One round trip per iteration (SPEC §2b): sites send sufficient statistics and their u-derivatives; the
        server steps on the exact profile likelihood (sync) or on stale sites' second-order Taylor models (async)."""
        return cls.of("stats", **changes)

    @classmethod
    def preset(cls, name: str | None = None, mode: str = "async", **settings) -> "FitConfig":
        """The settings of preset `name` in `mode`, `settings` overriding it (with n_workers=J: resolved for J).
        None: DEFAULT_PRESET, or PRIVACY_PRESET when settings carry privacy noise. In sync mode every quantity is
        fresh, so the block scheme's asynchronous presets do not apply."""
        name = preset_name(name, settings.get("privacy"))
        if name not in PRESETS:
            raise ValueError(f"preset must be one of {list(PRESETS)}, got {name!r}")
        if name == "stats":
            config = cls.stats(mode=mode, **settings)
        elif name == "paper" or mode == Mode.SYNC:
            config = cls.of("block", mode=mode, **settings)
        else:
            config = getattr(cls, name)(**settings)
        return config if config.n_workers is None else config.resolved(config.n_workers)

    @classmethod
    def from_dict(cls, settings: dict) -> "FitConfig":
        """The FitConfig of `as_dict`'s dict; also the flat dict of earlier versions' checkpoints."""
        settings = dict(settings)
        name = settings.pop("scheme", "block")
        if isinstance(settings.get("policy"), dict):  # a fit of an earlier version continues without retired settings
            settings["policy"] = retire(settings["policy"], refuse=False)
        if "stopping" not in settings:  # flat (earlier versions): the block scheme's fields beside the policy's dict
            keep = set(_names(cls)) | set(_names(Stopping)) | ({"policy"} if name == "stats" else set(_names(BlockScheme)))
            settings = {k: v for k, v in settings.items() if k in keep}
        nested = {**settings.pop("stopping", {}), **(settings.pop("block", None) or {})}
        if name == "block" or settings.get("policy") is None:
            settings.pop("policy", None)
        return cls.of(name, **nested, **settings)

    def resolved(self, n_workers: int) -> "FitConfig":
        """Copy with concrete agg_threshold (J sync; async 1 for the statistics scheme, ceil(0.2·J) for the block
        scheme) and, for the block scheme, its concrete alpha and strategy flags for J workers."""
        J = replace(self, n_workers=n_workers).n_workers  # the constructor checks J and agg_threshold against it
        A = self.agg_threshold
        if self.mode is Mode.SYNC:
            A = J
        elif A is None:  # the statistics scheme aggregates every answer (each is a whole site's statistics)
            A = 1 if isinstance(self.scheme, StatsPolicy) else max(1, math.ceil(0.2 * J))
        scheme = self.scheme
        if isinstance(scheme, BlockScheme):
            scheme = scheme.resolved(self.mode is Mode.ASYNC, int(A), int(J))
        return replace(self, agg_threshold=int(A), n_workers=int(J), scheme=scheme)

    def as_dict(self) -> dict:
        """Plain dict of the settings (fit.json and checkpoints): "scheme" its name, then "stopping" and the scheme's
        own ("block" or "policy"; the mechanism `privacy` as its dict)."""
        settings = {"mode": self.mode.value, "scheme": self.scheme_name, "agg_threshold": self.agg_threshold,
                    "step_bound": self.step_bound, "n_workers": self.n_workers,
                    "secure_aggregation": self.secure_aggregation, "stopping": asdict(self.stopping)}
        key = "policy" if isinstance(self.scheme, StatsPolicy) else "block"
        settings[key] = {f.name: getattr(self.scheme, f.name) for f in fields(self.scheme)}
        if self.privacy is not None:
            settings["block"]["privacy"] = asdict(self.privacy)
        return settings


def _misplaced(scheme: str, names: list[str]) -> str:
    """The line refusing settings that are not the scheme's."""
    other = "block" if scheme == "stats" else "stats"
    theirs = [n for n in names if n in _names(SCHEMES[other])]
    if scheme == "stats" and "privacy" in theirs:
        return ("privacy noise is calibrated for the block scheme's messages; use preset 'tuned' or 'paper' with "
                "privacy=, or name no preset (privacy then selects 'tuned')")
    if scheme == "stats" and theirs:
        return (f"{', '.join(theirs)} set(s) the block scheme's strategies, which preset 'stats' does not use: add "
                f"{option(TUNED, '--preset tuned')} or drop them")
    if theirs:
        return (f"{', '.join(theirs)} set(s) the statistics scheme's policy, which the block scheme does not use: use "
                "preset 'stats' (the default) or drop them")
    valid = sorted(set(_names(FitConfig)) - {"scheme", "stopping"} | set(_names(Stopping)) | set(_names(SCHEMES[scheme])))
    return f"unknown fit setting(s) {names}; valid: {', '.join(valid)}"
