"""`spatialfed predict DIR --store STORE.zarr --out PRED.csv`: federated prediction at points with uncertainty."""

from __future__ import annotations

import sys
import time
import warnings

from spatialfed.cli.args import add_fitted, add_point_columns, add_quiet, fitted_settings, point_columns

NAME = "predict"
HELP = "predict at new locations (or the store's test group) with uncertainty"


def register(subparsers) -> None:
    """Register `spatialfed predict` (SPEC §6)."""
    from spatialfed.outputs.prediction import PREDICTORS, RUNTIMES

    p = subparsers.add_parser(
        NAME, help=HELP,
        description="Federated kriging from a fitted model: the low-rank part from the server's state, the residual "
                    "part by the worker holding the nearest observation. Writes x, y (store CRS), mean, sd (sd of a "
                    "new observation) [, observed], sd_latent, owner, outside_domain, preceded by the coordinates "
                    "as given when they were in other columns or another CRS (e.g. lon, lat), and for a fit on log "
                    "values (ingest --transform log) median, q025, q975, mean_log, sd_log; with the test group or "
                    "--observed COL also metrics.json (RMSE, MAE, CRPS, 95 percent coverage) beside PRED.csv.")
    add_fitted(p, RUNTIMES, PREDICTORS)
    p.add_argument("--locations", default=None, metavar="FILE",
                   help="points to predict at with the fitted covariates ('intercept' is added): a CSV (coordinate "
                        "columns --x/--y or detected; in --crs, else the store's CRS) or a point GeoPackage/"
                        "GeoParquet (its own CRS), reprojected to the store's CRS; default: the store's test group")
    add_point_columns(p, "--locations")
    p.add_argument("--observed", default=None, metavar="COL",
                   help="column of --locations holding the observed values (on the variable's own scale): the "
                        "table gets an observed column and metrics.json the RMSE, MAE, CRPS and 95 percent coverage "
                        "against it")
    p.add_argument("--out", required=True, metavar="PRED.csv",
                   help="output table: .csv, .gpkg or .parquet (GeoParquet), written batch by batch and renamed into "
                        "place at the end; an existing one (or metrics.json beside it) is refused unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace PRED.csv, and the metrics.json beside it when the test group is scored, if they exist")
    add_batch(p)
    add_quiet(p)
    p.set_defaults(handler=run)


def add_batch(p) -> None:
    """--batch N: prediction locations per round of site calls (predict and map)."""
    p.add_argument("--batch", type=int, default=None, metavar="N",
                   help="prediction locations per batch (default: about 4 million matrix entries over the number "
                        "of knots m, 256..65536); the server's memory grows with N × m, a site's stays ≈ 32 MB")


def run(args) -> None:
    """Handler of `spatialfed predict`: outputs.prediction.predict_to_file (batches streamed to the output, a progress
    bar with ETA on stderr); warnings as one line each."""
    from spatialfed.outputs.prediction import predict_to_file

    tic = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        done = predict_to_file(args.fit_dir, args.store, args.out, locations=args.locations, batch=args.batch,
                               observed=args.observed, **point_columns(args),
                               progress=not args.quiet, overwrite=args.overwrite, **fitted_settings(args))
    for w in caught:
        print(f"spatialfed predict: warning: {w.message}", file=sys.stderr)
    print(f"wrote {done['out']}: {done['n']} predictions in {time.perf_counter() - tic:.1f} s "
          f"(batches of {done['batch']})")
    scores = done["scores"]
    if scores is not None:
        print(f"held-out scores ({scores['predictor']}, n = {scores['n']}): RMSE {scores['rmse']:.4g}  "
              f"MAE {scores['mae']:.4g}  CRPS {scores['crps']:.4g}  95% coverage {scores['coverage95']:.3f}  "
              f"-> {done['metrics']}")
