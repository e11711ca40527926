"""A saved fit back as an estimator (``FederatedGP.load``), and what ``save`` records so that it predicts.

Prediction needs the fitted state (μ, Σ, γ, δ, θ, the knots: model.zarr) and the sites' data: each site kriges the
residual part from its own partition (``outputs.prediction``), which no summary replaces. So

- a fit on a **store path** keeps pointing at that store (the federated contract: the data stay with the sites);
  ``load(dir, store=...)`` names its new place when it moved; a prediction without it is one line naming the
  path and the fix;
- a fit on **in-memory data** (a DataFrame or arrays, written to a temporary store: ``api.inputs``) has no store
  of its own beyond the estimator's life, so ``save`` copies that store into the fit directory as ``data.zarr``
  (your own data, already in this process), and ``load`` predicts from it.

``save`` also records the estimator's settings (those JSON can hold: a ``client``, a ``Domain`` object or a
privacy or delay-model object come back as None), the store's CRS and the groups column, in model.zarr's
attributes, so ``get_params()`` of a loaded estimator is that of the fit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from spatialfed.api import covariance
from spatialfed.errors import DataError, StoreError

DATA_ZARR = "data.zarr"   # the in-memory data of the fit, saved beside fit.json
SAVED = "estimator"       # model.zarr settings key of the estimator's settings


def saved_settings(gp) -> dict:
    """The settings ``save`` adds to model.zarr's attributes for ``load`` (``FitResult.extra``)."""
    from spatialfed.api.options import Cluster, Emulation, checkpoint_of, cluster_of, emulation_of

    params = {}
    cluster, emulation = cluster_of(gp.cluster), emulation_of(gp.emulation)
    plain = {**gp.get_params(deep=False), "cluster": None if cluster == Cluster() else cluster.saved(),
             "emulation": None if emulation == Emulation() else emulation.saved(),
             "checkpoint": None if gp.checkpoint is None else checkpoint_of(gp.checkpoint).saved()}
    for name, value in plain.items():
        try:
            params[name] = json.loads(json.dumps(value, default=_plain, allow_nan=False))
        except (TypeError, ValueError):  # a live object (client, Domain, mechanism): not saved
            params[name] = None
    return {SAVED: params, "store_crs": gp.store_crs_, "groups_column": gp.groups_column_,
            "covariates_inferred": bool(getattr(gp, "covariates_inferred_", False)),
            "transform": getattr(gp, "transform_", "none"),
            "data": DATA_ZARR if _own_data(gp) is not None else None}


def _plain(obj):
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(type(obj).__name__)


def _temporary(gp):
    return gp.__dict__.get("_temporary_store")


def _own_data(gp) -> Path | None:
    """The store of a fit on in-memory data: its temporary store, or the data.zarr of the directory it was loaded
    from; None for a fit on a store path."""
    temporary = _temporary(gp)
    if temporary is not None:
        return Path(temporary.path)
    loaded = getattr(gp, "loaded_from_", None)
    return Path(gp.store_) if loaded and Path(gp.store_) == Path(loaded) / DATA_ZARR else None


def saved_data(gp) -> dict:
    """``write_results`` extras: {"data.zarr": a copy of its data} for a fit on in-memory data."""
    own = _own_data(gp)
    return {} if own is None else {DATA_ZARR: lambda path: shutil.copytree(own, path)}


def load(cls, fit_dir, store=None):
    """``cls.load``: a fitted estimator from the directory ``save`` (or ``spatialfed fit``) wrote; `store`
    replaces the recorded store path (checked to be the same data when it exists)."""
    from spatialfed.outputs.prediction import load_model
    from spatialfed.outputs.results import load_fit

    d = Path(fit_dir)
    if not d.is_dir():
        raise DataError(f"cannot load {d}: {'it is a file, not a' if d.exists() else 'there is no'} fit directory; "
                        "give a directory written by FederatedGP.save(DIR) or `spatialfed fit`")
    try:
        model, fit = load_model(d), load_fit(d)
    except DataError as exc:
        raise DataError(f"cannot load {d}: {exc}") from None
    except json.JSONDecodeError as exc:  # zarr's (load_fit reports a damaged fit.json as a plain ValueError)
        raise DataError(f"cannot load {d}: its model.zarr is damaged ({exc}); save the fit again or run "
                        "`spatialfed fit` again") from None
    except ValueError as exc:
        raise DataError(f"cannot load {d}: {exc}") from None
    except Exception as exc:  # zarr's other errors for a damaged model.zarr
        raise DataError(f"cannot load {d}: its model.zarr is damaged ({type(exc).__name__}: {exc}); save the fit "
                        "again or run `spatialfed fit` again") from None
    extra = fit.extra or {}
    gp = cls(**_settings(cls, fit, extra))
    gp.store_ = _store_path(d, fit, extra, store)
    _fitted(gp, fit, model, extra, d)
    return gp


