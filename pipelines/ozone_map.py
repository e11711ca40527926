"""Midwest ozone, one day: federated low-rank kriging with one worker per state, mapped over the monitored region.

The day's monitors (lon/lat) are projected to CONUS Albers (EPSG:5070, metres) and split by state (station FIPS
prefix), a random share is held out, the intercept-only model is fitted on Dask, scored against the independence model
and pooled OLS, and mapped over the monitored region (convex hull of the stations, buffered).

    python pipelines/ozone_map.py [--date 870715] [--out out/ozone] [--publish docs/figures]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import run_pipeline
from spatialfed.data import datasets, geometry
from spatialfed.data.ingest import ingest_frame

CRS = "EPSG:5070"   # NAD83 / Conus Albers, metres


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--date", default="870715", help="day YYMMDD, 870603..870831 (default 870715)")
    ap.add_argument("--out", default="out/ozone", help="output directory (default out/ozone)")
    ap.add_argument("--test-fraction", type=float, default=0.15, help="random share held out (default 0.15)")
    ap.add_argument("--knots", type=int, default=60, help="knots m (default 60)")
    ap.add_argument("--nu", type=float, default=0.5, help="Matérn smoothness (default 0.5)")
    ap.add_argument("--buffer-km", type=float, default=25.0, help="buffer around the stations' hull (default 25)")
    ap.add_argument("--resolution-km", type=float, default=10.0, help="map cell size (default 10 km)")
    ap.add_argument("--max-iter", type=int, default=50, help="fit iterations at most (default 50)")
    ap.add_argument("--tol", type=float, default=1e-4, help="relative parameter change to stop at (default 1e-4)")
    ap.add_argument("--mode", choices=["sync", "async"], default="sync", help="fitting mode (default sync)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the hold-out (default 0)")
    ap.add_argument("--dask-workers", type=int, default=None, help="Dask worker processes (default min(J, cores))")
    ap.add_argument("--publish", type=Path, default=None, help="copy the PNGs here (e.g. docs/figures)")
    args = ap.parse_args(argv)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store = out / "ozone.zarr"
    day = datasets.ozone_frame(args.date)
    implausible = day["ozone"] < 1.0  # 8-hour averages below 1 ppb in summer: monitor faults, treated as missing
    info, _ = ingest_frame(day.loc[~implausible], store, value="ozone", x="lon", y="lat", crs="EPSG:4326",
                           target_crs=CRS, partition="column:state", test_fraction=args.test_fraction,
                           seed=args.seed, overwrite=True, extra_attrs={"dataset": "ozone2", "date": args.date},
                           min_site_rows=datasets.OZONE_MIN_SITE_ROWS)
    stations = day[["lon", "lat"]].to_numpy()
    sites = geometry.to_projected(stations, "EPSG:4326", CRS)[0]    # the monitored region: every station of the day
    domain = geometry.domain_from_points(sites, buffer=1000 * args.buffer_km, crs=CRS)
    report = run_pipeline(
        "Midwest ozone", store, out, domain=domain, knots=args.knots, nu=args.nu, mode=args.mode,
        dask_workers=args.dask_workers, publish=args.publish,
        fit_options={"max_iter": args.max_iter, "tol": args.tol},
        map_inputs={"resolution": 1000 * args.resolution_km, "units": "ozone, ppb",
                    "title": f"Midwest 8-hour ozone on 19{args.date[:2]}-{args.date[2:4]}-{args.date[4:]}, "
                             f"one worker per state"},
        description=f"Daily 8-hour average ozone (ppb) on {args.date}, intercept only, Matérn ν = {args.nu}; "
                    f"one worker per state ({len(info.sizes)} states); "
                    f"{int(implausible.sum())} reading(s) below 1 ppb dropped as monitor faults; "
                    f"random {args.test_fraction:.0%} of the monitors held out (seed {args.seed}); CRS {CRS}.")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
