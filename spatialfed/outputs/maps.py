"""Prediction maps: a grid over the domain, GeoTIFF and NetCDF rasters of mean and sd, a GeoPackage, a PNG.

`make_map` predicts at the centres of the square cells of `geometry.prediction_grid` inside the domain (federated, as
in `prediction.predict_at`) and writes into the output directory:
- `mean.tif`, `sd.tif`: single-band float32 GeoTIFFs in the store's CRS, or in `map_crs` (e.g. EPSG:4326 for a
  lon/lat raster: the cells are laid out in it and their centres predicted in the store's CRS) (NaN outside the
  domain);
- `map.nc`: the same mean and sd as one georeferenced NetCDF (CF grid mapping and GeoTransform written by
  rioxarray; `xarray.open_dataset(path, decode_coords="all").rio.crs` gives the CRS back), for xarray/GDAL/QGIS users;
- `grid.gpkg`: the cells as polygons with columns mean, sd, sd_latent, owner (layer "prediction"), for GIS users;
- `map.png`: mean and sd side by side with the domain outline, the sites' outlines (their hulls; the observation
  points themselves only on request, `sites="points"`, as they are raw data the sites then send), optional overlays
  (e.g. a river),
  on request (`show_owners`) the boundaries between the sites' regions as thin lines, the CRS's short name on the
  axes and colour bars labelled "mean (units)" and "sd (units)";
- `map.json`: predictor, number of cells, resolution, CRS (as stored and its short name) and the ranges of mean and sd.
Covariates other than the intercept come from a table of points (`covariates`, read by `tables.read_points`, so a
file in another CRS is reprojected; nearest point within one cell). Overlays in another CRS are reprojected too.
"""

from __future__ import annotations

import json
from contextlib import closing
from pathlib import Path

import geopandas as gpd
import numpy as np
import pandas as pd
import shapely
from scipy.spatial import cKDTree

from spatialfed.atomic import refuse_existing, staged, write_atomic, write_text
from spatialfed.data import geometry
from spatialfed.data.store import StoreInfo, open_store
from spatialfed.errors import DataError, option
from spatialfed.outputs import metrics
from spatialfed.outputs.bars import counting
from spatialfed.outputs.prediction import (INTERCEPT, LOGNORMAL, batch_size, check_predictor, check_store,
                                           default_predictor, design_matrix, load_model, open_workers,
                                           predict_batches, resolve_domain)
from spatialfed.outputs.report import distance
from spatialfed.outputs.prediction.targets import input_crs
from spatialfed.outputs.tables import TableStream, read_points

MEAN_TIF, SD_TIF, GRID_GPKG, MAP_PNG, MAP_NC = "mean.tif", "sd.tif", "grid.gpkg", "map.png", "map.nc"


def nice_resolution(domain: geometry.Domain, cells: int = 150) -> float:
    """A round cell size (1, 2 or 5 × 10^k) giving about `cells` cells along the domain's longer side."""
    xmin, ymin, xmax, ymax = domain.geometry.bounds
    raw = max(xmax - xmin, ymax - ymin) / cells
    k = 10.0 ** np.floor(np.log10(raw))
    return float(max(f for f in (1, 2, 5) if f * k <= raw) * k)


def covariates_at(points, table: pd.DataFrame, names: list[str], tolerance: float, source: str) -> np.ndarray:
    """X at `points` from the nearest row of a covariate table (x, y and covariate columns) within `tolerance`."""
    design_matrix(table.iloc[:0], names, source)  # a missing covariate column is named before the coverage check
    dist, idx = cKDTree(table[["x", "y"]].to_numpy(float)).query(points)
    far = np.flatnonzero(dist > tolerance)
    if far.size:
        raise DataError(f"{far.size} of {len(points)} map cells have no covariate value in {source} within "
                        f"{tolerance:g} (e.g. at {points[far[0]].round(3).tolist()}); give a domain inside the "
                        f"covariate table's coverage ({option('domain=', '--domain')}) or a denser covariate table")
    return design_matrix(table.iloc[idx].reset_index(drop=True), names, source)


