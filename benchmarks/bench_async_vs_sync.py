"""Asynchronous against synchronous fitting over many data sets: the distribution of the async/sync time ratio.

For every combination of seed × profile × n_j × partition × site sizes it simulates a store (SPEC §7: J workers,
m knots, Matérn ν, range β; one store per (seed, n_j, partition, sizes), shared by both modes and every profile),
fits it synchronously and asynchronously under the profile's slowdowns and measures the time each fit needs until
every parameter (δ, σ², β and every γ_k) stays within 1e-3 relative of the synchronous reference optimum (a
synchronous fit to tol 1e-10). Times are seconds since the fit started (virtual seconds on the simulated runtime,
wall seconds on Dask), so both include the φ₀ pass. The virtual clock is the charged one (runtime/virtual.py): the
server's own calls take their measured CPU on it, and the sites' flops are counted at this machine's rate for a
statistics request (calibrated once per store and printed).

    python benchmarks/bench_async_vs_sync.py --seeds 0-9 --profiles balanced,straggler,graded,graded:12 \\
        --n-per-worker 200,500 --partition random,area [--sizes equal,aligned,unaligned] [--jobs 2]
        [--workers 10] [--knots 100] [--nu 0.5] [--range 0.1] [--residual full|mpp|pp]
        [--preset stats|tuned|paper|basic] [--runtime simulated|dask|both] [--async-options JSON] [--max-iter 300]
        [--rows rows.jsonl [--summary-only]]

`--seeds` takes ranges and lists (0-4,7); `--sizes` takes named layouts (equal; aligned, unaligned, inverse: Figure
7's sizes from 1.5·n_j down to 0.5·n_j on the workers in order of speed, shuffled, or reversed) or one explicit list
of J sizes (100,150,...; ';' separates several lists). `--jobs N` runs N stores at once in worker processes: on the
virtual clock a run's times do not depend on the machine's load. `--rows PATH` keeps the rows as JSON lines as each
store finishes; the same command again runs only the stores missing there, and with `--summary-only` it summarizes
what is there (a grid still running, or one that was stopped). `--seed S` is `--seeds S`; `--store PATH` writes (or
reuses) the one store of a single combination there.

Prints one JSON document on stdout, progress on stderr (ending with the summary as a Markdown table):
{"settings": {...}, "rows": [...], "summary": {"by_group": [...], "by_profile": [...], "bounds": [...]}, "wall_s": ...}
- a row per (seed, partition, sizes, profile, n_per_worker) with sync_s, async_s, ratio = async_s / sync_s (null
  when a run never settled), settled (both did), dloglik = ℓ(async) − ℓ(reference), sync_dloglik, sync_rounds and
  async_rounds (for --preset stats: the statistics round trips of the synchronous run, the answers per site of the
  asynchronous one, whose aggregations are in async_aggregations), sync_server_s and async_server_s (--preset
  stats on the simulated runtime: CPU seconds the server itself took, charged to the clock), async_fit_s (the
  asynchronous fit's whole time) and async_server_share (its server's share of it), flop_rate (the calibrated site
  rate), ratio_sites_only (the same ratio on the old model that charges the sites only, at 1e9 flop/s; skipped with
  --no-sites-only),
  ratio_by_rtol (the same ratio at tolerances 1e-2 and 1e-4: where a ratio above 1 at 1e-3 is not above 1 at
  either, one estimate lay just inside the band and the other just outside), async_settled_by (--preset stats on
  the simulated runtime: the answer after which the asynchronous estimate settled, its site, kind — epoch,
  explore —, the epochs completed before it, at_s, and its site's round trip as a share of the slowest
  site's) and the wall seconds it took;
- a summary per (profile, n_per_worker, partition, sizes) and per profile: runs, settled, on_optimum
  (|dloglik| ≤ 1e-6), the mean and the worst (largest) ratio over the settled runs and the row of the worst, and
  settled_by: how many asynchronous runs settled on the slowest site's epoch answer, on another site's, or between
  epochs;
- bounds (async_reports.py): every run settled on the synchronous optimum, no ratio above 1.10, balanced ≤ 1.02,
  the means of straggler ≤ 0.55, graded ≤ 0.70 and graded:12 ≤ 0.85, each with its value and whether it holds (an
  unsettled run counts as an infinite ratio there).

`--preset stats` (the default) runs algorithm/stats_server.StatsServer (one round trip per iteration, SPEC §2b) on
the charged virtual clock through the same store → runtime.site → runtime.driver path as the
estimator, on knots jittered_unit_grid(m, seed=0); the other presets (the block scheme) run through FederatedGP, as
does `--runtime dask` (a LocalCluster of --dask-workers processes, one store at a time). Results: docs/results.md,
"Asynchronous fitting on the charged clock".
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from async_reports import LOGLIK_TOL, bounds, figure, settled_by_counts, stats_of, summarize, table  # noqa: F401
from harness import say

RTOL = 1e-3  # settle tolerance of every parameter, relative to the reference
#: the same ratio also at a tolerance ten times looser and ten times tighter: a ratio above 1 at RTOL that is not above
#: 1 at either is where one fit's estimate lay just inside the band and the other's just outside (a band-edge effect)
RTOL_BESIDE = (1e-2, 1e-4)
PROFILES = ("balanced", "graded")
RESIDUALS = ("full", "mpp", "pp")
LAYOUTS = ("equal", "aligned", "unaligned", "inverse")


@dataclass(frozen=True)
class Setting:
    """What every store and fit of one benchmark run shares."""

    workers: int = 10  # J
    knots: int = 100  # m
    nu: float = 0.5
    beta: float = 0.1  # the Matérn range of the simulated field
    residual: str = "full"

    @property
    def agg(self) -> int:
        """The block scheme's asynchronous Agg_threshold, 0.2·J (2 at J = 10)."""
        return max(1, round(0.2 * self.workers))


