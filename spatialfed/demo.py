"""`spatialfed demo`: an NO₂-like pollution field measured by five monitoring networks, fitted asynchronously.

The networks (a state agency, a city, an industry consortium, citizen sensors, a university) each own the stations
in their own area, in unequal numbers; the citizen-sensor network runs on a slow machine (a 62/3× straggler).
The field lives in UTM zone 32N (metres) over a 40 km × 30 km region: log-concentration = γ₀ + γ₁·traffic +
γ₂·urban + a Matérn(ν = 1.5, range 6 km) field + measurement noise. The fit runs on an embedded LocalCluster with
the library's defaults (the statistics scheme, asynchronous), and a synchronous fit of the same networks on the same
cluster shows what the asynchronous one saved.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from spatialfed.atomic import refuse_existing, write_atomic
from spatialfed.data import partition as partitions
from spatialfed.data.geometry import domain_from_bbox
from spatialfed.data.simulate import sample_field
from spatialfed.data.store import write_store
from spatialfed.model.matern import Matern

CRS = "EPSG:32632"
BBOX = (340_000.0, 5_690_000.0, 380_000.0, 5_720_000.0)
NETWORKS = ("state agency", "city", "industry", "citizen sensors", "university")
SIZES = (320, 260, 200, 140, 80)
TRUTH = {"gamma": [3.2, 0.6, 0.4], "delta": 1.0 / 0.15**2, "sigma2": 0.15, "nu": 1.5, "range_m": 6000.0}
COVARIATES = ["intercept", "traffic", "urban"]
SLOWDOWN = (1.0, 1.0, 1.0, 62.0 / 3.0, 1.0)
MAP_RESOLUTION_M = 250.0


def covariates(locs: np.ndarray) -> np.ndarray:
    """[1, traffic, urban]: exp(−distance to a motorway / 1.5 km) and a city-centre bump of 8 km scale."""
    x0, y0, x1, y1 = BBOX
    # a motorway crossing the region diagonally
    a, b = np.array([x0, y0 + 5_000.0]), np.array([x1, y1 - 8_000.0])
    t = np.clip(((locs - a) @ (b - a)) / ((b - a) @ (b - a)), 0.0, 1.0)
    d_road = np.linalg.norm(locs - (a + t[:, None] * (b - a)), axis=1)
    centre = np.array([x0 + 0.6 * (x1 - x0), y0 + 0.45 * (y1 - y0)])
    urban = np.exp(-np.sum((locs - centre) ** 2, axis=1) / (2 * 8_000.0**2))
    return np.column_stack([np.ones(len(locs)), np.exp(-d_road / 1_500.0), urban])


def simulate_networks(store: Path, seed: int = 0, test_size: int = 150):
    """Write the demo store: five area-based networks of unequal size plus a held-out test group."""
    rng = np.random.default_rng(seed)
    x0, y0, x1, y1 = BBOX
    n = sum(SIZES) + test_size
    locs = np.column_stack([rng.uniform(x0, x1, n), rng.uniform(y0, y1, n)])
    X = covariates(locs)
    kernel = Matern(TRUTH["nu"])
    beta = kernel.beta_from_range(TRUTH["range_m"])
    w, _ = sample_field(kernel, locs, TRUTH["sigma2"], beta, rng, "exact")
    z = X @ np.array(TRUTH["gamma"]) + w + rng.standard_normal(n) / np.sqrt(TRUTH["delta"])
    test = np.zeros(n, dtype=bool)
    test[rng.choice(n, size=test_size, replace=False)] = True
    labels = partitions.partition(locs[~test], "area", sizes=np.array(SIZES))
    parts = [(locs[~test][i], z[~test][i], X[~test][i]) for i in partitions.split(labels, len(SIZES))]
    truth = {"gamma": TRUTH["gamma"], "delta": TRUTH["delta"], "sigma2": TRUTH["sigma2"], "beta": beta,
             "nu": TRUTH["nu"]}
    return write_store(store, parts, partition="area", crs=CRS, covariate_names=COVARIATES, truth=truth,
                       test=(locs[test], z[test], X[test]), overwrite=True,
                       extra_attrs={"networks": list(NETWORKS), "value": "log NO2 (log µg/m³), simulated"})


def run_demo(out="spatialfed-demo", seed: int = 0, n_dask_workers=None, overwrite: bool = False) -> dict:
    """Simulate, fit asynchronously with one straggler on an embedded LocalCluster and synchronously on the same
    cluster, write the asynchronous fit's results; return their paths and both fits' wall times. An existing `out`
    (not empty) is refused before any work unless `overwrite`, which replaces its store, fit, map and covariates.csv
    (each atomically)."""
    from spatialfed.api import FederatedGP
    from spatialfed.api.options import Emulation
    from spatialfed.outputs.maps import make_map
    from spatialfed.runtime.cluster import default_n_workers, local_cluster

    out = Path(out)
    refuse_existing(out, overwrite)
    out.mkdir(parents=True, exist_ok=True)
    tic = time.perf_counter()
    store = out / "networks.zarr"
    info = simulate_networks(store, seed)
    print(f"simulated {sum(info.sizes)} stations in {info.n_workers} monitoring networks "
          f"({', '.join(f'{name}: {n}' for name, n in zip(NETWORKS, info.sizes))}) -> {store}", file=sys.stderr)
    handle = local_cluster(n_dask_workers or min(len(SIZES), default_n_workers()))
    try:  # both modes on one cluster, its workers' imports done first: their wall times differ only by the mode
        import importlib

        for module in ("spatialfed.runtime.site", "spatialfed.model.stats", "spatialfed.data.store"):
            handle.client.run(importlib.import_module, module)
        fits = {mode: FederatedGP(mode=mode, residual="full", knots=100, nu=TRUTH["nu"],
                                  emulation=Emulation(slowdown=list(SLOWDOWN)),
                                  domain=domain_from_bbox(*BBOX, crs=CRS), max_iter=60, seed=seed,
                                  cluster=handle.client).fit(store) for mode in ("async", "sync")}
    finally:
        handle.close()
    gp, sync = fits["async"], fits["sync"]
    print(f"asynchronous fit {gp.wall_time_s_:.1f} s, synchronous {sync.wall_time_s_:.1f} s on the same cluster "
          f"(log-likelihoods {gp.loglik_:.4f} and {sync.loglik_:.4f})", file=sys.stderr)
    fit_dir = out / "fit"
    gp.save(fit_dir, overwrite=True)  # inside the demo's own directory, refused above unless `overwrite`
    maps = make_map(fit_dir, store, out / "map", resolution=MAP_RESOLUTION_M,
                    covariates=write_covariate_table(out / "covariates.csv"), units="log NO₂ (log µg/m³)",
                    title="Simulated NO₂ over five monitoring networks — federated low-rank GP",
                    n_dask_workers=n_dask_workers, overwrite=True)
    return {"store": store, "fit": fit_dir / "fit.json", "report": fit_dir / "report.html", "map": maps["png"],
            "mean": maps["mean"], "sd": maps["sd"], "wall_time_s": time.perf_counter() - tic,
            "async_s": gp.wall_time_s_, "sync_s": sync.wall_time_s_}


def write_covariate_table(path: Path) -> Path:
    """The covariates on a lattice at half the map's cell size over the region and 3 km beyond it (what the map looks
    up: the map's default domain, the sites' hulls grown by their spacing, reaches past the region's edge)."""
    x0, y0, x1, y1 = np.add(BBOX, [-3_000.0, -3_000.0, 3_000.0, 3_000.0])
    step = MAP_RESOLUTION_M / 2
    gx, gy = np.meshgrid(np.arange(x0, x1 + step, step), np.arange(y0, y1 + step, step))
    pts = np.column_stack([gx.ravel(), gy.ravel()])
    X = covariates(pts)
    table = pd.DataFrame({"x": pts[:, 0], "y": pts[:, 1], "traffic": X[:, 1], "urban": X[:, 2]})
    return write_atomic(path, lambda tmp: table.to_csv(tmp, index=False))
