"""Time one full round of local quantities (mu_sigma, gamma, theta; cold cache) against one N×N Cholesky.

    python benchmarks/bench_local.py --n 2000 --m 200 --nu 0.5 --residual full

Prints one JSON line. Both timings are the best of --repeats runs in this process under the same BLAS thread limit
(--threads, default 1: what every Dask worker task runs with; numpy and scipy each bundle an OpenBLAS, and their two
thread pools slow each other down when both run multi-threaded in one process). Parameter-free set-up (the worker's
distance matrices, computed once per fit) is reported as setup_s.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params
from spatialfed.runtime.blas import limit_blas_threads


def best_time(fn, repeats: int) -> float:
    """Best wall time of `repeats` calls of fn()."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--m", type=int, default=200)
    ap.add_argument("--nu", type=float, default=0.5)
    ap.add_argument("--residual", default="full", choices=["full", "mpp", "pp"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads for both timings (default 1)")
    args = ap.parse_args(argv)
    if args.n <= 0 or args.m <= 0:
        ap.error("--n and --m must be positive")

    rng = np.random.default_rng(args.seed)
    locs = rng.uniform(size=(args.n, 2))
    side = int(np.ceil(np.sqrt(args.m)))
    grid = (np.arange(side) + 0.5) / side
    knots = np.stack(np.meshgrid(grid, grid), -1).reshape(-1, 2)[: args.m]
    X = np.column_stack([np.ones(args.n), rng.standard_normal((args.n, 4))])
    z = rng.standard_normal(args.n)
    kernel = Matern(args.nu)
    t0 = time.perf_counter()
    model = LocalModel(locs, z, X, knots, kernel, args.residual)
    setup_s = time.perf_counter() - t0
    m = knots.shape[0]
    params = Params(np.zeros(m), 0.1 * np.eye(m), np.zeros(X.shape[1]), delta=0.25, sigma2=1.0, beta=0.1)

    def round_():
        model.clear_cache()
        for step in ("mu_sigma", "gamma", "theta"):
            model.quantity(step, params)

    A = rng.standard_normal((args.n, args.n))
    spd = A @ A.T / args.n + np.eye(args.n)
    with limit_blas_threads(args.threads):
        round_()  # warm-up (imports, BLAS thread pools)
        np.linalg.cholesky(spd)
        local_s = best_time(round_, args.repeats)
        chol_s = best_time(lambda: np.linalg.cholesky(spd), args.repeats)
    out = {
        "n": args.n,
        "m": m,
        "nu": args.nu,
        "residual": args.residual,
        "local_round_s": round(local_s, 5),
        "cholesky_s": round(chol_s, 5),
        "ratio_to_cholesky": round(local_s / chol_s, 3),
        "setup_s": round(setup_s, 5),
        "threads": args.threads,
    }
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