def _settings(cls, fit, extra) -> dict:
    """The estimator's settings as saved (older fit directories: those fit.json and model.zarr imply)."""
    saved = dict(extra.get(SAVED) or {})
    if not saved:
        saved = {"method": fit.method, "mode": fit.mode, "nu": float(fit.nu), "knots": len(fit.knots) or 100,
                 "seed": extra.get("seed", 0), "profile": extra.get("profile", "balanced"),
                 "vecchia_k": extra.get("vecchia_k")}
    if isinstance(saved.get("knots"), list):  # an (m, 2) array of knots
        saved["knots"] = np.asarray(saved["knots"], dtype=float)
    from spatialfed.api.options import Cluster, checkpoint_of, emulation_of, recorded_cluster, spelled

    saved = spelled(saved)  # fit directories of earlier versions hold the old flat names
    # a fit directory is data: where to connect (address, jobqueue, tls) comes from the caller, never the files
    cluster = recorded_cluster(saved.get("cluster"))[0]
    only_runtime = cluster == Cluster(runtime=cluster.runtime)  # restored as spelled: None, "simulated", "dask"
    saved["cluster"] = (None if cluster.runtime == "auto" else cluster.runtime) if only_runtime else cluster
    if isinstance(saved.get("emulation"), dict):
        saved["emulation"] = emulation_of(saved["emulation"])
    saved["checkpoint"] = checkpoint_of(saved.get("checkpoint"))
    return {k: v for k, v in saved.items() if k in cls._get_param_names()}


def _store_path(d: Path, fit, extra, store) -> str:
    """The store prediction reads: `store` when given, the saved data.zarr of an in-memory fit, else the recorded
    store; a store that exists is checked against the fit's fingerprint."""
    from spatialfed.outputs.results import check_same_store

    recorded = extra.get("store")
    if store is None and extra.get("data"):
        path = d.resolve() / extra["data"]
    else:
        path = Path(store if store is not None else recorded)
    if store is not None or path.exists():
        check_same_store(fit.store_fingerprint, path, recorded_store=recorded)
    return str(path)


