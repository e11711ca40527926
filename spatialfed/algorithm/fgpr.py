"""FGPR (Yue & Al Kontar, "Federated Gaussian Process: convergence, automatic personalization and multi-fidelity
modeling"): FedAvg over clients that run E steps of mini-batch SGD or Adam on their exact local GP likelihood.

Model: the independence model (SPEC §1, Eq. 3), z_j ~ N(X_jγ, σ²C_β(S_j, S_j) + δ⁻¹I) on every worker.

Worker (Algorithm 2 of the FGPR paper, `local_update`): from the global parameters, E steps on the mini-batch
negative log-likelihood of Eq. (2) divided by the batch size M, in ω = (γ, ρ) with the positive parameters
θ = (δ⁻¹, σ², β) = softplus(ρ) + floor. With M ≥ n_j the local loss is −ℓ_j/n_j, so Σ_j p_j L_j = −ℓ_ind/N
(p_j = n_j/N, Eq. 3 of the FGPR paper): full-batch FGPR with E = 1 is gradient descent on ℓ_ind.
SGD uses η_t = β₁/t with t the client's global step count (FGPR paper, proof of Theorem 1: η^(t) = β₁/t, t ≥ 1);
Adam (Kingma & Ba 2014, named in FGPR Sec. 2.1) restarts its moments every round (the worker is stateless: L_j(p)
is a pure function of the partition and p) with rate lr/√r in round r. Mini-batches: `uniform` (M points without
replacement) or `nearest` (a random centre and its M − 1 nearest neighbours, the sgGP batches of Chen et al. 2020
that the FGPR paper builds on).

Server (Algorithm 1 of the FGPR paper, `FgprServer`): φ₀ from the moments/variogram passes of start.py, then rounds
r = 1..R: K_c clients drawn uniformly without replacement (all when participation is None), each runs the local
update from the global θ, and the server averages the returned θ_k (constrained, as θ̄ = Σ_k p_k θ_k of Sec. 2.2)
with weights n_k / Σ_{k∈S_c} n_k (McMahan et al. 2017's FedAvg, which Remark 3 names; the paper's Sec. 2.2
samples by p_k with replacement and averages 1/K_c, which would send one client duplicate tasks). A final
synchronous "value" pass gives ℓ_ind at the estimate (SPEC §6).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.protocol import FGPR_STEP, FINAL_STEP, Augmented, Quantity
from spatialfed.algorithm.server import FederatedServer, ServerState, relative_change
from spatialfed.algorithm.server_base import Phase
from spatialfed.model import blocks

#: the protocol step of one FGPR local update (Algorithm 2 of the FGPR paper)
STEP = FGPR_STEP
#: version of FgprServer.snapshot(); its "kind" is "fgpr" (FederatedServer's snapshots have no kind)
SNAPSHOT_FORMAT = 1
OPTIMIZERS = ("sgd", "adam")
BATCHINGS = ("uniform", "nearest")


@dataclass(frozen=True)
class FgprConfig:
    """Settings of FGPR (Algorithms 1–2 of the FGPR paper); validated eagerly with errors naming the fix."""

    max_iter: int = 100          # communication rounds R
    local_steps: int = 5         # E, local optimiser steps per round
    batch_size: int = 64         # M, mini-batch size (M ≥ n_j: the whole partition)
    optimizer: str = "adam"      # "sgd" (η_t = lr/t) | "adam" (rate lr/√r)
    lr: float = 0.1              # β₁ of η_t = β₁/t (sgd), or Adam's base rate
    batching: str = "uniform"    # "uniform" | "nearest"
    participation: int | None = None  # K_c clients per round (None: all J)
    floor: float = 1e-4          # θ = softplus(ρ) + floor for θ = (δ⁻¹, σ², β)
    seed: int = 0                # seeds client sampling and mini-batches
    tol: float = 1e-4            # stop when the relative parameter change stays below tol ...
    patience: int = 3            # ... for this many rounds
    time_budget: float | None = None  # stop after this many seconds of the runtime's clock

    def __post_init__(self):
        _check_int(self.max_iter, "max_iter", 1, "the number of communication rounds R")
        _check_int(self.local_steps, "local_steps", 1, "E, local steps per round")
        _check_int(self.batch_size, "batch_size", 2, "M, the mini-batch size (a GP likelihood needs M ≥ 2 points)")
        _check_int(self.patience, "patience", 1, "rounds the change must stay below tol")
        _check_int(self.seed, "seed", 0, "the random seed")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if self.batching not in BATCHINGS:
            raise ValueError(f"batching must be one of {BATCHINGS}, got {self.batching!r}")
        for name in ("lr", "floor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if isinstance(self.tol, bool) or not isinstance(self.tol, (int, float)) or not self.tol >= 0:
            raise ValueError(f"tol must be a number ≥ 0 (0: always run max_iter rounds), got {self.tol!r}")
        if self.time_budget is not None and not (isinstance(self.time_budget, (int, float)) and self.time_budget > 0):
            raise ValueError(f"time_budget must be a number of seconds > 0 or None, got {self.time_budget!r}")
        if self.participation is not None:
            _check_int(self.participation, "participation", 1, "K_c, the clients per round (None: all)")

    def resolved(self, n_workers: int) -> FgprConfig:
        """Check the settings against J workers (participation K_c ≤ J)."""
        if self.participation is not None and self.participation > n_workers:
            raise ValueError(f"participation K_c = {self.participation} exceeds the J = {n_workers} workers; give "
                             f"1..{n_workers}, or None for all")
        return self

    def as_dict(self) -> dict:
        """The settings as a plain dict (fit.json / model.zarr attributes)."""
        return dataclasses.asdict(self)


def _check_int(value, name: str, low: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} ({what}) must be an integer ≥ {low}, got {value!r}")


# --- the softplus-with-floor parameterisation ---------------------------------------------------------------
class FgprServer(ServerState):
    """FGPR's server with FederatedServer's runtime-facing interface (dispatch/next_task/busy/receive/done, trace).

    Phases: "moments" → "variogram" (φ₀, run by an inner FederatedServer with no knots: the same summaries and
    rules of start.py) → "loop" (round t = 1..R) → "value" (ℓ_ind at the estimate) → "done".
    """

    def __init__(self, n_workers: int, kernel, config: FgprConfig | None = None, start: Mapping | None = None):
        self.n_workers = J = int(n_workers)
        self.config = (config or FgprConfig()).resolved(J)
        self.kernel = kernel
        self.knots = np.empty((0, 2))
        self._init: FederatedServer | None = FederatedServer(J, self.knots, kernel, FitConfig.of(mode="sync"), start)
        self._start_state(J)
        self._n_j: dict[int, int] = {}
        self._pending: dict[int, Augmented] = {}   # tasks of the current round or pass, not yet sent
        self._in_flight: dict[int, Augmented] = {}
        self._results: dict[int, dict] = {}        # worker -> ξ of the current round or pass
        self._selected: list[int] = []             # S_c of the current round
        self._small_changes = 0
        self._phase = Phase.LOOP

    # --- the runtime's side ----------------------------------------------------------------------------
    @property
    def phase(self) -> Phase:
        """"moments" | "variogram" (φ₀) | "loop" (rounds) | "value" (ℓ_ind) | "done" | "error"."""
        return self._init.phase if self._init is not None else self._phase

    @phase.setter
    def phase(self, value: Phase) -> None:  # the error phase (ServerState._fail) ends the inner φ₀ server too
        self._init, self._phase = None, value

    @property
    def done(self) -> bool:
        """True once the value pass has set `loglik`; the runtime stops then."""
        return self.phase == Phase.DONE

    def busy(self, j: int) -> bool:
        """Whether worker j has a task in flight."""
        return self._init.busy(j) if self._init is not None else j in self._in_flight

    def buffer(self, j: int) -> tuple[Augmented, ...]:
        """Pending task of worker j (at most one per round or pass)."""
        if self._init is not None:
            return self._init.buffer(j)
        return (self._pending[j],) if j in self._pending else ()

    def next_task(self, j: int, free: bool = True) -> Augmented | None:
        """The task waiting for idle worker j (None: j is not selected this round); j is busy until it answers."""
        if self._init is not None:
            return self._init.next_task(j)
        if self.busy(j):
            raise RuntimeError(f"worker {j} already has a task in flight; call next_task only for idle workers")
        p = self._pending.pop(j, None)
        if p is not None:
            self._in_flight[j] = p
        return p

    def _validate(self, qs: list[Quantity]) -> None:
        if self._init is not None:
            self._init._validate(qs)
        else:
            super()._validate(qs)

    def _receive(self, qs: list[Quantity], now: float) -> None:
        """Quantities that arrived at `now` seconds since the fit started (one or a batch, checked)."""
        self._last_now = float(now)
        if self._init is not None:
            self._n_j.update({q.worker: int(q.xi["n"]) for q in qs if q.step == "moments"})
            self._init.receive(qs, now)
            self._leave_init(now)
            return
        for q in qs:
            self._in_flight.pop(q.worker)
            self._results[q.worker] = q.xi
        self._advance(now)

    def drop_worker(self, j: int, step: str, cause: str, now: float) -> None:
        """Continue without worker j: it leaves the rounds, the value pass and N (as FederatedServer.drop_worker)."""
        if self._init is not None:
            self._init.drop_worker(j, step, cause, now)
            self._leave_init(now)
            return
        self._remove_worker(j, step, cause, now)
        for state in (self._pending, self._in_flight, self._results, self._n_j):
            state.pop(j, None)
        self.n_obs = sum(self._n_j[k] for k in self.active)
        if j in self._selected:
            self._selected.remove(j)
        if self._phase == Phase.LOOP and not self._selected:
            self._select()  # every client of this round is gone: draw the round again
        self._advance(now)

    # --- checkpoint and resume (docs/recovery.md) ----------------------------------------------------
    def snapshot(self) -> dict:
        """Everything needed to continue, as a deep copy: this server's state, the inner φ₀ server's snapshot while
        it runs, and the tasks in flight put back as pending (re-sent on resume; they are deterministic in p)."""
        state = {k: v for k, v in vars(self).items() if k not in ("_init", "_pending", "_in_flight")}
        state.update(kind="fgpr", format=SNAPSHOT_FORMAT, pending={**self._pending, **self._in_flight},
                     init=None if self._init is None else self._init.snapshot())
        return copy.deepcopy(state)

    @classmethod
    def restore(cls, snapshot: Mapping) -> "FgprServer":
        """An FgprServer continuing `snapshot` (FgprServer.snapshot): nothing in flight, interrupted tasks pending."""
        snap = copy.deepcopy(dict(snapshot))
        if snap.get("kind") != "fgpr" or snap.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"not an FGPR snapshot of format {SNAPSHOT_FORMAT} "
                             f"(kind {snap.get('kind')!r}, format {snap.get('format')!r})")
        server = cls.__new__(cls)
        init, pending = snap.pop("init"), snap.pop("pending")
        for key in ("kind", "format", "meta"):
            snap.pop(key, None)
        vars(server).update(snap)
        server._init = None if init is None else FederatedServer.restore(init)
        server._pending, server._in_flight = pending, {}
        return server

    # --- rounds --------------------------------------------------------------------------------------
    def _leave_init(self, now: float) -> None:
        """Once the inner server has φ₀ (it entered its loop), take φ₀, N and its trace, and start round 1."""
        inner = self._init
        if inner.phase != Phase.LOOP:
            return
        self.params, self.n_obs = inner.params, inner.n_obs
        self.active, self.dropped = list(inner.active), list(inner.dropped)
        self.trace = [dict(row) for row in inner.trace]
        self._init = None
        self._begin_round()

    def _begin_round(self) -> None:
        self.t += 1
        self._phase = Phase.LOOP
        self._select()

    def _select(self) -> None:
        """S_c: K_c of the active clients, uniformly without replacement (seeded by (seed, round)); all if None."""
        K = self.config.participation
        if K is None or K >= len(self.active):
            chosen = list(self.active)
        else:
            rng = np.random.default_rng([self.config.seed, self.t])
            chosen = sorted(int(j) for j in rng.choice(self.active, size=K, replace=False))
        self._selected = chosen
        self._results = {}
        self._pending = {j: Augmented(self.params, self.t, STEP, {"config": self.config}) for j in chosen}

    def _advance(self, now: float) -> None:
        """Aggregate a complete round, or finish a complete value pass."""
        if self._phase == Phase.LOOP and self._selected and all(j in self._results for j in self._selected):
            self._aggregate(now)
        elif self._phase == Phase.VALUE and all(j in self._results for j in self.active):
            f = sum(self._results[j]["f"] for j in self.active)  # m = 0: no h term
            self.loglik = blocks.loglik_from_f(f, self.n_obs)
            self._record("final", now, self.loglik)
            self._phase = Phase.DONE

    def _aggregate(self, now: float) -> None:
        """θ̄ = Σ_{k∈S_c} n_k θ_k / Σ_{k∈S_c} n_k on (γ, δ⁻¹, σ², β) (FGPR Sec. 2.2 with FedAvg's n_k weights)."""
        xis = [self._results[j] for j in self._selected]
        w = np.array([xi["n"] for xi in xis], dtype=float)
        w /= w.sum()
        tau2 = float(sum(wk / xi["delta"] for wk, xi in zip(w, xis)))
        old = self.params
        self.params = old.replace(gamma=sum(wk * xi["gamma"] for wk, xi in zip(w, xis)), delta=1.0 / tau2,
                                  sigma2=float(sum(wk * xi["sigma2"] for wk, xi in zip(w, xis))),
                                  beta=float(sum(wk * xi["beta"] for wk, xi in zip(w, xis))))
        self.iterations = self.t
        self._record(STEP, now)
        cfg = self.config
        self._small_changes = self._small_changes + 1 if relative_change(old, self.params) < cfg.tol else 0
        if self._small_changes >= cfg.patience:
            self._stop("tol", now)
        elif self.t >= cfg.max_iter:
            self._stop("max_iter", now)
        elif cfg.time_budget is not None and now >= cfg.time_budget:
            self._stop("time_budget", now)
        else:
            self._begin_round()

    def _stop(self, reason: str, now: float) -> None:
        """Leave the rounds: a synchronous value pass over every active worker gives ℓ_ind (SPEC §6)."""
        self.stop_reason = reason
        self.converged = reason == "tol"
        self._phase = Phase.VALUE
        self._results = {}
        self._pending = {j: Augmented(self.params, self.t, FINAL_STEP) for j in self.active}

    def _record(self, step: str, now: float, loglik: float | None = None) -> None:
        """One trace row with FederatedServer's keys (no staleness in synchronous rounds)."""
        phi = self.params
        self.trace.append({"iter": self.iterations, "time_s": float(now), "step": step, "delta": phi.delta,
                           "sigma2": phi.sigma2, "beta": phi.beta, "gamma": phi.gamma.tolist(), "max_staleness": 0,
                           "loglik": loglik})
