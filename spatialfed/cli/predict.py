"""`spatialfed predict` and `spatialfed map` (SPEC §6): federated prediction at points, and maps on a grid."""

from __future__ import annotations

import json
import sys
import time
import warnings

from spatialfed.outputs.prediction import PREDICTORS, RUNTIMES


def _common(p) -> None:
    """Options shared by predict and map: fit directory, store, predictor and runtime."""
    p.add_argument("fit_dir", metavar="DIR", help="output directory of `spatialfed fit` (fit.json, model.zarr)")
    p.add_argument("--store", required=True, metavar="STORE.zarr", help="the partitioned store the model was fitted on")
    p.add_argument("--predictor", choices=PREDICTORS, default=None,
                   help="lowrank (federated low-rank kriging; default for lowrank fits), independent (each point "
                        "kriged by its owner alone), personal (one worker's data, see --worker) or ols (pooled "
                        "least squares)")
    p.add_argument("--worker", type=int, default=None, metavar="J", help="the worker for --predictor personal")
    p.add_argument("--domain", default=None, metavar="FILE",
                   help="polygon file (GeoPackage, shapefile, GeoJSON) in the store's CRS; default: the union of "
                        "the workers' bounding boxes ([0,1]² for simulated stores)")
    p.add_argument("--runtime", choices=RUNTIMES, default="dask",
                   help="dask (default; each worker's part runs where its partition lives) or inprocess (loads "
                        "the partitions here; small data)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="address of a running Dask scheduler; default: an embedded LocalCluster")
    p.add_argument("--dask-workers", type=int, default=None, metavar="N",
                   help="processes of the embedded LocalCluster (default: min(J, cores))")


def _runtime_kwargs(args) -> dict:
    return {"predictor": args.predictor, "worker": args.worker, "runtime": args.runtime,
            "scheduler": args.scheduler, "n_dask_workers": args.dask_workers, "domain": args.domain}


def register_predict(subparsers) -> None:
    """Register `spatialfed predict`."""
    p = subparsers.add_parser(
        "predict", help="predict at new locations (or the store's test group) with uncertainty",
        description="Federated kriging from a fitted model: the low-rank part from the server's state, the residual "
                    "part by the worker holding the nearest observation. Writes x, y, mean, sd (sd of a new "
                    "observation) [, observed], sd_latent, owner, outside_domain; with the test group also "
                    "metrics.json (RMSE, MAE, CRPS, 95 percent coverage) beside PRED.csv.")
    _common(p)
    p.add_argument("--locations", default=None, metavar="FILE.csv",
                   help="CSV with columns x, y (store CRS) and the fitted covariates ('intercept' is added), or a "
                        "point GeoPackage/GeoParquet in the store's CRS; default: the store's test group")
    p.add_argument("--out", required=True, metavar="PRED.csv", help="output CSV")
    p.set_defaults(handler=run_predict)


def run_predict(args) -> None:
    """Handler of `spatialfed predict`."""
    from spatialfed.outputs.prediction import predict, write_prediction

    tic = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        frame, scores = predict(args.fit_dir, args.store, locations=args.locations, **_runtime_kwargs(args))
    for w in caught:
        print(f"spatialfed predict: warning: {w.message}", file=sys.stderr)
    out, mpath = write_prediction(frame, args.out, scores)
    print(f"wrote {out}: {len(frame)} predictions in {time.perf_counter() - tic:.1f} s")
    if scores is not None:
        print(f"held-out scores ({scores['predictor']}, n = {scores['n']}): RMSE {scores['rmse']:.4g}  "
              f"MAE {scores['mae']:.4g}  CRPS {scores['crps']:.4g}  95% coverage {scores['coverage95']:.3f}  "
              f"-> {mpath}")


def register_map(subparsers) -> None:
    """Register `spatialfed map`."""
    p = subparsers.add_parser(
        "map", help="predict on a grid and write GeoTIFFs, a GeoPackage and a PNG map",
        description="Predicts on square cells over the domain and writes mean.tif and sd.tif (GeoTIFF in the "
                    "store's CRS), grid.gpkg (cells with mean, sd, sd_latent, owner), map.png and map.json.")
    _common(p)
    p.add_argument("--out", required=True, metavar="MAPDIR", help="output directory")
    p.add_argument("--resolution", type=float, default=None, metavar="R",
                   help="cell size in the store's CRS units (default: about 150 cells along the longer side)")
    p.add_argument("--covariates", default=None, metavar="FILE",
                   help="points (CSV with x, y or a point GeoPackage) carrying the fitted covariates; each cell "
                        "takes the nearest point within one cell (needed unless the model is intercept-only)")
    p.add_argument("--overlay", default=None, metavar="FILE", help="vector features to draw (e.g. a river)")
    p.add_argument("--overlay-label", default="", metavar="TEXT", help="legend entry of the overlay, e.g. 'river'")
    p.add_argument("--units", default="", help="units of the mapped variable for the colour bars, e.g. ppb")
    p.add_argument("--title", default=None, help="figure title")
    p.add_argument("--no-sites", action="store_true",
                   help="do not draw observation sites (drawing them sends the site coordinates, not the values, "
                        "from the workers)")
    p.set_defaults(handler=run_map)


def run_map(args) -> None:
    """Handler of `spatialfed map`."""
    from spatialfed.outputs.maps import make_map

    tic = time.perf_counter()
    paths = make_map(args.fit_dir, args.store, args.out, resolution=args.resolution, covariates=args.covariates,
                     units=args.units, title=args.title, overlay=args.overlay, overlay_label=args.overlay_label,
                     sites=not args.no_sites,
                     **_runtime_kwargs(args))
    summary = json.loads(paths["json"].read_text())
    print(f"wrote {args.out}: {', '.join(p.name for p in paths.values())} ({summary['cells']} cells of "
          f"{summary['resolution']:g}) in {time.perf_counter() - tic:.1f} s")