@dataclass(frozen=True)
class StoreSpec:
    """One simulated data set: both modes and every profile run on it."""

    seed: int
    n_per_worker: int
    partition: str = "random"
    sizes: str = "equal"  # a name of LAYOUTS or an explicit list "100,150,..."


def parse_seeds(text: str) -> list[int]:
    """'0-9', '0-4,7', '3' → sorted distinct seeds."""
    seeds: set[int] = set()
    for part in (p.strip() for p in str(text).split(",")):
        lo, dash, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ValueError(f"{part!r} is not a seed or a range of seeds (e.g. 0-9 or 0-4,7)") from None
        if a < 0 or b < a:
            raise ValueError(f"{part!r}: give non-negative seeds, a range as low-high")
        seeds.update(range(a, b + 1))
    return sorted(seeds)


def parse_sizes(text: str, workers: int) -> list[str]:
    """'equal,aligned' → names; '100,150,...' → one explicit list of J sizes; ';' separates several specs."""
    specs = []
    for spec in (s.strip() for s in str(text).split(";") if s.strip()):
        parts = [p.strip() for p in spec.split(",") if p.strip()]
        if all(p.isdigit() for p in parts):
            if len(parts) != workers or any(int(p) < 1 for p in parts):
                raise ValueError(f"{spec!r}: give {workers} positive sizes, one per worker (--workers {workers})")
            specs.append(",".join(str(int(p)) for p in parts))
        else:
            bad = [p for p in parts if p not in LAYOUTS]
            if bad:
                raise ValueError(f"{', '.join(bad)}: sizes are one of {', '.join(LAYOUTS)} or a list of {workers} "
                                 "integers")
            specs += parts
    if not specs:
        raise ValueError("no sizes given")
    return list(dict.fromkeys(specs))


def site_sizes(spec: StoreSpec, workers: int) -> list[int] | None:
    """The rows of each site (None: n_j each). Named layouts follow Figure 7 (pipelines/async_vs_sync.py): sizes
    spread evenly from 1.5·n_j down to 0.5·n_j, on the workers in order of speed (profiles slow the later workers
    more), shuffled by seed + 7, or reversed."""
    if spec.sizes == "equal":
        return None
    if spec.sizes not in LAYOUTS:
        return [int(v) for v in spec.sizes.split(",")]
    n = spec.n_per_worker
    desc = np.linspace(1.5 * n, 0.5 * n, workers).round().astype(int)
    layout = {"aligned": desc, "unaligned": np.random.default_rng(spec.seed + 7).permutation(desc),
              "inverse": desc[::-1]}[spec.sizes]
    return [int(v) for v in layout]


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