def map_design(grid: geometry.PredictionGrid, info: StoreInfo, covariates=None, columns=None,
               view: "MapView | None" = None) -> np.ndarray:
    """Design matrix at the grid's cells: intercept only, or values looked up in the covariate table file (its
    coordinate columns and CRS `columns` = {"x", "y", "crs"}, as for tables.read_points; in the store's CRS, within
    half a cell's diagonal there: a `view`'s cells are laid out in another CRS)."""
    names = list(info.covariate_names)
    if covariates is None:
        needed = [c for c in names if c != INTERCEPT]
        if needed:
            raise DataError(f"the model uses covariate(s) {needed}; give their values on the map with "
                            f"{option('covariates=', '--covariates FILE')} (points with x, y and those columns, e.g. "
                            "the dataset's prediction grid)")
        return np.ones((int(grid.mask.sum()), len(names)))
    table = read_points(covariates, info.crs, arrived=input_crs(info), **(columns or {}))
    if view is None:
        return covariates_at(grid.points, table, names, grid.resolution * np.sqrt(0.5) * 1.001, str(covariates))
    centres, h = view.to_store(grid.points), grid.resolution / 2
    reach = max(float(np.max(np.linalg.norm(view.to_store(grid.points + [dx, dy]) - centres, axis=1)))
                for dx in (-h, h) for dy in (-h, h))
    return covariates_at(centres, table, names, reach * 1.001, str(covariates))


class MapView:
    """The map's own CRS (`map_crs` of make_map) beside the store's: the grid is laid out in it, its cells' centres
    predicted in the store's CRS; what map.png draws (domain, sites, overlays) is taken into it."""

    def __init__(self, store_crs, map_crs):
        from pyproj import Transformer

        self.crs = geometry.parse_crs(map_crs)
        if self.crs is None or geometry.parse_crs(store_crs) is None:
            raise DataError(f"{option('map_crs=', '--map-crs')} needs a store with a CRS and a CRS to draw in, got "
                            f"{map_crs!r} for a store in {geometry.crs_name(store_crs) or 'planar units'}")
        self._forward = Transformer.from_crs(store_crs, self.crs, always_xy=True)
        self._back = Transformer.from_crs(self.crs, store_crs, always_xy=True)

    @classmethod
    def of(cls, store_crs, map_crs) -> "MapView | None":
        """None for no map CRS or the store's own."""
        if map_crs is None or geometry.parse_crs(map_crs) == geometry.parse_crs(store_crs):
            return None
        return cls(store_crs, map_crs)

    def to_store(self, points) -> np.ndarray:
        points = np.asarray(points, dtype=float).reshape(-1, 2)
        return np.column_stack(self._back.transform(points[:, 0], points[:, 1]))

    def to_map(self, points) -> np.ndarray:
        points = np.asarray(points, dtype=float).reshape(-1, 2)
        return np.column_stack(self._forward.transform(points[:, 0], points[:, 1]))

    def marks(self, locs):
        """_site_marks' ("points", xy) or ("outlines", polygons) in the map's CRS."""
        if locs is None:
            return None
        kind, what = locs
        if kind == "points":
            return kind, self.to_map(what)
        return kind, [shapely.transform(g, self.to_map) for g in what]


def write_geotiff(path, grid: geometry.PredictionGrid, values, crs, description: str) -> Path:
    """One-band float32 GeoTIFF of per-cell values (NaN outside the domain) with the grid's transform and `crs`."""
    import rasterio

    raster = grid.to_raster(values).astype("float32")
    profile = dict(driver="GTiff", height=raster.shape[0], width=raster.shape[1], count=1, dtype="float32",
                   crs=geometry.crs_string(crs), transform=grid.transform, nodata=np.nan, compress="deflate")

    def write(tmp):
        with rasterio.open(tmp, "w", **profile) as dst:
            dst.write(raster, 1)
            dst.set_band_description(1, description)

    return write_atomic(path, write)


