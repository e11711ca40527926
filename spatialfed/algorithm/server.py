"""The federated server of Algorithms 1 and 3 as a sans-IO state machine (SPEC §4).

The server holds the worker buffers ℙ_j (sub-step-aware FIFO), the server buffer ℚ (latest quantity per worker and
step), the counters Num.step and the parameter tuple φ. A runtime asks `next_task(j)` when worker j is idle, runs
`protocol.evaluate` there, and hands the result back with `receive(q, now)` (or a batch of results that arrived
together). `agg_threshold = J` with every strategy off is the synchronous algorithm of Section 3.1
(`mean_step="block"`: μ,Σ → γ → θ; the default `"joint"` updates (μ, Σ, γ) together at the mu_sigma step).

Phases: "moments" → "variogram" (summaries for φ₀, start.py) → "loop" (iteration t = 0 is Algorithm 1's synchronous
pass, t ≥ 1 are Algorithm 3's iterations) → "final" (synchronous μ*, Σ* at the final (γ, δ, θ)) → "value" (ℓ_LR at
that estimate) → "done".
"""

from __future__ import annotations

import copy
import dataclasses
from collections import deque
from collections.abc import Mapping

import numpy as np

from spatialfed.algorithm import start as starting
from spatialfed.algorithm.config import BlockScheme, FitConfig
from spatialfed.algorithm.privacy import PrivacyAccountant, project_spd
from spatialfed.algorithm.protocol import FINAL_STEP, STEPS, Augmented, Quantity
from spatialfed.algorithm.server_base import Phase, ServerState  # noqa: F401 (ServerState: the servers' shared base)
from spatialfed.algorithm.strategies import (
    aggregate,
    corrected_gradient,
    dominance_weights,
    moving_average,
    section5_step_size,
    staleness_step_size,
    staleness_weights,
    uniform_weights,
)
from spatialfed.errors import check_finite, check_positive
from spatialfed.model import blocks
from spatialfed.model.params import Params

START_KEYS = ("gamma", "delta", "sigma2", "beta")

#: version of the snapshot dict (FederatedServer.snapshot); bump when its keys change meaning
SNAPSHOT_FORMAT = 2

#: snapshot key -> server attribute, for the state that is copied as is (snapshot() and restore() share this table)
_SNAPSHOT_STATE = {
    "n_workers": "n_workers", "knots": "knots", "kernel": "kernel", "start": "start",
    "phase": "phase", "t": "t", "step_index": "_step", "iterations": "iterations", "params": "params",
    "loglik": "loglik", "n_obs": "n_obs", "converged": "converged", "stop_reason": "stop_reason", "trace": "trace",
    "Q": "_Q", "counters": "_num", "collected": "_collected", "grad_norm": "_grad_norm",
    "loglik_estimate": "_loglik_estimate", "end_of_last_iteration": "_end_of_last_iteration",
    "small_changes": "_small_changes", "ols_gamma": "_ols_gamma", "s2": "_s2", "diameter": "_diameter",
    "cutoff": "_cutoff", "time_s": "_last_now", "active": "active", "dropped": "dropped", "n_j": "_n_j",
    "arrivals": "_arrivals", "discarded": "discarded", "accountant": "_accountant",
}


def relative_change(old: Params, new: Params) -> float:
    """Stopping statistic: max(‖Δu‖∞, ‖Δγ‖∞ / ‖γ‖∞); u is log-scale, so both are relative changes."""
    du = np.max(np.abs(new.u - old.u))
    dgamma = np.max(np.abs(new.gamma - old.gamma)) / max(np.max(np.abs(old.gamma)), np.finfo(float).tiny)
    return float(max(du, dgamma))


