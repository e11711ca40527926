"""Federated prediction from a fit directory: the low-rank part on the server, the residual part by the owner.

For prediction locations s₀ (with covariates x₀) and a fitted low-rank model (SPEC §1; maths in
`spatialfed.model.predict`):

    mean = x₀ᵀγ + b(s₀)ᵀμ + E[w̃(s₀) | z_owner],   sd = √(Var[y(s₀) | z] + δ⁻¹)  (a new observation at s₀)

**Owner rule.** Every federated worker reports only its distance from each s₀ to its nearest observation; s₀ belongs to
the worker with the smallest distance (ties: the lowest index). With an `area` partition this is the worker whose area
holds s₀. The owner computes the residual part of s₀ from its own data (`LocalModel.residual_kriging`) and returns
arrays whose size is the number of its prediction points, never n_j: raw data never leave a worker.

Predictors (`PREDICTORS`):
- `seamless` (default for low-rank fits): the low-rank kriging above with the residual part blended over the sites
  whose data lie within a band of s₀ (smooth partition-of-unity weights, `outputs.seamless`): continuous across the
  owners' boundaries, the owner's prediction deep inside its region.
- `lowrank`: the federated low-rank kriging above, the residual from the owner alone (the owner predictor; residual
  pp: the low-rank part alone).
- `independent`: the independence model (Eq. 3): each s₀ kriged by its owner from its own data only, global (γ, δ, θ).
- `personal`: FGPR's personalised prediction: one chosen worker kriges every s₀ from its own data, global (γ, δ, θ).
- `ols`: pooled ordinary least squares from the workers' moments (XᵀX, Xᵀz, zᵀz): mean x₀ᵀγ̂ and the OLS
  prediction sd s·√(1 + x₀ᵀ(XᵀX)⁻¹x₀).

Runtimes: `dask` runs every worker's part in a task on the Dask worker that loads and keeps partition j (the fit's
partition executor, `runtime.site`); `simulated` loads the partitions in this process (small data, tests).

**Scale.** Locations are predicted in batches (`predict_batches`): every site call sees one batch, so a
worker builds at most batch × n_j cross-covariances and the server batch × m matrices — never an n₀ × n₀ or
n₀ × n_j one. `batch_size` picks the batch from the largest site (about 4·10⁶ entries per matrix, 32 MB). The
predict command streams each finished batch to a staged temporary file (`tables.stream_table`, renamed into place
at the end by `spatialfed.atomic`), with a tqdm bar and its ETA on stderr (`predict_to_file`); memory is the
targets (n₀ × (2 + p)) plus one batch.
"""

from __future__ import annotations

import json
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from spatialfed.atomic import refuse_existing, write_text
from spatialfed.data.store import StoreInfo, open_store
from spatialfed.errors import DataError, WorkerTaskError, option, warn
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params
from spatialfed.model import transform
from spatialfed.model.predict import assign_owners, combine_prediction
from spatialfed.model.residuals import residual_strategy
from spatialfed.model.vecchia_order import VECCHIA_K
from spatialfed.outputs import exchange, metrics, nearest, seamless, tables
from spatialfed.outputs.bars import counting, progress_bar  # noqa: F401 (progress_bar: the bar itself)
from spatialfed.outputs.domains import default_domain, load_domain, outside_domain, resolve_domain  # noqa: F401
from spatialfed.outputs.results import check_same_store, load_fit
from spatialfed.outputs.targets import (INTERCEPT, Targets, design_matrix, heldout_targets,  # noqa: F401
                                        observed_column, table_targets)
from spatialfed.runtime.factory import RUNTIMES  # noqa: F401 (the choices of predict's --runtime)

LOGNORMAL = ("median", "q025", "q975", "mean_log", "sd_log")  # the columns a log fit adds (transform.back)
SCORED = ("mean", "sd", "q025", "q975", "mean_log", "sd_log")  # what metrics.prediction_scores reads
PREDICTORS = ("seamless", "lowrank", "independent", "personal", "ols")
METRICS_JSON = "metrics.json"   # the held-out scores, beside the prediction table
CHUNK = 2048   # prediction locations per round of worker tasks when predict_at is given no batch size
#: entries of the server's largest per-batch matrix (batch × m): 4·2²⁰ float64 = 32 MB
BATCH_BUDGET = 4 * 2**20
BATCH_RANGE = (256, 65_536)


