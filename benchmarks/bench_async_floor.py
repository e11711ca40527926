"""How far can asynchrony go? The floor of the asynchronous fit's ratio, per store, from one answer of the slowest site.

An asynchronous statistics fit settles only when its estimate is within 1e-3 of the optimum u*, and the slowest
site's statistics enter it through a model (second-order Taylor, likelihood.taylor_statistics) around the points it
answered at. This script measures, per store, where the surrogate built from every other site's exact statistics and
ONE answer of the slowest site (site J−1: the slow one of the straggler and graded profiles) has its maximiser:

- answered at φ₀ (a site that is not held, as graded's): `one_answer_at_phi0` = max |Δ log θ| of that maximiser
  from u*. Above 1e-3 the slowest site must answer at least twice before the fit settles: async ≥ 2 T against
  sync's settle time;
- answered at u_s, the others' optimum (a held straggler): `one_answer_at_us`, the same distance;
- answered at φ₀ and modelled as the server does by default, through the others' exact statistics (the control
  variate of stale.site_models: only its difference from them at φ₀, where every site answered the first epoch,
  is extrapolated): `one_answer_at_phi0_cv`;
- answered at φ₀ with exact third derivatives besides (forward differences of its second derivatives, h = 1e-4:
  what a site could add to its first answer at a price in compute): `one_answer_at_phi0_third`;
- a SECOND answer, modelled the same way around it: at the maximiser c_1 of the control-variate model above
  (`second_answer_at_c1`: the best second point the first answer allows) or at sync's first step u_1
  (`second_answer_at_u1`: the asynchronous loop's second epoch point). Where c_1's settles and u_1's does not, the
  loop's second point, not the models, keeps the slowest site answering more than twice.

`sync_settle_rounds`: when the synchronous fit settles (within 1e-3 of the optimum), in round trips. The summary's
floors are means of min(1, k / sync_settle_rounds) with k the slowest site's answers before the surrogate can settle:
1 everywhere (`floor_hard`: no estimate before its first answer), 1 where its one answer's model settles and 2
elsewhere (`floor_one_answer`, second order; `floor_one_answer_cv`, the control variate; `floor_one_answer_third`,
third order).

null: the one answer's model is not positive definite at u* (it cannot stand for the site there at all).

    python benchmarks/bench_async_floor.py --seeds 0-2 --n-per-worker 200,500 --partition random,area

Same stores, knots and kernel as bench_async_vs_sync.py (J = 10, m = 100, ν = 0.5, β = 0.1, full residual). Prints
one JSON document: {"rows": [...], "summary": {...}}; progress on stderr. Results: docs/results.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import uuid
from pathlib import Path

import numpy as np
from scipy.linalg import cho_factor, cho_solve

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_async_vs_sync as bench  # noqa: E402


def maximiser(statistics, start, bounds, knots, kernel, iterations: int = 200) -> np.ndarray | None:
    """argmax over u in the box of ℓ_LR(Σ statistics(u)) from `start`: Newton ascent on the exact gradient and
    Hessian, damped (Levenberg) until a step keeps the sums positive definite and does not lower ℓ; coordinates
    on a bound the gradient pushes against stay there. None when the sums are not positive definite at `start` (a
    model that cannot be used there). Not a quasi-Newton method: trial points where the sums are not positive
    definite are common far from a model's centre, and L-BFGS-B stops at the first one."""
    from spatialfed.algorithm.likelihood import NotPositiveDefinite, profile_loglik, sum_statistics

    def at(u):
        try:
            return profile_loglik(sum_statistics(statistics(u)), knots, kernel)
        except NotPositiveDefinite:
            return None

    lo, hi = (np.asarray(b, dtype=float) for b in bounds)
    u = np.clip(np.asarray(start, dtype=float), lo, hi)
    pr = at(u)
    if pr is None:
        return None
    damping = 0.0
    for _ in range(iterations):
        g, H = np.asarray(pr.grad), np.asarray(pr.hess)
        free = ~(((u <= lo) & (g < 0)) | ((u >= hi) & (g > 0)))
        scale = float(np.max(np.abs(H)))
        if not np.any(free) or np.max(np.abs(g[free])) <= 1e-10 * scale:
            return u
        while True:
            new = u.copy()
            try:
                new[free] += cho_solve(cho_factor(-H[np.ix_(free, free)] + damping * np.eye(int(free.sum()))), g[free])
            except np.linalg.LinAlgError:  # -H not positive definite on the free coordinates: damp more
                new = None
            new_pr = None if new is None else at(np.clip(new, lo, hi))
            if new_pr is not None and new_pr.loglik >= pr.loglik:
                u, pr, damping = np.clip(new, lo, hi), new_pr, damping / 10
                break
            damping = max(10 * damping, 1e-8 * scale)
            if damping > 1e8 * scale:  # no step raises ℓ in double precision: u is the maximiser to rounding
                return u
    return u


