"""`spatialfed pilot-clip`: clip bounds for the privacy mechanism from a pilot fit on public or simulated data."""

from __future__ import annotations

import json
from pathlib import Path

NAME = "pilot-clip"
HELP = "per-key clip bounds for --privacy-clip from a pilot fit on PUBLIC or simulated data"


def register(subparsers) -> None:
    """Register `spatialfed pilot-clip PILOT.zarr --out clip.json`."""
    p = subparsers.add_parser(
        NAME, help=HELP,
        description="Fits the model without noise on a pilot store and writes margin × the largest per-observation "
                    "norm of every released array (docs/privacy.md). The pilot must not be the private data: "
                    "bounds taken from the private data void the privacy guarantee. Use the knots, ν and residual "
                    "of the private fit.")
    p.add_argument("store", metavar="PILOT.zarr", help="a store of public or simulated data like the private data")
    p.add_argument("--out", required=True, metavar="CLIP.json",
                   help="where to write {key: bound}; an existing file is refused unless --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace CLIP.json if it exists")
    p.add_argument("--method", choices=["lowrank", "independent"], default="lowrank", help="default lowrank")
    p.add_argument("--knots", type=int, default=100, help="number of knots m, as in the private fit (default 100)")
    p.add_argument("--nu", type=float, default=0.5, help="Matérn smoothness ν (default 0.5)")
    p.add_argument("--residual", choices=["full", "mpp", "pp"], default="full", help="default full")
    p.add_argument("--margin", type=float, default=4.0, help="bound = margin × largest pilot norm (default 4)")
    p.add_argument("--max-iter", type=int, default=10, help="iterations of the pilot fit (default 10)")
    p.add_argument("--seed", type=int, default=0, help="seed of the knot jitter, as in the private fit (default 0)")
    p.set_defaults(handler=run)


def run(args) -> None:
    """Handler of `spatialfed pilot-clip`: runtime.pilot.pilot_clip on the pilot store, written as JSON."""
    from spatialfed.atomic import refuse_existing, write_text
    from spatialfed.runtime.pilot import pilot_clip

    refuse_existing(args.out, args.overwrite)  # before the pilot fit
    models, knots, kernel = pilot_models(args)
    clip = pilot_clip(models, knots, kernel, margin=args.margin, max_iter=args.max_iter)
    out = write_text(Path(args.out), json.dumps(clip, indent=1) + "\n")
    print(f"wrote {out}: clip bounds for {len(clip)} released arrays (margin {args.margin:g}); "
          f"use: spatialfed fit ... --privacy-noise Z --privacy-clip {out}")


def pilot_models(args):
    """(LocalModels, knots, kernel) of the pilot store, with the knots the estimator lays out for these settings."""
    from spatialfed.api import FederatedGP
    from spatialfed.data.store import load_worker, open_store
    from spatialfed.model.local import LocalModel
    from spatialfed.model.matern import Matern
    from spatialfed.runtime.virtual import VirtualRuntime

    info = open_store(args.store)
    gp = FederatedGP(method=args.method, knots=args.knots, nu=args.nu, residual=args.residual, seed=args.seed)
    knots, _ = gp._knots(info, VirtualRuntime())  # the sites' bounding boxes, read in this process (public data)
    kernel = Matern(args.nu)
    models = [LocalModel(*load_worker(info.path, j), knots, kernel, residual=args.residual)
              for j in range(info.n_workers)]
    return models, knots, kernel