# --------------------------------------------------------------------------------------------------------------
# the fitted model
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FittedModel:
    """What prediction needs from a fit directory: the server's state φ, the knots, ν and the residual structure."""

    params: Params
    knots: np.ndarray
    nu: float
    residual: str
    method: str
    covariate_names: list[str] | None
    store: str | None = None              # the store the fit was made on, and its fingerprint (fit.json)
    store_fingerprint: str | None = None
    vecchia_k: int = VECCHIA_K            # neighbours of the Vecchia residual (fit.json "vecchia_k")
    transform: str = "none"               # "log": fitted on log values, predicted on their own scale (fit.json)

    @property
    def kernel(self) -> Matern:
        return Matern(self.nu)


def load_model(fit_dir) -> FittedModel:
    """The FittedModel of a `spatialfed fit` output directory (fit.json + model.zarr)."""
    try:
        fit = load_fit(fit_dir)
    except FileNotFoundError as exc:
        where = option("the directory FederatedGP.save wrote", "the --out directory of `spatialfed fit`")
        raise DataError(f"{exc}; give {where}") from None
    knots = np.asarray(fit.knots, dtype=float).reshape(-1, 2)
    m = len(knots)
    if fit.method == "lowrank" and (fit.mu is None or fit.Sigma is None or m == 0):
        raise DataError(f"{fit_dir} has no μ, Σ or knots (model.zarr missing or damaged); run `spatialfed fit` again")
    mu = np.zeros(m) if fit.mu is None else fit.mu              # non-low-rank fits: no low-rank part
    Sigma = np.zeros((m, m)) if fit.Sigma is None else fit.Sigma
    p = fit.params
    params = Params(mu, Sigma, np.asarray(p["gamma"], dtype=float), p["delta"], p["sigma2"], p["beta"])
    return FittedModel(params, knots, float(fit.nu), fit.residual, fit.method, fit.extra.get("covariate_names"),
                       fit.extra.get("store"), fit.store_fingerprint, int(fit.extra.get("vecchia_k", VECCHIA_K)),
                       transform.check_transform(fit.extra.get("transform")))


def check_store(model: FittedModel, info: StoreInfo) -> None:
    """Raise unless `info` is the store the model was fitted on (its fingerprint, results.check_same_store) and has
    the covariates the model was fitted with."""
    check_same_store(model.store_fingerprint, info, recorded_store=model.store)
    names = list(info.covariate_names)
    if len(names) != model.params.gamma.size or (model.covariate_names and names != list(model.covariate_names)):
        raise DataError(f"store {info.path} has covariates {names}, but the fit used "
                        f"{model.covariate_names or model.params.gamma.size}; predict with the store the model was "
                        "fitted on")


def prediction_runtime(runtime, info: StoreInfo, model: FittedModel, *, client=None, scheduler=None,
                       n_dask_workers=None) -> str:
    """The runtime prediction runs on: "auto" is in-process for small stores (runtime.factory.choose_runtime on the
    store's observations × the fit's knots) unless a client, scheduler or Dask worker count is given."""
    from spatialfed.runtime.factory import choose_runtime

    given = {"client": client is not None, "scheduler": scheduler, "n_dask_workers": n_dask_workers is not None}
    return choose_runtime(runtime, n_obs=sum(info.sizes), n_knots=len(model.knots),
                          dask_options=[name for name, value in given.items() if value])[0]


@contextmanager
def open_workers(info: StoreInfo, model: FittedModel, runtime: str = "auto", *, client=None, scheduler=None,
                 n_dask_workers=None, insecure: bool = False):
    """The store's sites with their partitions loaded, as a started `Runtime` (`call(name, {j: args})` runs
    runtime.site.SITE_CALLS where partition j lives): Dask (an embedded cluster unless told otherwise) or, with
    runtime="simulated", this process (small data, tests); "auto" chooses (`prediction_runtime`)."""
    from spatialfed.runtime import site
    from spatialfed.runtime.factory import open_runtime

    runtime = prediction_runtime(runtime, info, model, client=client, scheduler=scheduler,
                                 n_dask_workers=n_dask_workers)

    specs = site.site_specs(f"predict-{uuid.uuid4().hex[:12]}", info.path, info.n_workers, model.knots, model.kernel,
                            model.residual, model.vecchia_k)
    with open_runtime(runtime, client=client, scheduler=scheduler, n_dask_workers=n_dask_workers,
                      n_sites=info.n_workers, insecure=insecure) as workers:
        try:
            for event in workers.start(specs):
                if event.error is not None:
                    raise WorkerTaskError(event.error)
            workers.n_workers = info.n_workers
            yield workers
        finally:
            workers.stop()


