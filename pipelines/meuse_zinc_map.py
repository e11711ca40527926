"""Meuse topsoil zinc: federated low-rank kriging of log(zinc) with √dist as covariate, mapped on the Meuse grid.

The 155 samples are area-partitioned over several workers after holding out a test group: a random share, or with
`--holdout block` one whole area block (one of J + 1 area blocks), so that prediction there fills a gap no worker
covers. The model is fitted on Dask, scored on the held-out sites against the independence model and pooled OLS, and
mapped on the 40 m Meuse grid (domain = its cells) with the river outline. `--holdout blocks` is spatial
cross-validation instead: each of the J + 1 area blocks held out in turn (no maps), scores pooled over all samples.

    python pipelines/meuse_zinc_map.py [--out out/meuse_zinc] [--workers 4] [--holdout random|block|blocks]
                                       [--publish DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from common import COMPARED, cluster, fit_and_score, fit_line, publish_figures, run_pipeline, write_json
from spatialfed.data import datasets
from spatialfed.data.store import load_worker, open_store, write_store
from spatialfed.outputs import metrics
from spatialfed.outputs.maps import heldout_figure

UNITS = "log(zinc, mg/kg)"


def block_holdout(store, block: int) -> None:
    """Rewrite an area-partitioned store so that its worker `block` becomes the test group (a spatial hold-out)."""
    info = open_store(store)
    parts = [load_worker(store, j) for j in range(info.n_workers)]
    write_store(store, parts[:block] + parts[block + 1:], partition=info.partition, crs=info.crs,
                covariate_names=info.covariate_names, test=parts[block], overwrite=True,
                extra_attrs={"dataset": "meuse", "holdout": f"area block {block}"})


def block_store(store, n_blocks: int, block: int) -> None:
    """The Meuse store split into n_blocks area blocks, block `block` held out as the test group."""
    datasets.meuse_store(store, n_blocks, partition="area", overwrite=True)
    block_holdout(store, block)


def block_cv(out: Path, args) -> str:
    """Spatial cross-validation: each of the J + 1 area blocks held out in turn; scores pooled over all samples."""
    tic = time.perf_counter()
    folds, lines = args.workers + 1, []
    pooled = {label: [] for label in COMPARED}
    with cluster(args.workers, args.dask_workers) as handle:
        for block in range(folds):
            fold = out / f"fold{block}"
            fold.mkdir(parents=True, exist_ok=True)
            block_store(fold / "meuse.zarr", folds, block)
            gp, frames, _ = fit_and_score(fold / "meuse.zarr", fold, handle.client, domain=datasets.meuse_domain(),
                                          knots=args.knots, nu=args.nu, mode=args.mode)
            lines.append(f"- block {block} held out ({len(frames['pooled OLS'])} sites): {fit_line(gp)}")
            for label, frame in frames.items():
                pooled[label].append(frame)
    frames = {label: pd.concat(parts, ignore_index=True) for label, parts in pooled.items()}
    scores = {label: metrics.scores(f["observed"], f["mean"], f["sd"]) for label, f in frames.items()}
    write_json(out / "metrics.json", scores)
    heldout = heldout_figure(out / "heldout.png", frames, UNITS,
                             f"Meuse zinc: {folds}-fold area-block cross-validation ({len(frames['pooled OLS'])} sites)")
    if args.publish is not None:
        publish_figures(args.publish, {"meuse_zinc_blockcv_heldout.png": heldout})
    report = "\n".join([
        "# Meuse zinc, area-block cross-validation", "",
        f"log(zinc) ~ 1 + sqrt(dist), Matérn ν = {args.nu}; the samples split into {folds} area blocks; each block "
        f"held out in turn and predicted from the other {args.workers} (one worker each).", "", *lines, "",
        "Scores pooled over all held-out predictions (sd of a new observation; Gaussian CRPS):", "",
        metrics.table(scores), "", f"Figure: {heldout.name}. Run time {time.perf_counter() - tic:.0f} s.", ""])
    (out / "report.md").write_text(report)
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="out/meuse_zinc", help="output directory (default out/meuse_zinc)")
    ap.add_argument("--workers", type=int, default=4, help="area-partitioned workers J (default 4)")
    ap.add_argument("--holdout", choices=["random", "block", "blocks"], default="random",
                    help="test group: a random share (default), one of J + 1 area blocks, or each block in turn "
                         "(cross-validation, no maps)")
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
    if args.holdout == "blocks":
        print(block_cv(out, args))
        return 0
    store = out / "meuse.zarr"
    if args.holdout == "random":
        datasets.meuse_store(store, args.workers, partition="area", test_fraction=args.test_fraction, seed=args.seed,
                             overwrite=True)
        holdout = f"random {args.test_fraction:.0%} of the samples held out (seed {args.seed})"
    else:
        block_store(store, args.workers + 1, args.block)
        holdout = f"area block {args.block} of {args.workers + 1} held out"
    grid = datasets.meuse_grid()
    grid.assign(sqrt_dist=np.sqrt(grid["dist"]))[["x", "y", "sqrt_dist"]].to_csv(out / "covariates.csv", index=False)
    datasets.meuse_river().to_file(out / "river.gpkg")
    name = "Meuse zinc" if args.holdout == "random" else "Meuse zinc block holdout"
    report = run_pipeline(
        name, store, out, domain=datasets.meuse_domain(), knots=args.knots, nu=args.nu, mode=args.mode,
        dask_workers=args.dask_workers, publish=args.publish,
        map_inputs={"covariates": out / "covariates.csv", "overlay": out / "river.gpkg", "overlay_label": "river Meuse",
                    "resolution": datasets.MEUSE_CELL, "units": UNITS,
                    "title": f"Meuse topsoil log(zinc), {args.workers} area workers"},
        description=f"log(zinc) ~ 1 + sqrt(dist), Matérn ν = {args.nu}; {args.workers} area-partitioned workers; "
                    f"{holdout}; map on the 40 m Meuse grid.")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
