"""Meuse topsoil zinc: federated low-rank kriging of log(zinc) with √dist as covariate, mapped on the Meuse grid.

The 155 samples are area-partitioned over several workers after holding out a test group: a random share, or with
`--holdout block` one whole area block (one of J + 1 area blocks), so that prediction there fills a gap no worker
covers. The model is fitted on Dask, scored on the held-out sites against the independence model and pooled OLS, and
mapped on the 40 m Meuse grid (domain = its cells) with the river outline.

    python pipelines/meuse_zinc_map.py [--out out/meuse_zinc] [--workers 4] [--holdout random|block] [--publish DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from common import run_pipeline
from spatialfed.data import datasets
from spatialfed.data.store import load_worker, open_store, write_store


def block_holdout(store, block: int) -> None:
    """Rewrite an area-partitioned store so that its worker `block` becomes the test group (a spatial hold-out)."""
    info = open_store(store)
    parts = [load_worker(store, j) for j in range(info.n_workers)]
    write_store(store, parts[:block] + parts[block + 1:], partition=info.partition, crs=info.crs,
                covariate_names=info.covariate_names, test=parts[block], overwrite=True,
                extra_attrs={"dataset": "meuse", "holdout": f"area block {block}"})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/meuse_zinc", help="output directory (default out/meuse_zinc)")
    ap.add_argument("--workers", type=int, default=4, help="area-partitioned workers J (default 4)")
    ap.add_argument("--holdout", choices=["random", "block"], default="random",
                    help="test group: a random share (default) or one of J + 1 area blocks")
    ap.add_argument("--test-fraction", type=float, default=0.2, help="random share held out (default 0.2)")
    ap.add_argument("--block", type=int, default=2, help="the area block held out with --holdout block (default 2)")
    ap.add_argument("--knots", type=int, default=50, help="knots m (default 50)")
    ap.add_argument("--nu", type=float, default=0.5, help="Matérn smoothness (default 0.5)")
    ap.add_argument("--mode", choices=["sync", "async"], default="sync", help="fitting mode (default sync)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the random hold-out (default 1)")
    ap.add_argument("--dask-workers", type=int, default=None, help="Dask worker processes (default min(J, cores))")
    ap.add_argument("--publish", type=Path, default=None, help="copy the PNGs here (e.g. docs/figures)")
    args = ap.parse_args(argv)
    if args.holdout == "block" and not 0 <= args.block <= args.workers:
        ap.error(f"--block must be in 0..{args.workers} (one of the J + 1 = {args.workers + 1} area blocks)")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store = out / "meuse.zarr"
    if args.holdout == "random":
        datasets.meuse_store(store, args.workers, partition="area", test_fraction=args.test_fraction, seed=args.seed,
                             overwrite=True)
        holdout = f"random {args.test_fraction:.0%} of the samples held out (seed {args.seed})"
    else:
        datasets.meuse_store(store, args.workers + 1, partition="area", overwrite=True)
        block_holdout(store, args.block)
        holdout = f"area block {args.block} of {args.workers + 1} held out"
    grid = datasets.meuse_grid()
    grid.assign(sqrt_dist=np.sqrt(grid["dist"]))[["x", "y", "sqrt_dist"]].to_csv(out / "covariates.csv", index=False)
    datasets.meuse_river().to_file(out / "river.gpkg")
    name = "Meuse zinc" if args.holdout == "random" else "Meuse zinc block holdout"
    report = run_pipeline(
        name, store, out, domain=datasets.meuse_domain(), knots=args.knots, nu=args.nu, mode=args.mode,
        dask_workers=args.dask_workers, publish=args.publish,
        map_inputs={"covariates": out / "covariates.csv", "overlay": out / "river.gpkg", "overlay_label": "river Meuse",
                    "resolution": datasets.MEUSE_CELL, "units": "log(zinc, mg/kg)",
                    "title": f"Meuse topsoil log(zinc), {args.workers} area workers"},
        description=f"log(zinc) ~ 1 + sqrt(dist), Matérn ν = {args.nu}; {args.workers} area-partitioned workers; "
                    f"{holdout}; map on the 40 m Meuse grid.")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
