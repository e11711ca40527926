"""Random task delays and Poisson-process activations of workers, for experiments (VAFL, Chen et al. 2020).

VAFL §2.3 ("Stochastic unbounded delay") lets each client be activated by its own stochastic process; with independent
Poisson processes the delays, counted in server updates, are geometrically distributed (Assumptions 3 and 5). Its
experiments (Appendix G) add a random per-client delay to every client step: Poisson in G.2, exponential in G.3.

    ExponentialDelay(mean_s)       a task of worker j finishes Exp(mean mean_s[j]) seconds later
    PoissonDelay(rate, unit_s)     ... unit_s · K seconds later, K ~ Poisson(rate[j])
    PoissonActivations(rate)       worker j starts a task only at the points of a Poisson process of rate[j] per second

Every value is one number for all workers or a sequence of one per worker; `resolve(J)` checks the length and returns
the per-worker form. Delays have `sample(j, rng) -> seconds`, activations `next_activation(j, now, rng) -> time`;
all randomness comes from the caller's `numpy.random.Generator`, so a seeded run is reproducible.

Command-line strings, for J workers (a comma-separated list gives one value per worker, in worker order):

    delays (parse_delay)
        none
        exponential:MEAN  |  exponential:M1,...,MJ     ExponentialDelay, means in seconds
        exponential:vafl                               VAFL G.3: worker j = 1..J has mean j seconds
        poisson:RATE:UNIT  |  poisson:R1,...,RJ:UNIT   PoissonDelay, UNIT seconds per count
        poisson:vafl                                   VAFL G.2: rate 2j, unit 1/(2J) s (slowest mean 1 s)
    activations (parse_activations)
        none
        poisson:RATE  |  poisson:R1,...,RJ             PoissonActivations, activations per second
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

DELAY_GRAMMAR = "none | exponential:MEAN[,MEAN...] | exponential:vafl | poisson:RATE[,RATE...]:UNIT | poisson:vafl"
ACTIVATION_GRAMMAR = "none | poisson:RATE[,RATE...]"

PerWorker = float | tuple[float, ...]


class Delay(Protocol):
    """What the runtimes need of a delay model (ExponentialDelay, PoissonDelay): per-worker resolution and sampling."""

    def resolve(self, n_workers: int) -> Delay: ...

    def mean(self, j: int) -> float: ...

    def sample(self, j: int, rng: np.random.Generator) -> float: ...


def _check(name: str, value, positive: bool = False) -> PerWorker:
    """`value` as a float or a tuple of floats, each finite and ≥ 0 (> 0 if positive); ValueError naming `name`."""
    values = np.asarray(value, dtype=float)
    if values.ndim > 1 or values.size == 0:
        raise ValueError(f"{name} must be one number or a sequence of one number per worker, got {value!r}")
    low = values <= 0 if positive else values < 0
    if not np.all(np.isfinite(values)) or np.any(low):
        bound = "> 0" if positive else "≥ 0"
        raise ValueError(f"{name} must be finite numbers {bound}, got {values.tolist()}")
    return float(values) if values.ndim == 0 else tuple(values.tolist())


def _expand(name: str, value: PerWorker, n_workers: int) -> tuple[float, ...]:
    """One value per worker: a scalar repeated J times, or a sequence of exactly J values."""
    J = int(n_workers)
    if J < 1:
        raise ValueError(f"need at least one worker, got n_workers={n_workers!r}")
    if isinstance(value, float):
        return (value,) * J
    if len(value) != J:
        raise ValueError(f"got {len(value)} values of {name} for {J} workers; give one number for all workers or "
                         f"exactly one per worker")
    return value


def _at(value: PerWorker, j: int) -> float:
    return value if isinstance(value, float) else value[j]


@dataclass(frozen=True)
class ExponentialDelay:
    """Each task of worker j finishes an extra Exp(mean mean_s[j]) seconds later (VAFL Appendix G.3)."""

    mean_s: PerWorker

    def __post_init__(self):
        object.__setattr__(self, "mean_s", _check("mean_s", self.mean_s))

    @classmethod
    def vafl(cls, n_workers: int) -> ExponentialDelay:
        """VAFL G.3's setting: worker j = 1..J has an exponential delay of parameter j, read as the mean in seconds
        (the paper's own convention in Assumption 3, and numpy's `exponential(scale)`)."""
        return cls(tuple(np.arange(1.0, int(n_workers) + 1)))

    def resolve(self, n_workers: int) -> ExponentialDelay:
        """The same model with one mean per worker (ValueError if a sequence has not J entries)."""
        return ExponentialDelay(_expand("mean_s", self.mean_s, n_workers))

    def mean(self, j: int) -> float:
        """Expected delay of worker j, seconds."""
        return _at(self.mean_s, j)

    def sample(self, j: int, rng: np.random.Generator) -> float:
        """One delay of worker j, seconds."""
        return float(rng.exponential(self.mean(j)))


@dataclass(frozen=True)
class PoissonDelay:
    """Each task of worker j finishes an extra unit_s · K seconds later, K ~ Poisson(rate[j]) (VAFL Appendix G.2)."""

    rate: PerWorker
    unit_s: float

    def __post_init__(self):
        object.__setattr__(self, "rate", _check("rate", self.rate))
        if np.ndim(self.unit_s) != 0:
            raise ValueError(f"unit_s is one number (seconds per Poisson count, shared by all workers), got "
                             f"{self.unit_s!r}; give per-worker differences through the rates")
        object.__setattr__(self, "unit_s", _check("unit_s", self.unit_s))

    @classmethod
    def vafl(cls, n_workers: int) -> PoissonDelay:
        """VAFL G.2's setting: worker j = 1..J draws Poisson(2j) scaled by 1/(2J), so the slowest mean is 1 s."""
        J = int(n_workers)
        return cls(tuple(2.0 * np.arange(1, J + 1)), 1.0 / (2 * J))

    def resolve(self, n_workers: int) -> PoissonDelay:
        """The same model with one rate per worker (ValueError if a sequence has not J entries)."""
        return PoissonDelay(_expand("rate", self.rate, n_workers), self.unit_s)

    def mean(self, j: int) -> float:
        """Expected delay of worker j, seconds."""
        return self.unit_s * _at(self.rate, j)

    def sample(self, j: int, rng: np.random.Generator) -> float:
        """One delay of worker j, seconds."""
        return self.unit_s * int(rng.poisson(_at(self.rate, j)))