def floor_row(spec: bench.StoreSpec, setting: bench.Setting) -> dict:
    """One store: φ₀, u*, u_s, the one-answer maximisers' distances from u* and sync's settle rounds."""
    from spatialfed.algorithm.likelihood import sum_statistics, taylor_statistics
    from spatialfed.algorithm.stale import secant, site_models, u_key
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.data.simulate import simulate_store
    from spatialfed.data.store import open_store
    from spatialfed.model.matern import Matern
    from spatialfed.model.stats import site_statistics
    from spatialfed.runtime import site

    with tempfile.TemporaryDirectory(prefix="bench-floor-") as tmp:
        path = Path(tmp) / "floor.zarr"
        simulate_store(path, setting.workers, spec.n_per_worker, nu=setting.nu, beta=setting.beta, seed=spec.seed,
                       partition=spec.partition, test_size=0)
        ref = bench.fit_stats(path, setting, "sync", "balanced", max_iter=100, tol=1e-10)
        sync = bench.fit_stats(path, setting, "sync", "balanced")  # equal sites: every round trip lasts T
        knots, kernel = jittered_unit_grid(setting.knots, seed=0), Matern(setting.nu)
        info = open_store(path)
        run_id = uuid.uuid4().hex[:12]
        models = [site.local_model(s) for s in site.site_specs(run_id, info.path, info.n_workers, knots, kernel,
                                                                setting.residual)]
        site.release(run_id)  # this process's registry holds no partition after the script (models stay here)
    server = ref.server
    u_star = server.params.u
    init = next(row for row in server.trace if row["step"] == "init")
    u0 = np.log([init["delta"], init["sigma2"], init["beta"]])
    slow, others = len(models) - 1, range(len(models) - 1)

    def exact(u):
        return [site_statistics(models[k], server.params.with_u(np.asarray(u))) for k in others]

    def with_slow(answer):
        def statistics(u):
            rest = exact(u)
            return rest + [taylor_statistics(answer, rest[0]["u"])]
        return statistics

    def answer(u):
        return site_statistics(models[slow], server.params.with_u(np.asarray(u)))

    box = server.bounds
    u_s = maximiser(exact, u_star, box, knots, kernel)
    far = float(np.max(np.abs(u0 - u_star)))
    first = answer(u0)
    at_phi0 = maximiser(with_slow(first), u_star, box, knots, kernel)
    at_us = maximiser(with_slow(answer(u_s)), u_star, box, knots, kernel)
    third = secant(first, [answer(first["u"] + 1e-4 * e) for e in np.eye(3)], reach=np.inf)  # exact third order
    at_phi0_third = maximiser(with_slow(third), u_star, box, knots, kernel)

    def control_variate(one):  # the server's model of the slowest site from `one` answer, through the others there
        there = [taylor_statistics(st, one["u"]) for st in exact(one["u"])]  # at one["u"] to the bit (exp/log)
        epoch = {u_key(one["u"]): {"sum": sum_statistics(there + [one]), "sites": list(range(len(models)))}}

        def statistics(u):
            stats = {**dict(enumerate(exact(u))), slow: one}
            return [site_models(stats, epoch, range(len(models)), 1.0, True, np.asarray(u))(u)]
        return maximiser(statistics, u_star, box, knots, kernel)

    at_phi0_cv = control_variate(first)
    u1 = np.log([sync.trace_[1][k] for k in ("delta", "sigma2", "beta")])  # sync's first step from φ₀
    times = [row["time_s"] for row in sync.trace_]
    settle = bench.time_to_target(sync.trace_, ref.params_)
    def gap(u):  # None: the model of the one answer is not even positive definite at u*
        return None if u is None else float(np.max(np.abs(u - u_star)))

    return {"seed": spec.seed, "n_per_worker": spec.n_per_worker, "partition": spec.partition,
            "phi0_from_optimum": far, "us_from_optimum": gap(u_s), "one_answer_at_phi0": gap(at_phi0),
            "one_answer_at_us": gap(at_us), "one_answer_at_phi0_cv": gap(at_phi0_cv),
            "one_answer_at_phi0_third": gap(at_phi0_third),
            "second_answer_at_c1": None if at_phi0_cv is None else gap(control_variate(answer(at_phi0_cv))),
            "second_answer_at_u1": gap(control_variate(answer(u1))), "u1_from_optimum": gap(u1),
            "sync_settle_rounds": None if settle is None else (settle - times[0]) / (times[1] - times[0])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="0-2")
    ap.add_argument("--n-per-worker", default="200,500")
    ap.add_argument("--partition", default="random,area")
    ap.add_argument("--workers", type=int, default=10, help="J (the slowest site is the last)")
    ap.add_argument("--knots", type=int, default=100)
    ap.add_argument("--range", dest="beta", type=float, default=0.1, help="the field's Matérn range β")
    args = ap.parse_args(argv)
    setting, rows = bench.Setting(workers=args.workers, knots=args.knots, beta=args.beta), []
    for seed in bench.parse_seeds(args.seeds):
        for n in (int(v) for v in args.n_per_worker.split(",")):
            for partition in args.partition.split(","):
                rows.append(floor_row(bench.StoreSpec(seed, n, partition), setting))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    band = bench.RTOL
    def settles(key):
        return sum(r[key] is not None and r[key] <= band for r in rows)

    def floor(key=None):  # mean of min(1, k / sync's rounds), k = 1 where `key`'s one answer settles, else 2
        ks = [1 if key is None or (r[key] is not None and r[key] <= band) else 2 for r in rows]
        return float(np.mean([min(1.0, k / r["sync_settle_rounds"])
                              for k, r in zip(ks, rows) if r["sync_settle_rounds"]]))

    far = [np.inf if r["one_answer_at_phi0"] is None else r["one_answer_at_phi0"] for r in rows]
    summary = {"stores": len(rows), "one_answer_at_phi0_settles": settles("one_answer_at_phi0"),
               "one_answer_at_phi0_cv_settles": settles("one_answer_at_phi0_cv"),
               "one_answer_at_phi0_third_settles": settles("one_answer_at_phi0_third"),
               "one_answer_at_us_settles": settles("one_answer_at_us"),
               "second_answer_at_c1_settles": settles("second_answer_at_c1"),
               "second_answer_at_u1_settles": settles("second_answer_at_u1"),
               "median_one_answer_at_phi0": float(np.median(far)),
               "sync_settle_rounds_mean": float(np.mean([r["sync_settle_rounds"] or np.nan for r in rows])),
               "floor_hard": floor(), "floor_one_answer": floor("one_answer_at_phi0"),
               "floor_one_answer_cv": floor("one_answer_at_phi0_cv"),
               "floor_one_answer_third": floor("one_answer_at_phi0_third")}
    print(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
