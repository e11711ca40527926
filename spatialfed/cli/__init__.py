"""The `spatialfed` command line (SPEC §6): one `register_<name>(subparsers)` per command, logic lives in the library."""

from __future__ import annotations

import argparse
import sys

from spatialfed.demo import register_demo
from spatialfed.cli.args import int_list
from spatialfed.errors import SpatialFedError
from spatialfed.cli.fit import register_fit
from spatialfed.cli.predict import register_map, register_predict
from spatialfed.cli.pilot_clip import register_pilot_clip
from spatialfed.cli.cluster_script import register_cluster_script


def name_list(text: str) -> list[str]:
    """Parse 'a,b' into ['a', 'b'] for argparse."""
    return [v.strip() for v in text.split(",") if v.strip()]


def _print_store(info) -> None:
    """One summary line for a written store."""
    sizes = info.sizes if len(info.sizes) <= 10 else f"{min(info.sizes)}..{max(info.sizes)}"
    print(f"wrote {info.path}: {info.n_workers} workers, {sum(info.sizes)} rows (sizes {sizes}), "
          f"partition {info.partition}, crs {info.crs}, covariates {info.covariate_names}"
          f"{', with test group' if info.has_test else ''}")


def register_simulate(subparsers) -> None:
    """`spatialfed simulate`: the paper's simulation setting (SPEC §7) written as a store."""
    p = subparsers.add_parser("simulate", help="simulate the paper's setting into a partitioned Zarr store",
                              description="Jittered-grid locations in [0,1]², 5 N(0,1) covariates with "
                                          "γ=(−1,2,1,1,1), a Matérn field and Gaussian noise (SPEC §7).")
    p.add_argument("out", metavar="OUT.zarr", help="output store path")
    p.add_argument("--workers", type=int, help="number of workers J")
    p.add_argument("--n-per-worker", type=int, help="rows per worker n_j (equal sizes)")
    p.add_argument("--sizes", type=int_list, help="unequal rows per worker, e.g. 2000,5000,8000 (replaces "
                                                   "--n-per-worker)")
    p.add_argument("--nu", type=float, default=0.5, help="Matérn smoothness ν (default 0.5)")
    scale = p.add_mutually_exclusive_group()
    scale.add_argument("--beta", type=float, help="Matérn length scale β (default 0.1)")
    scale.add_argument("--range", type=float, help="effective range (correlation 0.05) instead of --beta")
    p.add_argument("--sigma2", type=float, default=1.0, help="field variance σ² (default 1)")
    p.add_argument("--noise-sd", type=float, default=2.0, help="noise sd; δ = 1/noise_sd² (default 2)")
    p.add_argument("--partition", choices=["random", "area", "neighbor"], default="random", help="default random")
    p.add_argument("--test-size", type=int, default=100, help="held-out test points (default 100, 0 for none)")
    p.add_argument("--method", choices=["auto", "exact", "circulant"], default="auto",
                   help="field sampler: exact Cholesky, circulant embedding, or auto (exact up to 20000 points)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT.zarr if it exists")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(handler=run_simulate)


def run_simulate(args) -> None:
    """Handler of `spatialfed simulate`."""
    from spatialfed.data.simulate import simulate_store
    from spatialfed.model.matern import Matern

    beta = Matern(args.nu).beta_from_range(args.range) if args.range is not None else (args.beta or 0.1)
    info = simulate_store(args.out, args.workers, args.n_per_worker, sizes=args.sizes, nu=args.nu, beta=beta,
                          sigma2=args.sigma2, noise_sd=args.noise_sd, partition=args.partition,
                          test_size=args.test_size, seed=args.seed, method=args.method, overwrite=args.overwrite,
                          progress=not args.quiet)
    _print_store(info)


def register_ingest(subparsers) -> None:
    """`spatialfed ingest`: a table of observations written as a partitioned store."""
    p = subparsers.add_parser("ingest", help="turn a CSV / GeoPackage / GeoParquet table into a partitioned store",
                              description="Reads the table, drops rows with missing values (reported), projects "
                                          "lon/lat to a metric CRS and writes the SPEC §5 store.")
    p.add_argument("table", metavar="TABLE", help="CSV, GeoPackage (.gpkg) or GeoParquet (.parquet) file")
    p.add_argument("out", metavar="OUT.zarr", help="output store path")
    p.add_argument("--x", help="x / longitude column (omit with --y for point geometries)")
    p.add_argument("--y", help="y / latitude column")
    p.add_argument("--value", required=True, help="column with the observed value z")
    p.add_argument("--covariates", type=name_list, default=[], help="comma-separated covariate columns")
    p.add_argument("--no-intercept", action="store_true", help="do not add an 'intercept' column to X")
    p.add_argument("--crs", help="CRS of the coordinates, e.g. EPSG:4326 (lon/lat is projected to UTM) or "
                                 "EPSG:28992; omit for planar units (store crs null)")
    p.add_argument("--target-crs", help="projected CRS to convert to instead of the automatic UTM zone")
    p.add_argument("--partition", default="random", help="random | area | neighbor | column:NAME (default random)")
    p.add_argument("--workers", type=int, help="number of workers J (default 4; not used with column:NAME)")
    p.add_argument("--sizes", type=int_list, help="unequal rows per worker, e.g. 50,100 (random/area/neighbor)")
    p.add_argument("--test-fraction", type=float, default=0.0, help="share of rows held out as test group")
    p.add_argument("--duplicates", choices=["error", "merge", "keep"], default="error",
                   help="rows at identical coordinates: stop with an error (default), merge (average) or keep")
    p.add_argument("--merge-duplicates", dest="duplicates", action="store_const", const="merge",
                   help="shorthand for --duplicates merge")
    p.add_argument("--layer", help="layer of a GeoPackage")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace OUT.zarr if it exists")
    p.set_defaults(handler=run_ingest)


def run_ingest(args) -> None:
    """Handler of `spatialfed ingest`."""
    from spatialfed.data.ingest import ingest

    info, report = ingest(args.table, args.out, layer=args.layer, x=args.x, y=args.y, value=args.value,
                          covariates=args.covariates, crs=args.crs, target_crs=args.target_crs,
                          partition=args.partition, n_workers=args.workers, sizes=args.sizes,
                          test_fraction=args.test_fraction, seed=args.seed, intercept=not args.no_intercept,
                          duplicates=args.duplicates, overwrite=args.overwrite)
    for line in report.lines():
        print(f"ingest: {line}", file=sys.stderr)
    _print_store(info)


REGISTRATIONS = [register_simulate, register_ingest, register_fit, register_predict, register_map, register_demo,
                 register_cluster_script, register_pilot_clip]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered command."""
    parser = argparse.ArgumentParser(prog="spatialfed", description="Federated low-rank spatial Gaussian processes.")
    subparsers = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for register in REGISTRATIONS:
        register(subparsers)
    return parser


def main(argv=None) -> int:
    """Entry point of the `spatialfed` console script; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        args.handler(args)
    except (SpatialFedError, ValueError) as exc:
        print(f"spatialfed {args.command}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
