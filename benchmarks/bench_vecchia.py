"""The Vecchia residual against the full one on one site (issue 29): what k and which ordering cost and change.

    python benchmarks/bench_vecchia.py --n 2000 --beta 0.05 --nugget 0.05 --k 5,10,15,20,30

One site of --n uniform points on [0,1]² holds an exact draw of a Matérn-½ field (σ² = 1, range --beta) plus a
nugget, z = 1 + field, X = intercept, 100 knots on a grid. At the truth u = (log 1/nugget, 0, log β) the site answers
a statistics request (model/stats.py) with the full residual and with the Vecchia residual for every k and ordering;
the server's exact profile (algorithm/likelihood.py) gives ℓ_LR and the Newton step. One JSON row per residual:
{n, beta, nugget, residual, ordering, k, cpu_s (of the request, one BLAS thread), loglik, dloglik (vecchia − full),
dstep (largest |Newton step difference| in u)}.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from scipy.spatial.distance import cdist
from threadpoolctl import threadpool_limits

from spatialfed.algorithm.likelihood import profile_loglik, sum_statistics
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.stats import site_statistics
from spatialfed.model.vecchia_order import ORDERINGS


def site(n: int, beta: float, nugget: float, seed: int):
    rng = np.random.default_rng(seed)
    locs = rng.uniform(size=(n, 2))
    cov = Matern(0.5).covariance(cdist(locs, locs), 1.0, beta) + nugget * np.eye(n)
    z = 1.0 + np.linalg.cholesky(cov) @ rng.standard_normal(n)
    g = (np.arange(10) + 0.5) / 10
    return locs, z, np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--beta", type=float, default=0.05)
    ap.add_argument("--nugget", type=float, default=0.05)
    ap.add_argument("--k", default="5,10,15,20,30", help="comma list of neighbour counts")
    ap.add_argument("--orderings", default=",".join(ORDERINGS))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    locs, z, knots = site(args.n, args.beta, args.nugget, args.seed)
    u = np.log([1.0 / args.nugget, 1.0, args.beta])
    head = {"n": args.n, "beta": args.beta, "nugget": args.nugget}

    def answer(residual, **kw):
        lm = LocalModel(locs, z, np.ones((args.n, 1)), knots, Matern(0.5), residual, **kw)
        if lm.residual == "vecchia":
            lm.vecchia_plan  # the neighbours are found once per site and fit: not part of a request
        tic = time.process_time()
        stats = site_statistics(lm, u)
        cpu = time.process_time() - tic
        prof = profile_loglik(sum_statistics([stats]), knots, Matern(0.5))
        return prof.loglik, -np.linalg.solve(prof.hess, prof.grad), cpu

    with threadpool_limits(1):
        ll0, step0, cpu0 = answer("full")
        print(json.dumps({**head, "residual": "full", "cpu_s": round(cpu0, 3), "loglik": round(ll0, 3)}), flush=True)
        for ordering in args.orderings.split(","):
            for k in (int(v) for v in args.k.split(",")):
                ll, step, cpu = answer("vecchia", vecchia_k=k, vecchia_ordering=ordering)
                print(json.dumps({**head, "residual": "vecchia", "ordering": ordering, "k": k, "cpu_s": round(cpu, 3),
                                  "loglik": round(ll, 3), "dloglik": round(ll - ll0, 3),
                                  "dstep": round(float(np.max(np.abs(step - step0))), 4)}), flush=True)


if __name__ == "__main__":
    main()