def fit(store, setting, runtime, mode, profile, client=None, max_iter=300, tol=1e-10, time_budget=None,
        strategies=None, preset="paper"):
    from spatialfed.api import Emulation, FederatedGP

    asked = {**(strategies or {}), **({"agg_threshold": setting.agg} if mode == "async" else {})}
    gp = FederatedGP(mode=mode, residual=setting.residual, knots=setting.knots, nu=setting.nu, max_iter=max_iter,
                     tol=tol, emulation=Emulation(profile=profile), cluster=runtime if client is None else client, seed=0,
                     time_budget=time_budget, strategies={"preset": preset, **asked}, progress=False)
    tic = time.perf_counter()
    gp.fit(store)
    gp.wall_s = time.perf_counter() - tic
    say(f"  {runtime:9s} {profile:8s} {mode:5s}: {gp.n_iter_} iterations ({gp.stop_reason_}), "
        f"trace ends at {gp.trace_[-1]['time_s']:.2f} s, took {gp.wall_s:.1f} s wall; "
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


def fit_stats(store, setting, mode, profile, max_iter=300, tol=1e-5, time_budget=None, cache=None, grow=True,
              agg_threshold=None, options=None, cost=None, charge_server=True, network=None):
    """StatsServer (SPEC §2b) driven over the store's sites on the virtual clock, knots as the estimator lays them
    out on the unit square. The clock charges the server's measured CPU (`charge_server`) and the sites `cost`
    (None: FlopCost.calibrated, this machine's rate), over `network` (runtime.heterogeneity.NetworkDelay). `cache`: {(site, u bytes): statistics} shared by runs (the synchronous runs of
    every profile visit the same u; reusing their statistics changes nothing but the wall time); grow=False only
    reads it (an asynchronous run visits mostly new u, and ~1 MB each at m = 100). `options`: further FitConfig
    settings."""
    import uuid

    from spatialfed.algorithm.config import FitConfig
    from spatialfed.algorithm.protocol import STATS_STEP, Quantity, evaluate
    from spatialfed.algorithm.server_base import Phase
    from spatialfed.algorithm.stats_server import StatsServer
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.data.store import open_store
    from spatialfed.model.matern import Matern
    from spatialfed.runtime import site
    from spatialfed.runtime.blas import limit_blas_threads
    from spatialfed.runtime.driver import drive
    from spatialfed.runtime.interface import Event
    from spatialfed.runtime.virtual import VirtualRuntime, message_bytes

    class CachedRuntime(VirtualRuntime):
        """The virtual clock with statistics reused across runs (same u, same site → same statistics)."""

        def submit(self, j, p, delay_s=0.0):
            key = None if cache is None or p.step != STATS_STEP else (j, p.params.u.tobytes())
            if key is None or (key not in cache and not grow):
                return super().submit(j, p, delay_s)
            if key not in cache:
                cache[key] = evaluate(self.models[j], p, j).xi
            q = Quantity(cache[key], p.t, p.step, j)
            finish = (self._now + self.network.seconds(message_bytes(p)) + self._s[j] * self.cost.seconds(
                self.models[j], p, 0.0) + self.network.seconds(message_bytes(q)) + delay_s)
            heapq.heappush(self._events, (finish, next(self._order), Event(j, p, q)))

    info = open_store(store)
    knots = jittered_unit_grid(setting.knots, seed=0)
    kernel = Matern(setting.nu)
    specs = site.site_specs(uuid.uuid4().hex[:12], info.path, info.n_workers, knots, kernel, setting.residual)
    settings = {"agg_threshold": agg_threshold, **(options or {})}
    config = FitConfig.of(mode=mode, max_iter=max_iter, tol=tol, time_budget=time_budget, **settings)
    class TimedServer(StatsServer):
        """StatsServer logging every answer of the loop (its arrival, site, kind and the epochs before it)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.answer_log = []  # (arrival time, site, kind, epochs completed) of every answer in the loop

        def _receive(self, qs, now):
            if self.phase == Phase.LOOP:
                for q in qs:
                    kind = ("epoch" if q.worker in self._owed and np.array_equal(q.xi["u"], self._epoch.params.u)
                            else "explore")
                    self.answer_log.append((float(now), int(q.worker), kind, int(self.epochs)))
            return super()._receive(qs, now)

    server = TimedServer(info.n_workers, knots, kernel, config)
    runtime = CachedRuntime(None, profile, cost, network, charge_server=charge_server)
    tic = time.perf_counter()
    with limit_blas_threads(1):  # as the estimator's virtual runtime: J small problems in turn
        drive(server, runtime, specs)
    out = StatsFit(server, time.perf_counter() - tic)
    # the clock when the fit ended: the final receive's own charge comes after the last trace row's time
    out.server_s, out.flop_rate, out.fit_s = runtime.server_s, runtime.cost.rate, runtime.now()
    say(f"  stats     {profile:9s} {mode:5s} {setting.residual}: {server.iterations} iterations "
        f"({server.stop_reason}), answers {server.answers}, trace ends at {server.trace[-1]['time_s']:.2f} s, took "
        f"{out.wall_s:.1f} s wall; δ={out.params_['delta']:.5g} σ²={out.params_['sigma2']:.5g} "
        f"β={out.params_['beta']:.5g} ℓ={server.loglik:.6f} boundary={server.boundary}")
    return out


def compare(profile, runtime, ref, sync, asyn, **more) -> dict:
    """One row: settle times against the reference fit `ref`, their ratio, ℓ differences to the reference."""
    sync_s = time_to_target(sync.trace_, ref.params_)
    async_s = time_to_target(asyn.trace_, ref.params_)
    return {"profile": profile, "runtime": runtime, "sync_s": sync_s, "async_s": async_s,
            "ratio": time_ratio(sync_s, async_s),
            "settled": sync_s is not None and async_s is not None, "dloglik": asyn.loglik_ - ref.loglik_,
            "sync_dloglik": sync.loglik_ - ref.loglik_, "sync_rounds": sync.n_iter_,
            "ratio_by_rtol": ratios_beside(sync.trace_, asyn.trace_, ref.params_), **more}


def time_ratio(sync_s, async_s) -> float | None:
    """async_s / sync_s (None when either run never settled)."""
    return None if (sync_s is None or async_s is None) else async_s / sync_s


def settle_ratio(sync_trace, async_trace, ref, rtol) -> float | None:
    """async / sync time to settle within rtol of ref (None when either never settles)."""
    return time_ratio(time_to_target(sync_trace, ref, rtol), time_to_target(async_trace, ref, rtol))


def ratios_beside(sync_trace, async_trace, ref) -> dict:
    """{rtol: settle_ratio} at each of RTOL_BESIDE (a row's ratio_by_rtol)."""
    return {f"{rtol:g}": settle_ratio(sync_trace, async_trace, ref, rtol) for rtol in RTOL_BESIDE}


def settled_by(answer_log, async_s, slowdowns) -> dict | None:
    """The answer after which the asynchronous estimate settled: the last to arrive by async_s (the settling trace
    row follows it), with its site, kind (epoch, explore), the epochs completed before it and its site's
    round trip as a share of the slowest site's (None when the run never settled)."""
    arrived = [a for a in answer_log if a[0] <= async_s * (1 + 1e-12)] if async_s is not None else []
    if not arrived:
        return None
    at, site, kind, epochs = arrived[-1]
    return {"site": site, "kind": kind, "epochs": epochs, "at_s": at,
            "round_trip_share": round(float(slowdowns[site] / np.max(slowdowns)), 3)}


def run_stats(store, setting, profiles, max_iter, options=None, sites_only=True, network=None):
    """Rows of the stats preset for one store: reference, then sync and async per profile (async gets at most 20×
    the synchronous settle time), on the charged clock (the server's measured CPU and the sites at this machine's
    calibrated rate: `ratio`) and, with `sites_only`, on the model that charges the sites only at FlopCost's 1e9
    flop/s (`ratio_sites_only`)."""
    from spatialfed.runtime.heterogeneity import resolve_slowdowns
    from spatialfed.runtime.virtual import FlopCost

    cache: dict = {}
    say("reference: synchronous StatsServer to tol 1e-10 (virtual clock)")
    ref = fit_stats(store, setting, "sync", "balanced", max_iter=100, tol=1e-10, cache=cache, charge_server=False)
    say(f"  calibrated site rate {ref.flop_rate:.3g} flop/s (a statistics request on the median site)")
    rows = []
    for profile in profiles:
        runs = {}
        for name, clock in (("charged", {"cost": FlopCost(ref.flop_rate), "network": network}),
                            ("sites_only", {"cost": FlopCost(), "charge_server": False}))[:2 if sites_only else 1]:
            sync = fit_stats(store, setting, "sync", profile, max_iter=100, cache=cache, **clock)
            sync_s = time_to_target(sync.trace_, ref.params_)
            budget = None if sync_s is None else 20 * sync_s
            asyn = fit_stats(store, setting, "async", profile, max_iter=max_iter, time_budget=budget, cache=cache,
                             grow=False, options=options, **clock)
            runs[name] = (sync, asyn)
        sync, asyn = runs["charged"]
        slowdowns = resolve_slowdowns(profile, asyn.server.n_workers)
        settled = settled_by(asyn.server.answer_log, time_to_target(asyn.trace_, ref.params_), slowdowns)
        beside = {}
        if sites_only:
            old_sync, old_async = runs["sites_only"]
            beside = {"ratio_sites_only": settle_ratio(old_sync.trace_, old_async.trace_, ref.params_, RTOL),
                      "async_server_s_sites_only": round(old_async.server_s, 3)}
        rows.append(compare(profile, "simulated", ref, sync, asyn, async_rounds=round(asyn.server.rounds, 2),
                            async_settled_by=settled, flop_rate=float(f"{ref.flop_rate:.4g}"),
                            async_aggregations=asyn.n_iter_, async_slowest_answers=int(min(asyn.server.answers)),
                            sync_server_s=round(sync.server_s, 3), async_server_s=round(asyn.server_s, 3),
                            async_fit_s=round(asyn.fit_s, 6),
                            async_server_share=round(asyn.server_s / max(asyn.fit_s, 1e-12), 3),
                            **beside, wall_s=round(ref.wall_s / len(profiles) + sum(
                                f.wall_s for pair in runs.values() for f in pair), 2)))
        say(f"  -> {rows[-1]}")
    return rows


def run_block(store, setting, runtime, profiles, max_iter, options=None, preset="paper", dask_workers=None):
    """Rows of a block-scheme preset (tuned, paper, basic) through FederatedGP, on the simulated runtime or Dask;
    the reference is the synchronous fit to tol 1e-10 on the simulated runtime (deterministic)."""
    say("reference: synchronous fit to tol 1e-10 (simulated runtime, deterministic)")
    ref = fit(store, setting, "simulated", "sync", "balanced", max_iter=100)
    handle = client = None
    if runtime == "dask":
        from spatialfed.runtime.cluster import local_cluster

        handle = local_cluster(dask_workers)
        client = handle.client
        say(f"Dask dashboard: {handle.dashboard_link}")
    rows = []
    try:
        for profile in profiles:
            if runtime == "simulated" and profile == "balanced":
                sync = ref
            else:
                sync = fit(store, setting, runtime, "sync", profile, client, max_iter=100)
            sync_s = time_to_target(sync.trace_, ref.params_)
            budget = None if sync_s is None else 20 * sync_s  # async gets 20× the sync time at most
            asyn = fit(store, setting, runtime, "async", profile, client, max_iter=max_iter, time_budget=budget,
                       strategies=options, preset=preset)
            rows.append(compare(profile, runtime, ref, sync, asyn, async_rounds=asyn.n_iter_,
                                wall_s=round(sync.wall_s + asyn.wall_s, 2)))
            say(f"  -> {rows[-1]}")
    finally:
        if handle is not None:
            handle.close()
    return rows


def fit_stats_dask(store, client, setting, mode, profile, max_iter=100, tol=1e-5, time_budget=None, scale=1.0):
    """The estimator itself, ``FederatedGP(preset="stats", cluster=client)`` (servers.server_for →
    StatsServer), on the fit_stats knots (jittered_unit_grid(M, seed=0)) and settings (async: agg_threshold 1, what
    StatsServer takes when given none); returns (gp, measures: answers per site, median wall of a statistics task,
    CPU seconds of the Dask worker processes and of this process, which runs the server, the client and the
    LocalCluster's scheduler). `scale`: every site's slowdown is multiplied by it (slowdown_scale in run_stats_dask)."""
    from distributed import get_task_stream

    from spatialfed.api import Emulation, FederatedGP
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.runtime.heterogeneity import profile_slowdowns

    J, M, NU, residual = setting.workers, setting.knots, setting.nu, setting.residual
    knots = jittered_unit_grid(M, seed=0)
    slowdown = tuple((scale * profile_slowdowns(profile, J)).tolist())
    gp = FederatedGP(mode=mode, residual=residual, knots=knots, nu=NU,
                     strategies={"preset": "stats", **({"agg_threshold": 1} if mode == "async" else {})},
                     max_iter=max_iter, tol=tol,
                     emulation=Emulation(profile=profile, slowdown=slowdown), cluster=client, seed=0,
                     time_budget=time_budget, progress=False)
    cpu0, here = client.run(time.process_time), time.process_time()
    tic = time.perf_counter()
    with get_task_stream(client) as ts:
        gp.fit(str(store))
    wall = time.perf_counter() - tic
    cpu1, here = client.run(time.process_time), time.process_time() - here
    if not np.array_equal(gp.knots_, knots):
        raise RuntimeError("the estimator laid out other knots than the virtual-clock run's; the references differ")
    if gp.config_.scheme_name != "stats":
        raise RuntimeError(f"preset 'stats' resolved to scheme {gp.config_.scheme_name!r}")
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


def task_costs(client, store, setting, params, slowdowns, repeats=3):
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

    J, M, NU, residual = setting.workers, setting.knots, setting.nu, setting.residual
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


def run_stats_dask(store, setting, profiles, max_iter, dask_workers, slowdown_scale=1.0):
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

    J, M, NU, residual = setting.workers, setting.knots, setting.nu, setting.residual
    say("reference: the estimator, synchronous stats fit to tol 1e-10 (simulated runtime)")
    ref_gp = FederatedGP(mode="sync", residual=residual, knots=jittered_unit_grid(M, seed=0), nu=NU, max_iter=100,
                         tol=1e-10, cluster="simulated", seed=0, strategies="stats", progress=False).fit(str(store))
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
            sync, sync_m = fit_stats_dask(store, client, setting, "sync", profile, max_iter=100,
                                          scale=slowdown_scale)
            sync_s = time_to_target(sync.trace_, ref)
            budget = None if sync_s is None else 20 * sync_s
            asyn, async_m = fit_stats_dask(store, client, setting, "async", profile, max_iter=max_iter,
                                           time_budget=budget, scale=slowdown_scale)
            async_s = time_to_target(asyn.trace_, ref)
            costs = task_costs(client, store, setting, ref, slowdown_scale * profile_slowdowns(profile, J))
            rows.append({"profile": profile, "runtime": "dask", "sync_s": sync_s, "async_s": async_s,
                         "ratio": time_ratio(sync_s, async_s),
                         "settled": sync_s is not None and async_s is not None,
                         "dloglik": asyn.loglik_ - ref_gp.loglik_, "sync_dloglik": sync.loglik_ - ref_gp.loglik_,
                         "sync_rounds": sync.n_iter_, "async_rounds": round(async_m["rounds"], 2),
                         "ratio_by_rtol": ratios_beside(sync.trace_, asyn.trace_, ref),
                         "async_aggregations": asyn.n_iter_,
                         "async_slowest_answers": int(min(async_m["answers"])), "dask_workers": dask_workers,
                         "slowdown_scale": slowdown_scale,
                         "sync_measures": sync_m, "async_measures": async_m, "task_costs": costs})
            say(f"  -> {json.dumps(rows[-1])}")
    finally:
        handle.close()
    return rows


def run_store(spec: StoreSpec, setting: Setting, profiles, runtimes, preset="stats", max_iter=300, options=None,
              dask_workers=None, slowdown_scale=1.0, store=None, latency=0.0, sites_only=True) -> list[dict]:
    """Simulate the store of `spec` (into `store`, or a temporary directory; an existing store is reused), run every
    profile on it in both modes, and return its rows, each labelled with the store's spec and the setting."""
    from spatialfed.data.simulate import simulate_store

    sizes = site_sizes(spec, setting.workers)
    label = {"seed": spec.seed, "partition": spec.partition, "sizes": spec.sizes,
             "n_per_worker": spec.n_per_worker}
    say(f"store {label}")
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        path = Path(store) if store else Path(tmp) / "bench.zarr"
        if (path / "zarr.json").exists():
            from dataclasses import replace

            from spatialfed.data.store import open_store

            setting = replace(setting, workers=open_store(path).n_workers)  # J of the store, not of --workers
        else:
            say(f"simulating J={setting.workers} × n={spec.n_per_worker} (sizes {sizes or 'equal'}, "
                f"{spec.partition}, ν={setting.nu}, β={setting.beta}, seed {spec.seed}) into {path}")
            simulate_store(path, setting.workers, None if sizes else spec.n_per_worker, sizes=sizes, nu=setting.nu,
                           beta=setting.beta, seed=spec.seed, partition=spec.partition, test_size=0)
        rows = []
        for runtime in runtimes:
            if preset == "stats" and runtime == "simulated":
                from spatialfed.runtime.heterogeneity import NetworkDelay

                rows += run_stats(path, setting, profiles, max_iter, options, sites_only, NetworkDelay(latency))
            elif preset == "stats":
                rows += run_stats_dask(path, setting, profiles, max_iter, dask_workers, slowdown_scale)
            else:
                rows += run_block(path, setting, runtime, profiles, max_iter, options, preset, dask_workers)
    more = {"site_sizes": sizes} if sizes else {}
    return [{**label, **row, **more, "workers": setting.workers, "knots": setting.knots, "nu": setting.nu,
             "beta": setting.beta, "residual": setting.residual, "preset": preset} for row in rows]


def kept_rows(path, specs, setting, preset, profiles, runtimes) -> tuple[dict, list]:
    """From a --rows file: {spec: its rows} for the stores of `specs` whose rows are all there (same setting and
    preset, every profile and runtime), and the file's rows of other stores and settings (kept when the file is
    rewritten)."""
    if path is None or not Path(path).exists():
        return {}, []
    try:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        wanted = set(specs)
        mine, others = {}, []
        for row in rows:
            spec = StoreSpec(row["seed"], row["n_per_worker"], row["partition"], row["sizes"])
            same = row["preset"] == preset and all(row[k] == v for k, v in asdict(setting).items())
            if same and spec in wanted and row["profile"] in profiles and row["runtime"] in runtimes:
                mine.setdefault(spec, []).append(row)
            else:
                others.append(row)
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a rows file of this benchmark ({type(exc).__name__}: {exc}); give another "
                         "path") from None
    complete = {spec: rs for spec, rs in mine.items() if len(rs) == len(profiles) * len(runtimes)}
    return complete, others  # the rows of an incomplete store are replaced when it runs


def store_specs(seeds, sizes_per_worker, partitions, layouts) -> list[StoreSpec]:
    """Every (seed, n_j, partition, sizes); an explicit size list stands for itself once, whatever n_j."""
    specs = []
    for seed in seeds:
        for layout in layouts:
            explicit = layout not in LAYOUTS
            ns = [round(sum(int(v) for v in layout.split(",")) / len(layout.split(",")))] if explicit \
                else sizes_per_worker
            for n in ns:
                for partition in partitions:
                    specs.append(StoreSpec(seed, n, partition, layout))
    return specs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", choices=["simulated", "dask", "both"], default="simulated")
    ap.add_argument("--n-per-worker", default="1000", help="comma-separated n_j values, e.g. 200,500,1000")
    ap.add_argument("--residual", choices=RESIDUALS, default="full")
    ap.add_argument("--profiles", default=",".join(PROFILES),
                    help="comma-separated: balanced,straggler,graded or graded:<min cores> (e.g. graded:12: cores "
                    "62 down to 12, slowdowns 1 to 5.2)")
    ap.add_argument("--max-iter", type=int, default=300, help="iteration cap of every asynchronous run (default 300)")
    ap.add_argument("--dask-workers", type=int, default=None,
                    help="Dask worker processes (default J: one per federated worker, as in the paper)")
    ap.add_argument("--dask-slowdown-scale", type=float, default=1.0, metavar="K",
                    help="--preset stats on Dask: multiply every site's slowdown by K ≥ 1 (default 1); "
                    "K ≥ J / cores lets J emulated machines share this host's cores without contention")
    ap.add_argument("--seed", type=int, default=None, help="one seed (the same as --seeds S)")
    ap.add_argument("--seeds", default=None, help="seeds of the simulated stores: ranges and lists, e.g. 0-9 or "
                    "0-4,7 (default 0)")
    ap.add_argument("--partition", default="random", help="comma-separated partitions of the simulated rows over "
                    "the workers: random, area (compact blocks), neighbor (default random)")
    ap.add_argument("--sizes", default="equal", help="site sizes: comma-separated layouts (equal, aligned, "
                    "unaligned, inverse: Figure 7's 1.5·n_j down to 0.5·n_j in the workers' speed order, shuffled, "
                    "reversed) or one list of J sizes, e.g. 100,150,...; ';' separates several (default equal)")
    ap.add_argument("--workers", type=int, default=Setting.workers, metavar="J",
                    help=f"workers of the simulated stores (default {Setting.workers})")
    ap.add_argument("--knots", type=int, default=Setting.knots, metavar="M",
                    help=f"knots (default {Setting.knots})")
    ap.add_argument("--nu", type=float, default=Setting.nu, help=f"Matérn smoothness (default {Setting.nu})")
    ap.add_argument("--range", "--beta", dest="beta", type=float, default=Setting.beta,
                    help=f"Matérn range β of the simulated field (default {Setting.beta})")
    ap.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="stores run at once in N worker processes (simulated runtime only; default 1)")
    ap.add_argument("--preset", default="stats",
                    help="preset: stats (the library's default: StatsServer, SPEC §2b; on --runtime dask through "
                    "FederatedGP(preset='stats')), tuned, paper or basic (the block scheme)")
    ap.add_argument("--async-options", type=json.loads, default=None, metavar="JSON",
                    help='extra FitConfig settings of the async runs, e.g. \'{"moving_average": false}\'')
    ap.add_argument("--latency", type=float, default=0.0, metavar="S",
                    help="one-way network latency of every message on the charged virtual clock (default 0)")
    ap.add_argument("--no-sites-only", dest="sites_only", action="store_false",
                    help="skip the old sites-only clock's ratio beside the charged one (ratio_sites_only)")
    ap.add_argument("--store", default=None, help="reuse/write the simulated store here instead of a temp dir "
                    "(one combination of seed, n_j, partition and sizes only)")
    ap.add_argument("--rows", default=None, metavar="PATH",
                    help="keep the rows here as JSON lines, rewritten (atomically) as each store finishes; a rerun "
                    "with the same options takes the stores already there from it instead of running them again")
    ap.add_argument("--summary-only", action="store_true",
                    help="with --rows: print the rows found there for these options and their summary, run nothing")
    ap.add_argument("--figure", default=None, metavar="PNG",
                    help="also draw every row's async/sync ratio per profile, n_j and partition, with the bounds")
    args = ap.parse_args(argv)

    from spatialfed.data import partition as partitions
    from spatialfed.runtime.heterogeneity import profile_slowdowns

    if args.seed is not None and args.seeds is not None:
        ap.error("give --seed or --seeds, not both")
    try:
        seeds = parse_seeds(args.seeds if args.seeds is not None else (args.seed or 0))
    except ValueError as exc:
        ap.error(f"--seeds: {exc}")
    try:
        ns = [int(v) for v in str(args.n_per_worker).split(",") if v]
    except ValueError:
        ap.error(f"--n-per-worker: give comma-separated integers, got {args.n_per_worker!r}")
    if not ns or min(ns) < 1:
        ap.error(f"--n-per-worker: give positive integers, got {args.n_per_worker!r}")
    for name in ("workers", "knots", "jobs", "max_iter"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(args, name)}")
    if not args.nu > 0 or not args.beta > 0:
        ap.error(f"--nu and --range must be > 0, got {args.nu} and {args.beta}")
    profiles = list(dict.fromkeys(v for v in args.profiles.split(",") if v))
    for profile in profiles:
        try:
            profile_slowdowns(profile, args.workers)
        except ValueError as exc:
            ap.error(f"--profiles: {exc}")
    partition_names = list(dict.fromkeys(v.strip() for v in args.partition.split(",") if v.strip()))
    for name in partition_names:
        try:
            kind, _ = partitions.parse_scheme(name)
        except Exception as exc:  # noqa: BLE001 - the library's message names the cause
            ap.error(f"--partition: {exc}")
        if kind == "column":
            ap.error("--partition: simulated data have no grouping column; use random, area or neighbor")
    try:
        layouts = parse_sizes(args.sizes, args.workers)
    except ValueError as exc:
        ap.error(f"--sizes: {exc}")
    if not args.dask_slowdown_scale >= 1:
        ap.error(f"--dask-slowdown-scale must be ≥ 1 (1 = the profile's slowdowns), got {args.dask_slowdown_scale}")
    if args.dask_slowdown_scale != 1 and (args.preset != "stats" or args.runtime == "simulated"):
        ap.error("--dask-slowdown-scale applies to --preset stats with --runtime dask or both")
    if args.jobs > 1 and args.runtime != "simulated":
        ap.error("--jobs runs stores in parallel on the virtual clock only; use --jobs 1 with --runtime dask")
    if args.summary_only and not args.rows:
        ap.error("--summary-only summarizes the rows of a --rows file; give --rows PATH")
    specs = store_specs(seeds, ns, partition_names, layouts)
    if args.store and len(specs) > 1:
        ap.error(f"--store holds one data set, but the options give {len(specs)} (seed, n_j, partition, sizes); "
                 "give one of each with it")
    setting = Setting(args.workers, args.knots, args.nu, args.beta, args.residual)
    runtimes = ["simulated", "dask"] if args.runtime == "both" else [args.runtime]
    common = dict(setting=setting, profiles=profiles, runtimes=runtimes, preset=args.preset, max_iter=args.max_iter,
                  options=args.async_options, dask_workers=args.dask_workers or setting.workers,
                  slowdown_scale=args.dask_slowdown_scale, store=args.store,
                  latency=args.latency, sites_only=args.sites_only)
    try:
        kept, others = kept_rows(args.rows, specs, setting, args.preset, profiles, runtimes)
    except ValueError as exc:
        ap.error(f"--rows: {exc}")
    todo = [] if args.summary_only else [spec for spec in specs if spec not in kept]
    rows = [row for spec in specs for row in kept.get(spec, [])]
    missing = [asdict(spec) for spec in specs if spec not in kept and args.summary_only]
    say(f"{len(specs)} stores × {len(profiles)} profiles: {len(kept)} found in {args.rows}, "
        f"{len(todo)} to run in {args.jobs} job(s)" if args.rows else f"{len(specs)} stores × {len(profiles)} "
        f"profiles, {args.jobs} job(s)")
    tic = time.perf_counter()

    def finished(new):
        rows.extend(new)
        if args.rows:
            from spatialfed.atomic import write_text

            write_text(args.rows, "".join(json.dumps(r) + "\n" for r in others + rows))
        say(f"[{len(rows) // (len(profiles) * len(runtimes))}/{len(specs)} stores done, "
            f"{time.perf_counter() - tic:.0f} s]")

    if args.jobs == 1:
        for spec in todo:
            finished(run_store(spec, **common))
    elif todo:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for future in as_completed([pool.submit(run_store, spec, **common) for spec in todo]):
                finished(future.result())
    order = {p: i for i, p in enumerate(profiles)}
    rows.sort(key=lambda r: (r["seed"], r["n_per_worker"], r["partition"], r["sizes"], order[r["profile"]],
                             r["runtime"]))
    out = {"settings": {**asdict(setting), "seeds": seeds, "profiles": profiles, "n_per_worker": ns,
                        "partitions": partition_names, "sizes": layouts, "preset": args.preset,
                        "runtimes": runtimes, "async_options": args.async_options, "max_iter": args.max_iter,
                        "rtol": RTOL, "loglik_tol": LOGLIK_TOL, "jobs": args.jobs},
           "rows": rows, "summary": summarize(rows, profiles), "wall_s": round(time.perf_counter() - tic, 1)}
    if missing:  # --summary-only: the stores not (yet) in the rows file
        out["missing_stores"] = missing
        say(f"{len(missing)} of the {len(specs)} stores are not in {args.rows}: the summary covers the others")
    say(table(out["summary"]))
    if args.figure:
        figure(rows, profiles, args.figure)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
