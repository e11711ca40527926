"""The predict command's driver and its files: a fit directory and a store in, a prediction table (in memory, or
streamed to .csv/.gpkg/.parquet) and held-out scores (metrics.json) out. `predict` and `predict_to_file` share one
skeleton (`_predicted`): every check before a site starts, then the sites opened, the domain resolved and the
locations predicted batch by batch."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from spatialfed.atomic import refuse_existing, write_text
from spatialfed.data.store import StoreInfo, open_store
from spatialfed.errors import DataError, option, warn
from spatialfed.outputs import metrics, nearest, tables
from spatialfed.outputs.bars import counting
from spatialfed.outputs.domains import resolve_domain
from spatialfed.outputs.prediction.engine import batch_size, open_workers, place, predict_batches
from spatialfed.outputs.prediction.model import (FittedModel, check_predictor, check_store, default_predictor,
                                                 load_model)
from spatialfed.outputs.prediction.targets import Targets, heldout_targets, table_targets

LOGNORMAL = ("median", "q025", "q975", "mean_log", "sd_log")  # the columns a log fit adds (transform.back)
SCORED = ("mean", "sd", "q025", "q975", "mean_log", "sd_log")  # what metrics.prediction_scores reads
METRICS_JSON = "metrics.json"   # the held-out scores, beside the prediction table


def prediction_frame(targets: Targets, pred: dict, outside: np.ndarray) -> pd.DataFrame:
    """Columns [the coordinates as given,] x, y (store CRS), mean, sd (sd of a new observation), [observed],
    sd_latent, owner, outside_domain [, median, q025, q975, mean_log, sd_log of a log fit]."""
    frame = pd.DataFrame({"x": targets.locs[:, 0], "y": targets.locs[:, 1], "mean": pred["mean"], "sd": pred["sd"]})
    if targets.given is not None:
        frame = pd.concat([targets.given.reset_index(drop=True), frame], axis=1)
    if targets.observed is not None:
        frame["observed"] = targets.observed
    frame = frame.assign(sd_latent=pred["sd_latent"], owner=pred["owner"], outside_domain=outside)
    return frame.assign(**{key: pred[key] for key in LOGNORMAL if key in pred})


@dataclass(frozen=True)
class _Run:
    """A checked predict run: the model, the store, the targets, the predictor (and its worker), the batch size."""

    model: FittedModel
    info: StoreInfo
    targets: Targets
    predictor: str
    worker: int | None
    batch: int

    def scores(self, pred: dict) -> dict | None:
        """The held-out scores of `pred` (None without observed values)."""
        if self.targets.observed is None:
            return None
        return {"predictor": self.predictor, **metrics.prediction_scores(self.targets.observed, pred)}


def _prepare(fit_dir, store, locations, predictor, worker, columns, batch) -> _Run:
    """The run of a predict call, every check done before a site starts; `columns`: {"x", "y", "crs", "observed"}
    of the locations file."""
    model = load_model(fit_dir)
    info = open_store(store)
    check_store(model, info)
    if locations is None and columns.get("observed") is not None:
        raise DataError(f"{option('observed=', '--observed')} names a column of the locations file; give "
                        f"{option('locations=', '--locations FILE')} (the store's test group is scored without it)")
    if locations is None and not info.has_test:
        raise DataError(f"store {info.path} has no test group; give prediction locations with "
                        f"{option('locations=', '--locations FILE.csv')}")
    targets = heldout_targets(info) if locations is None else table_targets(locations, info, **columns)
    predictor = predictor or default_predictor(model)
    check_predictor(predictor, worker, info.n_workers)
    return _Run(model, info, targets, predictor, worker, batch_size(len(model.knots), batch))


def _predicted(run: _Run, *, domain, progress: bool, spatial: bool, **cluster):
    """The one skeleton of predict and predict_to_file: yield (rows, part, outside) batch by batch — part the
    predictive at targets.locs[rows], outside its locations' outside-the-domain mask — with the sites open and a
    tqdm bar. `spatial`: batches in `nearest.spatial_order` (rows index arrays; the same numbers to rounding),
    else in the targets' own order (rows slices, for streaming). Warns once at the end about points outside."""
    locs, X = run.targets.locs, run.targets.X
    order = nearest.spatial_order(locs) if spatial else None
    n_outside = 0
    with open_workers(run.info, run.model, **cluster) as workers:
        dom = resolve_domain(domain, run.info, workers)
        batches = predict_batches(workers, run.model, locs if order is None else locs[order],
                                  X if order is None else X[order], run.predictor, run.worker, run.batch)
        with counting(len(locs), progress) as bar:
            for i, part in batches:
                k = len(part["mean"])
                rows = slice(i, i + k) if order is None else order[i:i + k]
                outside = ~dom.contains(locs[rows])
                n_outside += int(outside.sum())
                yield rows, part, outside
                if bar is not None:
                    bar.update(k)
    if n_outside:
        warn(f"{n_outside} of {len(locs)} prediction location(s) lie outside the domain (extrapolation; flagged in "
             "column outside_domain)", once=False)


