"""`spatialfed map DIR --store STORE.zarr --out MAPDIR`: prediction on a grid, written as GeoTIFFs, a GeoPackage
and a PNG map (SPEC §6)."""

from __future__ import annotations

import json
import time

from spatialfed.cli.args import add_fitted, add_point_columns, add_quiet, fitted_settings, point_columns
from spatialfed.cli.predict import add_batch

NAME = "map"
HELP = "predict on a grid and write GeoTIFFs, a GeoPackage and a PNG map"


def register(subparsers) -> None:
    """Register `spatialfed map` (SPEC §6)."""
    from spatialfed.outputs.prediction import PREDICTORS, RUNTIMES

    p = subparsers.add_parser(
        NAME, help=HELP,
        description="Predicts on square cells over the domain and writes mean.tif and sd.tif (GeoTIFF in the "
                    "store's CRS, or --map-crs), grid.gpkg (cells with mean, sd, sd_latent, owner), map.png and "
                    "map.json.")
    add_fitted(p, RUNTIMES, PREDICTORS)
    p.add_argument("--out", required=True, metavar="MAPDIR",
                   help="output directory (an existing one is refused unless --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace MAPDIR if it exists (atomically, when done)")
    p.add_argument("--resolution", type=float, default=None, metavar="R",
                   help="cell size in the map's CRS units (default: about 150 cells along the longer side)")
    p.add_argument("--map-crs", default=None, metavar="CRS",
                   help="CRS of the map files, e.g. EPSG:4326 for a lon/lat raster: the cells are laid out in it and "
                        "their centres predicted in the store's CRS (default: the store's CRS)")
    p.add_argument("--covariates", default=None, metavar="FILE",
                   help="points (CSV or a point GeoPackage/GeoParquet, reprojected to the store's CRS) carrying the "
                        "fitted covariates; each cell takes the nearest point within one cell (needed unless the "
                        "model is intercept-only)")
    add_point_columns(p, "--covariates")
    p.add_argument("--overlay", default=None, metavar="FILE", help="vector features to draw (e.g. a river)")
    p.add_argument("--overlay-label", default="", metavar="TEXT", help="legend entry of the overlay, e.g. 'river'")
    p.add_argument("--units", default="", help="units of the mapped variable for the colour bars, e.g. ppb")
    p.add_argument("--title", default=None, help="figure title")
    p.add_argument("--sites", choices=["outlines", "points", "none"], default="outlines",
                   help="what map.png shows of the observations: outlines (default: each site's hull, which the "
                        "default domain already uses), points (the raw coordinates, sent by the sites: only with "
                        "the owners' consent, docs/privacy.md) or none")
    p.add_argument("--no-sites", dest="sites", action="store_const", const="none", help="shorthand for --sites none")
    p.add_argument("--show-owners", action="store_true",
                   help="draw the boundaries between the sites' regions (the owner of each cell) as thin lines")
    add_batch(p)
    add_quiet(p)
    p.set_defaults(handler=run)


def run(args) -> None:
    """Handler of `spatialfed map`: outputs.maps.make_map, then one summary line."""
    from spatialfed.outputs.maps import make_map

    tic = time.perf_counter()
    paths = make_map(args.fit_dir, args.store, args.out, resolution=args.resolution, covariates=args.covariates,
                     units=args.units, title=args.title, overlay=args.overlay, overlay_label=args.overlay_label,
                     sites=args.sites, show_owners=args.show_owners, batch=args.batch, map_crs=args.map_crs,
                     progress=not args.quiet, overwrite=args.overwrite, **point_columns(args), **fitted_settings(args))
    summary = json.loads(paths["json"].read_text())
    print(f"wrote {args.out}: {', '.join(p.name for p in paths.values())} ({summary['cells']} cells of "
          f"{summary['resolution']:g}) in {time.perf_counter() - tic:.1f} s")