def _fitted(gp, fit, model, extra, d: Path) -> None:
    """The learned attributes of `gp` from the saved fit (those of ``FederatedGP._fitted``)."""
    from spatialfed.api.units import variogram_params
    from spatialfed.outputs.monitor import FitMonitor

    p = fit.params
    gp.params_ = {"gamma": np.asarray(p["gamma"], dtype=float), "delta": float(p["delta"]),
                  "sigma2": float(p["sigma2"]), "beta": float(p["beta"])}
    gp.store_fingerprint_ = fit.store_fingerprint
    gp.store_crs_ = extra["store_crs"] if "store_crs" in extra else _store_crs(gp.store_)
    saved_vp = {k: v for k, v in (extra.get("variogram_params") or {}).items() if k in covariance.FITTED_KEYS}
    if "nu_se_log" in saved_vp and "nu_95_wald" not in saved_vp:  # saved before the profile interval: Wald's
        saved_vp["nu_95_wald"] = saved_vp.pop("nu_95", None)
    if saved_vp:  # an estimated family: ν̂ (fit.json "nu"), its interval, the ranges and the metric
        gp.params_.update({k: float(fit.nu if k == "nu" else saved_vp[k]) for k in covariance.PARAM_KEYS
                           if k == "nu" or k in saved_vp})
    distance = {k: v for k, v in (extra.get("variogram_params") or {}).items() if k in covariance.DISTANCE_KEYS}
    gp.variogram_params_ = {**variogram_params(gp.params_, fit.nu, gp.store_crs_), **saved_vp,
                            **(distance or {"distance": "planar"})}  # saved before distances had a setting: planar
    gp.knots_, gp.mu_, gp.Sigma_ = model.knots, fit.mu, fit.Sigma
    gp.loglik_ = None if fit.loglik is None else float(fit.loglik)
    gp.residual_, gp.covariate_names_ = fit.residual, list(model.covariate_names or [])
    gp.n_workers_, gp.n_obs_, gp.n_iter_ = int(fit.n_workers), int(fit.n_obs), int(fit.iterations)
    gp.converged_, gp.stop_reason_, gp.wall_time_s_ = bool(fit.converged), extra.get("stop_reason"), fit.wall_time_s
    gp.trace_ = _trace(fit.trace, d)
    gp.boundary_ = dict(extra.get("boundary") or {})
    gp.site_blocked_cv_ = extra.get("site_blocked_cv")  # None: saved before it existed, or not applicable
    gp.dropped_workers_, gp.privacy_report_ = list(fit.dropped_workers), fit.privacy
    gp.discarded_stale_ = int(extra.get("discarded_stale", 0))
    gp.slowdowns_ = np.asarray(extra.get("slowdowns", np.ones(fit.n_workers)), dtype=float)
    gp.config_ = saved_config(extra.get("config") or {})
    gp.runtime_used_, gp.runtime_reason_ = extra.get("runtime", "simulated"), extra.get("runtime_reason", "")
    gp.groups_column_ = extra.get("groups_column")
    gp.covariates_inferred_ = bool(extra.get("covariates_inferred", False))
    gp.transform_ = str(extra.get("transform", "none"))
    gp.monitor_ = FitMonitor(fit.n_workers)  # the report of a re-save: the trace's plots, no arrivals
    gp.monitor_.trace_rows = [dict(row) for row in gp.trace_]
    gp.monitor_.nu = float(fit.nu)  # the fitted semivariogram's curve (the sites' bins were not saved)
    gp.domain_ = gp.dashboard_link_ = gp.scheduler_address_ = gp.assignment_ = gp.n_tasks_ = None
    gp.resumed_from_, gp.checkpoint_writes_, gp.checkpoint_seconds_ = None, 0, 0.0
    gp.loaded_from_ = str(d.resolve())


def _store_crs(path):
    """The CRS of the store at `path` (fit directories saved before the CRS was recorded); None without it."""
    from spatialfed.data.store import open_store

    try:
        return open_store(path).crs
    except StoreError:
        return None


def _trace(rows, d: Path) -> list[dict]:
    """fit.json's trace rows with the ℓ that trace.csv records where the server had one."""
    from spatialfed.outputs.results import load_trace_csv

    try:
        logliks = [row["loglik"] for row in load_trace_csv(d)]
    except (OSError, KeyError, ValueError):
        logliks = []
    rows = [dict(row) for row in rows]
    for row, ll in zip(rows, logliks):
        if np.isfinite(ll):
            row["loglik"] = float(ll)
    return rows


def saved_config(settings: dict):
    """The FitConfig of fit.json's "config" (FitConfig.from_dict), or for FGPR fits its settings as a SavedConfig."""
    from spatialfed.algorithm.config import FitConfig

    try:
        return FitConfig.from_dict(settings)
    except (TypeError, ValueError):
        return SavedConfig(settings)


class SavedConfig(dict):
    """The resolved FitConfig of a loaded fit, as saved: its settings as a dict and as attributes."""

    def as_dict(self) -> dict:
        return dict(self)

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def prediction_store(gp) -> str:
    """The store prediction reads (the estimator's own copy of in-memory data, else ``store_``); one line naming
    the path and the fix when it is gone."""
    temporary = _temporary(gp)
    path = Path(temporary.path if temporary is not None else gp.store_)
    if not path.exists():
        fix = (f"FederatedGP.load({gp.loaded_from_!r}, store='NEW_PATH')" if getattr(gp, "loaded_from_", None)
               else "FederatedGP.load(DIR, store='NEW_PATH') on what gp.save(DIR) wrote")
        raise StoreError(f"prediction needs the sites' data in the store {path} (each site kriges the residual part "
                         f"from its own partition), which is not there; put it back, or give its new place: {fix}")
    return str(path)
