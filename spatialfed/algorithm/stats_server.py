"""One round trip per iteration (SPEC §2b, issue 13): a sans-IO server that asks every site for its sufficient
statistics at u and steps on the exact profile log-likelihood, synchronously or asynchronously.

Phases: "moments" → "variogram" (φ₀, inherited from FederatedServer, init.py) → "loop" → ("final" →) "done".

Loop, mode "sync": each iteration one request ("stats", u) per site; when all have answered, the exact ℓ_LR(γ̂(u), u)
with gradient and Hessian (profile.profile_loglik) is compared with the last accepted point. A point with a lower
log-likelihood is rejected (the trust radius shrinks and a shorter step is taken from the accepted point), so no
accepted step decreases ℓ; otherwise the radius follows the ratio of actual to predicted increase and the next
trust-region Newton step is published. Stop: the step from an exact point is below `tol` in every log-parameter and
its predicted increase below `loglik_tol` (with γ̂ moving less than `tol` relative); the reported estimate and ℓ are
exact at the last accepted u.

Loop, mode "async": a site is re-asked at the newest u as soon as it answers, except a slow one (below). Once
`agg_threshold` new answers have arrived, the server builds the surrogate Σ_j T_j(u) (stale.site_models): each
site's model around the u_j its statistics were computed at — the second-order Taylor model (exact when fresh), or
for a stale site the control variate ρ Σ_F T_k(u) + Taylor[S_j − ρ Σ_F S_k] through the sites F that answered at u_j
too — and a site with no statistics yet, or whose u_j is farther than `taylor_radius` (∞-norm) from u, is stood in
for by the used sites' models scaled by N / Σ n_j used (no step before the used sites hold MIN_COVERAGE of the
observations). It maximises the surrogate by safeguarded Newton steps (each kept only if the surrogate's ℓ does not
decrease) within min(trust radius, taylor_radius − stalest ‖u − u_j‖∞). The trust radius follows, as in sync mode,
the ratio of the ℓ a step promised to the ℓ that newer answers give at the published u (_check_promise). When every
site answered at the current u the step is the synchronous one, so equal sites reproduce the synchronous run
exactly. Stop: the surrogate step is below tol and every site's u_j is within `stale_tol` of u → a final exact pass
at u (all sites), whose exact step decides: converged (report the exact ℓ) or continue.

Refining (async): while a slow site computes its first statistics, the others, settled, answer at two points
REFINE_STEP from their u_j; from the differences of the second derivatives their models become third order
(stale.refined, profile.taylor_statistics), so the step the slow site's answer triggers lands nearer the optimum.
A site that did not refine (a slow one) gets third derivatives from its own two answers before its latest, if within
SECANT_REACH (stale.secant): its model is third order along the path the fit took.

Pacing (async): a site whose last round trip took more than hold_ratio × the median (stale.slow_sites: the
initialisation's round trips first, then the statistics') is held back after each answer until the others' surrogate
settles (a step ≤ RELEASE_TOL), so a straggler computes near the optimum instead of at a point the fit is leaving.

Fallback (async): a fit that has not settled after STALL_ROUNDS answers per site, or after SYNC_ROUNDS round trips
of the slowest site (about what sync needs), continues synchronously (exact steps, every site at each u), so async
ends where sync would from there (a flat ridge of ℓ on few knots kept stale models moving the surrogate by ~1e-2
until max_iter; graded mpp sites took 2× the sync time).

Bounds: u stays in a box (profile.default_bounds); a nugget or range that runs to the boundary stops there and is
listed in `boundary`. A log-parameter that keeps moving one way in free Newton steps (a flat ℓ ≈ ℓ∞ − c/δ) is
probed once at its bound (_probe), which the sites' exact ℓ accepts or rejects like any step.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from spatialfed.algorithm import init, stale
from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.profile import (
    THIRD,
    NotPositiveDefinite,
    Profile,
    Step,
    at_bound,
    default_bounds,
    profile_loglik,
    sum_statistics,
    taylor_statistics,
    trust_region_step,
)
from spatialfed.algorithm.protocol import STATS_STEP, Augmented, Quantity
from spatialfed.algorithm.server import FederatedServer
from spatialfed.model.params import Params

#: the trust radius may grow to this multiple of FitConfig.step_bound after steps the exact ℓ confirmed
RADIUS_GROWTH = 3.0
#: share of the observations whose statistics must be usable before an asynchronous step (the rest stood in for)
MIN_COVERAGE = 0.5
#: asynchronous mode: a site whose last round trip took more than this multiple of the median is slow: after each
#: answer it is held back until the others' surrogate has settled, so it always computes near the optimum
HOLD_RATIO = 3.0
#: a surrogate step below this (∞-norm in u) is short: the surrogate has settled (idle sites may refine) and the
#: asynchronous trust region does not judge it
HOLD_TOL = 1e-2
#: held sites are asked again once the others' surrogate step is below this (∞-norm in u): the point they are asked at
#: then lies about as far from the full optimum as after a step of HOLD_TOL (the others' optimum lacks their data:
#: graded n_j = 200, 0.069 against 0.061 in log β), one fast round trip sooner (the slowest site's answer at 1.49 of
#: its round trip instead of 1.60) ...
RELEASE_TOL = 3e-2
#: ... or once the others have answered this many times on average since the hold began
HOLD_ROUNDS = 8
#: asynchronous mode: a fit that has not settled after this many answers per site (stale models keep moving the
#: surrogate, e.g. along a flat ridge of ℓ) continues synchronously: exact steps that never lower ℓ, as sync mode
STALL_ROUNDS = 40
#: ... or once it has run this many round trips of the slowest site (a synchronous fit converges in 4–6): under graded
#: compute with the mpp residual stale models kept the surrogate moving for 45 answers per site (2.06× the sync time)
SYNC_ROUNDS = 4
#: asynchronous mode: an answer due within this fraction of the median round trip is waited for before aggregating
WAIT = 0.25
#: floor of mod(−H)'s eigenvalues, relative to the largest, in the trust-region steps: the radius bounds every step, so
#: the floor only has to keep mod(−H) invertible. FitConfig.eig_floor (1e-6, the block scheme's Newton step has no
#: radius) turned a nugget running to 0 into steps of g/(1e-6·max|λ|) once ℓ flattened in log δ: 0.36 → 0.03 in
#: log δ per round trip, 33 round trips to the bound on a noise-free field (tests/api/test_api_boundary.py)
EIG_FLOOR = 1e-12
#: a log-parameter that moved toward one side by at least PROBE_STEP in PROBE_AFTER consecutive exact Newton steps
#: (not cut short by the trust radius) is tried once at that bound of the box, the other entries taking the Newton
#: step: a nugget running to 0 has ℓ ≈ ℓ∞ − c/δ, whose Newton steps stay ≈ 1 in log δ all the way (16 round trips
#: over the 11 to the bound on a noise-free field); the sites' exact ℓ there accepts the probe or, lower, rejects it
#: like any step (one round trip)
PROBE_AFTER, PROBE_STEP = 3, 0.5
#: asynchronous mode: while a slow site computes its first statistics, a site not slow, settled at the current u, is
#: asked at u_j + REFINE_STEP·e_i (stale.refine_points, two points) for the third derivatives of its statistics
#: (stale.refined): its model is then third order. When the slow site answers, the others' models are centred where
#: they settled without it, ~0.03 in u from the optimum, and a second-order model leaves the surrogate's optimum
#: ~1.5·Δu² off (8.5e-3 in log β on graded n_j = 200, a fast round trip more to settle); third order: 2e-4
REFINE_STEP = 0.03
#: asynchronous mode: a site's two answers before its latest, if within this (∞-norm in u) of it, give its model third
#: derivatives along the fit's path (stale.secant) where refining gave none
SECANT_REACH = 0.2
#: attributes of StatsServer beyond FederatedServer's, kept in snapshots under "stats_server"
_STATE = ("taylor_radius", "inner_steps", "stale_tol", "loglik_tol", "bounds", "boundary", "answers", "accepted",
          "control_variates", "hold_ratio", "_slow", "_held", "_hold_answers", "_sent_at", "_durations", "_promise",
          "_after_surrogate", "_fallback", "_loop_t0", "_stats", "_rounds", "_new", "_wait_until", "_u",
          "_anchor", "_anchor_t", "_radius", "_last_step", "_last_pred", "_final_t", "_final_reason", "_toward",
          "_probed",
          "_refine", "refine_step", "_settled", "_user_bounds", "_earlier", "_secant")


class StatsServer(FederatedServer):
    """Sans-IO server of SPEC §2b with FederatedServer's runtime interface (done, busy, next_task, dispatch,
    receive, drop_worker, snapshot/restore) and attributes (params, loglik, trace, t, iterations, converged,
    stop_reason, n_obs, phase). Extra attributes: `boundary` (names of parameters on a bound of the box),
    `answers` (statistics answered per site), `accepted` ((iteration, exact ℓ) of each accepted exact point),
    `bounds` ((lower, upper) of u).

    config: FitConfig — mode, agg_threshold, tol, max_iter (in `rounds`), time_budget, step_bound (largest trust
    radius, in u), eig_floor are used; the strategies of FederatedServer (correction, weights, moving average, α) are not.
    """

    def __init__(self, n_workers: int, knots, kernel, config: FitConfig | None = None, start: Mapping | None = None,
                 *, taylor_radius: float = 0.5, stale_tol: float | None = None, loglik_tol: float = 1e-6,
                 bounds: tuple | None = None, inner_steps: int = 10, control_variates: bool = True,
                 hold_ratio: float | None = HOLD_RATIO, refine_step: float | None = REFINE_STEP):
        if config is not None and config.privacy is not None:
            raise ValueError("the statistics server does not add privacy noise (its messages are second-order "
                             "statistics): use FederatedServer for a fit with privacy")
        if not taylor_radius > 0 or not loglik_tol > 0:
            raise ValueError("taylor_radius and loglik_tol must be > 0")
        threshold = None if config is None else config.agg_threshold
        super().__init__(n_workers, knots, kernel, config, start)
        if self.config.mode == "async" and threshold is None:  # aggregating is cheap here: every answer counts
            self.config = dataclasses.replace(self.config, agg_threshold=1)
        self.taylor_radius = float(taylor_radius)
        self.stale_tol = float(stale_tol) if stale_tol is not None else min(1e-2, max(np.sqrt(self.config.tol),
                                                                                       10 * self.config.tol))
        self.loglik_tol = float(loglik_tol)
        self.inner_steps = int(inner_steps)
        self.control_variates = bool(control_variates)
        self.hold_ratio = None if hold_ratio is None else float(hold_ratio)
        self.refine_step = None if not refine_step else float(refine_step)
        self._refine: dict[int, list[dict]] = {}  # site -> its answers near its u_j so far (stale.refine_points)
        self._earlier: dict[int, list[dict]] = {}  # site -> its two answers before its latest (second order)
        self._secant: dict[int, dict] = {}  # site -> its latest statistics with third derivatives (stale.secant)
        self._settled = False  # the last asynchronous step was short with room to go farther (refining pays off)
        self._slow: list[int] = []  # sites classed slow by their round-trip times (async, _classify)
        self._held: list[int] = []  # slow sites waiting for the others' surrogate to settle
        self._hold_answers = 0  # answers of the other sites when the hold began
        self._sent_at: dict[int, float] = {}  # site -> time its task in flight was handed out
        self._durations: dict[str, dict[int, float]] = {}  # step -> site -> duration of its last round trip
        self._after_surrogate = False  # the last aggregation stepped on a surrogate (async)
        self._fallback = False  # async that did not settle in STALL_ROUNDS: exact steps from then on
        self._loop_t0 = 0.0  # time the statistics loop began
        # [published u, the u it stepped from, the increase of ℓ it promised, the ℓ there, the sites it was exact for]
        self._promise: list | None = None
        self._user_bounds = None if bounds is None else tuple(np.asarray(b, dtype=float) for b in bounds)
        self.bounds: tuple[np.ndarray, np.ndarray] | None = None
        self.boundary: tuple[str, ...] = ()
        self.answers = [0] * self.n_workers
        self.accepted: list[tuple[int, float]] = []  # (iteration, exact ℓ) of every accepted exact point
        self._stats: dict[int, dict] = {}  # site -> its latest statistics (with "t" of its request)
        self._rounds: dict[str, dict] = {}  # u (hex of its bytes) -> {"sum": exact statistics summed, "sites": [j]} at that u
        self._new = 0  # answers since the last aggregation
        self._wait_until: float | None = None  # waiting for answers due soon: aggregate at this time without them
        self._u: np.ndarray | None = None  # the published u
        self._anchor: tuple[Profile, dict] | None = None  # last accepted exact point: (profile, summed statistics)
        self._anchor_t = -1
        self._radius = float(self.config.step_bound)
        self._last_step = 0.0
        self._toward = [0, 0, 0]  # consecutive exact steps of ≥ PROBE_STEP per log-parameter, signed by direction
        self._probed: list[int] = []  # log-parameters already tried at a bound (once each)
        self._last_pred = 0.0
        self._final_t: int | None = None
        self._final_reason: str | None = None

    @property
    def mode(self) -> str:
        return self.config.mode

    @property
    def _synchronous(self) -> bool:
        """Every aggregation waits for all sites: sync mode, or async after STALL_ROUNDS without settling."""
        return self.mode == "sync" or self._fallback

    @property
    def rounds(self) -> float:
        """Round trips so far, the unit of max_iter: iterations (sync), answers per active site (async, where every
        answer may start an aggregation)."""
        if self.mode == "sync":
            return float(self.t + 1)
        return sum(self.answers[j] for j in self.active) / len(self.active)

    # --- runtime side ---------------------------------------------------------------------------------
    def receive(self, qs: Quantity | Sequence[Quantity], now: float) -> None:
        """Statistics (or φ₀ summaries) that arrived at `now`; a batch enters before the server aggregates."""
        for q in [qs] if isinstance(qs, Quantity) else qs:
            if q.worker in self._sent_at:
                self._durations.setdefault(q.step, {})[q.worker] = float(now) - self._sent_at.pop(q.worker)
        if self.phase in ("moments", "variogram"):
            return super().receive(qs, now)
        self._last_now = float(now)
        for q in [qs] if isinstance(qs, Quantity) else qs:
            j = q.worker
            p = self._in_flight.pop(j, None)
            if p is None:
                raise RuntimeError(f"worker {j} sent a quantity without a task in flight")
            if (q.t, q.step) != (p.t, p.step):
                raise RuntimeError(f"worker {j} answered ({q.t}, {q.step}) to task ({p.t}, {p.step})")
            if j in self._obsolete or self.phase == "done":
                self._obsolete.discard(j)
                continue
            if "refine" in p.extra:
                self._refined(j, q.xi)
                continue
            previous = self._stats.get(j)
            self._stats[j] = {**q.xi, "t": int(q.t)}
            self._refined(j)
            self._secant_model(j, previous)
            self._remember(j)
            if j in self._slow and self.phase == "loop":
                self._hold_back([j])
            self.answers[j] += 1
            self._new += 1
        self._progress(now)

    def _remember(self, j: int) -> None:
        live = [p.params.u for p in self._asked().values()]
        stale.remember(self._rounds, self._stats, j, live)

    def _asked(self) -> dict[int, Augmented]:
        """The requests for statistics at a published u in flight (not the refining ones), by site."""
        return {j: p for j, p in self._in_flight.items() if p.step == STATS_STEP and "refine" not in p.extra}

    def _refined(self, j: int, nearby: dict | None = None) -> None:
        """Site j's answers near its u_j (_refine_task), with `nearby` a new one: those still between ½ and 1½
        REFINE_STEP from u_j are kept (the published u often moves by less than that while a slow site computes), and
        once they span u with c, j's model is third order (stale.refined) and the surrogate is maximised again."""
        st = self._stats.get(j)
        kept = self._refine.pop(j, [])
        if st is None or self.refine_step is None:
            return
        if nearby is not None:
            kept.append(nearby)
        h = self.refine_step
        kept = [x for x in kept if 0.5 * h <= float(np.max(np.abs(x["u"] - st["u"]))) <= 1.5 * h]
        if len(kept) < len(stale.refine_points(st, h, *self.bounds)):
            if kept:
                self._refine[j] = kept
            return
        try:
            self._stats[j] = {**stale.refined(st, kept), "t": st["t"]}
        except ValueError:  # the answers kept do not span u (two along one direction): ask again
            return
        self._refine[j] = kept
        if nearby is not None:
            self._new += 1

    def _secant_model(self, j: int, previous: dict | None) -> None:
        """Site j's latest statistics with third derivatives from its two answers before (stale.secant, within
        SECANT_REACH), kept apart from its statistics: the surrogate uses them only where refining (_refined) gave
        none, and a site with a secant model still refines."""
        earlier = self._earlier.setdefault(j, [])
        if previous is not None:
            earlier.append({key: value for key, value in previous.items() if key not in THIRD})
            del earlier[:-2]
        self._secant.pop(j, None)
        st = self._stats[j]
        near = [x for x in earlier if 1e-4 <= float(np.max(np.abs(x["u"] - st["u"]))) <= SECANT_REACH]
        if len(near) == 2 and "d3S" not in st:
            self._secant[j] = {**stale.secant(st, near), "t": st["t"]}

    def _first_due(self, but: int | None = None) -> float:
        """When the last slow site (other than `but`) asked for its first statistics is due to answer, −∞ when none
        is: its request's time plus its round trip in the initialisation times the median ratio of statistics to
        initialisation round trips over the sites that have both (the kind of the initialisation where that site is
        slowest). Its answer will move u far more than the others' next ones (graded n_j = 200: 0.06 in log β)."""
        stats = self._durations.get(STATS_STEP, {})
        due = -np.inf
        for k in self._asked():
            if k not in self._slow or k in self._stats or k == but or k not in self._sent_at:
                continue
            for step, kind in self._durations.items():
                both = [stats[j] / kind[j] for j in self.active if j in stats and kind.get(j, 0.0) > 0]
                if step != STATS_STEP and k in kind and both:
                    due = max(due, self._sent_at[k] + kind[k] * float(np.median(both)))
        return due

    def _refine_task(self, j: int) -> Augmented | None:
        """Asynchronous mode: for site j (not slow), whose u_j lies within stale_tol of the current u after a short
        surrogate step, the next point near u_j at which to refine its model (REFINE_STEP), if its refining answers
        fit before a slow site's first statistics are due (_first_due); None otherwise.
        Refining comes before answering at a u that moved by less than stale_tol (while a slow site computes, stale
        models of the others move u by ~1e-4 again and again: a site re-asked each time would never refine). Equal
        sites never refine."""
        st = self._stats.get(j)
        if (self.refine_step is None or self._synchronous or self.phase != "loop" or st is None or "d3S" in st
                or j in self._slow or not self._settled or float(np.max(np.abs(st["u"] - self._u))) > self.stale_tol):
            return None
        own = self._durations.get(STATS_STEP, {}).get(j)
        if own is None:
            return None
        kept = [(x["u"] - st["u"]) / np.max(np.abs(x["u"] - st["u"])) for x in self._refine.get(j, [])]
        points = [v for v in stale.refine_points(st, self.refine_step, *self.bounds)
                  if not any(abs(float((v - st["u"]) @ d)) > 0.5 * self.refine_step for d in kept)]
        if not points or self._last_now + len(points) * own > self._first_due(but=j):
            return None  # its refining answers would not be in before the slow site's
        p = Augmented(self.params.with_u(points[0]), self.t, STATS_STEP, extra={"refine": st["u"]})
        self._in_flight[j] = p
        self._sent_at[j] = self._last_now
        return p

    def next_task(self, j: int) -> Augmented | None:
        """The front of ℙ_j, except that a site is not asked again at the u it last answered (it would send the
        same statistics): it stays idle until a new u is published."""
        if (self.phase in ("loop", "final") and not self.busy(j) and self._P[j] and j in self._stats
                and self._P[j][0].step == STATS_STEP and np.array_equal(self._P[j][0].params.u, self._stats[j]["u"])):
            if self.phase == "final":  # its answer at this u is already in: it counts for the final pass
                self._P[j].pop(0)
            return self._refine_task(j)
        if j in self._held and self.phase == "loop" and not self._release_held():
            return None
        refine = self._refine_task(j)
        if refine is not None:
            return refine
        p = super().next_task(j)
        if p is not None:
            self._sent_at[j] = self._last_now
        return p

    def _classify(self) -> None:
        """Asynchronous mode: which sites are slow (stale.slow_sites, by their latest round-trip times)."""
        self._slow = [] if self._synchronous or self.hold_ratio is None else stale.slow_sites(
            self._durations, self.active, self._n_j, self.hold_ratio, MIN_COVERAGE, STATS_STEP)

    def _hold_back(self, sites) -> None:
        """Hold slow sites back until the others' surrogate settles. A slow site asked at a point the fit is still
        leaving would answer at a u long left behind (its model then misleads the surrogate); asked where the others
        settled, its answer is near the optimum, where its model errs by ~1e-4 in u."""
        self._held = sorted(set(self._held) | set(sites))
        self._hold_answers = sum(self.answers[k] for k in self.active if k not in self._held)

    def _release_held(self) -> bool:
        """Release the held sites when the others' surrogate settled (_aggregate), when the others answered
        HOLD_ROUNDS times each since the hold began, or when nothing else is pending (every other site idle at the
        current u); slow sites are then re-classified by their latest round-trip times."""
        others = [k for k in self.active if k not in self._held]
        asked = self._asked()
        waiting = all(k not in asked and k in self._stats and np.array_equal(self._stats[k]["u"], self._u)
                      for k in others)
        answered = sum(self.answers[k] for k in others) - self._hold_answers
        if waiting or answered >= HOLD_ROUNDS * len(others):
            self._release()
        return not self._held

    def _release(self) -> None:
        self._held = []
        self._classify()

    def drop_worker(self, j: int, step: str, cause: str, now: float) -> None:
        """Continue without site j: its statistics leave the sums, N and the thresholds."""
        self._remove_worker(j, step, cause, now)
        self._P[j] = []
        self._in_flight.pop(j, None)
        self._obsolete.discard(j)
        self._collected.pop(j, None)
        self._stats.pop(j, None)
        self._earlier.pop(j, None)
        self._secant.pop(j, None)
        if self._n_j:
            self.n_obs = sum(self._n_j[k] for k in self.active)
        if self.phase in ("moments", "variogram"):
            self._complete_synchronous(now)
        elif self.phase != "done":
            self._anchor, self._anchor_t = None, -1  # the sums changed: the old accepted value is not comparable
            self._progress(now)

    def snapshot(self) -> dict:
        """FederatedServer.snapshot plus this server's state under "stats_server" (docs/recovery.md)."""
        snap = super().snapshot()
        snap["stats_server"] = copy.deepcopy({name: getattr(self, name) for name in _STATE})
        return snap

    @classmethod
    def restore(cls, snapshot: Mapping) -> StatsServer:
        """A StatsServer continuing from `snapshot`; the tasks that were in flight are re-sent by dispatch()."""
        if "stats_server" not in snapshot:
            raise ValueError("this snapshot was written by FederatedServer, not StatsServer: restore it with "
                             "FederatedServer.restore")
        server = super().restore(snapshot)
        for name, value in copy.deepcopy(dict(snapshot["stats_server"])).items():
            setattr(server, name, value)
        return server

    # --- loop ----------------------------------------------------------------------------------------
    def _begin_loop(self, now: float, estimated: Mapping | None = None) -> None:
        """φ₀ (init.initial_params, `start` overriding), the box for u, and the first request to every site."""
        values = {"gamma": self._ols_gamma, **(estimated or {}), **self.start}
        self.bounds = self._user_bounds or default_bounds(self._s2, self._diameter)
        params = init.initial_params(values["gamma"], values["delta"], values["sigma2"], values["beta"],
                                     self.knots, self.kernel)
        u = np.clip(params.u, *self.bounds)
        self.params = params.with_u(u)
        self._record("init", now, 0)
        self._loop_t0 = float(now)
        self.phase = "loop"
        self._classify()  # by the initialisation round trips
        self._hold_back(self._slow)
        self._publish_u()

    def _publish_u(self) -> None:
        """Ask every site for its statistics at u of `params` (a newer request replaces an older one in ℙ_j); u is
        read back from params exactly as the sites will (log of exp), so fresh answers match it bit for bit."""
        self._u = self.params.u
        self._publish(Augmented(self.params, self.t, STATS_STEP))

    def _progress(self, now: float, wait: bool = True) -> None:
        """Aggregate when the mode's condition holds (async: unless `wait` and _worth_waiting), then check the
        time budget."""
        self._wait_until = None
        if self.phase == "final":
            if self._exact_here():
                self._after_final_pass(now)
        elif self.phase == "loop":
            if self._synchronous:
                if self._exact_here():
                    self._aggregate(now)
            elif ((self._new >= min(self.config.agg_threshold, len(self.active)) or (self._new and not self._asked()))
                  and not (wait and self._worth_waiting(now))):
                self._aggregate(now)  # or fewer answers than the threshold when no other answer can come
        budget = self.config.time_budget
        if self.phase == "loop" and budget is not None and now >= budget:
            self._stop("time_budget", now)

    def _exact_here(self) -> bool:
        """Every active site answered at the published u."""
        return all(j in self._stats and np.array_equal(self._stats[j]["u"], self._u) for j in self.active)

    def _surrogate(self, u_at: np.ndarray):
        """(function u ↦ summed statistics, largest move allowed, staleness in iterations), or None while the sites
        that can be used hold less than MIN_COVERAGE of the observations.

        Sites whose u_j lie within taylor_radius of u_at (∞-norm) enter through their models (stale.site_models); the
        others (no statistics yet, or an answer from a u the fit has since left) are stood in for by the used ones
        scaled by N / Σ n_j used. The move is limited so that no used model is evaluated farther than taylor_radius
        from its u_j: the trust radius shrinks with the stalest Δu (a used site never drops out before it answers)."""
        have = {j: float(np.max(np.abs(u_at - st["u"]))) for j, st in self._stats.items() if j in self.active}
        used = sorted(j for j, du in have.items() if du <= self.taylor_radius)
        n_used = sum(int(self._stats[j]["n"]) for j in used)
        if n_used < MIN_COVERAGE * self.n_obs:
            return None
        stalest = max(have[j] for j in used)
        stale_t = self.t + 1 if len(used) < len(self.active) else max(self.t - self._stats[j]["t"] for j in used)
        models = {j: self._secant[j] if j in self._secant and "d3S" not in st else st for j, st in self._stats.items()}
        at = stale.site_models(models, self._rounds, used, self.n_obs / n_used, self.control_variates)
        return at, min(self._radius, self.taylor_radius - stalest), stale_t, used if stalest == 0 else None

    def _aggregate(self, now: float) -> None:
        """One iteration: the exact (all fresh) or surrogate profile at the published u, acceptance, step, publish."""
        self._new = 0
        lower, upper = self.bounds
        exact = self._exact_here()
        staleness = 0
        if exact:
            total = sum_statistics([self._stats[j] for j in self.active])
            try:
                here = profile_loglik(total, self.knots, self.kernel)
            except NotPositiveDefinite:
                here = None
            consecutive = self._anchor is not None and (self._synchronous or self._anchor_t == self.t - 1)
            if consecutive and (here is None or here.loglik < self._anchor[0].loglik - 1e-12 * abs(here.loglik)):
                self._radius = max(0.25 * self._last_step, 1e-6)  # rejected: a shorter step from the accepted point
            else:
                if consecutive and self._last_pred > self.loglik_tol:  # below: ratio is rounding noise
                    self._update_radius((here.loglik - self._anchor[0].loglik) / self._last_pred)
                elif here is not None:
                    self._check_promise(lambda u: taylor_statistics(total, u), here.loglik, list(self.active))
                if here is None:
                    raise NotPositiveDefinite("the summed statistics are not positive definite at the first point")
                self._anchor, self._anchor_t = (here, total), self.t
                self.accepted.append((self.t, here.loglik))
            base, base_stats = self._anchor
            at = lambda u: taylor_statistics(base_stats, u)  # noqa: E731
            # async after surrogate steps: the step is checked by no exact answer before it is published
            radius = min(self._radius, self.taylor_radius) if self._after_surrogate else self._radius
            self._after_surrogate = False
        else:
            surrogate = self._surrogate(self._u)
            if surrogate is None:  # too few observations heard from yet: wait for more answers
                return
            at, radius, staleness, exact_for = surrogate
            self._after_surrogate = True
            try:
                base = profile_loglik(at(self._u), self.knots, self.kernel)
            except NotPositiveDefinite:  # the models disagree here: wait for fresher answers at this u
                return
            self._check_promise(at, base.loglik, exact_for)

        if exact:  # one Newton step, verified by the sites' exact answers at the next round
            step = trust_region_step(base.u, base.grad, base.hess, radius, lower, upper, floor=EIG_FLOOR)
            probe = self._probe(base.u, step, radius)
            new = None if probe else self._evaluate(at, base.u + step.p)
            step = probe or step
            if new is None:  # a probe, or the model is not usable there: publish u with the current μ, Σ, γ
                new = dataclasses.replace(base, u=base.u + step.p)
        else:
            new, step = self._maximise(at, base, radius)
            if float(np.max(np.abs(new.u - base.u))) <= self.config.tol:
                new = base  # no move: the sites already answered here stay idle (next_task)
            move = float(np.max(np.abs(new.u - base.u)))
            if self._held and move <= RELEASE_TOL:
                self._release()  # the others' surrogate settled: ask the held sites at the next u
            self._settled = move <= HOLD_TOL < 0.5 * radius  # a short move not for want of room
            self._promise = [new.u.tolist(), base.u.tolist(), new.loglik - base.loglik, base.loglik,
                             exact_for] if move > 0 else None
        self.boundary = step.at_bound
        change = float(np.max(np.abs(step.p if exact else new.u - base.u)))
        dgamma = float(np.max(np.abs(new.gamma - base.gamma)) / max(np.max(np.abs(base.gamma)), 1e-300)) \
            if base.gamma.size else 0.0
        small = max(change, dgamma) <= self.config.tol and step.predicted <= self.loglik_tol
        self._last_step, self._last_pred = float(np.linalg.norm(step.p)), step.predicted
        self.iterations = self.t + 1
        if small and exact:
            self._finish(base, "tol", now)
            return
        if small and not exact and staleness <= self.t and self._stalest_u(base.u) <= self.stale_tol:
            self._set_params(base)
            self._record(STATS_STEP, now, staleness, base.loglik)
            self._begin_final("tol", now)
            return
        self._set_params(new)
        self._record(STATS_STEP, now, staleness, new.loglik)
        if self.rounds >= self.config.max_iter:
            self._stop("max_iter", now)
            return
        if not self._synchronous and (self.rounds >= STALL_ROUNDS or self._later_than_sync(now)):
            self._fallback = True  # stale models have not settled: finish with exact steps (every site at each u)
            self._release()
        self._next_iteration()
        self._publish_u()

    def _probe(self, u: np.ndarray, step: Step, radius: float) -> Step | None:
        """The step with one log-parameter moved to its bound (PROBE_AFTER, PROBE_STEP), or None. Only Newton
        steps inside the trust region count: a step the radius cut short is a far start, not a flat ℓ."""
        lower, upper = self.bounds
        probe = None
        free = float(np.linalg.norm(step.p)) < 0.99 * radius
        for i, d in enumerate(step.p):
            sign = 0 if not free else 1 if d >= PROBE_STEP else -1 if d <= -PROBE_STEP else 0
            k = self._toward[i]
            self._toward[i] = k + sign if sign and np.sign(k) == sign else sign
            if probe is None and abs(self._toward[i]) >= PROBE_AFTER and i not in self._probed:
                p = step.p.copy()
                p[i] = (upper[i] if sign > 0 else lower[i]) - u[i]
                self._probed.append(i)
                probe = Step(p=p, predicted=0.0, at_bound=at_bound(u + p, lower, upper))  # the exact ℓ decides
        return probe

    def _maximise(self, at, base: Profile, max_move: float):
        """Safeguarded Newton iterations on the surrogate u ↦ ℓ(at(u)) from base.u, each kept only if the surrogate
        does not decrease, within ‖u − base.u‖₂ ≤ max_move; returns (the point reached, its last step)."""
        lower, upper = self.bounds
        cur, r, last = base, max_move, None
        for _ in range(self.inner_steps):
            room = max_move - float(np.linalg.norm(cur.u - base.u))
            if room <= 1e-12:
                break
            step = trust_region_step(cur.u, cur.grad, cur.hess, min(r, room), lower, upper,
                                     floor=EIG_FLOOR)
            if last is None:
                last = step
            if not np.any(step.p):
                last = step
                break
            try:
                trial = profile_loglik(at(cur.u + step.p), self.knots, self.kernel)
            except NotPositiveDefinite:
                trial = None
            if trial is None or trial.loglik < cur.loglik:
                r = 0.25 * float(np.linalg.norm(step.p))
                continue
            cur, last = trial, step
            if float(np.max(np.abs(step.p))) <= self.config.tol:
                break
        if cur is base:  # no step kept: stay
            last = trust_region_step(base.u, base.grad, base.hess, 0.0, lower, upper)
        return cur, last

    def _worth_waiting(self, now: float) -> bool:
        """Asynchronous aggregation waits (until `alarm`) for a site in flight that can still answer soon: answers
        that come together enter the step exactly instead of as stale models. A site whose answer is due (its
        request's time plus its last round trip) within WAIT × the median round trip is waited for that long; one
        with no round trip of statistics yet was not classed slow, so it is waited for until HOLD_RATIO × the
        median has passed since its request (graded n_j = 200: 190 aggregations → ~30; equal sites with jittered
        answers: docs/algorithm.md). An answer that does not come by then is not waited for, but each new answer
        opens a new window from its own time, so while answers keep arriving an overdue site is waited for again
        (anchoring the window at the first answer not yet aggregated was measured and not kept: graded n_j = 200
        0.53 → 0.78, docs/algorithm.md "Still weak")."""
        last = self._durations.get(STATS_STEP, {})
        known = [last[j] for j in self.active if j in last]
        if not known:
            return False
        median = float(np.median(known))
        soon, until = now + WAIT * median, []
        for j, p in self._asked().items():
            if j not in self._sent_at or j in self._obsolete:
                continue
            if j in last:  # due soon (or overdue): wait WAIT × the median, no longer
                until.append(soon if self._sent_at[j] + last[j] <= soon else now)
            else:  # not classed slow: due within HOLD_RATIO × the median of its request
                until.append(self._sent_at[j] + (self.hold_ratio or HOLD_RATIO) * median)
        deadline = max(until, default=now)
        if deadline > now:
            self._wait_until = deadline
            return True
        return False

    @property
    def alarm(self) -> float | None:
        """While waiting for answers due soon (_worth_waiting): when to aggregate without them."""
        return self._wait_until

    def tick(self, now: float) -> None:
        """The wait ran out with no answer: aggregate the answers in (and check the time budget). A tick with no
        alarm set, or before it, changes nothing."""
        if self.phase == "loop" and self._wait_until is not None and now >= self._wait_until:
            self.clock(now)
            self._progress(now, wait=False)

    def _later_than_sync(self, now: float) -> bool:
        """The asynchronous loop has run SYNC_ROUNDS round trips of the slowest site (its last, or the one it is in):
        about what a synchronous fit needs to converge, so stale models are no longer paying off."""
        if not all(j in self._stats for j in self.active):  # a held site not asked yet: its round trip is unknown
            return False
        last = self._durations.get(STATS_STEP, {})
        slowest = max(max(last.get(j, 0.0), now - self._sent_at.get(j, now)) for j in self.active)
        return slowest > 0 and now - self._loop_t0 >= SYNC_ROUNDS * slowest

    def _check_promise(self, at, loglik: float, exact_for: list | None = None) -> None:
        """Asynchronous trust region: the last surrogate step promised an increase ℓ(u_new) − ℓ(u_old). Once newer
        answers give a newer model `at` (with ℓ = `loglik` at the published u_new), the increase it sees between the
        same two points, over the promised one, sets the radius as in the synchronous case. Both ends are evaluated
        on the newer model: its level moves as sites enter or leave the stand-in, its slope is what is checked. A
        surrogate that exploits its own model error (a stale model extrapolated too far) is reined in. When the same
        sites answered at both points (`exact_for`), the ℓ at u_old is their exact one, not the newer model's
        extrapolation back (which on straggler seed 2 let steps of 0.4 in log β cycle for half a slow round trip)."""
        promise, self._promise = self._promise, None
        if (promise is None or not np.allclose(promise[0], self._u, rtol=0.0, atol=1e-9)
                or not promise[2] > self.loglik_tol):  # published u = log(exp(u)): equal to rounding
            return
        start = np.asarray(promise[1])
        step, moved = float(np.max(np.abs(self._u - start))), float(np.linalg.norm(self._u - start))
        if exact_for is not None and list(exact_for) == list(promise[4] or ()):
            old = promise[3]
        elif step > HOLD_TOL or moved >= 0.99 * self._radius:  # judged; a step cut at the radius: may it grow?
            at_old = self._evaluate(at, start)
            old = None if at_old is None else at_old.loglik
        else:
            old = None
        if old is None:  # a step this short cannot exploit model error: new answers only moved the optimum
            return
        self._last_step = moved
        self._update_radius((loglik - old) / promise[2])
        self._radius = max(self._radius, HOLD_TOL)

    def _update_radius(self, ratio: float) -> None:
        """Trust-region radius from actual / predicted increase of ℓ: shrink below 0.25, grow (up to
        RADIUS_GROWTH·step_bound) above 0.75 when the step reached the radius."""
        if ratio < 0.25:
            self._radius = max(0.25 * self._last_step, 1e-6)
        elif ratio > 0.75 and self._last_step >= 0.99 * self._radius:
            self._radius = min(2.0 * self._radius, RADIUS_GROWTH * float(self.config.step_bound))

    def _evaluate(self, at, u) -> Profile | None:
        try:
            return profile_loglik(at(u), self.knots, self.kernel, derivatives=False)
        except NotPositiveDefinite:
            return None

    def _stalest_u(self, u) -> float:
        return max((float(np.max(np.abs(u - self._stats[j]["u"]))) if j in self._stats else np.inf)
                   for j in self.active)

    def _next_iteration(self) -> None:
        self.t += 1

    def _set_params(self, pr: Profile) -> None:
        self.params = Params(mu=pr.mu, Sigma=pr.Sigma, gamma=pr.gamma, delta=float(np.exp(pr.u[0])),
                             sigma2=float(np.exp(pr.u[1])), beta=float(np.exp(pr.u[2])))

    def _stop(self, reason: str, now: float) -> None:
        """max_iter or time budget: report the last accepted exact point (sync) or run the final exact pass."""
        if self._synchronous and self._anchor is not None:
            self._finish(self._anchor[0], reason, now)
        else:
            self._begin_final(reason, now)

    def _begin_final(self, reason: str, now: float) -> None:
        """Ask every site for exact statistics at the current u (tasks in flight still arrive and are kept)."""
        self._final_reason = reason
        self.phase = "final"
        self._next_iteration()
        self._final_t = self.t
        self._publish_u()
        if self._exact_here():  # every site already answered at this u
            self._after_final_pass(now)

    def _after_final_pass(self, now: float) -> None:
        """Exact statistics of every site at the final u: converged → done; otherwise (tol) continue the loop."""
        reason = self._final_reason
        if reason != "tol":
            total = sum_statistics([self._stats[j] for j in self.active])
            self._finish(profile_loglik(total, self.knots, self.kernel), reason, now)
            return
        self.phase = "loop"
        self._anchor, self._anchor_t = None, -1
        self._aggregate(now)

    def _finish(self, pr: Profile, reason: str, now: float) -> None:
        """Report the exact estimate and ℓ_LR at pr (the "final" trace row) and stop."""
        self._set_params(pr)
        self.boundary = at_bound(pr.u, *self.bounds)
        self.loglik = pr.loglik
        self.stop_reason = reason
        self.converged = reason == "tol"
        self._record("final", now, 0, self.loglik)
        self._P = [[] for _ in range(self.n_workers)]
        self._obsolete = set(self._in_flight)
        self.phase = "done"