def raster_dataset(grid: geometry.PredictionGrid, layers: dict, crs, units: str = ""):
    """An xarray Dataset of (y, x) float32 rasters (NaN outside the domain) on the grid's cell centres, with the CRS
    (CF grid mapping `spatial_ref`) and the affine transform written by rioxarray. `layers`: name -> (values,
    long_name)."""
    import rioxarray  # noqa: F401  (registers the .rio accessor)
    import xarray as xr

    data = {name: (("y", "x"), grid.to_raster(values).astype("float32"),
                   {"long_name": long_name, "units": units or "data units"})
            for name, (values, long_name) in layers.items()}
    ds = xr.Dataset(data, coords={"x": grid.x, "y": grid.y})
    ds = ds.rio.set_spatial_dims(x_dim="x", y_dim="y")
    name = geometry.crs_string(crs)
    if name is not None:
        ds = ds.rio.write_crs(name)
    ds = ds.rio.write_transform(grid.transform)
    ds = ds.rio.write_coordinate_system()
    ds.attrs.update({"title": "spatialfed prediction map", "Conventions": "CF-1.8",
                     "crs_name": geometry.crs_name(crs) or "planar units (no CRS)"})
    return ds


def write_netcdf(path, grid: geometry.PredictionGrid, mean, sd, crs, units: str = "") -> Path:
    """Georeferenced NetCDF (classic format, no extra library) holding `mean` and `sd` (sd of a new observation) as
    float32 rasters in `crs` with the grid's transform; NaN outside the domain."""
    ds = raster_dataset(grid, {"mean": (mean, "predicted mean"),
                               "sd": (sd, "prediction standard deviation (new observation)")}, crs, units)
    import dask

    for name in ("mean", "sd"):       # update, not replace: rioxarray keeps `grid_mapping` in the encoding
        ds[name].encoding.update({"dtype": "float32", "_FillValue": np.float32(np.nan)})
    # the arrays are in memory, but xarray ≥ 2025 asks Dask for the scheduler anyway: a "dask.distributed" default
    # left by a Client of this process that is gone raised "no Client active"
    with dask.config.set(scheduler="synchronous"):
        return write_atomic(path, lambda tmp: ds.to_netcdf(tmp, engine="scipy", format="NETCDF3_64BIT"))


def grid_frame(grid: geometry.PredictionGrid, pred: dict, rows: slice = slice(None)) -> gpd.GeoDataFrame:
    """The grid's cells (those of `rows`, in grid.points order) as square polygons with the prediction columns
    (`pred` holds the values of those rows)."""
    pts, h = grid.points[rows], grid.resolution / 2
    cells = shapely.box(pts[:, 0] - h, pts[:, 1] - h, pts[:, 0] + h, pts[:, 1] + h)
    cols = {k: pred[k] for k in ("mean", "sd", "sd_latent", "owner", *LOGNORMAL) if k in pred}
    return gpd.GeoDataFrame({"x": pts[:, 0], "y": pts[:, 1], **cols}, geometry=cells, crs=grid.crs)


def write_grid_gpkg(path, frame: gpd.GeoDataFrame) -> Path:
    """The cells as a GeoPackage (layer "prediction")."""
    def write(tmp):
        try:
            frame.to_file(tmp, driver="GPKG", layer="prediction")
        except Exception as exc:  # pyogrio reports I/O failures (a full disk, ...) as its own error types
            raise exc if isinstance(exc, OSError) else OSError(f"GDAL could not write the GeoPackage ({exc})") from None

    return write_atomic(path, write)


def _crs_unit(crs) -> str:
    """Short name of the CRS's linear unit ("m", "ft", …); "" for planar units without a CRS."""
    crs = geometry.parse_crs(crs)
    unit = crs.axis_info[0].unit_name if crs is not None and crs.axis_info else ""
    return {"metre": "m", "meter": "m", "kilometre": "km", "foot": "ft", "US survey foot": "ft"}.get(unit, unit)


