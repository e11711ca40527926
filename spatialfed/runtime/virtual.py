"""Virtual-clock runtime: drives the same FederatedServer as the Dask runtime, on one process, in simulated time.

Each worker holds at most one task. When worker j takes p, its quantity L_j(p) is computed in-process at once
(it is a pure function of the partition and p) and its completion is scheduled at

    start + network(p) + s_j · cost(p) + network(q) + delay_j,

s_j the worker's slowdown, start = now — or, with Poisson activations, worker j's next activation, when it takes the
newest task in its buffer (a VAFL client pulls the server's state when it activates) — and
delay_j a random extra delay (0 without a delay model; `runtime.delays`, docs/delays.md).

The server is one processor on the same timeline (`charge_server`, the default): each of its calls takes its
measured CPU time (`runtime.driver` times them), answers arriving meanwhile wait and reach it as one batch when it
is free, and a request leaves only once the decision that made it is taken. cost(p) is in the same seconds:
`FlopCost.calibrated` (the default) counts the task's flops at this machine's measured rate for a statistics
request; `MeasuredCost` uses the measured compute time itself. With `charge_server=False` and a fixed `FlopCost` a
run is reproducible to the bit and immune to machine noise (a model that leaves the server out: tests).
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass

import numpy as np

from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.fgpr_local import local_flops
from spatialfed.algorithm.protocol import FGPR_STEP, PILOT_STEP, STATS_STEP, Augmented, evaluate
from spatialfed.algorithm.server import FederatedServer
from spatialfed.algorithm.make_server import server_for
from spatialfed.model.stats import stats_flops
from spatialfed.runtime import site
from spatialfed.runtime.delays import Delay, PoissonActivations
from spatialfed.runtime.driver import drive
from spatialfed.runtime.heterogeneity import NetworkDelay, resolve_slowdowns
from spatialfed.runtime.interface import ACTIVATION, ALARM, ALARM_SITE, Event, Runtime


#: rates measured by FlopCost.calibrated in this process, by (n, m, p, residual): one rate per problem shape
_RATES: dict[tuple, float] = {}


@dataclass(frozen=True)
class FlopCost:
    """Deterministic task cost: flops / rate; ~n_j³/3 + n_j²m for `full`, ~n_j m² for `pp`/`mpp` per sub-step."""

    rate: float = 1e9
    theta_factor: float = 3.0  # the theta step also differentiates in the three entries of u

    @classmethod
    def calibrated(cls, models, repeats: int = 3) -> "FlopCost":
        """This machine's rate for a statistics request (flops / the fastest of `repeats` timed requests at new u)
        on the median-size site of `models`, so that site and server seconds are the same seconds. Measured once
        per problem shape in a process (later fits of the same shape reuse it)."""
        from spatialfed.model.stats import site_statistics

        lm = sorted(models, key=lambda model: model.n)[len(models) // 2]
        key = (int(lm.n), int(lm.m), int(lm.p), str(lm.residual), repr(lm.kernel))
        if key not in _RATES:
            best = np.inf
            kappa = getattr(lm.kernel, "start_kappa", lambda: np.zeros(0))()  # an estimated family's κ beyond β
            for i in range(int(repeats)):  # a new u each time: the model caches its factorisation at u
                tic = time.process_time()
                site_statistics(lm, np.concatenate([[0.1 * i, -0.1 * i, np.log(0.1) + 0.05 * i], kappa]))
                best = min(best, time.process_time() - tic)
            flops = stats_flops(lm.n, lm.m, lm.p, lm.residual, lm.vecchia_k) * _blocks(3 + kappa.size) / _blocks(3)
            _RATES[key] = flops / max(best, 1e-6)
        return cls(rate=_RATES[key])

    def seconds(self, lm, p: Augmented, measured_s: float) -> float:
        """Virtual compute time of task p on LocalModel lm (measured_s is ignored)."""
        n, m, k = lm.n, lm.m, lm.p
        if p.step == "moments":
            flops = n * k * k
        elif p.step == "variogram":
            flops = n * n
        elif p.step == FGPR_STEP:
            flops = local_flops(lm, p)
        elif p.step in (STATS_STEP, PILOT_STEP):
            sub = lm if p.step == STATS_STEP else lm.pilot(p.extra["points"])
            flops = stats_flops(sub.n, m, k, sub.residual, sub.vecchia_k) * _blocks(len(p.params.u)) / _blocks(3)
        else:
            flops = lm.strategy.solve_flops(n, m, k, lm.vecchia_k)
            if p.step == "theta":
                flops *= self.theta_factor
        return flops / self.rate


def _blocks(q: int) -> int:
    """The k×k blocks of a statistics message for u of q entries (S, its q first and q(q+1)/2 second derivatives):
    a site's work grows with them (an estimated family's u has q > 3)."""
    return 1 + q + q * (q + 1) // 2


@dataclass(frozen=True)
class MeasuredCost:
    """Task cost = the measured in-process compute time (realistic, but subject to machine noise)."""

    def seconds(self, lm, p: Augmented, measured_s: float) -> float:
        return measured_s


def message_bytes(message) -> int:
    """Size of the arrays in a p (its φ) or a q (its ξ); keys and masked integers (secure aggregation) included."""
    if isinstance(message, Augmented):
        phi = message.params
        arrays = [] if phi is None else [phi.mu, phi.Sigma, phi.gamma, phi.u]
        arrays += [v for v in message.extra.values() if isinstance(v, np.ndarray)]
        arrays += [message.extra["secagg"]["peers"]] if "secagg" in message.extra else []
    else:
        arrays = list(message.xi.values())
    return int(sum(_nbytes(a) for a in arrays))


def _nbytes(value) -> int:
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (bytes, type(None), tuple)):  # a key or round id; a masked message's shapes
        return len(value) if isinstance(value, bytes) else 0
    return value.nbytes if isinstance(value, np.ndarray) else np.asarray(value, dtype=float).nbytes


class VirtualRuntime(Runtime):
    """The sites in this process on a virtual clock (module docstring): `submit` computes L_j(p) at once and
    schedules its completion; `completed` replays completions in time order, simultaneous arrivals as one batch.

    `models`: the sites' LocalModels (tests, experiments on simulated data); None loads them from the store at
    `start` (`runtime.site`: every partition in this process — for experiments, not for private data). `cost`:
    None is `FlopCost.calibrated` on the sites at `start`. `charge_server`: the server's calls take their measured
    CPU time on the clock (module docstring); False leaves the server out (a reproducible model, for tests)."""

    name = "simulated"

    def __init__(self, models=None, slowdowns="balanced", cost=None, network: NetworkDelay | None = None,
                 charge_server: bool = True):
        self.models = None if models is None else list(models)
        self.slowdowns = slowdowns
        self.cost = cost
        self.network = network or NetworkDelay()
        self.charge_server = bool(charge_server)
        self.server_s = 0.0
        self._events: list[tuple[float, int, Event]] = []
        self._order = itertools.count()
        self._now = 0.0
        self._alarm: float | None = None
        self._run_id = None

    def start(self, specs=None, clock_start: float = 0.0, on_loaded=None, skip=()) -> list[Event]:
        loading = self.models is None  # from the store, one site after the other
        if loading:
            self._run_id, self.models = specs[0].run_id, []
        for j in range(len(specs) if loading else len(self.models)):
            if loading:
                self.models.append(site.local_model(specs[j]))
            if on_loaded is not None:
                on_loaded(self._loaded(j))
        self._s = resolve_slowdowns(self.slowdowns, len(self.models))
        if self.cost is None:
            self.cost = FlopCost.calibrated(self.models)
        self._now = float(clock_start)
        return [self._loaded(j) for j in range(len(self.models))]

    def _loaded(self, j: int) -> Event:
        lm = self.models[j]
        return Event(j, None, {"worker": j, "n": int(lm.n), "p": int(lm.p)})

    def submit(self, j: int, p: Augmented, delay_s: float = 0.0) -> None:
        """Site j computes p from now; its quantity arrives after the network, s_j·cost and the drawn delay."""
        tic = time.perf_counter()
        q = evaluate(self.models[j], p, j)
        compute = self.cost.seconds(self.models[j], p, time.perf_counter() - tic)
        finish = (self._now + self.network.seconds(message_bytes(p)) + self._s[j] * compute
                  + self.network.seconds(message_bytes(q)))
        if delay_s:
            finish += delay_s
        heapq.heappush(self._events, (finish, next(self._order), Event(j, p, q)))

    def charge(self, seconds: float) -> float:
        """The server computed for `seconds`: with charge_server, the clock moves on by them (answers that
        arrive meanwhile wait for it); returns what the clock was charged (0 without charge_server)."""
        super().charge(seconds)
        if not self.charge_server:
            return 0.0
        self._now += max(float(seconds), 0.0)
        return max(float(seconds), 0.0)

    def wake(self, j: int, at: float) -> None:
        heapq.heappush(self._events, (float(at), next(self._order), Event(j, ACTIVATION)))

    def alarm(self, at: float | None) -> None:
        at = None if at is None else max(float(at), self._now)  # one already past rings at once
        if at != self._alarm:
            self._alarm = at
            if at is not None:
                heapq.heappush(self._events, (at, next(self._order), Event(ALARM_SITE, ALARM)))

    def completed(self):
        events = self._events
        while events:
            at, _, event = heapq.heappop(events)
            if event.request == ALARM:
                if at != self._alarm or all(e.request == ALARM for _, _, e in events):
                    continue  # replaced, cancelled, or nothing else outstanding
                self._alarm = None
            self._now = max(self._now, at)  # an answer that arrived while the server computed waited for it
            batch = [event]
            if event.request not in (ACTIVATION, ALARM):  # arrivals until now come together (all enter ℚ first)
                while events and events[0][0] <= self._now and events[0][2].request not in (ACTIVATION, ALARM):
                    batch.append(heapq.heappop(events)[2])
            yield batch

    def now(self) -> float:
        return self._now

    def call(self, name: str, calls) -> dict:
        return {j: site.run_call(self.models[j], name, args) for j, args in calls.items()}

    def stop(self) -> None:
        self._events.clear()
        self._alarm = None
        if self._run_id is not None:  # loaded from the store at start: release them (a later start reloads)
            site.release(self._run_id)
            self.models, self._run_id = None, None


def run_virtual(models, knots, kernel, config: FitConfig | None = None, slowdowns="balanced", cost=None,
                network: NetworkDelay | None = None, start=None, on_event=None, server=None,
                delays: Delay | None = None, activations: PoissonActivations | None = None,
                seed=0, on_result=None, charge_server: bool = False) -> FederatedServer:
    """Fit `models` (LocalModels) on a virtual clock; returns the finished server (trace times are virtual).

    By default the reproducible model clock of the tests and the paper's experiments: the server is not charged
    and the sites cost `FlopCost()` (1e9 flop/s) unless `cost` says otherwise; `charge_server=True` (and cost
    None: calibrated) is the clock a deployment pays, as `VirtualRuntime` is by default.

    `server`: a server to drive instead of FederatedServer(J, knots, kernel, config, start) (e.g. the FGPR server);
    config and start are then ignored. `delays` and `activations`: docs/delays.md; `on_event`, `on_result`:
    `runtime.driver.drive`."""
    if server is None:
        server = server_for(len(models), knots, kernel, config, start)
    cost = cost if cost is not None or charge_server else FlopCost()
    runtime = VirtualRuntime(models, slowdowns, cost, network, charge_server)
    return drive(server, runtime, None, delays=delays, activations=activations, seed=seed, on_event=on_event,
                 on_result=on_result)


def settle_time(trace, reference, rtol: float = 1e-3) -> float | None:
    """Earliest trace time from which every later row has δ, σ², β and each γ_k within rtol (relative) of
    `reference` (a mapping with those keys); None when the last row is outside."""
    def within(row) -> bool:
        got = np.r_[row["delta"], row["sigma2"], row["beta"], row["gamma"]]
        ref = np.r_[reference["delta"], reference["sigma2"], reference["beta"], reference["gamma"]]
        return bool(np.all(np.abs(got - ref) <= rtol * np.abs(ref)))

    ok = [within(row) for row in trace]
    if not ok or not ok[-1]:
        return None
    first_good = max((i for i, flag in enumerate(ok) if not flag), default=-1) + 1
    return float(trace[first_good]["time_s"])