# --------------------------------------------------------------------------------------------------------------
# server side: combine the workers' parts
# --------------------------------------------------------------------------------------------------------------


def owners_of(workers, locs0, boxes: np.ndarray) -> np.ndarray:
    """Owner of each s₀: the worker reporting the nearest observation (assign_owners), asking only the sites whose
    data's bounding box `boxes` can hold it (nearest.nearest_distances)."""
    return assign_owners(nearest.nearest_distances(workers, locs0, boxes, 0.0))


def _groups(owners: np.ndarray) -> dict:
    return {int(j): np.flatnonzero(owners == j) for j in np.unique(owners)}


def ols_prediction(workers, X0) -> dict:
    """Pooled OLS from summed moments: mean x₀ᵀγ̂, sd s√(1 + x₀ᵀ(XᵀX)⁻¹x₀) (sd_latent: s√(x₀ᵀ(XᵀX)⁻¹x₀)).
    `workers`: a runtime (the moments are asked for) or the {j: moments} it answered."""
    mom = (workers if isinstance(workers, dict) else
           workers.call("moments", {j: () for j in range(workers.n_workers)})).values()
    XtX, Xtz = sum(m["XtX"] for m in mom), sum(m["Xtz"] for m in mom)
    ztz, n = sum(m["ztz"] for m in mom), sum(m["n"] for m in mom)
    g = np.linalg.solve(XtX, Xtz)
    s2 = (ztz - 2 * g @ Xtz + g @ XtX @ g) / max(n - len(g), 1)
    lev = np.einsum("ij,ij->i", X0, np.linalg.solve(XtX, X0.T).T)
    return {"mean": X0 @ g, "sd_latent": np.sqrt(s2 * lev), "sd": np.sqrt(s2 * (1 + lev)),
            "owner": np.full(len(X0), -1)}


def check_predictor(predictor: str, worker: int | None, n_workers: int) -> None:
    """Raise ValueError for an unknown predictor, or `personal` without a valid worker index."""
    if predictor not in PREDICTORS:
        raise ValueError(f"predictor must be one of {PREDICTORS}, got {predictor!r}")
    if predictor == "personal" and (worker is None or not 0 <= int(worker) < n_workers):
        raise ValueError(f"personalised prediction needs a worker index 0..{n_workers - 1} "
                         f"({option('worker=J', '--worker J')}), "
                         f"got {worker!r}")


