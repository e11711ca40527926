"""`spatialfed demo [--out DIR] [--overwrite]`: five simulated monitoring networks fitted asynchronously (spatialfed.demo)."""

from __future__ import annotations

NAME = "demo"
HELP = "simulate five monitoring networks and fit them asynchronously"


def register(subparsers) -> None:
    """Register `spatialfed demo` (SPEC §6)."""
    p = subparsers.add_parser(NAME, help=HELP,
                              description="An NO₂-like pollution field measured by five monitoring networks of "
                                          "unequal size, one on a slow machine, fitted asynchronously on an "
                                          "embedded LocalCluster; writes the store, the fit, its report and a map.")
    p.add_argument("--out", default="spatialfed-demo", metavar="DIR",
                   help="output directory (default spatialfed-demo); an existing one is refused unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace the demo's outputs in DIR if it exists")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--dask-workers", type=int, default=None, metavar="N",
                   help="worker processes of the embedded LocalCluster (default: number of cores)")
    p.set_defaults(handler=run)


def run(args) -> None:
    """Handler of `spatialfed demo`: spatialfed.demo.run_demo, then where its outputs are."""
    from spatialfed.demo import run_demo

    paths = run_demo(args.out, args.seed, args.dask_workers, overwrite=args.overwrite)
    print(f"demo finished in {paths.pop('wall_time_s'):.1f} s; the asynchronous fit took {paths.pop('async_s'):.1f} s, "
          f"a synchronous fit of the same networks {paths.pop('sync_s'):.1f} s; outputs:")
    for what, path in paths.items():
        print(f"  {what:8s} {path}")
