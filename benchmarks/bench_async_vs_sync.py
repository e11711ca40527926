"""Asynchronous vs synchronous fitting under balanced and graded compute (the paper's Section 6.2, small scale).

Setting: J = 10 workers, m = 100 knots, ν = 0.5, β = 0.1, full residual (``--residual``), Agg_threshold = 2 (= 0.2·J).
For each profile (balanced, graded) and runtime (simulated virtual clock and/or Dask) it runs the synchronous and the
asynchronous algorithm and measures the time each needs until every parameter (δ, σ², β and every γ_k) stays within
1e-3 relative of the converged synchronous estimate (a synchronous fit run to tol = 1e-10). Times are seconds since
the fit started (virtual seconds for the simulated runtime, wall seconds for Dask), so both include the φ₀ pass.

    python benchmarks/bench_async_vs_sync.py [--runtime simulated|dask|both] [--n-per-worker 200,500,1000]
        [--residual full|mpp|pp] [--profiles balanced,straggler,graded,graded:12] [--preset stats|tuned|paper|basic]

prints {"results": [{"profile", "runtime", "sync_s", "async_s", "ratio", "n_per_worker", "residual", "preset",
"sync_rounds", "async_rounds", "settled"}, ...]} (ratio = async_s / sync_s; null when a run never settled within the
tolerance; settled = both runs settled; *_rounds = the iterations of each run: for --preset stats the statistics
round trips of the synchronous run and the answers per site of the asynchronous one, whose aggregations are in
async_aggregations). Progress goes to stderr.

``--preset stats`` runs algorithm/stats_server.StatsServer (one round trip per iteration, SPEC §2b) on the virtual
clock (FlopCost: deterministic), through the same store → runtime.site → runtime.driver path as the estimator; its
reference is the synchronous StatsServer run to tol 1e-10 (the same ℓ_LR maximiser as the block algorithm's).

--preset stats (the default; StatsServer, SPEC §2b), virtual clock (FlopCost), 2026-11-24 (session 11: third-order
models of slow sites from their earlier answers, held sites released at a step of 3e-2; control-variate stale models,
slow sites held until the others settle, third-order models of idle sites, asynchronous trust region, answers due
together taken together, synchronous fallback; docs/algorithm.md); sync_s / async_s (ratio), sync round trips.
Every run settled; async ℓ within 2e-9 of sync.
- full, n = 200: balanced 0.46 / 0.46 (1.00), 4; straggler 9.57 / 3.81 (0.40); graded 9.57 / 4.77 (0.498).
- full, n = 500: balanced 2.86 / 2.86 (1.00), 5; straggler 59.1 / 23.5 (0.40); graded 59.1 / 29.4 (0.497).
- full, n = 1000: balanced 25.0 / 25.0 (1.00), 6; straggler 516.5 / 143.3 (0.28); graded 516.5 / 196.8 (0.38).
- mpp, n = 500: balanced 0.91 / 0.91 (1.00), 6; straggler 18.8 / 6.29 (0.33); graded 18.8 / 7.51 (0.40).
- pp, n = 500: balanced 0.91 / 0.91 (1.00), 6; straggler 18.8 / 5.61 (0.30); graded 18.8 / 7.03 (0.37).
- full, graded:12 (the milder imbalance, slowdowns 1 to 5.2): n = 200 2.39 / 2.55 (1.07), n = 500 14.8 / 20.2 (1.37);
  n = 200 with --seed 1 / --seed 2: 1.69 / 2.03. Async is slower here (docs/algorithm.md, "Still weak").
Before session 11 (commit 141ae3c): graded 0.53, 0.50, 0.44, mpp 0.45, pp 0.40; straggler 0.40, 0.41, 0.28, mpp
0.33, pp 0.30; graded:12 1.29 (n = 200), 1.70 (n = 500).
Before the wait rule (commit 756ccb2): graded 0.71, 1.04, mpp 2.06, pp 0.31. Before control variates and pacing
(commit 89bbd44): n = 200 straggler 1.00, graded 0.77; n = 500 straggler 0.70, graded 1.33; n = 1000 straggler 0.60,
graded 2.23; mpp n = 500 graded 8.0; pp n = 500 0.75 / 0.75.
- dask, stats, n = 500, 10 workers (commit be52270, before the wait rule): graded 30.4 / 128.6 (4.23), balanced
  14.7 / 98.9 (6.71) at K = 1 (CPU contention of 10 processes on 2 cores); graded 135.6 / 143.5 (1.06) at
  ``--dask-slowdown-scale 20``, matching the virtual clock's 1.04 of the time.
- dask, stats, n = 500, 10 workers, ``--dask-slowdown-scale 10`` (commit 69e616e: worker malloc settings; idle
  machine, two runs): graded 38.4 / 19.5 (0.51) and 37.6 / 20.6 (0.55); balanced 2.37 / 2.29 (0.97). Session 11
  (secant models, release at 3e-2; idle machine): graded 38.7 / 21.8 (0.56), the slowest site answering 4 times.

Measured on the 2-core development machine (shared with other jobs), 2026-11-22; ratio = async_s / sync_s:
- simulated, n = 1000, ``--preset tuned`` (FitConfig.tuned: correction on, uniform weights, no moving average,
  staleness-scaled step): balanced 10.8 s / 10.8 s (1.00); graded 223.9 s / 104.4 s (0.47).
- simulated, n = 1000, ``--preset paper`` (all three strategies, Remark 8 values; the default then), since the moving
  average of Eq. (19) averages block updates (docs/algorithm.md): graded 223.9 s / 218.3 s (0.97); balanced never
  settled within 1e-3 (stopped by the 20× time budget after 99 iterations: α = 0.5·A/J = 0.1 moves a tenth of a
  Newton step per aggregation). Before that change neither settled (balanced: 247 iterations; graded: 300
  iterations, β 1.2 % off). At n = 300: graded 1.78, balanced never.
- simulated, n = 1000, paper preset with ``--async-options '{"moving_average": false}'``: balanced 4.80, graded 0.60.
- dask, n = 500, tuned, 10 worker processes on 2 shared cores: balanced 16.9 s / 19.7 s (1.16); graded 9.3 s /
  22.2 s (2.39). With slowdowns emulated on CPU time, per-task overhead and core contention on this host dwarf the
  emulated heterogeneity, and async's extra tasks compete for the two cores; the virtual clock is the meaningful
  comparison here, the Dask run needs one core per worker to reproduce the paper's setting.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

J, M, NU, BETA, AGG = 10, 100, 0.5, 0.1, 2
RTOL = 1e-3
PROFILES = ("balanced", "graded")
RESIDUALS = ("full", "mpp", "pp")


def within(row, ref, rtol=RTOL) -> bool:
    """Every parameter of a trace row within rtol (relative) of the reference estimate."""
    for name in ("delta", "sigma2", "beta"):
        if not abs(row[name] - ref[name]) <= rtol * abs(ref[name]):
            return False
    g, g_ref = np.asarray(row["gamma"], dtype=float), np.asarray(ref["gamma"], dtype=float)
    return bool(np.all(np.abs(g - g_ref) <= rtol * np.abs(g_ref)))


def time_to_target(trace, ref, rtol=RTOL) -> float | None:
    """Earliest trace time from which every later row stays within rtol of ref (None if the last row is outside)."""
    ok = [within(r, ref, rtol) for r in trace]
    if not ok or not ok[-1]:
        return None
    last_bad = max((i for i, flag in enumerate(ok) if not flag), default=-1)
    return float(trace[last_bad + 1]["time_s"])


def say(*args):
    print(*args, file=sys.stderr, flush=True)


def fit(store, runtime, mode, profile, client=None, max_iter=300, tol=1e-10, time_budget=None, strategies=None,
        preset="paper", residual="full"):
    from spatialfed.api import FederatedGP

    gp = FederatedGP(mode=mode, residual=residual, knots=M, nu=NU, agg_threshold=AGG if mode == "async" else None,
                     max_iter=max_iter, tol=tol, runtime=runtime, profile=profile, client=client, seed=0,
                     time_budget=time_budget, strategies=strategies, preset=preset, progress=False)
    tic = time.perf_counter()
    gp.fit(store)
    say(f"  {runtime:9s} {profile:8s} {mode:5s}: {gp.n_iter_} iterations ({gp.stop_reason_}), "
        f"trace ends at {gp.trace_[-1]['time_s']:.2f} s, took {time.perf_counter() - tic:.1f} s wall; "
        f"δ={gp.params_['delta']:.5g} σ²={gp.params_['sigma2']:.5g} β={gp.params_['beta']:.5g}")
    return gp


class StatsFit:
    """A StatsServer fit on the virtual clock, with the estimator's result attributes the benchmark reads."""

    def __init__(self, server, wall_s):
        phi = server.params
        self.server = server
        self.trace_ = server.trace
        self.params_ = {"delta": phi.delta, "sigma2": phi.sigma2, "beta": phi.beta, "gamma": phi.gamma.tolist()}
        self.n_iter_, self.stop_reason_, self.loglik_ = server.iterations, server.stop_reason, server.loglik
        self.wall_s = wall_s


