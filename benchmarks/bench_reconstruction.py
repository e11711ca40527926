"""A curious server's reconstruction attack on one site's messages (docs/privacy.md, "What the server can learn").

A default synchronous fit (statistics scheme, full residual) runs on a simulated store of three sites on [0,1]²;
the server records every message site 0 sends: the start pass (XᵀX, Xᵀz, zᵀz, n, extent; the binned semivariances)
and, per request, S = WᵀR⁻¹W with W = [B X z], its u-derivatives and log det R at the requested u. Everything the
attacker uses besides them is public: the knots, the kernel, u at each request, n_j.

- **Values, locations known** (`recover_values`): the z column of S, [B X]ᵀR⁻¹z, and of ∂S/∂log δ, ε[B X]ᵀR⁻²z,
  are linear in z with coefficients computable from the locations and u; stacked over the requests with the start
  pass's Xᵀz they are solved by least squares. Reported: ‖ẑ − z‖/‖z‖ and the share of values within 1 %.
- **Locations, values unknown** (`recover_locations`): the B block of S, BᵀR⁻¹B, depends on the locations alone;
  the attacker fits n_j points in the knots' box to it over the requests (multistart least squares) and matches
  them to the true points (Hungarian). Reported: the median distance as a share of the box's side and the share of
  points within 1 % of it.
- The same with the block scheme's Gaussian noise on each array (algorithm/privacy.py: σ = z·2c·n_j, z the
  documented multipliers, c the smallest clip that leaves this site's arrays unclipped) and with only the sum over
  the 3 sites (what secure aggregation releases), the attacker still knowing site 0's locations.
- **A published map** (`map_minima`, Meuse): the local minima of the predicted sd (the default predictor, as
  `spatialfed map` draws it) on 20 m cells
  against the observation points, and the mean there against the observed values.

    python benchmarks/bench_reconstruction.py [--quick] [--out rows.jsonl]

prints one JSON row per (n_j, m, release, target) and one for the map; --quick: n_j = 20, m = 25 only.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import uuid
from pathlib import Path

import numpy as np
from harness import emitter, say
from scipy import optimize

SIZES = (20, 50, 200, 1000)
KNOTS = (25, 100)
#: the block scheme's documented noise multipliers z (docs/privacy.md, its measured table)
MULTIPLIERS = (1e-5, 1e-4, 1e-2)
#: locations are attacked up to this n_j (2 n_j unknowns, a numerical Jacobian of 2 n_j O(n_j³) evaluations)
MAX_LOCATION_N = 20
#: residual evaluations per start of the location fit (each O(n_j³), a numerical Jacobian costs 2 n_j of them)
MAX_NFEV = 40
NU = 1.5
#: the attacker's truncation of the stacked system's singular values (relative): noise-free messages are consistent,
#: so it costs them nothing, and it keeps noisy ones from being amplified without bound
RCOND = 1e-6


def record_fit(n: int, m: int, J: int = 3, seed: int = 0, max_iter: int | None = None) -> dict:
    """Run a default sync fit on a simulated store of J sites of n points and m knots; returns every message each
    site sent ("messages": site → list of ξ in arrival order), the sites' data, the knots and the kernel."""
    from spatialfed.algorithm.config import FitConfig
    from spatialfed.algorithm.stats_server import StatsServer
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.data.simulate import simulate_store
    from spatialfed.data.store import load_worker, open_store
    from spatialfed.model.matern import Matern
    from spatialfed.runtime import site
    from spatialfed.runtime.driver import drive
    from spatialfed.runtime.factory import open_runtime

    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "s.zarr"
        simulate_store(store, J, n, seed=seed, test_size=0, nu=NU, partition="area")
        info = open_store(store)
        knots, kernel = jittered_unit_grid(m, seed=0), Matern(NU)
        config = FitConfig.of(mode="sync", **({} if max_iter is None else {"max_iter": max_iter}))
        server = StatsServer(J, knots, kernel, config)
        messages = {j: [] for j in range(J)}
        specs = site.site_specs(uuid.uuid4().hex[:12], info.path, J, knots, kernel, "full")
        with open_runtime("simulated", n_sites=J) as runtime:
            drive(server, runtime, specs, on_result=lambda j, p, q: p is not None and messages[j].append(
                {"step": q.step, **q.xi}))
        parts = [load_worker(store, j) for j in range(J)]
    return {"messages": messages, "parts": parts, "knots": knots, "kernel": kernel, "loglik": server.loglik}


def _public_model(locs, X, knots, kernel):
    from spatialfed.model.local import LocalModel

    return LocalModel(np.asarray(locs, float), np.zeros(len(locs)), X, knots, kernel, residual="full")


