"""The prediction engine: the sites opened as a runtime, and the server combining their parts batch by batch
(the predictors of `spatialfed.outputs.prediction`; maths in `spatialfed.model.predict`)."""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import numpy as np

from spatialfed.data.store import StoreInfo
from spatialfed.errors import DataError, WorkerTaskError, option
from spatialfed.model import transform
from spatialfed.model.predict import assign_owners, combine_prediction
from spatialfed.model.residuals import residual_strategy
from spatialfed.outputs import exchange, nearest, seamless
from spatialfed.outputs.bars import counting
from spatialfed.outputs.prediction.model import FittedModel, check_predictor

CHUNK = 2048   # prediction locations per round of worker tasks when predict_at is given no batch size
#: entries of the server's largest per-batch matrix (batch × m): 4·2²⁰ float64 = 32 MB
BATCH_BUDGET = 4 * 2**20
BATCH_RANGE = (256, 65_536)


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
                            model.residual, model.vecchia_k, model.space)
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
    locs0 = model.to_space(locs0)  # isotropic in As, or Earth-centred x/y/z (the sites hold theirs so)
    batch = batch_size(0, batch)
    if predictor == "ols":
        mom = workers.call("moments", {j: () for j in range(workers.n_workers)})
        for i in range(0, len(locs0), batch):
            yield i, transform.back(ols_prediction(mom, X0[i:i + batch]), model.transform)
        return
    # the seamless band: one number per site, asked once (pp has no residual part and mpp's is uncorrelated between
    # distinct locations, a surface without seams: nothing to blend)
    band, boxes = None, None if predictor == "personal" else nearest.site_boxes(workers)
    if predictor == "seamless" and residual_strategy(model.residual).correlated:
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
            place(out, order[i:i + len(part["mean"])], part, len(locs0))
            if bar is not None:
                bar.update(len(part["mean"]))
    return out


def place(out: dict, rows, part: dict, n: int, keys=None) -> None:
    """Put a batch's columns (`keys` of them, default all) at `rows` of the n-long arrays of `out`."""
    for key in part if keys is None else [k for k in keys if k in part]:
        out.setdefault(key, np.empty(n, dtype=np.asarray(part[key]).dtype))[rows] = part[key]


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
        out = combine_prediction(locs0, X0, par, model.space_knots, model.kernel, model.residual, owned)
    else:
        parts = workers.call("independent_kriging", {j: (locs0[idx], X0[idx], par) for j, idx in groups.items()})
        mean, var = np.empty(len(locs0)), np.empty(len(locs0))
        for j, part in parts.items():
            mean[groups[j]], var[groups[j]] = part["mean"], part["var"]
        var = np.clip(var, 0.0, None)
        out = {"mean": mean, "sd_latent": np.sqrt(var), "sd": np.sqrt(var + 1.0 / par.delta)}
    return {**out, "owner": owners}