def fit_stats(store, mode, profile, residual, max_iter=300, tol=1e-5, time_budget=None, cache=None, agg_threshold=None):
    """StatsServer (SPEC §2b) driven over the store's sites on the virtual clock (FlopCost), knots as the estimator
    lays them out on the unit square. `cache`: {(site, u bytes): statistics} shared by runs (the synchronous runs of
    every profile visit the same u; reusing their statistics changes nothing but the wall time)."""
    import uuid

    from spatialfed.algorithm.config import FitConfig
    from spatialfed.algorithm.protocol import STATS_STEP, Quantity, evaluate
    from spatialfed.algorithm.stats_server import StatsServer
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.data.store import open_store
    from spatialfed.model.matern import Matern
    from spatialfed.runtime import site
    from spatialfed.runtime.driver import drive
    from spatialfed.runtime.interface import Event
    from spatialfed.runtime.virtual import FlopCost, VirtualRuntime, message_bytes

    class CachedRuntime(VirtualRuntime):
        """The virtual clock with statistics reused across runs (same u, same site → same statistics)."""

        def submit(self, j, p, delay_s=0.0):
            if cache is None or p.step != STATS_STEP:
                return super().submit(j, p, delay_s)
            key = (j, p.params.u.tobytes())
            if key not in cache:
                cache[key] = evaluate(self.models[j], p, j).xi
            q = Quantity(cache[key], p.t, p.step, j)
            finish = (self._now + self.network.seconds(message_bytes(p)) + self._s[j] * FlopCost().seconds(
                self.models[j], p, 0.0) + self.network.seconds(message_bytes(q)) + delay_s)
            heapq.heappush(self._events, (finish, next(self._order), Event(j, p, q)))

    info = open_store(store)
    knots = jittered_unit_grid(M, seed=0)
    kernel = Matern(NU)
    specs = site.site_specs(uuid.uuid4().hex[:12], info.path, info.n_workers, knots, kernel, residual)
    config = FitConfig(mode=mode, max_iter=max_iter, tol=tol, time_budget=time_budget, agg_threshold=agg_threshold)
    server = StatsServer(info.n_workers, knots, kernel, config)
    runtime = CachedRuntime(None, profile, FlopCost())
    tic = time.perf_counter()
    drive(server, runtime, specs)
    out = StatsFit(server, time.perf_counter() - tic)
    say(f"  stats     {profile:9s} {mode:5s} {residual}: {server.iterations} iterations ({server.stop_reason}), "
        f"answers {server.answers}, trace ends at {server.trace[-1]['time_s']:.2f} s, took {out.wall_s:.1f} s wall; "
        f"δ={out.params_['delta']:.5g} σ²={out.params_['sigma2']:.5g} β={out.params_['beta']:.5g} "
        f"ℓ={server.loglik:.6f} boundary={server.boundary}")
    return out


