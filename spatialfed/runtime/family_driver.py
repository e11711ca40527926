"""Run the Matérn family's statistics server (algorithm/family_fit.py) on Dask: each site's data is scattered to a
worker once; the server sends u and receives S_j and its derivatives (model/family_stats.py). Synchronous: rounds
of all sites at one u. Asynchronous: the server steps on every answer, in the order they arrive, and sends that site
the new u at once (distributed.as_completed)."""

from __future__ import annotations

import numpy as np
from distributed import as_completed

from spatialfed.algorithm.family_fit import FamilyServer
from spatialfed.model.family import MaternFamily
from spatialfed.model.family_stats import family_statistics


def _site_statistics(part, knots, family, residual, u):
    locs, z, X = part
    return family_statistics(locs, z, X, knots, family, residual, u)


def fit_dask(client, parts, knots, family: MaternFamily, residual: str, u0, lower, upper, synchronous: bool = True,
             tol: float = 1e-7, max_answers: int = 5000) -> FamilyServer:
    """The stopped server (`done`: the exact Profile at the estimate) after fitting on `client`'s workers."""
    knots = np.asarray(knots, dtype=float)
    server = FamilyServer(knots, family, np.asarray(u0, dtype=float), lower, upper, len(parts), tol=tol)
    data = client.scatter(list(parts), hash=False)  # one future per site (hash=False: fits never share keys)

    site_of = {}

    def ask(j, u):
        future = client.submit(_site_statistics, data[j], knots, family, residual, np.array(u), pure=False)
        site_of[future.key] = j
        return future

    if synchronous:
        for _ in range(max_answers // len(parts)):
            u = server.u
            for j, st in enumerate(client.gather([ask(j, u) for j in range(len(parts))])):
                server.receive(j, st, synchronous=True)
            if server.done is not None:
                return server
    else:
        pending = as_completed([ask(j, server.u) for j in range(len(parts))])
        for answers, future in enumerate(pending):
            j = site_of.pop(future.key)
            nxt = server.receive(j, future.result(), synchronous=False)
            if server.done is not None:
                client.cancel([f for f in pending.futures])
                return server
            if answers >= max_answers:
                break
            pending.add(ask(j, nxt))
    raise RuntimeError(f"the family fit did not stop within {max_answers} site answers (tol={tol:g})")