@dataclass(frozen=True)
class PoissonActivations:
    """Worker j may start a task only at the points of a Poisson process of rate[j] per second (VAFL Assumption 3)."""

    rate: PerWorker

    def __post_init__(self):
        object.__setattr__(self, "rate", _check("activation rate", self.rate, positive=True))

    def resolve(self, n_workers: int) -> PoissonActivations:
        """The same model with one rate per worker (ValueError if a sequence has not J entries)."""
        return PoissonActivations(_expand("activation rate", self.rate, n_workers))

    def next_activation(self, j: int, now: float, rng: np.random.Generator) -> float:
        """Worker j's first activation after `now`: now + Exp(rate j), exact since the process is memoryless."""
        return now + float(rng.exponential(1.0 / _at(self.rate, j)))


def _numbers(text: str, what: str, grammar: str) -> float | list[float]:
    """'0.5' -> 0.5, '0.1,0.2' -> [0.1, 0.2]; ValueError quoting the grammar otherwise."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"{what} must be a number or a comma-separated list of numbers, got {text!r}; "
                         f"expected {grammar}") from None
    return values[0] if len(values) == 1 else values


def parse_delay(text: str, n_workers: int) -> ExponentialDelay | PoissonDelay | None:
    """A resolved delay model from a command-line string (grammar: module docstring, DELAY_GRAMMAR)."""
    kind, _, rest = text.strip().partition(":")
    kind = kind.lower()
    if kind == "none" and not rest:
        return None
    if (kind, rest) == ("exponential", "vafl"):
        return ExponentialDelay.vafl(n_workers).resolve(n_workers)
    if (kind, rest) == ("poisson", "vafl"):
        return PoissonDelay.vafl(n_workers).resolve(n_workers)
    if kind == "exponential" and rest:
        return ExponentialDelay(_numbers(rest, "the exponential mean", DELAY_GRAMMAR)).resolve(n_workers)
    if kind == "poisson" and rest.count(":") == 1:
        rates, unit = rest.split(":")
        return PoissonDelay(_numbers(rates, "the Poisson rate", DELAY_GRAMMAR),
                            _numbers(unit, "the Poisson unit", DELAY_GRAMMAR)).resolve(n_workers)
    raise ValueError(f"cannot parse the delay model {text!r}; expected {DELAY_GRAMMAR} "
                     f"(e.g. exponential:0.5 or poisson:2:0.1)")


def parse_activations(text: str, n_workers: int) -> PoissonActivations | None:
    """Resolved Poisson activations from a command-line string (grammar: ACTIVATION_GRAMMAR)."""
    kind, _, rest = text.strip().partition(":")
    kind = kind.lower()
    if kind == "none" and not rest:
        return None
    if kind == "poisson" and rest and ":" not in rest:
        return PoissonActivations(_numbers(rest, "the activation rate", ACTIVATION_GRAMMAR)).resolve(n_workers)
    raise ValueError(f"cannot parse the activation model {text!r}; expected {ACTIVATION_GRAMMAR} "
                     f"(rates in activations per second, e.g. poisson:2)")

