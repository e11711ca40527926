"""Virtual-clock runtime: drives the same FederatedServer as the Dask runtime, on one process, in simulated time.

Each worker holds at most one task. When worker j takes p, its quantity L_j(p) is computed in-process at once
(it is a pure function of the partition and p) and its completion is scheduled at

    start + network(p) + s_j · cost(p) + network(q) + delay_j,

s_j the worker's slowdown, start = now — or, with Poisson activations, worker j's next activation, when it takes the
newest task in its buffer (a VAFL client pulls the server's state when it activates) — and
delay_j a random extra delay (0 without a delay model; `runtime.delays`, docs/delays.md). Events are processed in
time order; quantities finishing at the same instant reach the server as one batch (all enter ℚ before it checks
Num.step). With the deterministic `FlopCost` a run is reproducible to the bit and immune to machine noise;
`MeasuredCost` uses the measured compute time instead.
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass

import numpy as np

from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.fgpr import local_flops
from spatialfed.algorithm.protocol import FGPR_STEP, Augmented, Quantity, evaluate
from spatialfed.algorithm.server import FederatedServer
from spatialfed.runtime.delays import Delay, PoissonActivations
from spatialfed.runtime.heterogeneity import NetworkDelay, resolve_slowdowns


@dataclass(frozen=True)
class FlopCost:
    """Deterministic task cost: flops / rate; ~n_j³/3 + n_j²m for `full`, ~n_j m² for `pp`/`mpp` per sub-step."""

    rate: float = 1e9
    theta_factor: float = 3.0  # the theta step also differentiates in the three entries of u

    def seconds(self, lm, p: Augmented, measured_s: float) -> float:
        """Virtual compute time of task p on LocalModel lm (measured_s is ignored)."""
        n, m, k = lm.n, lm.m, lm.p
        if p.step == "moments":
            flops = n * k * k
        elif p.step == "variogram":
            flops = n * n
        elif p.step == FGPR_STEP:
            flops = local_flops(lm, p)
        else:
            flops = n**3 / 3 + n * n * m if lm.residual == "full" else n * m * m
            if p.step == "theta":
                flops *= self.theta_factor
        return flops / self.rate


@dataclass(frozen=True)
class MeasuredCost:
    """Task cost = the measured in-process compute time (realistic, but subject to machine noise)."""

    def seconds(self, lm, p: Augmented, measured_s: float) -> float:
        return measured_s


def message_bytes(message) -> int:
    """Size of the arrays in a p (its φ) or a q (its ξ)."""
    if isinstance(message, Augmented):
        phi = message.params
        arrays = [] if phi is None else [phi.mu, phi.Sigma, phi.gamma, phi.u]
        arrays += [v for v in message.extra.values() if isinstance(v, np.ndarray)]
    else:
        arrays = list(message.xi.values())
    return int(sum(np.asarray(a, dtype=float).nbytes for a in arrays))


def run_virtual(models, knots, kernel, config: FitConfig | None = None, slowdowns="balanced", cost=None,
                network: NetworkDelay | None = None, start=None, on_event=None, server=None,
                delays: Delay | None = None, activations: PoissonActivations | None = None,
                seed=0, on_result=None) -> FederatedServer:
    """Fit with the FederatedServer on a virtual clock; returns the finished server (trace times are virtual).

    `on_event(server, now)` is called after each batch of arrivals, as in the Dask runtime. `server`: a fresh server
    to drive instead of FederatedServer(J, knots, kernel, config, start) (any object with dispatch/receive/done, e.g.
    the FGPR server); config and start are then ignored. `delays` (ExponentialDelay, PoissonDelay) add a sampled
    delay to each task; with `activations` an idle worker takes its newest task only at its next activation (VAFL
    §2.3); both draw from numpy.random.default_rng(seed), in event order. Without them the run draws nothing and
    is unchanged. `on_result(j, p, q)` sees every quantity as it is computed (as in the Dask runtime)."""
    cost = cost or FlopCost()
    network = network or NetworkDelay()
    s = resolve_slowdowns(slowdowns, len(models))
    delays = None if delays is None else delays.resolve(len(models))
    activations = None if activations is None else activations.resolve(len(models))
    rng = np.random.default_rng(seed)
    if server is None:
        server = FederatedServer(len(models), knots, kernel, config, start)
    events: list[tuple[float, int, Quantity | None, int]] = []  # (time, order, q or None = activation of j, j)
    order = itertools.count()
    waiting: set[int] = set()  # workers with an activation scheduled

    def launch(j: int, p: Augmented, t0: float) -> None:
        """Worker j computes p from t0; its quantity arrives after the network, s_j·cost and a sampled delay."""
        tic = time.perf_counter()
        q = evaluate(models[j], p, j)
        compute = cost.seconds(models[j], p, time.perf_counter() - tic)
        if on_result is not None:
            on_result(j, p, q)
        finish = t0 + network.seconds(message_bytes(p)) + s[j] * compute + network.seconds(message_bytes(q))
        if delays is not None:
            finish += delays.sample(j, rng)
        heapq.heappush(events, (finish, next(order), q, j))

    now = 0.0
    while not server.done:
        if activations is None:
            for j, p in server.dispatch():
                launch(j, p, now)
        else:  # an idle worker acts only at its next activation, and then takes the newest task it has
            for j in server.active:
                if not server.busy(j) and j not in waiting:
                    waiting.add(j)
                    heapq.heappush(events, (activations.next_activation(j, now, rng), next(order), None, j))
        now, _, q, j = heapq.heappop(events)
        if q is None:
            waiting.discard(j)
            p = server.next_task(j)
            if p is not None:
                launch(j, p, now)
            continue
        arrived = [q]
        while events and events[0][0] == now and events[0][2] is not None:  # simultaneous arrivals come together
            arrived.append(heapq.heappop(events)[2])
        server.receive(arrived, now)
        if on_event is not None:
            on_event(server, now)
    return server


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