def _axis_labels(crs, extent: float) -> tuple[str, str, float]:
    """Axis labels naming the unit and the CRS (short name), and the tick scale: kilometres for metre CRSs spanning
    more than 20 km."""
    unit = _crs_unit(crs)
    if not unit:
        return "x (planar units, no CRS)", "y (planar units, no CRS)", 1.0
    if geometry.parse_crs(crs).is_geographic:
        return f"Longitude (°), {geometry.crs_name(crs)}", f"Latitude (°), {geometry.crs_name(crs)}", 1.0
    scale = 1000.0 if unit == "m" and extent > 20_000 else 1.0
    unit = "km" if scale == 1000.0 else unit
    return f"Easting ({unit}), {geometry.crs_name(crs)}", f"Northing ({unit}), {geometry.crs_name(crs)}", scale


def colourbar_labels(units: str = "") -> tuple[str, str]:
    """Colour-bar labels of the mean and the sd panels: both in the value's units, the second says it is the sd."""
    units = units or "data units"
    return f"mean ({units})", f"sd ({units})"


def owner_edges(grid: geometry.PredictionGrid, owner) -> np.ndarray:
    """Cell edges (k × 2 × 2 segments) between neighbouring cells predicted by different workers."""
    lab, h = grid.to_raster(owner), grid.resolution / 2
    inside = np.isfinite(lab)
    r, c = np.nonzero((lab[:, 1:] != lab[:, :-1]) & inside[:, 1:] & inside[:, :-1])
    xb = grid.x[c] + h
    vertical = np.stack([np.column_stack([xb, grid.y[r] - h]), np.column_stack([xb, grid.y[r] + h])], axis=1)
    r, c = np.nonzero((lab[1:, :] != lab[:-1, :]) & inside[1:, :] & inside[:-1, :])
    yb = grid.y[r] - h
    horizontal = np.stack([np.column_stack([grid.x[c] - h, yb]), np.column_stack([grid.x[c] + h, yb])], axis=1)
    return np.concatenate([vertical, horizontal])


def map_figure(path, grid: geometry.PredictionGrid, mean, sd, domain: geometry.Domain, **options) -> Path:
    """PNG (atomic) of `build_map_figure`."""
    fig = build_map_figure(grid, mean, sd, domain, **options)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))


