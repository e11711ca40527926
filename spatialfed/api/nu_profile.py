"""The profile-likelihood interval of ν of a ``nu="estimate"`` fit, computed federated (docs/equations.md,
"Covariance options", Eq. 24): {log ν : 2(ℓ̂ − ℓ_p(log ν)) ≤ χ²₁(0.95)} with

    ℓ_p(v) = max over (log δ, log σ², log β [, log r, φ]) of ℓ_LR with log ν = v,

each ℓ_p(v) a statistics fit on the same sites (a fresh StatsServer, sync) whose box pins log ν (lower = upper = v:
the trust-region step holds an entry on both bounds, so the sites' statistics with ν estimated are used as they
are), started from the nearest evaluated point's estimate and stopped at the looser tol of
``algorithm.family_fit.nu_interval`` (its in-process twin); the root-finding is
``algorithm.family_interval.likelihood_ratio_interval``. The sites are loaded again from the fit's SiteSpecs for
each refit, as ``api.blocked_cv`` does after the fit.

Cost: more than the fit itself. Every refit is a moments round and its Newton rounds, and the interval takes
~10–20 refits (bracketing and Brent's steps on each side): ``"nu_interval_rounds"`` against the fit's ``n_iter_``,
e.g. 39 round trips and 3 s against 7 and 1 s on the tests' 3 sites × 100 points, 29–84 round trips and 3–12 s
against 6–8 and 1.2 s in bench_covariance_recovery.py at n = 400 in 5 sites. With anisotropy the refits start
(r, φ) at the family's start, not at the nearest estimate (StatsServer's start holds δ, σ², β only).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import uuid

import numpy as np

from spatialfed.algorithm.config import Mode, Stopping
from spatialfed.algorithm.family_fit import NU_INDEX, REFIT_ROUNDS
from spatialfed.algorithm.family_interval import likelihood_ratio_interval
from spatialfed.algorithm.likelihood import NotPositiveDefinite
from spatialfed.algorithm.stats_server import StatsServer
from spatialfed.api import progress
from spatialfed.errors import WorkerTaskError
from spatialfed.model.family import MaternFamily
from spatialfed.runtime.driver import drive

log = logging.getLogger("spatialfed.api")

#: the refits' stopping: Newton step and predicted gain (family_fit.nu_interval's: ℓ_p to ~1e-4 at the ends)
TOL, LOGLIK_TOL = 1e-5, 1e-6


def applies(server) -> bool:
    """Whether the fit estimated ν by the statistics server and ended with an exact ℓ̂ on every site."""
    return (isinstance(server, StatsServer) and isinstance(server.kernel, MaternFamily) and server.kernel.nu is None
            and server.bounds is not None and server.loglik is not None
            and len(server.active) == server.n_workers)


def for_fit(gp, server, runtime, specs) -> dict:
    """{"nu_95": [lo, hi] in ν (None for a side the data leave open up to the box; None when neither side is
    bounded or the interval failed, logged), "nu_interval_rounds": round trips of the refits (the most answers
    of one site, summed over refits), "nu_interval_s": their wall seconds}; {} where ν is not estimated. A fit
    that dropped a site has none (ℓ̂ and the refits would sum different sites)."""
    if not isinstance(getattr(server, "kernel", None), MaternFamily) or server.kernel.nu is not None:
        return {}
    tic = time.perf_counter()
    counter = {"rounds": 0}
    ends = None
    if not applies(server):
        log.warning("no profile-likelihood interval of ν for this fit: it needs every site's exact ℓ at the end")
    else:
        try:
            ends = profile_interval(server, runtime, specs, gp.variogram_params_.get("nu_se_log", math.nan), counter)
        except (NotPositiveDefinite, np.linalg.LinAlgError, WorkerTaskError, RuntimeError) as exc:
            log.warning("no profile-likelihood interval of ν for this fit: %s", exc)
    nu_95 = None if ends is None or ends == (None, None) else [None if e is None else float(np.exp(e)) for e in ends]
    return {"nu_95": nu_95, "nu_interval_rounds": int(counter["rounds"]),
            "nu_interval_s": float(time.perf_counter() - tic)}


def profile_interval(server, runtime, specs, se: float, counter: dict | None = None,
                     level: float = 0.95) -> tuple[float | None, float | None]:
    """(lo, hi) in log ν of the finished StatsServer `server` (module docstring), its refits driven on `runtime`
    over the sites `specs`; `counter["rounds"]` accumulates their round trips."""
    counter = {} if counter is None else counter
    counter.setdefault("rounds", 0)
    u_hat = np.asarray(server.params.u, dtype=float)
    lower, upper = (np.asarray(b, dtype=float) for b in server.bounds)
    config = dataclasses.replace(
        server.config, mode=Mode.SYNC, agg_threshold=None, scheme=dataclasses.replace(server.policy, pilot_points=0,
                                                                  loglik_tol=LOGLIK_TOL),
        stopping=Stopping(max_iter=REFIT_ROUNDS, tol=TOL, patience=server.config.stopping.patience))
    starts = {float(u_hat[NU_INDEX]): u_hat}  # each refit starts from the nearest ν's estimate

    def profile(v: float) -> float:
        u0 = starts[min(starts, key=lambda w: abs(w - v))]
        lo, hi = lower.copy(), upper.copy()
        lo[NU_INDEX] = hi[NU_INDEX] = v
        refit = type(server)(server.n_workers, server.knots, server.kernel, config,
                             {"delta": math.exp(u0[0]), "sigma2": math.exp(u0[1]), "beta": math.exp(u0[2])},
                             bounds=(lo, hi))
        answers = [0] * server.n_workers

        def answered(j, p, _result):
            if p is not None:
                answers[j] += 1

        progress.phase(f"profile likelihood of ν: refit at ν = {math.exp(v):.4g}")
        run_id = f"nu-profile-{uuid.uuid4().hex[:12]}"
        drive(refit, runtime, [dataclasses.replace(s, run_id=run_id) for s in specs], on_result=answered)
        counter["rounds"] += max(answers)
        starts[v] = np.asarray(refit.params.u, dtype=float)
        return float(refit.loglik)

    return likelihood_ratio_interval(profile, float(u_hat[NU_INDEX]), float(server.loglik), float(se),
                                     float(lower[NU_INDEX]), float(upper[NU_INDEX]), level)