def predict(fit_dir, store, *, locations=None, x=None, y=None, crs=None, domain=None, predictor=None, worker=None,
            runtime="auto", client=None, scheduler=None, n_dask_workers=None, insecure=False, batch=None,
            progress: bool = False, observed=None) -> tuple[pd.DataFrame, dict | None]:
    """Predict at a locations file (coordinate columns `x`, `y` or detected; in its own CRS or `crs`, else the
    store's), or at the store's test group; returns the table and held-out scores (or None: a locations file is
    scored against its column `observed` when given). The whole table is in memory: for 10⁵–10⁶ locations use
    `predict_to_file`, which streams it to disk."""
    run = _prepare(fit_dir, store, locations, predictor, worker, {"x": x, "y": y, "crs": crs, "observed": observed},
                   batch)
    n = len(run.targets.locs)
    pred, outside = {}, np.empty(n, dtype=bool)
    for rows, part, out in _predicted(run, domain=domain, progress=progress, spatial=True, runtime=runtime,
                                      client=client, scheduler=scheduler, n_dask_workers=n_dask_workers,
                                      insecure=insecure):
        place(pred, rows, part, n)
        outside[rows] = out
    frame = prediction_frame(run.targets, pred, outside)
    frame.attrs["crs"] = run.info.crs  # the store's: where x, y are (write_prediction georeferences .gpkg/.parquet)
    return frame, run.scores(pred)


def predict_to_file(fit_dir, store, out, *, locations=None, x=None, y=None, crs=None, domain=None, predictor=None,
                    worker=None, runtime="auto", client=None, scheduler=None, n_dask_workers=None, insecure=False,
                    batch=None, progress: bool = True, overwrite: bool = False, observed=None) -> dict:
    """Predict batch by batch and stream each finished batch to `out` (.csv, .gpkg or .parquet: the columns of
    `prediction_frame`), staged beside it and renamed into place at the end (`tables.stream_table`, atomic); with
    the store's test group, or a locations file's `observed` column, also metrics.json beside it. A tqdm bar shows
    the locations done, the rate and the ETA. An existing `out`, or metrics.json when the test group is scored, is
    refused unless `overwrite` (`atomic.refuse_existing`), before any site starts.

    Returns {"out", "metrics" (path or None), "n", "batch", "outside" (count), "scores" (or None)}. Memory: the
    targets plus one batch's matrices (`batch_size`), whatever the number of locations."""
    tables.check_writer(out)  # an output format we cannot write is refused before any site starts
    refuse_existing(out, overwrite)
    run = _prepare(fit_dir, store, locations, predictor, worker, {"x": x, "y": y, "crs": crs, "observed": observed},
                   batch)
    scoring = run.targets.observed is not None
    refuse_metrics(out, scoring, overwrite)
    n = len(run.targets.locs)
    scored, n_outside = {}, 0  # the predictive's columns the scores need, kept when scoring
    with tables.stream_table(out, crs=run.info.crs) as stream:
        for rows, part, outside in _predicted(run, domain=domain, progress=progress, spatial=False, runtime=runtime,
                                              client=client, scheduler=scheduler, n_dask_workers=n_dask_workers,
                                              insecure=insecure):
            n_outside += int(outside.sum())
            stream.append(prediction_frame(run.targets.rows(rows), part, outside))
            place(scored, rows, part, n, SCORED if scoring else ())
        scores = run.scores(scored)
        # metrics.json before the table is renamed into place: if it cannot be written (a full disk), neither is
        mpath = None if scores is None else write_text(Path(out).with_name(METRICS_JSON),
                                                       json.dumps(scores, indent=1) + "\n")
    return {"out": Path(out), "metrics": mpath, "n": n, "batch": run.batch, "outside": n_outside, "scores": scores}


def write_prediction(frame: pd.DataFrame, out, scores: dict | None = None, crs=None, *,
                     overwrite: bool = False) -> tuple[Path, Path | None]:
    """The prediction table in the format its extension names (.csv, .gpkg, .parquet; points in `crs`, the
    store's) and, with scores, metrics.json beside it — both atomic; an existing `out` is refused unless
    `overwrite` (so is an existing metrics.json beside it, when there are scores)."""
    refuse_existing(out, overwrite)
    refuse_metrics(out, scores is not None, overwrite)
    out = tables.write_table(frame, out, crs=crs if crs is not None else frame.attrs.get("crs"))
    metrics_path = out.with_name(METRICS_JSON)
    return out, (None if scores is None else write_text(metrics_path, json.dumps(scores, indent=1) + "\n"))


def refuse_metrics(out, scoring: bool, overwrite: bool) -> None:
    """The overwrite rule for the metrics.json written beside `out` when `scoring` (an earlier prediction's scores
    in that directory are refused as `out` itself would be)."""
    if scoring:
        refuse_existing(Path(out).with_name(METRICS_JSON), overwrite, instead="predict into another directory")
