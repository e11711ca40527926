"""What each covariance option costs a site: numbers per statistics message and CPU seconds of one evaluation.

    python benchmarks/bench_covariance_cost.py [--n 200 400] [--knots 36] [--repeats 3]

For each option (q = dim u) and site size n_j: the message's numbers (model/stats.py message_size:
k²(1 + q + q(q+1)/2) + q(q+1)/2 + q + 2, k = m + p + 1, here p = 1) and the median CPU seconds (process time, so
that other jobs on a shared machine do not inflate it) of model/family_stats.py family_statistics with the `full`
residual. One JSON line per (option, n_j).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from spatialfed.model.family import MaternFamily
from spatialfed.model.family_stats import family_statistics
from spatialfed.model.stats import message_size

OPTIONS = {"nu=0.5 isotropic": (MaternFamily(0.5), []), "nu estimated": (MaternFamily(None), [0.3]),
           "anisotropy": (MaternFamily(0.5, True), [0.5, 0.3]),
           "nu estimated + anisotropy": (MaternFamily(None, True), [0.3, 0.5, 0.3])}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=[200, 400])
    ap.add_argument("--knots", type=int, default=36)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    side = int(round(np.sqrt(a.knots)))
    g = (np.arange(side) + 0.5) / side
    knots = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    for n in a.n:
        locs, z, X = rng.uniform(size=(n, 2)), rng.standard_normal(n), np.ones((n, 1))
        for label, (family, rest) in OPTIONS.items():
            u = np.array([1.0, 0.0, np.log(0.2)] + rest)
            cpu = []
            for _ in range(a.repeats):
                t = time.process_time()
                st = family_statistics(locs, z, X, knots, family, "full", u)
                cpu.append(time.process_time() - t)
            print(json.dumps({"option": label, "q": family.q, "n_j": n, "m": len(knots),
                              "message_numbers": message_size(st), "cpu_s": float(np.median(cpu))}), flush=True)


if __name__ == "__main__":
    main()