class FederatedServer(ServerState):
    """Sans-IO server of Algorithms 1 and 3: quantities in (`receive`), augmented parameters out (`next_task`)."""

    def __init__(self, n_workers: int, knots, kernel, config: FitConfig | None = None, start: Mapping | None = None):
        self.n_workers = J = int(n_workers)
        self.config = (config or FitConfig()).resolved(J)
        if isinstance(self.config.scheme, BlockScheme):
            self.block = self.config.scheme
        elif type(self) is FederatedServer:
            raise ValueError("a statistics-scheme config runs on StatsServer (algorithm.make_server.server_for)")
        else:  # StatsServer shares the state; the block settings it never reads keep their defaults
            self.block = BlockScheme()
        self.knots = np.asarray(knots, dtype=float)
        self.kernel = kernel
        self.start = _check_start(start)
        self._P: list[list[Augmented]] = [[] for _ in range(J)]  # ℙ_j, kept on the server
        self._in_flight: dict[int, Augmented] = {}
        self._obsolete: set[int] = set()  # workers whose in-flight task predates the final pass
        self._start_state(J)
        self._n_j: dict[int, int] = {}  # n_j from the moments pass, so N follows the active workers
        self._arrivals = [0] * J  # quantities received per worker in the loop (dominance correction)
        self.discarded = 0  # quantities dropped for staleness > D (staleness_bound)
        self._accountant = None if self.config.privacy is None else PrivacyAccountant(self.config.privacy)
        self._Q: dict[tuple[int, str], tuple[Quantity, Params]] = {}  # ℚ: (j, step) -> (q, φ it was computed at)
        self._num = dict.fromkeys(STEPS, 0)  # Num.step
        self._collected: dict[int, dict] = {}  # synchronous passes: worker -> ξ
        self._history = {step: deque(maxlen=self.block.t_M) for step in STEPS}  # block updates, newest first
        self._grad_norm = 0.0  # ‖g^{t−1}‖ of Eq. (18)
        self._loglik_estimate: float | None = None  # −(J Σ_j w_j f_j + h) − (N/2) log 2π of the last theta step
        self._step = 0  # index of the current step in STEPS
        self._end_of_last_iteration: Params | None = None
        self._small_changes = 0
        self._ols_gamma = self._s2 = self._diameter = self._cutoff = None
        self.phase = Phase.MOMENTS
        self._publish(Augmented(None, 0, "moments"))

    # --- the runtime's side ----------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        """True once the final evaluation pass has set `loglik`."""
        return self.phase == Phase.DONE

    def busy(self, j: int) -> bool:
        """Whether worker j has a task in flight."""
        return j in self._in_flight

    def buffer(self, j: int) -> tuple[Augmented, ...]:
        """The pending entries of ℙ_j, front first (for inspection and monitoring)."""
        return tuple(self._P[j])

    @property
    def counters(self) -> dict[str, int]:
        """Num.step: arrivals per step since that step was last aggregated."""
        return dict(self._num)

    def next_task(self, j: int, free: bool = True) -> Augmented | None:
        """Pop the front of ℙ_j for idle worker j (None when ℙ_j is empty); j is busy until its quantity arrives.
        `free`: whether a task of j would start at once where j runs (runtime.free); every task here is needed."""
        if self.busy(j):
            raise RuntimeError(f"worker {j} already has a task in flight; call next_task only for idle workers")
        if self.done or j not in self.active or not self._P[j]:
            return None
        p = self._P[j].pop(0)
        self._in_flight[j] = p
        return p

    def _receive(self, qs: list[Quantity], now: float) -> None:
        self._last_now = float(now)
        for q in qs:
            j = q.worker
            p = self._in_flight.pop(j)
            if self._accountant is not None:
                self._accountant.record(j, self.config.privacy.released(q.xi))
            if j in self._obsolete:
                self._obsolete.discard(j)
            elif self.phase == Phase.LOOP:
                self._Q[(j, q.step)] = (q, p.params)
                self._num[q.step] += 1
                self._arrivals[j] += 1
            else:
                self._receive_synchronous(q, now)
        if self.phase == Phase.LOOP:
            self._progress(now)

    @property
    def privacy_report(self) -> dict | None:
        """The privacy loss of the fit so far (privacy.PrivacyAccountant.report), None without the mechanism."""
        return None if self._accountant is None else self._accountant.report()

    # --- checkpoint and resume (docs/recovery.md) ----------------------------------------------------
    def snapshot(self) -> dict:
        """Everything needed to continue this fit, as a plain dict of picklable values (a deep copy).

        Keys: "format"; "config" (the resolved FitConfig as a dict); "n_workers", "knots", "kernel", "start";
        the parameters "params", the block updates per step "history" (newest first, the inputs of Eq. 19) and
        "end_of_last_iteration"; "buffers" (ℙ_j, front first, with every task that was in flight put back at the
        front: it is to be re-sent), "resend" ({j: p} of those tasks); "Q" (ℚ: (j, step) -> (q, φ it was computed
        at)), "counters" (Num.step), "collected" (a synchronous pass's quantities so far); "phase", "t",
        "step_index", "iterations", "small_changes", "grad_norm", "loglik_estimate", "converged", "stop_reason",
        "loglik", "n_obs", "ols_gamma", "s2"; "trace"; "time_s" (the runtime clock at the last receive: a resumed
        runtime continues its clock from there so time budgets and trace times carry on). Tasks made obsolete by
        the final pass are dropped, not re-sent.
        """
        resend = {j: p for j, p in sorted(self._in_flight.items()) if j not in self._obsolete}
        state = {key: getattr(self, attr) for key, attr in _SNAPSHOT_STATE.items()}
        state.update(
            format=SNAPSHOT_FORMAT,
            config=self.config.as_dict(),
            buffers=[([resend[j]] if j in resend else []) + list(self._P[j]) for j in range(self.n_workers)],
            resend=resend,
            history={step: list(values) for step, values in self._history.items()},
        )
        return copy.deepcopy(state)

    @staticmethod
    def snapshot_attributes() -> set[str]:
        """The attributes FederatedServer.snapshot covers (copied, or rebuilt by restore)."""
        return set(_SNAPSHOT_STATE.values()) | {"config", "block", "_P", "_in_flight", "_obsolete", "_history"}

    @classmethod
    def restore(cls, snapshot: Mapping) -> FederatedServer:
        """A server continuing from `snapshot` (FederatedServer.snapshot): no task in flight; the tasks that were in
        flight wait at the front of their worker's buffer, so the runtime's next dispatch() re-sends them."""
        snap = copy.deepcopy(dict(snapshot))
        version = snap.get("format")
        if version != SNAPSHOT_FORMAT:
            raise ValueError(f"snapshot format {version!r} is not supported (this version reads {SNAPSHOT_FORMAT})")
        if snap.get("diameter") is not None:  # written before the variogram's bins followed the sites' extents
            snap.setdefault("cutoff", 0.5 * snap["diameter"])
        missing = sorted((set(_SNAPSHOT_STATE) | {"config", "buffers", "history"}) - set(snap))
        if missing:
            raise ValueError(f"snapshot is missing {missing}")
        server = cls.__new__(cls)
        for key, attr in _SNAPSHOT_STATE.items():
            setattr(server, attr, snap[key])
        server.phase = Phase(server.phase)
        server.config = FitConfig.from_dict(snap["config"])
        server.block = server.config.scheme if isinstance(server.config.scheme, BlockScheme) else BlockScheme()
        if len(snap["buffers"]) != server.n_workers:
            raise ValueError(f"snapshot has {len(snap['buffers'])} worker buffers for n_workers={server.n_workers}")
        server._P = [list(buffer) for buffer in snap["buffers"]]
        server._in_flight = {}
        server._obsolete = set()
        server._history = {step: deque(snap["history"].get(step, []), maxlen=server.block.t_M)
                           for step in STEPS}
        return server

    def drop_worker(self, j: int, step: str, cause: str, now: float) -> None:
        """Continue without worker j (its computation failed): it leaves the aggregates, the thresholds and N.

        The fit then maximises the likelihood of the remaining workers' data; `dropped` records who, where and why.
        """
        self._remove_worker(j, step, cause, now)
        self._P[j] = []
        self._in_flight.pop(j, None)
        self._obsolete.discard(j)
        self._collected.pop(j, None)
        for key in [key for key in self._Q if key[0] == j]:
            del self._Q[key]
        if self._n_j:
            self.n_obs = sum(self._n_j[k] for k in self.active)
        if self.phase == Phase.LOOP:
            self._progress(now)
        elif self.phase != Phase.DONE:
            self._complete_synchronous(now)

    # --- Algorithm 3: buffers, counters, aggregation ---------------------------------------------------
    def _publish(self, p: Augmented) -> None:
        """Send p to every ℙ_j: it replaces the entry with the same step, else it is appended."""
        if self.config.privacy is not None:  # the workers privatize what they send (privacy.GaussianMechanism)
            p = dataclasses.replace(p, extra={**p.extra, "privacy": self.config.privacy})
        for j in self.active:
            buffer = self._P[j]
            same = [i for i, old in enumerate(buffer) if old.step == p.step]
            if same:
                buffer[same[0]] = p
            else:
                buffer.append(p)

    @property
    def _threshold(self) -> int:
        """Agg_threshold (at most the active workers); Algorithm 1's pass (t = 0) waits for all active workers."""
        active = len(self.active)
        return active if self.t == 0 else min(self.config.agg_threshold, active)

    def _too_stale(self, t_j: int) -> bool:
        """Staleness t − t_j above the bound D (VAFL's uniformly bounded delay; never without a bound)."""
        D = self.block.staleness_bound
        return D is not None and self.t - t_j > D

    def _discard(self, j: int, step: str) -> None:
        """Drop worker j's too-stale quantity of `step` and refresh j: its newest task of that step goes first."""
        self.discarded += 1
        self._Q.pop((j, step), None)
        buffer = self._P[j]
        same = [i for i, p in enumerate(buffer) if p.step == step]
        if same:
            buffer.insert(0, buffer.pop(same[0]))

    def _fresh(self, step: str) -> bool:
        """Every active worker has a quantity of `step` in ℚ no older than D (too-stale ones are discarded)."""
        for j in self.active:
            entry = self._Q.get((j, step))
            if entry is not None and self._too_stale(entry[0].t):
                self._discard(j, step)
        return all((j, step) in self._Q for j in self.active)

    def _progress(self, now: float) -> None:
        """Aggregate while the current step has Num.step ≥ Agg_threshold and fresh quantities from every worker,
        then check the time budget."""
        while (self.phase == Phase.LOOP and self._num[STEPS[self._step]] >= self._threshold
               and self._fresh(STEPS[self._step])):
            self._aggregate(now)
        budget = self.config.stopping.time_budget
        if self.phase == Phase.LOOP and budget is not None and now >= budget:
            self._stop("time_budget", now)

    def _aggregate(self, now: float) -> None:
        """Aggregate the current step (Eq. 17), update its block (Eqs. 8–10), smooth it (Eq. 19) and publish."""
        cfg, step = self.block, STEPS[self._step]
        self._num[step] = 0
        entries = [self._Q[(j, step)] for j in self.active]
        t_js = [q.t for q, _ in entries]
        if cfg.adaptive_weights:
            w = staleness_weights(self.t, t_js, self._grad_norm, cfg.a, cfg.T_c)
        else:
            w = uniform_weights(len(self.active))
        if cfg.dominance and min(t_js) <= cfg.T_c:  # Eq. (18)'s window: uniform afterwards keeps the optimum
            w = dominance_weights(w, [self._arrivals[j] for j in self.active])
        block = {"mu_sigma": self._update_mean, "gamma": self._update_gamma, "theta": self._update_theta}[step](
            entries, w
        )
        if cfg.moving_average:
            block = self._moving_average(step, block)
        self.params = self.params.with_u(block["u"]) if step == "theta" else self.params.replace(**block)
        self._record(step, now, max(self.t - tj for tj in t_js), self._loglik_estimate if step == "theta" else None)
        if step == "theta":
            self._end_iteration(now)
        if self.phase == Phase.LOOP:
            self._step = (self._step + 1) % len(STEPS)
            self._publish(self._task(STEPS[self._step]))

    def _task(self, step: str) -> Augmented:
        """p = (φ, t, step); under mean_step="joint" the mu_sigma task also asks for the gamma quantity at φ."""
        joint = step == "mu_sigma" and self.block.mean_step == "joint"
        return Augmented(self.params, self.t, step, {"with": ("gamma",)} if joint else {})

    def _update_mean(self, entries, w) -> dict:
        """The mu_sigma block: (μ, Σ) given γ (Eq. 8, mean_step="block") or (μ, Σ, γ) given θ ("joint")."""
        if self.block.mean_step == "joint":
            return self._update_mu_sigma_gamma(entries, w)
        return self._update_mu_sigma(entries, w)

    def _update_mu_sigma(self, entries, w) -> dict:
        """Σ⁺ = (Σ_j A_j + K⁻¹)⁻¹, μ⁺ = Σ⁺ Σ_j b_j (Eq. 8 with sums)."""
        agg = aggregate([q.xi for q, _ in entries], w)
        mu, Sigma = blocks.update_mu_sigma(self._spd(agg["A"]), agg["b"], self._K())
        return {"mu": mu, "Sigma": Sigma}

    def _update_mu_sigma_gamma(self, entries, w) -> dict:
        """Exact joint (μ, Σ, γ) given θ (docs/algorithm.md): with W = Σ_j B_jᵀR_j⁻¹X_j, μ̄ = Σ⁺ Σ_j B_jᵀR_j⁻¹z_j,
        γ⁺ = (Σ_j X_jᵀR_j⁻¹X_j − WᵀΣ⁺W)⁻¹ (Σ_j X_jᵀR_j⁻¹z_j − Wᵀμ̄) (GLS given θ) and μ⁺ = μ̄ − Σ⁺Wγ⁺.

        B_jᵀR_j⁻¹z_j = b_j + W_jγ_j and X_jᵀR_j⁻¹z_j = X_jᵀR_j⁻¹(z_j − B_jμ_j) + W_jᵀμ_j at the (γ_j, μ_j) worker j
        computed at, so each worker's contribution depends on its θ_j only.
        """
        stats = [{"A": q.xi["A"], "W": q.xi["BtRX"], "XtRX": q.xi["XtRX"],
                  "Bz": q.xi["b"] + q.xi["BtRX"] @ at.gamma, "Xz": q.xi["XtRr"] + q.xi["BtRX"].T @ at.mu}
                 for q, at in entries]
        agg = aggregate(stats, w)
        mu_bar, Sigma = blocks.update_mu_sigma(self._spd(agg["A"]), agg["Bz"], self._K())
        W = agg["W"]
        gamma = blocks.update_gamma(self._spd(agg["XtRX"] - W.T @ Sigma @ W), agg["Xz"] - W.T @ mu_bar)
        return {"mu": mu_bar - Sigma @ W @ gamma, "Sigma": Sigma, "gamma": gamma}

    def _K(self) -> np.ndarray:
        """K = C_θ(S*, S*) at the current θ."""
        return blocks.knot_covariance(self.knots, self.kernel, self.params.sigma2, self.params.beta)

    def _update_gamma(self, entries, w) -> dict:
        """γ⁺ = (Σ_j X_jᵀR_j⁻¹X_j)⁻¹ Σ_j X_jᵀR_j⁻¹(z_j − B_jμ) (Eq. 9)."""
        agg = aggregate([q.xi for q, _ in entries], w)
        return {"gamma": blocks.update_gamma(self._spd(agg["XtRX"]), agg["XtRr"])}

    def _spd(self, M: np.ndarray) -> np.ndarray:
        """An aggregated Gram matrix, projected onto the SPD cone when privacy noise is on (post-processing)."""
        return M if self.config.privacy is None else project_spd(M)

    def _update_theta(self, entries, w) -> dict:
        """One Newton step on u (Eq. 10) with the corrected gradients of Eq. (15) and the profile or block Hessian."""
        cfg, phi = self.block, self.params
        xis = [q.xi for q, _ in entries]
        if cfg.correction:
            rec = max(entries, key=lambda e: e[0].t)[1]
            xis = [{**xi, "grad": corrected_gradient(xi, at, rec)} for xi, (_, at) in zip(xis, entries)]
        self._grad_norm = float(np.linalg.norm(sum(wj * xi["grad"] for wj, xi in zip(w, xis))))
        agg = aggregate(xis, w)
        h = blocks.h_terms(phi.mu, phi.Sigma, self.knots, self.kernel, phi.sigma2, phi.beta)
        self._loglik_estimate = blocks.loglik_from_f(agg["f"] + h["f"], self.n_obs)
        total = {key: agg[key] + h[key] for key in ("grad", "hess", "d2_du_dmu", "d2_du_dSigma")}
        H = total["hess"]
        if cfg.hessian == "profile":
            H = blocks.profile_hessian(H, total["d2_du_dmu"], total["d2_du_dSigma"], phi.Sigma)
        staleness = [self.t - q.t for q, _ in entries]
        rule = {"staleness": staleness_step_size, "section5": section5_step_size}.get(cfg.alpha_rule)
        alpha = cfg.alpha if rule is None else rule(cfg.alpha, w, staleness)
        u = blocks.newton_step(phi.u, total["grad"], H, alpha=alpha, bound=self.config.step_bound,
                               floor=cfg.eig_floor)
        return {"u": u}

    def _moving_average(self, step: str, block: dict) -> dict:
        """Eq. (19) on the block just updated, over it and its last M = min(t, t_M) updates (not their averages)."""
        previous = list(self._history[step])[: min(self.t, self.block.t_M)]
        self._history[step].appendleft(block)
        return {key: moving_average([value] + [old[key] for old in previous], self.block.omega)
                for key, value in block.items()}

    def _end_iteration(self, now: float) -> None:
        """After the theta step: apply the stopping rules, then move to iteration t + 1.

        Converged: the relative change stayed below tol for `patience` iterations and for longer than the
        stalest quantity in ℚ is old, so the fixed point includes fresh input from every worker (in the
        synchronous algorithm staleness is 0 and this is the plain rule).
        """
        cfg = self.config.stopping
        if self.t >= 1:
            self.iterations = self.t
            change = relative_change(self._end_of_last_iteration, self.params)
            self._small_changes = self._small_changes + 1 if change < cfg.tol else 0
            if self._small_changes >= cfg.patience and self._staleness() < self._small_changes:
                self._stop("tol", now)
            elif self.t >= cfg.max_iter:
                self._stop("max_iter", now)
        self._end_of_last_iteration = self.params
        self.t += 1

    def _staleness(self) -> int:
        """Largest staleness t − t_j in ℚ: the tolerance rule waits until every worker's input is this recent."""
        return max(self.t - q.t for q, _ in self._Q.values())

    def _stop(self, reason: str, now: float) -> None:
        """Leave the loop: drop pending work and start the final synchronous pass at the current φ."""
        self.stop_reason = reason
        self.converged = reason == "tol"
        self._P = [[] for _ in range(self.n_workers)]
        self._obsolete = set(self._in_flight)
        self._begin_synchronous(Phase.FINAL, self._task("mu_sigma"))

    # --- synchronous passes: φ₀ summaries and the final evaluation -------------------------------------
    def _begin_synchronous(self, phase: Phase, p: Augmented) -> None:
        self.phase = phase
        self._collected = {}
        self._publish(p)

    def _receive_synchronous(self, q: Quantity, now: float) -> None:
        self._collected[q.worker] = q.xi
        self._complete_synchronous(now)

    def _complete_synchronous(self, now: float) -> None:
        """Run the phase's next step once every active worker has answered the synchronous pass."""
        if any(j not in self._collected for j in self.active):
            return
        xis = [self._collected[j] for j in self.active]
        {"moments": self._after_moments, "variogram": self._after_variogram, "final": self._after_final,
         FINAL_STEP: self._after_value}[self.phase](xis, now)

    def _after_moments(self, xis, now) -> None:
        self._n_j = {j: int(xi["n"]) for j, xi in zip(self.active, xis)}
        self._ols_gamma, self._s2, self.n_obs = starting.pooled_ols(xis)
        self._diameter = starting.study_diameter(self.knots, xis)
        self._cutoff = starting.variogram_cutoff(self._diameter, xis)
        if all(key in self.start for key in ("delta", "sigma2", "beta")):
            self._begin_loop(now)
        else:
            edges = starting.variogram_edges(self._cutoff)
            self._begin_synchronous(Phase.VARIOGRAM, Augmented(None, 0, "variogram",
                                                           {"gamma": self._ols_gamma, "edges": edges}))

    def _after_variogram(self, xis, now) -> None:
        sums = aggregate(xis, uniform_weights(len(xis)))
        edges = starting.variogram_edges(self._cutoff)
        tau2, sigma2, beta = starting.fit_variogram(sums["sum_sq"], sums["count"], edges, self._start_kernel,
                                                    self._s2, self._diameter)
        self._begin_loop(now, {"delta": 1.0 / tau2, "sigma2": sigma2, "beta": beta})

    @property
    def _start_kernel(self):
        """The fixed-ν Matérn of φ₀: the kernel, or an estimated family's base (model/family.py)."""
        return getattr(self.kernel, "base", self.kernel)

    def _begin_loop(self, now: float, estimated: Mapping | None = None) -> None:
        """φ₀ (start.initial_params, `start` overriding) and Algorithm 1's synchronous pass as iteration t = 0."""
        values = {"gamma": self._ols_gamma, **(estimated or {}), **self.start}
        self.params = starting.initial_params(values["gamma"], values["delta"], values["sigma2"], values["beta"],
                                          self.knots, self.kernel)
        self._record("init", now, 0)
        self._begin_synchronous(Phase.LOOP, self._task(STEPS[0]))

    def _after_final(self, xis, now) -> None:
        """μ*, Σ* at the final (γ, δ, θ) (Eq. 8), or μ*, Σ*, γ* at the final θ under mean_step="joint", from fresh
        quantities of all workers."""
        entries = [(Quantity(xi, self.t, "mu_sigma", j), self.params) for j, xi in zip(self.active, xis)]
        self.params = self.params.replace(**self._update_mean(entries, uniform_weights(len(xis))))
        self._begin_synchronous(Phase.VALUE, Augmented(self.params, self.t, FINAL_STEP))

    def _after_value(self, xis, now) -> None:
        """ℓ_LR = −(Σ_j f_j + h) − (N/2) log 2π at (μ*, Σ*) (SPEC §1); recorded as the trace's "final" row."""
        phi = self.params
        h = blocks.h_terms(phi.mu, phi.Sigma, self.knots, self.kernel, phi.sigma2, phi.beta)
        self.loglik = blocks.loglik_from_f(sum(xi["f"] for xi in xis) + h["f"], self.n_obs)
        self._record("final", now, 0, self.loglik)
        self.phase = Phase.DONE

    def _record(self, step: str, now: float, max_staleness: int, loglik: float | None = None) -> None:
        """One trace row; `loglik` on theta rows is the estimate from the aggregated f_j, on the final row ℓ_LR
        (whose iter is the last completed iteration)."""
        phi = self.params
        self.trace.append({"iter": self.iterations if step == "final" else self.t, "time_s": float(now), "step": step, "delta": phi.delta,
                           "sigma2": phi.sigma2, "beta": phi.beta, "gamma": phi.gamma.tolist(),
                           "max_staleness": int(max_staleness), "loglik": loglik})


def _check_start(start: Mapping | None) -> dict:
    """Validate user-given starting values (any of γ, δ, σ², β)."""
    start = dict(start or {})
    unknown = set(start) - set(START_KEYS)
    if unknown:
        raise ValueError(f"unknown starting value(s) {sorted(unknown)}; allowed: {START_KEYS}")
    checked = {key: check_positive(start[key], key) for key in ("delta", "sigma2", "beta") if key in start}
    if "gamma" in start:
        checked["gamma"] = check_finite(np.atleast_1d(start["gamma"]), "gamma")
    return checked