def run_stats(store, n, residual, profiles, max_iter):
    """Rows of the stats preset for one store: reference, then sync and async per profile."""
    cache: dict = {}
    say("reference: synchronous StatsServer to tol 1e-10 (virtual clock)")
    ref = fit_stats(store, "sync", "balanced", residual, max_iter=100, tol=1e-10, cache=cache).params_
    rows = []
    for profile in profiles:
        sync = fit_stats(store, "sync", profile, residual, max_iter=100, cache=cache)
        sync_s = time_to_target(sync.trace_, ref)
        budget = None if sync_s is None else 20 * sync_s
        asyn = fit_stats(store, "async", profile, residual, max_iter=max_iter, time_budget=budget)
        async_s = time_to_target(asyn.trace_, ref)
        ratio = None if (sync_s is None or async_s is None) else async_s / sync_s
        rows.append({"profile": profile, "runtime": "simulated", "sync_s": sync_s, "async_s": async_s, "ratio": ratio,
                     "n_per_worker": n, "residual": residual, "preset": "stats", "sync_rounds": sync.n_iter_,
                     "async_rounds": round(asyn.server.rounds, 2), "async_aggregations": asyn.n_iter_,
                     "settled": sync_s is not None and async_s is not None,
                     "async_loglik_minus_sync": asyn.loglik_ - sync.loglik_,
                     "async_slowest_answers": int(min(asyn.server.answers))})
        say(f"  -> {rows[-1]}")
    return rows