def _coefficients(lm, u) -> tuple[np.ndarray, np.ndarray, float, np.ndarray]:
    """(A, P, ε, B) at u: A = [B X]ᵀR⁻¹ (m+p × n), P = R⁻¹, ε = 1/δ and the knot basis B: what the attacker
    computes from the locations."""
    from spatialfed.model.dense import inverse_in_place
    from spatialfed.model.params import Params

    delta, sigma2, beta = np.exp(np.asarray(u, float))
    fz = lm.factorise(Params(np.zeros(lm.m), np.eye(lm.m), np.zeros(lm.p), delta, sigma2, beta), whiten=False)
    P = np.array(inverse_in_place(fz.factor), dtype=float)
    P = np.triu(P) + np.triu(P, 1).T if not np.allclose(P, P.T) else P  # the factor's storage: upper triangle
    W1 = np.hstack([fz.kb.B, lm.X])
    return (P @ W1).T, P, fz.eps, fz.kb.B


def theta_messages(messages) -> list[dict]:
    """The per-request statistics messages (those with an S) of one site."""
    return [q for q in messages if "S" in q]


def recover_values(locs, X, knots, kernel, messages) -> np.ndarray:
    """ẑ from one site's recorded messages given its locations (and X): least squares on the z columns of S and
    ∂S/∂log δ at every request ([B X]ᵀR⁻¹z and ε[B X]ᵀR⁻²z, linear in z) and the start pass's Xᵀz."""
    lm = _public_model(locs, X, knots, kernel)
    rows, rhs = [], []
    for q in messages:
        if "Xtz" in q:
            rows.append(np.asarray(X, float).T)
            rhs.append(np.atleast_1d(q["Xtz"]))
        if "S" in q:
            A, P, eps, _ = _coefficients(lm, q["u"])
            k = A.shape[0]
            rows += [A, eps * (A @ P)]
            rhs += [np.asarray(q["S"])[:k, -1], np.asarray(q["dS"])[0][:k, -1]]
    M, y = np.vstack(rows), np.concatenate(rhs)
    scale = np.linalg.norm(M, axis=1)
    scale[scale == 0] = 1.0
    return np.linalg.lstsq(M / scale[:, None], y / scale, rcond=RCOND)[0]


def recover_locations(n: int, X, knots, kernel, messages, *, starts: int = 2, seed: int = 0,
                      max_requests: int = 2) -> np.ndarray:
    """n locations fitted to the B blocks BᵀR⁻¹B of the recorded messages (values unknown): least squares over the
    knots' box from `starts` random starts, the best kept; uses the last `max_requests` requests."""
    msgs = theta_messages(messages)[-max_requests:]
    m = len(knots)
    lo, hi = knots.min(axis=0), knots.max(axis=0)
    iu = np.triu_indices(m)
    targets = [np.asarray(q["S"])[:m, :m][iu] for q in msgs]
    norm = max(np.linalg.norm(t) for t in targets)

    def residual(flat):
        lm = _public_model(flat.reshape(n, 2), X, knots, kernel)
        out = []
        for q, t in zip(msgs, targets):
            A, _, _, B = _coefficients(lm, q["u"])
            out.append(((A[:m] @ B)[iu] - t) / norm)  # BᵀR⁻¹B at the candidate locations
        return np.concatenate(out)

    rng = np.random.default_rng(seed)
    best = None
    for _ in range(starts):
        x0 = rng.uniform(lo, hi, (n, 2)).ravel()
        fit = optimize.least_squares(residual, x0, bounds=(np.tile(lo, n), np.tile(hi, n)), max_nfev=MAX_NFEV)
        if best is None or fit.cost < best.cost:
            best = fit
    return best.x.reshape(n, 2)


def value_scores(z_hat, z) -> dict:
    """Relative error of the recovered values and the share within 1 % of each value."""
    z_hat, z = np.asarray(z_hat), np.asarray(z)
    return {"rel_error": float(np.linalg.norm(z_hat - z) / np.linalg.norm(z)),
            "within_1pct": float(np.mean(np.abs(z_hat - z) <= 0.01 * np.abs(z)))}


def location_scores(found, locs, side: float) -> dict:
    """Median matched distance (Hungarian) as a share of `side` and the share of points within 1 % of it."""
    from scipy.optimize import linear_sum_assignment
    from scipy.spatial.distance import cdist

    D = cdist(found, locs)
    r, c = linear_sum_assignment(D)
    d = D[r, c] / side
    return {"median_distance": float(np.median(d)), "within_1pct": float(np.mean(d <= 0.01))}


def noised(messages, n: int, z: float, seed: int = 0) -> list[dict]:
    """The messages with the block scheme's Gaussian mechanism (noise multiplier z) on every released array, with
    the smallest per-observation clip that leaves these arrays unclipped (the most favourable public choice)."""
    from spatialfed.algorithm.privacy import EXEMPT_KEYS, GaussianMechanism

    keys = [k for k in ("S", "dS", "d2S", "d", "dd", "d2d", "XtX", "Xtz", "ztz") if any(k in q for q in messages)]
    clip = {k: 1.0001 * max(np.linalg.norm(np.asarray(q[k], float)) for q in messages if k in q) / n for k in keys}
    mech = GaussianMechanism(noise_multiplier=z, clip=clip, seed=seed)
    out = []
    for t, q in enumerate(messages):
        xi = {k: v for k, v in q.items() if k in clip}
        noisy, _ = mech.privatize(xi, n=n, worker=0, t=t, step=str(q["step"]))
        out.append({**{k: v for k, v in q.items() if k not in clip or k in EXEMPT_KEYS}, **noisy})
    return out