def build_map_figure(grid: geometry.PredictionGrid, mean, sd, domain: geometry.Domain, *, sites=None, owner=None,
                     outlines=None, overlays: gpd.GeoDataFrame | None = None, overlay_label: str = "",
                     units: str = "", title: str = ""):
    """Matplotlib Figure with the predicted mean and sd side by side, domain outline, sites (points) or the sites'
    `outlines` (polygons), the owners' areas, overlays, axes naming the CRS and colour bars labelled "mean (units)"
    and "sd (units)"."""
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    xmin, ymin, xmax, ymax = domain.geometry.bounds
    pad = 0.03 * max(xmax - xmin, ymax - ymin)
    aspect = (ymax - ymin + 2 * pad) / (xmax - xmin + 2 * pad)
    fig = Figure(figsize=(12, float(np.clip(4.6 * aspect + 1.3, 3.5, 9.5))), layout="constrained")
    axes = fig.subplots(1, 2)
    h = grid.resolution / 2
    extent = (grid.x[0] - h, grid.x[-1] + h, grid.y[-1] - h, grid.y[0] + h)
    xlabel, ylabel, scale = _axis_labels(grid.crs, max(xmax - xmin, ymax - ymin))
    ticks = FuncFormatter(lambda v, _: f"{v / scale:.0f}" if "Longitude" not in xlabel else f"{v:g}")
    mean_label, sd_label = colourbar_labels(units)
    panels = ((axes[0], mean, "viridis", "Predicted mean", mean_label),
              (axes[1], sd, "magma", "Prediction standard deviation", sd_label))
    for ax, values, cmap, label, bar_label in panels:
        im = ax.imshow(grid.to_raster(values), extent=extent, origin="upper", cmap=cmap, interpolation="nearest")
        fig.colorbar(im, ax=ax, shrink=0.85, label=bar_label)
        if overlays is not None and len(overlays):
            overlays.plot(ax=ax, facecolor="#9ecae1", edgecolor="#3182bd", linewidth=0.6, alpha=0.8, zorder=2)
        domain.to_geoseries().boundary.plot(ax=ax, color="0.15", linewidth=0.8, zorder=3)
        if owner is not None:
            ax.add_collection(LineCollection(owner_edges(grid, owner), colors="white", linewidths=0.5, alpha=0.6,
                                             zorder=3, label="boundaries between the sites' regions"))
        if outlines is not None and len(outlines):
            edges = gpd.GeoSeries(list(outlines)).boundary
            edges.plot(ax=ax, color="white", linewidth=0.7, linestyle="--", zorder=4)
            ax.plot([], [], color="white", linewidth=0.7, linestyle="--",
                    label=f"observation areas of the {len(outlines)} sites")
        if sites is not None and len(sites):
            ax.scatter(sites[:, 0], sites[:, 1], s=9, facecolor="white", edgecolor="black", linewidth=0.5,
                       zorder=4, label=f"observation sites (n = {len(sites)})")
        ax.set(xlim=(xmin - pad, xmax + pad), ylim=(ymin - pad, ymax + pad), xlabel=xlabel, ylabel=ylabel,
               title=label, aspect="equal")
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.yaxis.set_major_locator(MaxNLocator(5))
        ax.xaxis.set_major_formatter(ticks)
        ax.yaxis.set_major_formatter(ticks)
    handles, labels = axes[0].get_legend_handles_labels()
    if overlays is not None and len(overlays) and overlay_label:
        handles.append(Patch(facecolor="#9ecae1", edgecolor="#3182bd"))
        labels.append(overlay_label)
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), fontsize=9, facecolor="0.85")
    if title:
        fig.suptitle(title)
    return fig


def read_overlay(path, info: StoreInfo) -> gpd.GeoDataFrame:
    """Vector features drawn on the map (e.g. a river), reprojected to the store's CRS when they have another."""
    try:
        frame = gpd.read_file(path)
    except Exception as exc:  # pyogrio raises several unrelated types for unreadable files
        raise DataError(f"cannot read overlay file {path}: {exc}") from None
    store = geometry.parse_crs(info.crs)
    if frame.crs is not None and store is not None and frame.crs != store:
        frame = frame.to_crs(store)
    elif frame.crs is not None and store is None:
        raise DataError(f"overlay file {path} is in {geometry.crs_name(frame.crs)} but the store has planar units "
                        "(no CRS); give an overlay without a CRS, in the store's units")
    return frame