def fit_stats_dask(store, client, mode, profile, residual, max_iter=100, tol=1e-5, time_budget=None, scale=1.0):
    """The estimator itself, ``FederatedGP(preset="stats", runtime="dask", client=...)`` (servers.server_for →
    StatsServer), on the fit_stats knots (jittered_unit_grid(M, seed=0)) and settings (async: agg_threshold 1, what
    StatsServer takes when given none); returns (gp, measures: answers per site, median wall of a statistics task,
    CPU seconds of the Dask worker processes and of this process, which runs the server, the client and the
    LocalCluster's scheduler). `scale`: every site's slowdown is multiplied by it (slowdown_scale in run_stats_dask)."""
    from distributed import get_task_stream

    from spatialfed.api import FederatedGP
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.runtime.heterogeneity import profile_slowdowns

    knots = jittered_unit_grid(M, seed=0)
    gp = FederatedGP(mode=mode, residual=residual, knots=knots, nu=NU, agg_threshold=1 if mode == "async" else None,
                     max_iter=max_iter, tol=tol, runtime="dask", profile=profile, client=client, seed=0,
                     slowdown=(scale * profile_slowdowns(profile, J)).tolist(), time_budget=time_budget,
                     preset="stats", progress=False)
    cpu0, here = client.run(time.process_time), time.process_time()
    tic = time.perf_counter()
    with get_task_stream(client) as ts:
        gp.fit(str(store))
    wall = time.perf_counter() - tic
    cpu1, here = client.run(time.process_time), time.process_time() - here
    if not np.array_equal(gp.knots_, knots):
        raise RuntimeError("the estimator laid out other knots than the virtual-clock run's; the references differ")
    if gp.config_.scheme != "stats":
        raise RuntimeError(f"preset 'stats' resolved to scheme {gp.config_.scheme!r}")
    answers, task_wall = [0] * J, []
    for task in ts.data:
        key = str(task["key"])
        if key.startswith("stats-"):
            answers[int(key.split("-")[1][1:])] += 1
            task_wall += [ss["stop"] - ss["start"] for ss in task.get("startstops", ()) if ss["action"] == "compute"]
    worker_cpu = sum(cpu1[a] - cpu0.get(a, cpu1[a]) for a in cpu1)
    measures = {"answers": answers, "rounds": sum(answers) / J, "n_tasks": int(gp.n_tasks_ or 0),
                "fit_wall_s": round(wall, 2), "worker_cpu_s": round(worker_cpu, 2),
                "client_cpu_s": round(here, 2), "cores_busy": round((worker_cpu + here) / wall, 2),
                "host_load_1min": round(os.getloadavg()[0], 2),
                "stats_task_wall_median_s": round(float(np.median(task_wall)), 4) if task_wall else None}
    say(f"  dask      {profile:9s} {mode:5s} {residual}: {gp.n_iter_} iterations ({gp.stop_reason_}), answers "
        f"{answers}, trace ends at {gp.trace_[-1]['time_s']:.2f} s, took {wall:.1f} s wall, worker CPU "
        f"{worker_cpu:.1f} s, this process (server, client, scheduler) {here:.1f} s; δ={gp.params_['delta']:.5g} "
        f"σ²={gp.params_['sigma2']:.5g} β={gp.params_['beta']:.5g} "
        f"ℓ={gp.loglik_:.6f}")
    return gp, measures


