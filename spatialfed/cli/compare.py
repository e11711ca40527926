"""`spatialfed compare`: candidate covariance models fitted on one store, side by side by ℓ, AIC and the federated
site-blocked CV score (api/compare.py)."""

from __future__ import annotations

from pathlib import Path

from spatialfed.cli import args as common

NAME = "compare"
HELP = "fit candidate covariance models (ν, anisotropy) on one store and compare ℓ, AIC and site-blocked CV"


def register(subparsers) -> None:
    """Register `spatialfed compare STORE.zarr [--candidate SPEC ...] [--out comparison.json]`."""
    p = subparsers.add_parser(
        NAME, help=HELP,
        description="Fits each candidate with the statistics scheme and prints ℓ, AIC = −2ℓ + 2q and the site-blocked "
                    "CV RMSE/CRPS (each site's points predicted from the other sites' data), naming the best by "
                    "AIC and by CV CRPS and saying when they disagree: the likelihood can prefer a model that "
                    "predicts worse (docs/user-guide.md, \"Covariance options\").")
    p.add_argument("store", metavar="STORE.zarr", help="the partitioned store (spatialfed ingest or simulate)")
    p.add_argument("--candidate", action="append", default=None, metavar="SPEC",
                   help="a candidate, e.g. nu=0.5, nu=1.5, nu=estimate, anisotropy, nu=estimate,anisotropy or "
                        "distance=chordal; "
                        "repeat for more (default: nu=0.5, nu=estimate, anisotropy, nu=estimate,anisotropy)")
    p.add_argument("--out", default=None, metavar="COMPARISON.json",
                   help="also write the comparison as JSON; an existing file is refused unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace COMPARISON.json if it exists")
    p.add_argument("--mode", choices=["sync", "async"], default="sync", help="default sync")
    p.add_argument("--knots", type=int, default=100, help="number of knots m (default 100)")
    p.add_argument("--residual", default="auto", help="auto (default), full, vecchia, mpp, pp")
    p.add_argument("--max-iter", type=int, default=50, help="iteration limit of each fit (default 50)")
    p.add_argument("--seed", type=int, default=0, help="seed of the knot jitter (default 0)")
    common.add_dask(p, ("auto", "dask", "simulated"), "auto (default), dask or simulated (in this process)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.set_defaults(handler=run)


def run(args) -> None:
    """Handler of `spatialfed compare`: api.compare.compare_models on the store, printed (and written as JSON)."""
    from spatialfed.api.compare import compare_models
    from spatialfed.api.options import spelled
    from spatialfed.atomic import refuse_existing, write_text

    if args.out:
        refuse_existing(args.out, args.overwrite)  # before the fits
    settings = spelled({"mode": args.mode, "knots": args.knots, "residual": args.residual,
                        "max_iter": args.max_iter, "seed": args.seed, "progress": not args.quiet,
                        **common.dask_settings(args)})
    table = compare_models(args.store, candidates=args.candidate, **settings)
    print(table)
    if args.out:
        out = write_text(Path(args.out), table.to_json() + "\n")
        print(f"wrote {out}")
