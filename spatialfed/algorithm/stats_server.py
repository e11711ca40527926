"""One round trip per iteration (SPEC §2b): a sans-IO server that asks every site for its sufficient statistics at u
and steps on the exact profile log-likelihood, synchronously or asynchronously (docs/algorithm.md).

Phases: moments → variogram (φ₀, as FederatedServer) → pilot (pilot.py, large sites) → loop → (final →) done; error
on a failed receive.

The loop runs in **epochs**: every site answers at the epoch's point, whose exact ℓ_LR accepts or rejects it and
decides the stop and the next point — sync's trust-region Newton step (sync mode: that is all). In async mode the
slowest site is asked again the moment it answers (it is never idle), while faster sites answer where the surrogate
Σ_j T_j(u) (site_records) leads, when pacing.Pacing says they still answer the next epoch in time on a free
processor, and the server steps on the surrogate only while it is otherwise idle (_idle_for_step: a step at its
measured cost ends before the epoch's first owed answer is due). Every epoch point is sync's step, so the epochs are
sync's iterations; a surrogate step is an estimate (a trace row) only from every site's model within half the
epoch's step of its point, resting mostly on answers newer than the epoch point's (SiteRecords.spread).
docs/algorithm.md argues that async ends no later than sync up to the server work on the epochs' path.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from spatialfed.algorithm import start as starting
from spatialfed.algorithm.boundary import BoundaryProbe
from spatialfed.algorithm.config import BlockScheme, FitConfig, Mode, StatsPolicy
from spatialfed.algorithm.pacing import Pacing
from spatialfed.algorithm.pilot import Pilot, pilot_size
from spatialfed.algorithm.likelihood import (U_NAMES, NotPositiveDefinite, Profile, TrustStep, at_bound, default_bounds,
                                             distance, maximise, newton_length, profile_loglik, stop_point,
                                             taylor_statistics, trust_region_step, updated_radius)
from spatialfed.algorithm.protocol import STATS_STEP, Augmented
from spatialfed.algorithm.server import FederatedServer
from spatialfed.algorithm.site_records import SiteRecords
from spatialfed.algorithm.stale import u_key
from spatialfed.algorithm.server_base import Phase
from spatialfed.model.family import MaternFamily
from spatialfed.model.params import Params


@dataclasses.dataclass(frozen=True)
class Promise:
    """A surrogate step's promise, judged by the next step's model: it moved from `start` (where ℓ was `loglik`,
    from the sites `sites` when all answered there) to `end`, promising ℓ to rise by `increase`."""

    end: tuple
    start: tuple
    increase: float
    loglik: float
    sites: tuple | None


class StatsServer(FederatedServer):
    """Sans-IO server of SPEC §2b with FederatedServer's runtime interface (done, busy, next_task, dispatch,
    receive, drop_worker, snapshot/restore) and results (params, loglik, trace, t, iterations, converged,
    stop_reason, n_obs, phase). Extra: `boundary` (parameters on a bound of the box), `answers` (statistics
    answered per site), `accepted` ((iteration, exact ℓ) of each accepted epoch point), `bounds` ((lower, upper)).

    config: FitConfig — mode, agg_threshold, tol, max_iter (in `rounds`), time_budget, step_bound (the first trust
    radius) and `policy` (config.StatsPolicy) are used; the block scheme's strategies are not.
    """

    def __init__(self, n_workers: int, knots, kernel, config: FitConfig | None = None, start=None, *,
                 bounds: tuple | None = None):
        if config is not None and config.privacy is not None:
            raise ValueError("the statistics server does not add privacy noise (its messages are second-order "
                             "statistics): use FederatedServer for a fit with privacy")
        # resolved once, as the statistics scheme: asynchronous aggregation then takes every answer (agg_threshold 1)
        if config is None:
            config = FitConfig.stats()
        elif isinstance(config.scheme, BlockScheme):
            if config.scheme != BlockScheme():
                raise ValueError("the statistics server takes no block-scheme settings: give FitConfig.stats(...) "
                                 "(or FitConfig.of(...) without them)")
            config = dataclasses.replace(config, scheme=StatsPolicy())
        super().__init__(n_workers, knots, kernel, config, start)
        self.policy = self.config.policy
        self.stale_tol = self.policy.stale_tol_for(self.config.stopping.tol)
        self.records = SiteRecords(self.policy)
        self.pacing = Pacing()
        self._user_bounds = None if bounds is None else tuple(np.asarray(b, dtype=float) for b in bounds)
        self.bounds: tuple[np.ndarray, np.ndarray] | None = None
        self.boundary: tuple[str, ...] = ()
        self.answers = [0] * self.n_workers
        self.accepted: list[tuple[int, float]] = []
        self.epochs = 0  # epochs completed
        self._epoch: Augmented | None = None  # the request every site answers in this epoch
        self._owed: list[int] = []  # sites that have not answered at the epoch's u yet
        self._anchor: tuple[Profile, dict] | None = None  # last accepted epoch point: (profile, summed statistics)
        self._radius = float(self.config.step_bound)  # the epochs' trust radius (sync's)
        self._epoch_step, self._epoch_pred = 0.0, 0.0  # length and predicted increase of the last epoch step
        self._boundary = BoundaryProbe(self.policy.probe_step)
        self._explore: Augmented | None = None  # the request at the surrogate's current point (async)
        self._explore_radius = float(self.config.step_bound)  # the surrogate steps' trust radius (async)
        self._promise: Promise | None = None  # what the last surrogate step promised (_check_promise)
        self._new = 0  # answers since the last surrogate step
        self._crowded: set[int] = set()  # idle sites whose processor other sites' tasks held at their last request
        self._final, self._final_reason = None, None  # the final pass's request and reason (a stop before any point)
        self._pilot: Pilot | None = None  # the pilot start's rounds (pilot.py), once the φ₀ passes are done
        self._step_costs: list[float] = []  # clock seconds of the last few calls that took a surrogate step (spent)
        self._dearest_call = 0.0  # clock seconds of the dearest call of the loop so far (spent)
        self._stepped = False  # the call in progress took a surrogate step
        self._paced: dict[str, tuple] = {}  # what pacing predicted, with the state it read (_pace: O(J) once per change)

    @property
    def rounds(self) -> float:
        """Round trips so far, the unit of max_iter: epochs, the one in progress included (no pilot round)."""
        return float(self.epochs + 1)

    _u = property(lambda self: self.params.u)

    # --- the runtime's side ---------------------------------------------------------------------------
    def spent(self, seconds: float) -> None:
        """What the call just made took on the fit's clock: in the loop, the dearest call so far and the last few
        that took a surrogate step (_idle_for_step)."""
        if self.phase in (Phase.LOOP, Phase.FINAL) and seconds > 0:
            self._dearest_call = max(self._dearest_call, float(seconds))
            if self._stepped:
                self._step_costs = [*self._step_costs[-4:], float(seconds)]
        self._stepped = False

    def _idle_for_step(self, now: float) -> bool:
        """Whether a surrogate step, at its measured cost (before one is measured: the loop's dearest call), ends
        before the first epoch answer is due: the server is otherwise idle, so the step never delays the epoch's
        decision. With equal sites the answers come together and no step is taken: async does sync's work. Always
        where the clock leaves the server out (cost 0)."""
        cost = float(np.median(self._step_costs)) if self._step_costs else self._dearest_call
        if cost <= 0.0:
            return True
        first = self._pace("first", now, lambda: self._first_due(now))
        return first is None or now + cost <= first

    def _pace(self, name: str, now: float, predict):
        """A pacing prediction, computed again only once a task was sent or arrived, or the clock moved: the driver
        asks every idle site in turn, and each prediction reads every owed site (O(J) each, O(J²) per answer)."""
        key = (self.pacing.version, float(now), len(self._owed), id(self._epoch))
        if self._paced.get(name, (None,))[0] != key:
            self._paced[name] = (key, predict())
        return self._paced[name][1]

    def _first_due(self, now: float) -> float | None:
        """When the first answer the epoch still owes is due (None: no round trip known)."""
        due = []
        for k in self._owed:  # in flight with the epoch's task: r after it left; busy elsewhere: 2r; idle: now + r
            r = self.pacing.round_trip(k, self.active, end=0)
            if r is not None:
                task = self._in_flight.get(k)
                sent = self.pacing.sent_at.get(k, now) if task is not None else now
                due.append(sent + (r if task is None or task is self._epoch else 2 * r))
        return min(due) if due else None

    def next_task(self, j: int, free: bool = True) -> Augmented | None:
        """Site j's next request: the φ₀ passes' from ℙ_j; in the loop the epoch's point until it answered there,
        then (async) the surrogate's point or a refining point when pacing allows and j's processor is `free` (a
        task would start at once: spare work must not queue before another site's epoch task); the final pass's."""
        if self.busy(j):
            raise RuntimeError(f"worker {j} already has a task in flight; call next_task only for idle workers")
        if self.done or j not in self.active:
            return None
        (self._crowded.discard if free else self._crowded.add)(j)
        if self.phase in (Phase.MOMENTS, Phase.VARIOGRAM):
            p = super().next_task(j)
        elif self.phase == Phase.PILOT:
            p = self._pilot.task(self.params, self.t, j)
        elif self.phase == Phase.FINAL:
            p = None if self.records.answered_at(j, self._final.params.u) else self._final
        else:
            p = self._loop_task(j, free)
        if p is not None:
            self._in_flight[j] = p
            self.pacing.sent(j, self._last_now)
        return p

    def _loop_task(self, j: int, free: bool) -> Augmented | None:
        if j in self._owed:
            return self._epoch
        if self.config.mode is Mode.SYNC or not self.policy.explore or self._explore is None or not free:
            return None
        if not self._step_due() and self.records.answered_at(j, self._explore.params.u):
            return None  # nothing new to ask (no step due): not worth the pacing's O(J) look
        due = self._pace("due", self._last_now, self._epoch_due)
        if not self.pacing.may_work(j, self._last_now, due, self.active):
            return None
        if self._step_due() and self._idle_for_step(self._last_now):  # deferred while the processors were crowded
            self._surrogate_step(self._last_now)
        return None if self.records.answered_at(j, self._explore.params.u) else self._explore

    def _epoch_due(self) -> float | None:
        busy = {k: k in self._in_flight and self._in_flight[k] is not self._epoch for k in self._owed}
        return self.pacing.epoch_due(self._owed, self.active, busy, self._last_now)

    def _receive(self, qs, now: float) -> None:
        for q in qs:
            self.pacing.arrived(q.worker, q.step, now)
        if self.phase in (Phase.MOMENTS, Phase.VARIOGRAM):
            return super()._receive(qs, now)
        self._last_now = float(now)
        for q in qs:
            j = q.worker
            p = self._in_flight.pop(j)
            if self.phase == Phase.PILOT:
                self._pilot.answered(j, q.xi)
                continue
            if j in self._obsolete or self.phase == Phase.DONE:
                self._obsolete.discard(j)
                continue
            live = list({id(task.params): task.params.u for task in self._in_flight.values()}.values())
            at_epoch = j in self._owed and np.array_equal(q.xi["u"], self._epoch.params.u)
            self.records.answered(j, q.xi, q.t, live + ([self._epoch.params.u] if self._epoch else []), at_epoch)
            if at_epoch:
                self._owed.remove(j)
            self.answers[j] += 1
            self._new += 1
        self._pilot_round(now) if self.phase == Phase.PILOT else self._progress(now)

    def drop_worker(self, j: int, step: str, cause: str, now: float) -> None:
        """Continue without site j: its statistics leave the sums, N and the epoch."""
        self._remove_worker(j, step, cause, now)
        self._P[j] = []
        self._in_flight.pop(j, None)
        self._obsolete.discard(j)
        self._collected.pop(j, None)
        self.records.drop(j)
        self.pacing.drop(j)
        if self._n_j:
            self.n_obs = sum(self._n_j[k] for k in self.active)
        if self.phase in (Phase.MOMENTS, Phase.VARIOGRAM):
            self._complete_synchronous(now)
        elif self.phase == Phase.PILOT:
            self._pilot.drop(j)
            self._pilot_round(now)
        elif self.phase == Phase.LOOP:
            self._anchor = None  # the sums changed: the accepted ℓ is not comparable
            self._owed = [k for k in self.active if not self.records.answered_at(k, self._epoch.params.u)]
            self._progress(now)
        elif self.phase == Phase.FINAL:
            self._progress(now)

    # --- the loop -------------------------------------------------------------------------------------
    def _begin_loop(self, now: float, estimated=None) -> None:
        """φ₀ (start.initial_params, `start` overriding), the box for u, then the pilot (pilot.py), the first epoch."""
        values = {"gamma": self._ols_gamma, **(estimated or {}), **self.start}
        self.bounds = self._user_bounds or self._default_bounds()
        params = starting.initial_params(values["gamma"], values["delta"], values["sigma2"], values["beta"],
                                         self.knots, self._start_kernel)
        if isinstance(self.kernel, MaternFamily):  # its further coordinates κ start at the family's start
            params = params.with_u(np.concatenate([params.u, self.kernel.start_kappa()]))
        self.params = params.with_u(np.clip(params.u, *self.bounds))
        self._record("init", now, 0)
        n_s = pilot_size(self._n_j, self.policy.pilot_points, self.policy.pilot_share)
        if n_s is not None:
            self._pilot = Pilot(self._u, self.bounds, self.policy, self.config.step_bound, self.config.stopping.tol,
                                self.config.stopping.max_iter, n_s, self.n_obs)
            self.phase = Phase.PILOT
            return
        self._start_loop(now)

    def _default_bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """likelihood.default_bounds for (log δ, log σ², log β), then an estimated family's own box on κ."""
        lo, hi = default_bounds(self._s2, self._diameter)
        if isinstance(self.kernel, MaternFamily):
            klo, khi = self.kernel.bounds()
            lo, hi = np.concatenate([lo, klo]), np.concatenate([hi, khi])
        return lo, hi

    @property
    def u_names(self) -> tuple[str, ...]:
        """The names of u's entries: U_NAMES, then an estimated family's (log ν, log r, φ)."""
        extra = self.kernel.names[1:] if isinstance(self.kernel, MaternFamily) else ()
        return U_NAMES + tuple(extra)

    def _pilot_round(self, now: float) -> None:
        """After a pilot answer or a drop: the pilot's next point (a "pilot" trace row) or, once done, the loop."""
        budget = self.config.stopping.time_budget  # spent: the pilot ends at its accepted point
        if self._pilot.complete(self.active, lambda st: self._evaluate(lambda _: st, st["u"], True),
                                budget is not None and now >= budget):
            self.params = self.params.with_u(self._pilot.u)
            self._record("pilot", now, 0)
            if self._pilot.done:
                self._start_loop(now)
                self._progress(now)

    def _start_loop(self, now: float) -> None:
        """The first epoch, at the current point (φ₀, or the pilot's end): every site is asked there at once."""
        self._start_epoch()

    def _start_epoch(self) -> None:
        """Ask every active site at the current u (read back from params as the sites will: log of exp)."""
        self.phase = Phase.LOOP
        self._epoch = self._explore = Augmented(self.params, self.t, STATS_STEP)
        self._owed = [j for j in self.active if not self.records.answered_at(j, self._u)]
        self._P = [[] for _ in range(self.n_workers)]

    def _progress(self, now: float) -> None:
        """End the epoch once every site answered at its point; otherwise (async) step on the surrogate after
        agg_threshold new answers, unless every idle site's processor is crowded by other sites' tasks (sites sharing
        few cores): then the step waits until a site is free to be asked where it leads (_loop_task), so that the
        server's own work does not take the cores the epoch needs; and only while the server is otherwise idle
        (_idle_for_step: the answers meanwhile accumulate into the next step). Then check the time budget."""
        if self.phase == Phase.FINAL:
            if all(self.records.answered_at(j, self._final.params.u) for j in self.active):
                self._finish(self._exact_profile(self._final.params.u), self._final_reason, now)
        elif self.phase == Phase.LOOP:
            if not self._owed:
                self._end_epoch(now)
            elif (self._step_due() and any(j not in self._crowded for j in self.active if not self.busy(j))
                  and self._idle_for_step(now)):
                self._surrogate_step(now)
        budget = self.config.stopping.time_budget
        if self.phase == Phase.LOOP and budget is not None and now >= budget:
            self._stop("time_budget", now)

    def _step_due(self) -> bool:
        return self.config.mode is Mode.ASYNC and self._new >= min(self.config.agg_threshold, len(self.active))

    def _exact_profile(self, u) -> Profile | None:
        """ℓ_LR at u from every active site's exact statistics there (None: not positive definite)."""
        entry = self.records.rounds[u_key(u)]
        if sorted(entry["sites"]) != sorted(self.active):
            raise RuntimeError(f"statistics at u are summed over sites {entry['sites']}, not {self.active}")
        try:
            return profile_loglik(entry["sum"], self.knots, self.kernel)
        except NotPositiveDefinite:
            return None

    def _end_epoch(self, now: float) -> None:
        """Every site answered at the epoch's u: accept or reject it on the exact ℓ, stop or publish the next."""
        u = self._epoch.params.u
        here = self._exact_profile(u)
        before = None if self._anchor is None else self._anchor[0]  # the last exact point (newton_settled)
        anchor = None if before is None else before.loglik
        worse = anchor is not None and (here is None or here.loglik < anchor - 1e-12 * abs(here.loglik))
        if worse:
            self._radius = max(0.25 * self._epoch_step, 1e-6)  # rejected: a shorter step from the accepted point
        else:
            if here is None:
                raise NotPositiveDefinite("the summed statistics are not positive definite at the first point")
            if anchor is not None and self._epoch_pred > self.policy.loglik_tol:
                self._radius = self._updated(self._radius, (here.loglik - anchor) / self._epoch_pred,
                                             self._epoch_step)
            self._anchor = (here, self.records.rounds[u_key(u)]["sum"])
            self.accepted.append((self.t, here.loglik))
        base, base_stats = self._anchor
        lower, upper = self.bounds
        step = trust_region_step(base.u, base.grad, base.hess, self._radius, lower, upper,
                                 floor=self.policy.eig_floor)
        dgamma = 0.0
        new = self._evaluate(lambda v: taylor_statistics(base_stats, v), base.u + step.p)
        if new is not None and base.gamma.size:
            dgamma = float(np.max(np.abs(new.gamma - base.gamma)) / max(np.max(np.abs(base.gamma)), 1e-300))
        self.iterations = self.t + 1
        newton = None if worse else newton_length(step, base.hess, self._radius, self.policy.eig_floor)
        end = stop_point(base, new, step, dgamma, before, newton, self.config.stopping.tol, self.policy.loglik_tol)
        if end is not None:
            self._finish(end, "tol", now)
            return
        probe = self._boundary.step(base, step, lower, upper)
        if probe is not None:
            step, new = probe, None
        if new is None:  # the second-order model is not positive definite there: ℓ at the step is unknown until asked
            new = dataclasses.replace(base, u=base.u + step.p)
        self._epoch_step, self._epoch_pred = distance(new.u, base.u), step.predicted
        self.boundary = at_bound(new.u, lower, upper, self.u_names)
        self._set_params(new)
        self._record(STATS_STEP, now, 0, new.loglik)
        self.epochs += 1
        if self.rounds > self.config.stopping.max_iter:
            self._stop("max_iter", now)
            return
        self.t += 1
        self._start_epoch()
        if not self._owed:  # every site answered there already (explorations): the epoch is over as it begins
            self._end_epoch(now)

    def _surrogate_step(self, now: float) -> None:
        """Async, between epochs: maximise the surrogate from the current point and publish where it leads (the
        point faster sites are asked at); the surrogate steps have their own trust region (_check_promise)."""
        self._new, self._stepped = 0, True
        u = self._explore.params.u
        found = self.records.surrogate(u, self.active, self.n_obs, self.t, self._explore_radius)
        if found is None:
            return
        at, radius, staleness, used, exact_for = found
        base = self._evaluate(at, u, derivatives=True)
        if base is None:  # the models disagree here: wait for fresher answers
            return
        self._check_promise(at, base.loglik, exact_for)
        new, step = self._maximise(at, base, radius)
        move = distance(new.u, base.u)
        if move <= self.config.stopping.tol:
            new, move = base, 0.0
        self._promise = Promise(tuple(new.u.tolist()), tuple(base.u.tolist()), new.loglik - base.loglik,
                                base.loglik, None if exact_for is None else tuple(exact_for)) if move > 0 else None
        self.boundary = step.at_bound
        self._set_params(new)
        # an estimate only from every site's model, where it agrees with sync's step (within |s|/2 of the epoch
        # point), and where most of what it rests on is newer than the epoch point's own model: the
        # answers' mean square distance at most half of |s|² (every site's at u_a); elsewhere it is a probe
        if (len(used) == len(self.active) and distance(new.u, self._epoch.params.u) <= 0.5 * self._epoch_step
                and self.records.spread(new.u, u, self.active) <= 0.5 * self._epoch_step ** 2):
            self._record(STATS_STEP, now, staleness, new.loglik)
        self.iterations = self.t + 1
        self.t += 1
        self._explore = Augmented(self.params, self.t, STATS_STEP)

    def _maximise(self, at, base: Profile, max_move: float) -> tuple[Profile, TrustStep]:
        """likelihood.maximise on the surrogate u ↦ ℓ(at(u)) within the box."""
        return maximise(lambda u: self._evaluate(at, u, derivatives=True), base, max_move, *self.bounds,
                        self.policy.inner_steps, self.policy.eig_floor, self.config.stopping.tol)

    def _check_promise(self, at, loglik: float, exact_for: list | None = None) -> None:
        """The surrogate steps' trust region: the last one promised ℓ(u_new) − ℓ(u_old); the newer model `at`
        (ℓ = `loglik` at u_new) sees an increase between the same two points; their ratio sets the radius as an
        exact one would. Where the same sites answered at both points (`exact_for`), ℓ at u_old is their exact one.
        A step shorter than settle_tol is not judged (it cannot exploit model error), unless it reached the radius."""
        promise, self._promise = self._promise, None
        if (promise is None or not np.allclose(promise.end, self._explore.params.u, rtol=0.0, atol=1e-9)
                or not promise.increase > self.policy.loglik_tol):
            return
        start = np.asarray(promise.start)
        moved = distance(self._explore.params.u, start)
        if exact_for is not None and tuple(exact_for) == (promise.sites or ()):
            old = promise.loglik
        elif moved > self.policy.settle_tol or moved >= 0.99 * self._explore_radius:
            at_old = self._evaluate(at, start)
            old = None if at_old is None else at_old.loglik
        else:
            return
        if old is not None:
            self._explore_radius = max(self._updated(self._explore_radius, (loglik - old) / promise.increase, moved),
                                       self.policy.settle_tol)

    def _updated(self, radius: float, ratio: float, step: float) -> float:
        return updated_radius(radius, ratio, step, self.policy.radius_growth * float(self.config.step_bound))

    def _evaluate(self, at, u, derivatives: bool = False) -> Profile | None:
        try:
            return profile_loglik(at(u), self.knots, self.kernel, derivatives=derivatives)
        except NotPositiveDefinite:
            return None

    def _set_params(self, pr: Profile) -> None:
        # (δ, σ², β) = e^u[:3], κ = u[3:]
        self.params = Params(pr.mu, pr.Sigma, pr.gamma, *(float(v) for v in np.exp(pr.u[:3])), kappa=pr.u[3:])

    # --- the end --------------------------------------------------------------------------------------
    def _stop(self, reason: str, now: float) -> None:
        """max_iter or time budget: report the last accepted point, or before one exists ask every site at the
        current u (a final pass) and report that."""
        if self._anchor is not None:
            self._finish(self._anchor[0], reason, now)
            return
        self._final_reason, self.phase = reason, Phase.FINAL
        self._final = Augmented(self.params, self.t, STATS_STEP)
        self._P = [[] for _ in range(self.n_workers)]
        self._obsolete = set(self._in_flight)
        if self.params is not None and all(self.records.answered_at(j, self._u) for j in self.active):
            self._progress(now)

    def _finish(self, pr: Profile, reason: str, now: float) -> None:
        """Report the estimate and ℓ_LR at pr (the "final" trace row; exact, or within O(‖p‖³): stop_point), stop."""
        self._set_params(pr)
        self.boundary = at_bound(pr.u, *self.bounds, self.u_names)
        self.loglik = pr.loglik
        self.stop_reason = reason
        self.converged = reason == "tol"
        self._record("final", now, 0, self.loglik)
        self._P = [[] for _ in range(self.n_workers)]
        self._obsolete = set(self._in_flight)
        self.phase = Phase.DONE

    # --- checkpoints ----------------------------------------------------------------------------------
    def snapshot(self) -> dict:
        """FederatedServer.snapshot plus every other attribute of this server under "stats_server" (nothing a fit
        holds is left out: tests/algorithm/test_algorithm_snapshots.py)."""
        snap = super().snapshot()
        snap["stats_server"] = copy.deepcopy({name: value for name, value in vars(self).items()
                                              if name not in FederatedServer.snapshot_attributes()})
        return snap

    @classmethod
    def restore(cls, snapshot) -> StatsServer:
        """A StatsServer continuing from `snapshot`; the requests that were in flight are asked again."""
        if "stats_server" not in snapshot:
            raise ValueError("this snapshot was written by FederatedServer, not StatsServer: restore it with "
                             "FederatedServer.restore")
        server = super().restore(snapshot)
        for name, value in copy.deepcopy(dict(snapshot["stats_server"])).items():
            setattr(server, name, value)
        return server