def summed(messages_by_site: dict) -> list[dict]:
    """What secure aggregation releases: per message, the sum over the sites (they answer the same requests)."""
    sites = list(messages_by_site.values())
    out = []
    for qs in zip(*sites):
        q0 = dict(qs[0])
        for k in ("S", "dS", "d2S", "d", "dd", "d2d", "XtX", "Xtz", "ztz", "n"):
            if k in q0:
                q0[k] = sum(np.asarray(q[k], float) for q in qs)
        out.append(q0)
    return out


def attack_rows(n: int, m: int, *, seed: int = 0, locations: bool = True, multipliers=MULTIPLIERS) -> list[dict]:
    """Every row of one (n_j, m): values (plain, noised at each z, 3-site sum) and locations (plain)."""
    rec = record_fit(n, m, seed=seed)
    locs, z, X = rec["parts"][0]
    own = rec["messages"][0]
    base = {"n_j": n, "m": m, "requests": len(theta_messages(own)),
            "numbers_sent": int(sum(sum(np.size(v) for k, v in q.items() if k not in ("step", "u", "c", "m", "p"))
                                    for q in own))}
    releases = [("plain", own)] + [(f"dp z={zm:g}", noised(own, n, zm)) for zm in multipliers] + \
        [("sum of 3 sites", summed(rec["messages"]))]
    rows = []
    for name, msgs in releases:
        z_hat = recover_values(locs, X, rec["knots"], rec["kernel"], msgs)
        rows.append({**base, "release": name, "target": "values (locations known)", **value_scores(z_hat, z)})
    if locations and n <= MAX_LOCATION_N:
        found = recover_locations(n, X, rec["knots"], rec["kernel"], own, seed=seed)
        side = float(np.ptp(rec["knots"], axis=0).max())
        rows.append({**base, "release": "plain", "target": "locations (values unknown)",
                     **location_scores(found, locs, side)})
    return rows


def map_minima(resolution: float = 20.0) -> dict:
    """Local minima of a Meuse sd map (20 m cells) against the observation points: the share within one cell, the
    median distance, and the correlation of the mapped mean there with the observed values (log zinc)."""
    import pandas as pd
    from scipy.ndimage import minimum_filter
    from scipy.spatial import cKDTree

    from spatialfed.api import FederatedGP
    from spatialfed.data import datasets, geometry

    frame = pd.read_csv(datasets.data_file("meuse", "meuse.csv"))[["x", "y", "zinc"]]
    gp = FederatedGP(cluster="simulated", crs="EPSG:28992", transform="log", n_sites=4, progress=False).fit(
        frame, "zinc")
    grid = geometry.prediction_grid(datasets.meuse_domain(), resolution)
    pts = grid.points
    pred = gp.predict(pd.DataFrame({"x": pts[:, 0], "y": pts[:, 1]}), return_std=True)
    mean, sd = (np.asarray(v, float) for v in pred)
    raster = grid.to_raster(sd)
    filled = np.where(np.isnan(raster), np.inf, raster)
    minima = (filled == minimum_filter(filled, size=3, mode="nearest")) & np.isfinite(filled)
    rows, cols = np.nonzero(minima)
    found = np.column_stack([grid.x[cols], grid.y[rows]])
    obs = frame[["x", "y"]].to_numpy(float)
    dist, nearest = cKDTree(found).query(obs)
    within = dist <= resolution
    at = cKDTree(pts).query(found[nearest[within]])[1]
    corr = float(np.corrcoef(mean[at], np.log(frame["zinc"].to_numpy()[within]))[0, 1])
    return {"target": "observation points from a published sd map", "dataset": "meuse", "cell_m": resolution,
            "points": len(obs), "minima": len(found), "points_within_one_cell": int(within.sum()),
            "median_distance_m": float(np.median(dist)), "mean_vs_observed_log_corr": corr}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="n_j = 20, m = 25 only, no map")
    ap.add_argument("--sizes", default=None, help="comma-separated n_j (default 20,50,200,1000)")
    ap.add_argument("--knots", default=None, help="comma-separated m (default 25,100)")
    ap.add_argument("--no-map", action="store_true", help="skip the Meuse map measurement")
    ap.add_argument("--out", type=Path, default=None, help="also append the JSON rows to this file")
    args = ap.parse_args(argv)
    emit = emitter(args.out)
    sizes = (20,) if args.quick else tuple(int(v) for v in (args.sizes or ",".join(map(str, SIZES))).split(","))
    knots = (25,) if args.quick else tuple(int(v) for v in (args.knots or ",".join(map(str, KNOTS))).split(","))
    for m in knots:
        for n in sizes:
            say(f"n_j = {n}, m = {m}")
            for row in attack_rows(n, m):
                emit(row)
    if not (args.quick or args.no_map):
        emit(map_minima())
    return 0


if __name__ == "__main__":
    sys.exit(main())