def make_map(fit_dir, store, out_dir, *, domain=None, resolution=None, covariates=None, x=None, y=None, crs=None,
             units="", title=None, overlay=None, overlay_label="", sites="outlines", show_owners=False, predictor=None,
             worker=None, runtime="auto", client=None, scheduler=None, n_dask_workers=None, insecure=False,
             batch=None, progress: bool = False, overwrite: bool = False, map_crs=None) -> dict:
    """Predict on a grid over the domain and write mean.tif, sd.tif, grid.gpkg, map.png and map.json; returns paths.
    `x`, `y`, `crs`: the coordinate columns and CRS of the `covariates` table (default: detected, its own CRS or
    the store's). `map_crs`: the CRS of the map files (None: the store's; `resolution` is in its units).
    `show_owners` draws the boundaries between the sites' regions (the owner rule) on map.png as thin
    lines. `sites`: what map.png shows of the observations, "outlines" (each site's hull, the polygon it already
    sends for the default domain), "points" (the raw coordinates, fetched from the sites: only with the owners'
    consent) or "none" (True / False: "points" / "none").

    Cells are predicted in batches (`prediction.predict_batches`, `batch` cells per round; default `batch_size`),
    each batch's cells appended to grid.gpkg in the staged output directory as it finishes, with a tqdm bar and ETA
    when `progress`; the rasters keep one float per cell."""
    sites = site_drawing(sites)
    model = load_model(fit_dir)
    info = open_store(store)
    check_store(model, info)
    predictor = predictor or default_predictor(model)
    check_predictor(predictor, worker, info.n_workers)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DataError(f"{option('out_dir', '--out')} {out} exists and is not a directory; give a directory for "
                        "the map files")
    refuse_existing(out, overwrite)
    view = MapView.of(info.crs, map_crs)
    overlays = None if overlay is None else read_overlay(overlay, info)
    if overlays is not None and view is not None:
        overlays = overlays.to_crs(view.crs)
    with staged(out, directory=True) as tmp:  # the whole set or nothing (a full disk, Ctrl-C); replaces an old one
        with open_workers(info, model, runtime, client=client, scheduler=scheduler,
                          n_dask_workers=n_dask_workers, insecure=insecure) as workers:
            dom = resolve_domain(domain, info, workers)
            dom = dom if view is None else dom.to_crs(view.crs)
            grid = geometry.prediction_grid(dom, nice_resolution(dom) if resolution is None else resolution)
            X0 = map_design(grid, info, covariates, {"x": x, "y": y, "crs": crs}, view)
            pred = _predict_grid(workers, model, grid, X0, predictor, worker,
                                 batch_size(len(model.knots), batch), tmp / GRID_GPKG, progress,
                                 grid.points if view is None else view.to_store(grid.points))
            locs = _site_marks(workers, sites)
        if not show_owners:
            pred = {**pred, "owner": np.full(len(pred["owner"]), -1)}  # the rasters/PNG only: grid.gpkg has them
        locs = locs if view is None else view.marks(locs)
        paths = _write_map_files(tmp, grid, pred, dom, info.crs if view is None else view.crs, predictor, locs,
                                 overlays, overlay_label, units, title)
    return {key: out / Path(path).name for key, path in paths.items()}


SITE_DRAWINGS = ("outlines", "points", "none")


def site_drawing(sites) -> str:
    """The `sites` option of make_map as one of SITE_DRAWINGS (True / False: "points" / "none")."""
    sites = {True: "points", False: "none"}.get(sites, sites) if isinstance(sites, bool) else sites
    if sites not in SITE_DRAWINGS:
        raise DataError(f"{option('sites', '--sites')} must be one of {', '.join(SITE_DRAWINGS)}, got {sites!r}")
    return sites


def _site_marks(workers, sites: str):
    """What map.png draws of the sites: ("points", their coordinates: a "sites" call, raw data), ("outlines", their
    hulls: the "hull" call of the default domain, polygons) or None."""
    if sites == "none":
        return None
    every = {j: () for j in range(workers.n_workers)}
    if sites == "points":
        return "points", np.vstack(list(workers.call("sites", every).values()))
    return "outlines", [shapely.from_wkb(h) for h in workers.call("hull", every).values()]


def _predict_grid(workers, model, grid, X0, predictor, worker, batch: int, gpkg: Path, progress: bool,
                  points) -> dict:
    """Predict the grid's cells (their centres `points`, in the store's CRS) batch by batch, appending each batch's
    cells to the GeoPackage `gpkg` (layer "prediction"); returns the per-cell arrays the rasters need."""
    n = len(grid.points)
    pred = {key: np.empty(n) for key in ("mean", "sd", "sd_latent")}
    pred["owner"] = np.empty(n, dtype=np.int64)
    stream = TableStream(gpkg, ".gpkg", crs=grid.crs, layer="prediction")
    with counting(n, progress, desc="map") as bar, closing(stream):
        for i, part in predict_batches(workers, model, points, X0, predictor, worker, batch):
            rows = slice(i, i + len(part["mean"]))
            for key in pred:
                pred[key][rows] = part[key]
            try:
                stream.append(grid_frame(grid, part, rows))
            except Exception as exc:  # pyogrio reports I/O failures (a full disk, ...) as its own error types
                raise exc if isinstance(exc, OSError) else OSError(f"GDAL could not write the GeoPackage ({exc})") \
                    from None
            if bar is not None:
                bar.update(len(part["mean"]))
    return pred