def task_costs(client, store, residual, params, slowdowns, repeats=3):
    """What one statistics task costs on each Dask worker, measured with the runtime's own site.answer: c = its
    thread CPU seconds (`time.thread_time` on the worker), w = its wall seconds inside the task with the profile's
    slowdown s_j (compute, then the (s_j − 1)·c sleep), and the overhead = the client's round trip − w (scheduler,
    network, serialisation; of the tasks timed alone). At s = 1 each site is timed alone (no contention; its
    partition loaded first), then every site at once (the host's cores shared by J tasks); with s_j the sites run at
    once (they mostly sleep; the slowest's wait bounds the time). Medians over `repeats` nearby u (no cached
    factor)."""
    import uuid

    from spatialfed.algorithm.protocol import STATS_STEP, Augmented
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.model.matern import Matern
    from spatialfed.model.params import Params
    from spatialfed.runtime import site
    from spatialfed.runtime.cluster import worker_addresses
    from spatialfed.runtime.dask_runtime import assign_partitions

    def timed(spec, p, s):  # runs on the worker (pickled by value: a local function)
        import time as _t

        from spatialfed.runtime import site as _site

        tic, cpu = _t.perf_counter(), _t.thread_time()
        _site.answer(spec, p, s)
        return _t.thread_time() - cpu, _t.perf_counter() - tic

    knots = jittered_unit_grid(M, seed=0)
    run_id = f"costs-{uuid.uuid4().hex[:8]}"
    specs = site.site_specs(run_id, store, J, knots, Matern(NU), residual)
    where = assign_partitions(J, worker_addresses(client))
    gamma = np.asarray(params["gamma"], dtype=float)

    def request(k):
        f = 1.0 + 1e-3 * (k + 1)
        phi = Params(np.zeros(M), np.eye(M), gamma, params["delta"] * f, params["sigma2"], params["beta"] * f)
        return Augmented(phi, k, STATS_STEP)

    def one(j, k, s):
        tic = time.perf_counter()
        c, w = client.submit(timed, specs[j], request(k), float(s), workers=[where[j]], pure=False).result()
        return c, w, time.perf_counter() - tic - w

    try:
        for j in range(J):
            one(j, -1, 1.0)  # load the partition
        alones = [[one(j, k, 1.0) for k in range(repeats)] for j in range(J)]
        slows = [[] for _ in range(J)]
        for k in range(repeats):
            futs = [client.submit(timed, specs[j], request(repeats + k), float(slowdowns[j]), workers=[where[j]],
                                  pure=False) for j in range(J)]
            for j, fut in enumerate(futs):
                slows[j].append(fut.result())
        rows = []
        for j in range(J):
            alone, slowed = alones[j], slows[j]
            c = float(np.median([a[0] for a in alone + slowed]))
            rows.append({"site": j, "slowdown": round(float(slowdowns[j]), 3), "cpu_s": round(c, 4),
                         "wall_alone_s": round(float(np.median([a[1] for a in alone])), 4),
                         "wall_slowed_s": round(float(np.median([a[1] for a in slowed])), 4),
                         "sleep_expected_s": round((float(slowdowns[j]) - 1) * c, 4),
                         "overhead_s": round(float(np.median([a[2] for a in alone])), 4)})
        together = []
        for k in range(repeats):
            tic = time.perf_counter()
            futs = [client.submit(timed, specs[j], request(2 * repeats + k), 1.0, workers=[where[j]], pure=False)
                    for j in range(J)]
            out = client.gather(futs)
            together.append((time.perf_counter() - tic, [o[0] for o in out], [o[1] for o in out]))
    finally:
        client.run(site.release, run_id)
    summary = {"cpu_s_median": round(float(np.median([r["cpu_s"] for r in rows])), 4),
               "overhead_s_median": round(float(np.median([r["overhead_s"] for r in rows])), 4),
               "together_round_s": round(float(np.median([t[0] for t in together])), 4),
               "together_cpu_s_median": round(float(np.median([np.median(t[1]) for t in together])), 4),
               "together_task_wall_s_median": round(float(np.median([np.median(t[2]) for t in together])), 4)}
    return {"sites": rows, **summary}


