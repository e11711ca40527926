"""The seamless predictor's picture for docs/maps.md (issue 30): owner against seamless prediction on one store.

    python pipelines/seamless_map.py [--out out/seamless] [--publish docs/figures]

Simulates 4 area sites × 300 points (SPEC §7 covariates, ν = 1.5, noise sd 0.5, seed 2), fits it in-process
(sync, 49 knots, full residual), predicts a 150 × 150 grid over [0,1]² with the owner predictor (`lowrank`) and the
seamless one, and draws: both maps of the spatial part (mean − x₀ᵀγ, one colour scale, the sites' boundaries as
thin lines, the seam statistic in the title), the blending weight of one site, and a transect across a boundary
with both predictors' mean ± 1.96 sd (latent). Writes `seamless_map.png` and `summary.json` into --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

CELLS = 150


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("out/seamless"))
    ap.add_argument("--publish", type=Path, default=None, metavar="DIR", help="also copy the figure here")
    ap.add_argument("--seed", type=int, default=2)
    args = ap.parse_args(argv)

    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure

    from spatialfed.atomic import write_atomic, write_text
    from spatialfed.cli import main as cli
    from spatialfed.data.store import open_store
    from spatialfed.outputs import seamless
    from spatialfed.outputs.metrics import seam_ratio
    from spatialfed.outputs.prediction import load_model, open_workers, predict_at

    args.out.mkdir(parents=True, exist_ok=True)
    store, fit = args.out / "sim.zarr", args.out / "fit"
    if cli(["simulate", str(store), "--workers", "4", "--n-per-worker", "300", "--partition", "area", "--nu", "1.5",
            "--noise-sd", "0.5", "--test-size", "0", "--seed", str(args.seed), "--overwrite", "--quiet"]) != 0:
        return 1
    if cli(["fit", str(store), "--out", str(fit), "--runtime", "simulated", "--mode", "sync", "--knots", "49",
            "--nu", "1.5", "--max-iter", "30", "--quiet"]) != 0:
        return 1
    model, info = load_model(fit), open_store(store)
    c = (np.arange(CELLS) + 0.5) / CELLS
    xx, yy = np.meshgrid(c, c[::-1])
    pts = np.column_stack([xx.ravel(), yy.ravel()])
    X0 = np.zeros((len(pts), model.params.gamma.size))
    X0[:, 0] = 1.0
    y_line = 0.25
    line = np.column_stack([np.linspace(0.0, 1.0, 801), np.full(801, y_line)])
    X1 = np.zeros((len(line), X0.shape[1]))
    X1[:, 0] = 1.0
    with open_workers(info, model, "simulated") as workers:
        pred = {p: predict_at(workers, model, pts, X0, p) for p in ("lowrank", "seamless")}
        along = {p: predict_at(workers, model, line, X1, p) for p in ("lowrank", "seamless")}
        h = seamless.band_width(workers)
        d = np.array([lm.nearest_distance(pts) for lm in workers.models])
    weights = seamless.blend_weights(d, h)
    owner = pred["seamless"]["owner"].reshape(CELLS, CELLS)
    surface = {p: (v["mean"] - X0 @ model.params.gamma).reshape(CELLS, CELLS) for p, v in pred.items()}
    seams = {p: seam_ratio(s, owner) for p, s in surface.items()}

    # the boundaries between owners as cell-edge segments
    segs = []
    r, k = np.nonzero(owner[:, 1:] != owner[:, :-1])
    segs += [((c[k1] + 0.5 / CELLS, c[::-1][r1] - 0.5 / CELLS), (c[k1] + 0.5 / CELLS, c[::-1][r1] + 0.5 / CELLS))
             for r1, k1 in zip(r, k)]
    r, k = np.nonzero(owner[1:, :] != owner[:-1, :])
    segs += [((c[k1] - 0.5 / CELLS, c[::-1][r1] - 0.5 / CELLS), (c[k1] + 0.5 / CELLS, c[::-1][r1] - 0.5 / CELLS))
             for r1, k1 in zip(r, k)]

    fig = Figure(figsize=(15, 8.2), layout="constrained")
    gs = fig.add_gridspec(2, 3, height_ratios=[1.25, 1])
    lo, hi = np.percentile(np.concatenate([s.ravel() for s in surface.values()]), [0.5, 99.5])
    titles = {"lowrank": "owner predictor (--predictor lowrank)", "seamless": "seamless predictor (default)"}
    for col, p in enumerate(("lowrank", "seamless")):
        ax = fig.add_subplot(gs[0, col])
        im = ax.imshow(surface[p], extent=(0, 1, 0, 1), cmap="viridis", vmin=lo, vmax=hi, interpolation="nearest")
        ax.add_collection(LineCollection(segs, colors="white", linewidths=0.5, alpha=0.6))
        ax.axhline(y_line, color="k", lw=0.6, ls=":")
        ax.set_title(f"{titles[p]}: mean − x₀ᵀγ\nseam statistic {seams[p]:.2f}", fontsize=10)
    fig.colorbar(im, ax=fig.axes[:2], shrink=0.8, label="predicted spatial part")
    ax = fig.add_subplot(gs[0, 2])
    j = int(owner[CELLS // 2, CELLS // 2])
    im = ax.imshow(weights[j].reshape(CELLS, CELLS), extent=(0, 1, 0, 1), cmap="Greys_r", vmin=0, vmax=1)
    ax.add_collection(LineCollection(segs, colors="tab:red", linewidths=0.5, alpha=0.6))
    ax.set_title(f"weight w_j of site {j} (band h = {h:.3f} = {seamless.BAND:g} sampling spacings)", fontsize=10)
    fig.colorbar(im, ax=ax, shrink=0.8, label="w_j")
    ax = fig.add_subplot(gs[1, :])
    xs = line[:, 0]
    for p, colour in (("lowrank", "tab:orange"), ("seamless", "tab:blue")):
        m = along[p]["mean"] - X1 @ model.params.gamma
        s = along[p]["sd_latent"]
        ax.plot(xs, m, color=colour, lw=1.2, label=f"{titles[p]}: mean")
        ax.fill_between(xs, m - 1.96 * s, m + 1.96 * s, color=colour, alpha=0.15, label="± 1.96 sd (latent)")
    for x in xs[1:][np.diff(along["seamless"]["owner"]) != 0]:
        ax.axvline(x, color="k", lw=0.8, ls="--")
    ax.set(xlabel=f"x along the dotted line y = {y_line} (dashed: boundary between sites)",
           ylabel="spatial part", xlim=(0, 1))
    ax.legend(fontsize=8, ncols=2)
    fig.suptitle("Seamless prediction: the sites' residual predictions tied at their boundaries and blended by "
                 f"partition-of-unity weights (4 area sites × 300 points, seed {args.seed})")
    png = write_atomic(args.out / "seamless_map.png", lambda tmp: fig.savefig(tmp, dpi=80, format="png"))
    summary = {"seam": {p: round(v, 3) for p, v in seams.items()}, "band": h, "params": {
        k: float(getattr(model.params, k)) for k in ("delta", "sigma2", "beta")}}
    write_text(args.out / "summary.json", json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))
    if args.publish is not None:
        shutil.copyfile(png, args.publish / png.name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