def batch_size(m: int, batch: int | None = None) -> int:
    """Prediction locations per batch: `batch` when given (a positive integer), else BATCH_BUDGET entries over m
    (the batch × m knot basis the server combines ≈ 32 MB), clipped to BATCH_RANGE. A site kriges its share of a
    batch in row blocks of ≈ 32 MB (`LocalModel.residual_kriging`), so its memory never grows with the batch."""
    if batch is not None:
        if isinstance(batch, bool) or int(batch) != batch or batch < 1:
            raise ValueError(f"the batch size ({option('batch=', '--batch')}) must be a positive integer, "
                             f"got {batch!r}")
        return int(batch)
    return int(np.clip(BATCH_BUDGET // max(int(m), 1), *BATCH_RANGE))


def _check_targets(model: FittedModel, locs0, X0) -> tuple[np.ndarray, np.ndarray]:
    locs0, X0 = np.asarray(locs0, dtype=float).reshape(-1, 2), np.atleast_2d(np.asarray(X0, dtype=float))
    p = model.params.gamma.size
    if len(locs0) == 0:
        raise DataError("there are no prediction locations")
    if X0.shape != (len(locs0), p):
        raise DataError(f"prediction covariates must have shape ({len(locs0)}, {p}) to match the fit, got {X0.shape}")
    return locs0, X0


def predict_batches(workers, model: FittedModel, locs0, X0, predictor: str = "seamless", worker: int | None = None,
                    batch: int = CHUNK):
    """Yield (start, part) for consecutive batches of `batch` locations: part = {"mean", "sd", "sd_latent",
    "owner"} at locs0[start:start + batch], back on the variable's own scale for a log fit (`transform.back`: with
    median, q025, q975, mean_log, sd_log; sd_latent stays on the log scale). Each batch is one round of site calls (owner distances, then the owners'
    residual parts in row blocks of ≈ 32 MB), so the server's memory is O(batch · m) and a site's O(batch) beside
    its blocks; `ols` is one pooled moment call, then batches."""
    check_predictor(predictor, worker, workers.n_workers)
    locs0, X0 = _check_targets(model, locs0, X0)
    batch = batch_size(0, batch)
    if predictor == "ols":
        mom = workers.call("moments", {j: () for j in range(workers.n_workers)})
        for i in range(0, len(locs0), batch):
            yield i, transform.back(ols_prediction(mom, X0[i:i + batch]), model.transform)
        return
    # the seamless band: one number per site, asked once (pp has no residual part and mpp's is uncorrelated between
    # distinct locations, a surface without seams: nothing to blend)
    band, boxes = None, None if predictor == "personal" else nearest.site_boxes(workers)
    if predictor == "seamless" and model.residual not in ("pp", "mpp"):
        spacing = seamless.sampling_spacing(workers)
        band = (seamless.BAND * spacing, exchange.build(workers, model, spacing, boxes), boxes)
    for i in range(0, len(locs0), batch):
        part = _predict_block(workers, model, locs0[i:i + batch], X0[i:i + batch], predictor, worker, band, boxes)
        yield i, transform.back(part, model.transform)


def predict_at(workers, model: FittedModel, locs0, X0, predictor: str = "seamless", worker: int | None = None,
               chunk: int | None = None, *, progress: bool = False) -> dict:
    """{"mean", "sd", "sd_latent", "owner"} at locs0 (n₀×2) with covariates X0 (n₀×p); sd is of a new observation
    (and the lognormal columns of a log fit: `predict_batches`).

    Locations go to the workers `chunk` at a time (`predict_batches`; default CHUNK) in `nearest.spatial_order`, so
    a batch needs the sites of one area; the results are the same for every batch size and order (to rounding).
    `progress` shows a tqdm bar with its ETA."""
    locs0, X0 = _check_targets(model, locs0, X0)
    order = nearest.spatial_order(locs0)
    out = {}
    with counting(len(locs0), progress) as bar:
        for i, part in predict_batches(workers, model, locs0[order], X0[order], predictor, worker, chunk or CHUNK):
            k = len(part["mean"])
            for key in part:
                out.setdefault(key, np.empty(len(locs0), dtype=np.asarray(part[key]).dtype))[order[i:i + k]] = \
                    part[key]
            if bar is not None:
                bar.update(k)
    return out


def _predict_block(workers, model: FittedModel, locs0, X0, predictor: str, worker: int | None,
                   band: tuple | None = None, boxes: np.ndarray | None = None) -> dict:
    """predict_at for one block of locations (seamless with `band` = (its half-width, its boundary exchange, the
    sites' boxes), lowrank, independent or personal)."""
    if band is not None:
        return seamless.predict_block(workers, model, locs0, X0, *band)
    par = model.params
    owners = np.full(len(locs0), int(worker)) if predictor == "personal" else owners_of(workers, locs0, boxes)
    groups = _groups(owners)
    if predictor in ("lowrank", "seamless"):
        owned = {}
        if residual_strategy(model.residual).kriges:
            parts = workers.call("residual_kriging", {j: (locs0[idx], par) for j, idx in groups.items()})
            owned = {j: (groups[j], part) for j, part in parts.items()}
        out = combine_prediction(locs0, X0, par, model.knots, model.kernel, model.residual, owned)
    else:
        parts = workers.call("independent_kriging", {j: (locs0[idx], X0[idx], par) for j, idx in groups.items()})
        mean, var = np.empty(len(locs0)), np.empty(len(locs0))
        for j, part in parts.items():
            mean[groups[j]], var[groups[j]] = part["mean"], part["var"]
        var = np.clip(var, 0.0, None)
        out = {"mean": mean, "sd_latent": np.sqrt(var), "sd": np.sqrt(var + 1.0 / par.delta)}
    return {**out, "owner": owners}


# --------------------------------------------------------------------------------------------------------------
# the predict command's driver and its files
# --------------------------------------------------------------------------------------------------------------


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


def default_predictor(model: FittedModel) -> str:
    """`seamless` for low-rank fits, `independent` for the baselines' fits."""
    return "seamless" if model.method == "lowrank" else "independent"


def _prepare(fit_dir, store, locations, predictor, worker, columns):
    """(model, store info, targets, predictor) of a predict run, every check done before a site starts; `columns`:
    {"x", "y", "crs", "observed"} of the locations file."""
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
    return model, info, targets, predictor


def predict(fit_dir, store, *, locations=None, x=None, y=None, crs=None, domain=None, predictor=None, worker=None,
            runtime="auto", client=None, scheduler=None, n_dask_workers=None, insecure=False, batch=None,
            progress: bool = False, observed=None) -> tuple[pd.DataFrame, dict | None]:
    """Predict at a locations file (coordinate columns `x`, `y` or detected; in its own CRS or `crs`, else the
    store's), or at the store's test group; returns the table and held-out scores (or None: a locations file is
    scored against its column `observed` when given). The whole table is in memory: for 10⁵–10⁶ locations use
    `predict_to_file`, which streams it to disk."""
    model, info, targets, predictor = _prepare(fit_dir, store, locations, predictor, worker,
                                               {"x": x, "y": y, "crs": crs, "observed": observed})
    with open_workers(info, model, runtime, client=client, scheduler=scheduler,
                      n_dask_workers=n_dask_workers, insecure=insecure) as workers:
        dom = resolve_domain(domain, info, workers)
        outside = outside_domain(targets.locs, dom)
        pred = predict_at(workers, model, targets.locs, targets.X, predictor, worker,
                          batch_size(len(model.knots), batch), progress=progress)
    frame = prediction_frame(targets, pred, outside)
    frame.attrs["crs"] = info.crs  # the store's: where x, y are (write_prediction georeferences .gpkg/.parquet)
    scores = None
    if targets.observed is not None:
        scores = {"predictor": predictor, **metrics.prediction_scores(targets.observed, pred)}
    return frame, scores


def predict_to_file(fit_dir, store, out, *, locations=None, x=None, y=None, crs=None, domain=None, predictor=None,
                    worker=None, runtime="auto", client=None, scheduler=None, n_dask_workers=None, insecure=False,
                    batch=None, progress: bool = True, overwrite: bool = False, observed=None) -> dict:
    """Predict batch by batch and stream each finished batch to `out` (.csv, .gpkg or .parquet: the columns of
    `prediction_frame`), staged beside it and renamed into place at the end (`tables.stream_table`, atomic); with
    the store's test group, or a locations file's `observed` column, also metrics.json beside it. A tqdm bar shows the locations done, the rate and the ETA.
    An existing `out`, or metrics.json when the test group is scored, is refused unless `overwrite`
    (`atomic.refuse_existing`), before any site starts.

    Returns {"out", "metrics" (path or None), "n", "batch", "outside" (count), "scores" (or None)}. Memory: the
    targets plus one batch's matrices (`batch_size`), whatever the number of locations."""
    tables.check_writer(out)  # an output format we cannot write is refused before any site starts
    refuse_existing(out, overwrite)
    model, info, targets, predictor = _prepare(fit_dir, store, locations, predictor, worker,
                                               {"x": x, "y": y, "crs": crs, "observed": observed})
    refuse_metrics(out, targets.observed is not None, overwrite)
    n = len(targets.locs)
    size = batch_size(len(model.knots), batch)
    scoring = targets.observed is not None
    scored = {}  # the predictive's columns the scores need, kept when scoring
    n_outside = 0
    with open_workers(info, model, runtime, client=client, scheduler=scheduler,
                      n_dask_workers=n_dask_workers, insecure=insecure) as workers:
        dom = resolve_domain(domain, info, workers)
        with tables.stream_table(out, crs=info.crs) as stream:
            with counting(n, progress) as bar:
                for i, part in predict_batches(workers, model, targets.locs, targets.X, predictor, worker, size):
                    rows = slice(i, i + len(part["mean"]))
                    outside = ~dom.contains(targets.locs[rows])
                    n_outside += int(outside.sum())
                    stream.append(prediction_frame(targets.rows(rows), part, outside))
                    for key in SCORED if scoring else ():
                        if key in part:
                            scored.setdefault(key, np.empty(n))[rows] = part[key]
                    if bar is not None:
                        bar.update(len(part["mean"]))
            scores = {"predictor": predictor, **metrics.prediction_scores(targets.observed, scored)} if scoring else None
            # metrics.json before the table is renamed into place: if it cannot be written (a full disk), neither is
            mpath = None if scores is None else write_text(Path(out).with_name(METRICS_JSON),
                                                           json.dumps(scores, indent=1) + "\n")
    if n_outside:
        warn(f"{n_outside} of {n} prediction location(s) lie outside the domain (extrapolation; flagged in "
             "column outside_domain)", once=False)
    out = Path(out)
    return {"out": out, "metrics": mpath, "n": n, "batch": size, "outside": n_outside, "scores": scores}


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