def run_stats_dask(store, n, residual, profiles, max_iter, dask_workers, slowdown_scale=1.0):
    """Rows of the stats preset on a Dask LocalCluster of `dask_workers` processes, through the estimator, plus what
    a statistics task costs there (task_costs). Reference: the estimator's synchronous fit to tol 1e-10 on the
    simulated runtime (the same knots, the same ℓ_LR maximiser as run_stats's); async gets 20× the sync time.
    `slowdown_scale` K multiplies every site's slowdown (site j sleeps (K·s_j − 1)·c): with K ≥ J / cores the J
    emulated machines need no more than the host's cores, as when each site has its own machine (the virtual clock's
    setting); ratios are unchanged by K on the virtual clock, which charges the sites' compute only."""
    from spatialfed.api import FederatedGP
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.runtime.cluster import local_cluster
    from spatialfed.runtime.heterogeneity import profile_slowdowns

    say("reference: the estimator, synchronous stats fit to tol 1e-10 (simulated runtime)")
    ref_gp = FederatedGP(mode="sync", residual=residual, knots=jittered_unit_grid(M, seed=0), nu=NU, max_iter=100,
                         tol=1e-10, runtime="simulated", seed=0, preset="stats", progress=False).fit(str(store))
    ref = ref_gp.params_
    say(f"  reference: {ref_gp.n_iter_} iterations, ℓ={ref_gp.loglik_:.6f}")
    rows = []
    handle = local_cluster(dask_workers)
    client = handle.client
    try:
        say(f"Dask: {dask_workers} worker processes; dashboard {handle.dashboard_link}")
        import importlib

        for mod in ("spatialfed.runtime.site", "spatialfed.model.stats", "spatialfed.data.store"):
            client.run(importlib.import_module, mod)  # imports are not the fit's time
        for profile in profiles:
            sync, sync_m = fit_stats_dask(store, client, "sync", profile, residual, max_iter=100,
                                          scale=slowdown_scale)
            sync_s = time_to_target(sync.trace_, ref)
            budget = None if sync_s is None else 20 * sync_s
            asyn, async_m = fit_stats_dask(store, client, "async", profile, residual, max_iter=max_iter,
                                           time_budget=budget, scale=slowdown_scale)
            async_s = time_to_target(asyn.trace_, ref)
            ratio = None if (sync_s is None or async_s is None) else async_s / sync_s
            costs = task_costs(client, store, residual, ref, slowdown_scale * profile_slowdowns(profile, J))
            rows.append({"profile": profile, "runtime": "dask", "sync_s": sync_s, "async_s": async_s, "ratio": ratio,
                         "n_per_worker": n, "residual": residual, "preset": "stats", "sync_rounds": sync.n_iter_,
                         "async_rounds": round(async_m["rounds"], 2), "async_aggregations": asyn.n_iter_,
                         "settled": sync_s is not None and async_s is not None,
                         "async_loglik_minus_sync": asyn.loglik_ - sync.loglik_,
                         "async_slowest_answers": int(min(async_m["answers"])), "dask_workers": dask_workers,
                         "slowdown_scale": slowdown_scale,
                         "sync_measures": sync_m, "async_measures": async_m, "task_costs": costs})
            say(f"  -> {json.dumps(rows[-1])}")
    finally:
        handle.close()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", choices=["simulated", "dask", "both"], default="simulated")
    ap.add_argument("--n-per-worker", default="1000", help="comma-separated n_j values, e.g. 200,500,1000")
    ap.add_argument("--residual", choices=RESIDUALS, default="full")
    ap.add_argument("--profiles", default=",".join(PROFILES),
                    help="comma-separated: balanced,straggler,graded or graded:<min cores> (e.g. graded:12: cores "
                    "62 down to 12, slowdowns 1 to 5.2)")
    ap.add_argument("--max-iter", type=int, default=300, help="iteration cap of every run (default 300)")
    ap.add_argument("--dask-workers", type=int, default=J,
                    help="Dask worker processes (default J: one per federated worker, as in the paper)")
    ap.add_argument("--dask-slowdown-scale", type=float, default=1.0, metavar="K",
                    help="--preset stats on Dask: multiply every site's slowdown by K ≥ 1 (default 1); "
                    "K ≥ J / cores lets J emulated machines share this host's cores without contention")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--preset", default="stats",
                    help="preset: stats (the library's default: StatsServer, SPEC §2b; on --runtime dask through "
                    "FederatedGP(preset='stats')), tuned, paper or basic (the block scheme)")
    ap.add_argument("--async-options", type=json.loads, default=None, metavar="JSON",
                    help='extra FitConfig settings of the async runs, e.g. \'{"moving_average": false}\'')
    ap.add_argument("--store", default=None, help="reuse/write the simulated store here instead of a temp dir "
                    "(one n_j only)")
    args = ap.parse_args(argv)

    from spatialfed.data.simulate import simulate_store

    sizes = [int(v) for v in str(args.n_per_worker).split(",") if v]
    profiles = [v for v in args.profiles.split(",") if v]
    from spatialfed.runtime.heterogeneity import profile_slowdowns
    for profile in profiles:
        try:
            profile_slowdowns(profile, J)
        except ValueError as exc:
            ap.error(f"--profiles: {exc}")
    if not args.dask_slowdown_scale >= 1:
        ap.error(f"--dask-slowdown-scale must be ≥ 1 (1 = the profile's slowdowns), got {args.dask_slowdown_scale}")
    if args.dask_slowdown_scale != 1 and (args.preset != "stats" or args.runtime == "simulated"):
        ap.error("--dask-slowdown-scale applies to --preset stats with --runtime dask or both")
    if args.store and len(sizes) > 1:
        ap.error("--store holds one dataset: give a single --n-per-worker with it")
    runtimes = ["simulated", "dask"] if args.runtime == "both" else [args.runtime]
    results = []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
            store = Path(args.store) if args.store else Path(tmp) / "bench.zarr"
            if not (store / "zarr.json").exists():
                say(f"simulating J={J} × n={n} (ν={NU}, β={BETA}) into {store}")
                simulate_store(store, J, n, nu=NU, beta=BETA, seed=args.seed, test_size=0)
            if args.preset == "stats":
                if args.runtime in ("simulated", "both"):
                    results += run_stats(store, n, args.residual, profiles, args.max_iter)
                if args.runtime in ("dask", "both"):
                    results += run_stats_dask(store, n, args.residual, profiles, args.max_iter, args.dask_workers,
                                              args.dask_slowdown_scale)
                continue
            say("reference: synchronous fit to tol 1e-10 (simulated runtime, deterministic)")
            ref_gp = fit(store, "simulated", "sync", "balanced", max_iter=100, residual=args.residual)
            ref = ref_gp.params_
            for runtime in runtimes:
                handle = None
                client = None
                if runtime == "dask":
                    from spatialfed.runtime.cluster import local_cluster

                    handle = local_cluster(args.dask_workers)
                    client = handle.client
                    say(f"Dask dashboard: {handle.dashboard_link}")
                try:
                    for profile in profiles:
                        if runtime == "simulated" and profile == "balanced":
                            sync_gp = ref_gp
                        else:
                            sync_gp = fit(store, runtime, "sync", profile, client, max_iter=100,
                                          residual=args.residual)
                        sync_s = time_to_target(sync_gp.trace_, ref)
                        budget = None if sync_s is None else 20 * sync_s  # async gets 20× the sync time at most
                        async_gp = fit(store, runtime, "async", profile, client, max_iter=args.max_iter,
                                       time_budget=budget, strategies=args.async_options, preset=args.preset,
                                       residual=args.residual)
                        async_s = time_to_target(async_gp.trace_, ref)
                        ratio = None if (sync_s is None or async_s is None) else async_s / sync_s
                        results.append({"profile": profile, "runtime": runtime, "sync_s": sync_s,
                                        "async_s": async_s, "ratio": ratio, "n_per_worker": n,
                                        "residual": args.residual, "preset": args.preset,
                                        "sync_rounds": sync_gp.n_iter_, "async_rounds": async_gp.n_iter_,
                                        "settled": sync_s is not None and async_s is not None})
                        say(f"  -> {results[-1]}")
                finally:
                    if handle is not None:
                        handle.close()
    print(json.dumps({"results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
