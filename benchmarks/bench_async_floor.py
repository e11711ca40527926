"""How far can asynchrony go? The floor of issue 27's ratio, per store, from one answer of the slowest site.

An asynchronous statistics fit settles only when its estimate is within 1e-3 of the optimum u*, and the slowest
site's statistics enter it through a model (second-order Taylor, profile.taylor_statistics) around the points it
answered at. This script measures, per store, where the surrogate built from every other site's exact statistics and
ONE answer of the slowest site (site J−1: the slow one of the straggler and graded profiles) has its maximiser:

- answered at φ₀ (a site that is not held, as graded's): `one_answer_at_phi0` = max |Δ log θ| of that maximiser
  from u*. Above 1e-3 the slowest site must answer at least twice before the fit settles: async ≥ 2 T against
  sync's settle time;
- answered at u_s, the others' optimum (a held straggler): `one_answer_at_us`, the same distance.

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
from scipy.optimize import minimize

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_async_vs_sync as bench  # noqa: E402


def maximiser(statistics, start, bounds, knots, kernel) -> np.ndarray | None:
    """argmax over u in the box of ℓ_LR(Σ statistics(u)) from `start` (L-BFGS-B on the exact gradient); None when
    the summed statistics are not positive definite at `start` (a model that cannot be used there)."""
    from spatialfed.algorithm.profile import NotPositiveDefinite, profile_loglik, sum_statistics

    def negative(u):
        try:
            pr = profile_loglik(sum_statistics(statistics(u)), knots, kernel)
        except NotPositiveDefinite:
            return np.inf, np.zeros_like(u)
        return -pr.loglik, -np.asarray(pr.grad)

    if not np.isfinite(negative(np.asarray(start, dtype=float))[0]):
        return None
    return minimize(negative, start, jac=True, method="L-BFGS-B", bounds=list(zip(*bounds)),
                    options={"gtol": 1e-9, "ftol": 1e-15}).x


def floor_row(spec: bench.StoreSpec, setting: bench.Setting) -> dict:
    """One store: φ₀, u*, u_s and the two one-answer maximisers' distances from u*."""
    from spatialfed.algorithm.profile import taylor_statistics
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
    at_phi0 = maximiser(with_slow(answer(u0)), u_star, box, knots, kernel)
    at_us = maximiser(with_slow(answer(u_s)), u_star, box, knots, kernel)
    def gap(u):  # None: the model of the one answer is not even positive definite at u*
        return None if u is None else float(np.max(np.abs(u - u_star)))

    return {"seed": spec.seed, "n_per_worker": spec.n_per_worker, "partition": spec.partition,
            "phi0_from_optimum": far, "us_from_optimum": gap(u_s), "one_answer_at_phi0": gap(at_phi0),
            "one_answer_at_us": gap(at_us)}


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

    far = [np.inf if r["one_answer_at_phi0"] is None else r["one_answer_at_phi0"] for r in rows]
    summary = {"stores": len(rows), "one_answer_at_phi0_settles": settles("one_answer_at_phi0"),
               "one_answer_at_us_settles": settles("one_answer_at_us"), "median_one_answer_at_phi0": float(np.median(far))}
    print(json.dumps({"rows": rows, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
