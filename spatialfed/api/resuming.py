"""Continuing a fit from a checkpoint (docs/recovery.md): the estimator's ``resume`` and the checkpoint's meta."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

from spatialfed.api import covariance
from spatialfed.errors import DataError, option
from spatialfed.version import __version__

#: settings a resume may change (the rest come from the checkpoint: the model and the algorithm's state); `cluster`
#: whole: its size and timeout, and on_worker_error, so that a fit stopped by a failing site can continue without
#: it, recorded as dropped
RESUME_OVERRIDES = ("max_iter", "tol", "time_budget", "cluster", "progress", "checkpoint")


def resume(cls, checkpoint_path, store, overrides: dict):
    """``cls.resume``: a new estimator with the checkpoint's settings and `overrides`, fitted from the checkpoint."""
    from spatialfed.algorithm.checkpoint import CheckpointError, read_checkpoint
    from spatialfed.api.options import (FOLDED, MOVED, Checkpoint, absorb_moved, checkpoint_of, cluster_of, homes,
                                        recorded_cluster, spelled)

    snap = read_checkpoint(checkpoint_path)
    meta = snap.get("meta") or {}
    params = meta.get("params")
    if params is None:
        raise CheckpointError(f"{checkpoint_path} has no estimator settings in its meta; it was not written by "
                              "FederatedGP.fit(checkpoint=...)")
    moved = {k: overrides[k] for k in overrides if k in MOVED or k in FOLDED}
    if moved:  # earlier spellings (FutureWarning), onto the cluster, progress, checkpoint (or refused below)
        folded = absorb_moved({"cluster": overrides.get("cluster"), "emulation": None,
                               "progress": overrides.get("progress", True), "strategies": None, "privacy": None,
                               "residual": "auto", "checkpoint": overrides.get("checkpoint", str(checkpoint_path))},
                              moved)
        overrides = {**{k: v for k, v in overrides.items() if k not in moved},
                     **{k: folded[k] for k in homes(moved)}}
    bad = sorted(set(overrides) - set(RESUME_OVERRIDES))
    if bad:
        raise ValueError(f"resume cannot change {bad} (the checkpoint fixes them); allowed: "
                         f"{', '.join(RESUME_OVERRIDES)}")
    params = spelled(dict(params))  # a checkpoint of an earlier version holds the old flat names
    kept, recorded = recorded_cluster(params.pop("cluster", None))
    settings = {k: v for k, v in params.items() if k in cls._get_param_names()}
    settings["cluster"] = kept  # never where to connect, what to submit, or how securely
    recorded_every = getattr(checkpoint_of(params.get("checkpoint")), "every", None)
    settings["checkpoint"] = Checkpoint(str(checkpoint_path), recorded_every)  # where the checkpoint is now
    if isinstance(overrides.get("checkpoint"), (str, Path)):  # a path alone: as often as recorded
        overrides = {**overrides, "checkpoint": Checkpoint(str(overrides["checkpoint"]), recorded_every)}
    shown = {k: recorded[k] for k in ("address", "jobqueue") if k in recorded}
    if shown:
        if kept.runtime == "auto":  # it ran on Dask: so does its resume
            settings["cluster"] = dataclasses.replace(kept, runtime="dask")
        given = cluster_of(overrides.get("cluster"))
        if not (given.address or given.client is not None or given.jobqueue):
            warnings.warn(not_reconnecting(checkpoint_path, shown), UserWarning, stacklevel=3)
    settings.update(overrides)
    gp = cls(**settings)
    store = store if store is not None else meta["store"]
    from spatialfed.outputs.results import check_same_store

    check_same_store(meta.get("store_fingerprint"), store, recorded_store=meta.get("store"), what="the checkpoint",
                     cli_store="{} as STORE.zarr (or leave STORE.zarr out: the checkpoint's store is the default)")
    return gp.fit(store, resume=snap)


def not_reconnecting(checkpoint_path, shown: dict) -> str:
    """The line saying which cluster the checkpointed fit ran on and that this resume does not go there."""
    where = (f"the scheduler {shown['address']}" if "address" in shown
             else f"{shown['jobqueue'].get('kind', 'batch')} jobs" if isinstance(shown["jobqueue"], dict)
             else "batch jobs")
    again = option("cluster=ADDRESS or cluster=Cluster(jobqueue={...})", "--scheduler ADDRESS or --jobqueue KIND")
    return (f"{checkpoint_path} was written by a fit on {where}; a checkpoint restores the fit, never where to "
            f"connect or what to submit: this resume runs on an embedded Dask cluster (give {again} to continue "
            "on that cluster)")


def meta(gp, store_path) -> dict:
    """What a checkpoint needs besides the server's state to continue this fit (docs/recovery.md)."""
    from spatialfed.data.store import store_fingerprint

    from spatialfed.api.options import checkpoint_of, cluster_of, emulation_of

    params = {k: str(v) if isinstance(v, Path) else v for k, v in gp.get_params(deep=False).items()}
    params["cluster"] = cluster_of(gp.cluster).saved()  # plain values, never the live client
    params["emulation"] = emulation_of(gp.emulation).saved()
    params["checkpoint"] = None if gp.checkpoint is None else checkpoint_of(gp.checkpoint).saved()
    return {"store": str(Path(store_path).resolve()), "store_fingerprint": store_fingerprint(store_path),
            "params": params, "version": __version__}


def restored_server(gp, resume, n_workers: int):
    """The server continuing `resume` (a checkpoint path or snapshot dict), with this estimator's stopping
    rules (max_iter, tol, time_budget); None when not resuming."""
    if resume is None:
        return None

    from spatialfed.algorithm.checkpoint import read_checkpoint
    from spatialfed.algorithm.make_server import restore_server

    snap = resume if isinstance(resume, dict) else read_checkpoint(resume)
    if (snap.get("kind") == "fgpr") != (gp.method == "fgpr"):
        raise ValueError(f"the checkpoint is of a {'FGPR' if snap.get('kind') == 'fgpr' else 'block-wise'} fit; "
                         f"this estimator has method={gp.method!r}")
    server = restore_server(snap)  # FederatedServer, StatsServer or FgprServer, as the snapshot says
    if server.n_workers != n_workers:
        raise DataError(f"the checkpoint is of a fit with {server.n_workers} workers; the store has {n_workers}")
    if server.kernel != covariance.kernel(gp):
        raise ValueError(f"the checkpoint's fit used the covariance {server.kernel}; this estimator's is "
                         f"{covariance.kernel(gp)} (nu={gp.nu!r}, anisotropy={gp.anisotropy!r})")
    rules = {"max_iter": gp.max_iter, "tol": gp.tol, "time_budget": gp.time_budget}
    config = server.config
    stopping = getattr(config, "stopping", None)  # FitConfig's Stopping; FgprConfig holds its rules flat
    server.config = (dataclasses.replace(config, stopping=dataclasses.replace(stopping, **rules)) if stopping
                     else dataclasses.replace(config, **rules))
    server.wall_time_s = float((snap.get("meta") or {}).get("wall_time_s", 0.0))  # the fit's real seconds so far
    return server
