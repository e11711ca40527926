"""`spatialfed simulate OUT.zarr`: the paper's simulation setting (SPEC §7) written as a partitioned store."""

from __future__ import annotations

from spatialfed.cli.args import add_quiet, int_list, store_summary

NAME = "simulate"
HELP = "simulate the paper's setting into a partitioned Zarr store"


def register(subparsers) -> None:
    """Register `spatialfed simulate` (SPEC §6)."""
    p = subparsers.add_parser(NAME, help=HELP,
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
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> None:
    """Handler of `spatialfed simulate`: data.simulate.simulate_store, then one summary line."""
    from spatialfed.data.simulate import simulate_store
    from spatialfed.model.matern import Matern

    beta = Matern(args.nu).beta_from_range(args.range) if args.range is not None else \
        (0.1 if args.beta is None else args.beta)  # --beta 0 is refused by the simulator, not taken for 0.1
    info = simulate_store(args.out, args.workers, args.n_per_worker, sizes=args.sizes, nu=args.nu, beta=beta,
                          sigma2=args.sigma2, noise_sd=args.noise_sd, partition=args.partition,
                          test_size=args.test_size, seed=args.seed, method=args.method, overwrite=args.overwrite,
                          progress=not args.quiet)
    print(store_summary(info))
