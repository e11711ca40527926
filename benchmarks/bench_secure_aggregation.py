"""Cost of secure aggregation (docs/secure-aggregation.md): wall time and bytes of a synchronous statistics fit with
and without masking, side by side, at J sites; prints JSON rows.

The sites run in this process on the virtual runtime (their computations are real: the statistics, the masks, the
server's decoding), one after another, so the wall time is the fit's total compute; bytes are what the requests
and the answers carry (runtime.virtual.message_bytes: arrays, keys, masked integers).

    PYTHONPATH=. python benchmarks/bench_secure_aggregation.py --sites 10 50 --n 40 --knots 25
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.make_server import server_for
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.runtime.blas import limit_blas_threads
from spatialfed.runtime.virtual import message_bytes, run_virtual


def sites(J: int, n: int, side: int, seed: int = 0):
    """J sites of n points in vertical strips of [0, 1]²: a smooth field plus noise, one covariate and an intercept."""
    rng = np.random.default_rng(seed)
    g = (np.arange(side) + 0.5) / side
    knots = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    models = []
    for j in range(J):
        locs = np.column_stack([(j + rng.uniform(size=n)) / J, rng.uniform(size=n)])
        X = np.column_stack([np.ones(n), rng.standard_normal(n)])
        field = np.sin(3 * locs[:, 0]) * np.cos(4 * locs[:, 1])
        z = X @ [1.0, 0.5] + field + 0.3 * rng.standard_normal(n)
        models.append(LocalModel(locs, z, X, knots, Matern(0.5), "full"))
    return models, knots


def fit(models, knots, secure: bool) -> dict:
    config = FitConfig.of(mode="sync", scheme="stats", max_iter=60, tol=1e-8, secure_aggregation=secure)
    server = server_for(len(models), knots, Matern(0.5), config)
    sent = {"requests": 0, "answers": 0}

    def count(j, p, q):
        if p is not None:
            sent["requests"] += message_bytes(p)
            sent["answers"] += message_bytes(q)

    tic = time.perf_counter()
    server = run_virtual(models, knots, Matern(0.5), server=server, on_result=count)
    wall = time.perf_counter() - tic
    return {"wall_s": wall, "bytes": sent["requests"] + sent["answers"], **sent, "loglik": server.loglik,
            "round_trips": server.epochs + 1, "redone": getattr(server, "redone", 0)}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sites", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--n", type=int, default=40, help="points per site")
    ap.add_argument("--knots", type=int, default=25, help="knots (a square number: a side × side grid)")
    args = ap.parse_args(argv)
    side = int(round(np.sqrt(args.knots)))
    rows = []
    with limit_blas_threads(1):
        for J in args.sites:
            models, knots = sites(J, args.n, side)
            plain, secure = fit(models, knots, False), fit(models, knots, True)
            row = {"sites": J, "n_per_site": args.n, "knots": side * side, "plain": plain, "secure": secure,
                   "wall_ratio": secure["wall_s"] / plain["wall_s"], "bytes_ratio": secure["bytes"] / plain["bytes"],
                   "loglik_difference": abs(secure["loglik"] - plain["loglik"])}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