def map_title(predictor: str, grid: geometry.PredictionGrid, crs) -> str:
    """The default title of map.png: "seamless prediction on 3,103 cells of side 40 m, EPSG:28992"."""
    name = geometry.crs_name(crs)
    return (f"{predictor} prediction on {int(grid.mask.sum()):,} cells of side "
            f"{distance(grid.resolution, _crs_unit(crs) or None)}" + (f", {name}" if name else ""))


def _write_map_files(tmp: Path, grid, pred, dom, crs, predictor, locs, overlays, overlay_label, units,
                     title) -> dict:
    """The rasters, NetCDF, PNG and map.json of make_map, in `crs`, into the staged directory `tmp` (grid.gpkg is
    there)."""
    title = map_title(predictor, grid, crs) if title is None else title
    owner = pred["owner"] if (pred["owner"] >= 0).all() else None
    summary = {"predictor": predictor, "cells": int(grid.mask.sum()), "resolution": grid.resolution,
               "crs": geometry.crs_string(crs), "crs_name": geometry.crs_name(crs), "units": units or None,
               "mean_range": [float(pred["mean"].min()), float(pred["mean"].max())],
               "sd_range": [float(pred["sd"].min()), float(pred["sd"].max())]}
    return {"mean": write_geotiff(tmp / MEAN_TIF, grid, pred["mean"], crs, "predicted mean"),
            "sd": write_geotiff(tmp / SD_TIF, grid, pred["sd"], crs, "prediction sd (new observation)"),
            "netcdf": write_netcdf(tmp / MAP_NC, grid, pred["mean"], pred["sd"], crs, units),
            "gpkg": tmp / GRID_GPKG,
            "png": map_figure(tmp / MAP_PNG, grid, pred["mean"], pred["sd"], dom, owner=owner,
                              **({} if locs is None else {"sites" if locs[0] == "points" else "outlines": locs[1]}),
                              overlays=overlays, overlay_label=overlay_label, units=units, title=title),
            "json": write_text(tmp / "map.json", json.dumps(summary, indent=1) + "\n")}


def heldout_figure(path, frames: dict, units: str = "", title: str = "") -> Path:
    """Observed vs predicted at held-out points with 95% intervals, one panel per method (frames: name -> table with
    observed, mean, sd)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4.2 * len(frames), 4.4), layout="constrained")
    axes = fig.subplots(1, len(frames), squeeze=False, sharex=True, sharey=True)
    every = pd.concat([f[["observed", "mean"]] for f in frames.values()]).to_numpy()
    lo, hi = every.min(), every.max()
    pad = 0.08 * (hi - lo)
    unit_txt = f" ({units})" if units else ""
    for ax, (name, f) in zip(axes[0], frames.items()):
        s = metrics.scores(f["observed"], f["mean"], f["sd"])
        bars = ax.errorbar(f["observed"], f["mean"], yerr=1.96 * f["sd"], fmt="o", ms=3.5, color="#2c7fb8",
                           ecolor="#a6bddb", elinewidth=1 if len(f) <= 60 else 0.5, capsize=0)
        bars[-1][0].set_alpha(1.0 if len(f) <= 60 else 0.5)
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="0.3", lw=0.8, ls="--")
        ax.set(title=f"{name}\nRMSE {s['rmse']:.3f}, CRPS {s['crps']:.3f}, cover {s['coverage95']:.0%}",
               xlabel=f"observed{unit_txt}", aspect="equal", xlim=(lo - pad, hi + pad), ylim=(lo - pad, hi + pad))
    axes[0][0].set_ylabel(f"predicted mean ± 1.96 sd{unit_txt}")
    if title:
        fig.suptitle(title)
    return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=100, format="png"))
