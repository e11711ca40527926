"""The estimator: ``FederatedGP`` fits the knot-based low-rank spatial GP of SPEC §1 across federated workers.

A scikit-learn estimator (``BaseEstimator``, ``RegressorMixin``): the constructor only stores settings
(``get_params``/``set_params``/``clone`` are scikit-learn's); ``fit`` validates them, runs the federated algorithm
(SPEC §2–4) on the chosen runtime and returns ``self``; learned state lives in attributes ending in ``_``; methods
that need them raise ``NotFittedError`` before ``fit``; ``save(out_dir)`` writes the result files of SPEC §6.

    >>> gp = FederatedGP(mode="async", knots=100, emulation=Emulation(profile="straggler")).fit("data.zarr")
    >>> gp.params_, gp.variogram_params_, gp.loglik_
    >>> gp.save("fit_out")
    >>> gp = FederatedGP(crs="EPSG:4326", cluster="simulated").fit(frame[["lon", "lat"]], frame["ozone"],
    ...                                                             groups=frame["state"])
    >>> mean, sd = gp.predict(new_points, return_std=True)

The partitioned store (SPEC §5) is the federated contract: in production each site holds its partition and ``fit``
gets the store's path. DataFrames, GeoDataFrames and arrays are a convenience for notebooks, tests and
cross-validation: they are written to a temporary store (``api.inputs``), kept while the estimator lives.
A script may fit at top level without ``if __name__ == "__main__":`` (``api.scripts``).

Runtimes (the class docstring's ``cluster``): ``None`` (automatic), ``"dask"`` (every partition stays on the Dask worker
that loaded it), ``"simulated"`` (a virtual clock in this process: for experiments, not for private data).
"""

from __future__ import annotations

import logging
import time
import uuid
from contextlib import closing
from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, RegressorMixin

# noqa F401 below: MODES, PRESETS, METHODS, RESIDUAL_CHOICES, RESIDUALS, RUNTIMES, PROFILES are the CLI's choices
from spatialfed.algorithm.config import MODES, PRESETS, preset_name  # noqa: F401
from spatialfed.algorithm.likelihood import U_NAMES
from spatialfed.api import (blocked_cv, covariance, inputs, loading, nu_profile, options, predicting, resuming, scripts,
                            settings, signals)
from spatialfed.api.predicting import NotFittedError  # noqa: F401 (re-exported)
from spatialfed.api.progress import Progress
from spatialfed.api.settings import METHODS  # noqa: F401
from spatialfed.api.units import variogram_params
from spatialfed.model.matern import Matern
from spatialfed.model.names import RESIDUAL_CHOICES, RESIDUALS  # noqa: F401
from spatialfed.runtime.factory import RUNTIMES, open_runtime  # noqa: F401
from spatialfed.runtime.heterogeneity import PROFILES  # noqa: F401
from spatialfed.runtime.interface import Runtime

log = logging.getLogger("spatialfed.api")


class FederatedGP(RegressorMixin, BaseEstimator):
    """Federated low-rank spatial GP (SPEC §1–4), fitted synchronously or asynchronously; a scikit-learn regressor.

    By default (``strategies`` None = the preset "stats", SPEC §2b, ``algorithm/stats_server.py``) each iteration is one round trip:
    every site sends the sufficient statistics of its data at the current (δ, σ², β) and the server takes an exact
    profile-likelihood Newton step (async: the same epochs at the slowest site's pace, while faster sites answer
    where models of every site's statistics lead, so that better steps are taken; docs/algorithm.md). The paper's block-wise Algorithms 1–3 are the presets "tuned", "paper", "basic" and "section5".

    Parameters
    ----------
    method : "lowrank" (the federated low-rank model), "independent" (the independence model of Eq. 3, fitted by
        the same algorithm with no knots; its loglik is ℓ_ind) or "fgpr" (the same model fitted by FGPR: FedAvg over
        clients running E local SGD/Adam steps on mini-batch exact GP likelihoods, algorithm/fgpr.py, docs/fgpr.md;
        its loglik is ℓ_ind). FGPR rounds are synchronous: `mode`, a preset and agg_threshold do not apply
        to it and fit.json records mode "sync".
    mode : "sync" | "async".
    residual : "auto" (default: each site uses the dense `full` residual up to 1,000 points and its Vecchia
        approximation above; `full` with the block scheme's presets and for method="independent"/"fgpr") | "full" |
        "vecchia" (the full residual's Vecchia approximation, SPEC §2c: sites of any size; preset "stats" only) |
        "mpp" | "pp" (Remark 3); "vecchia:K" and "auto:K" set the Vecchia residual's K neighbours per point (default
        15, model/vecchia_order.py VECCHIA_K; fit.json "vecchia_k"). The structure used is ``residual_`` (fit.json
        "residual": a plain name).
    knots : int m (a jittered grid of m knots over the domain; the paper's layout on [0,1]²) or an (m, 2) array.
    nu : Matérn smoothness ν: a number (fixed; default 0.5) or "estimate" (log ν fitted with the other parameters
        in 0.2–4; ν̂, the standard error of log ν from the observed information and a 95 % Wald interval in
        ``variogram_params_``; api/covariance.py, docs/equations.md "Covariance options"). Compare candidate models
        by held-out prediction too (``predictive_scores``): the likelihood can prefer a smoothness that predicts worse.
    anisotropy : False, or True for geometric anisotropy: the major range β along an angle φ from north and the
        minor range β/r across it (``variogram_params_``: range_major, range_minor, anisotropy_ratio, angle_deg);
        predictions and maps krige with it. With ``nu="estimate"`` or ``anisotropy`` the statistics scheme fits
        u = (log δ, log σ², log β [, log ν] [, log r, φ]) (method "lowrank", the preset "stats", no privacy).
    distance : None (chordal for a lowrank fit on a store with a CRS whose domain spans over 1,000 km, else
        planar), "planar" (distances in the store's CRS) or "chordal" (on the sphere: ‖R p(s) − R p(s')‖, p the
        unit vector of the point's lon/lat, valid for the Matérn at every ν; the knots laid out in the store's
        coordinates; ``variogram_params_`` adds range_km and range_arc_deg; api/covariance.py, Eq. 26).
    max_iter, tol : stopping rules (relative parameter change below tol for 3 iterations).
    seed : seed of the knot jitter (and of the emulated delays).
    strategies : how an iteration reaches the sites: a preset name, or a dict of settings with the preset under
        "preset". None (the default) = "stats": one round trip of sufficient statistics per iteration (SPEC §2b),
        exact profile-likelihood Newton steps in sync mode, stale sites as second-order models in async mode; with
        privacy noise the default is "tuned". "tuned" (``FitConfig.tuned()``): the block scheme of Algorithms 1–3
        with gradient correction, uniform weights and a staleness-scaled step; "paper" (Remark 8's, to reproduce the
        paper), "basic", "section5" (docs/algorithm.md). Further settings of the scheme are FitConfig's
        (``FitConfig.of``: e.g. {"preset": "tuned", "correction": False, "hessian": "block"} for the block presets,
        {"settle_tol": 0.02} for "stats"), or for
        method="fgpr" FgprConfig's: ``local_steps`` (E, default 5), ``batch_size`` (M, 64), ``optimizer`` ("adam" |
        "sgd"), ``lr``, ``batching`` ("uniform" | "nearest"), ``participation`` (K_c clients per round), ``floor``,
        ``patience``. A setting of the other scheme is refused in one line. ``{"agg_threshold": A}``: aggregate once A
        new answers arrived, 1..J (async; default 1 for the default preset "stats", where every answer is a whole
        site's statistics; ceil(0.2·J) for the block presets); sync always uses J.
    time_budget : stop after this many seconds (of the runtime's clock).
    start : optional starting values {"gamma", "delta", "sigma2", "beta"} overriding the data-driven φ₀ (with large
        sites the pilot start still refines it unless it is already as near as the pilot can tell: docs/algorithm.md).
    domain : a ``spatialfed.data.geometry.Domain`` or a vector file (GeoPackage, GeoJSON, shapefile) for the knots,
        reprojected to the store's CRS if needed; default [0,1]² for simulated stores, else the
        union of the workers' bounding boxes (each worker reports only its 4 bbox numbers).
    crs : CRS of in-memory coordinates without one (arrays, DataFrame columns), e.g. "EPSG:4326" for lon/lat (then
        projected to metres as by ``spatialfed ingest``) or "planar"; a GeoDataFrame's own CRS takes precedence.
        Also the CRS of prediction locations given without one. Not used for a store path (the store records its CRS).
    covariates : the columns of a DataFrame X that are covariates, e.g. ``["elevation"]`` (an intercept is always
        added; ``[]`` = intercept only), as ``spatialfed ingest --covariates``. None (default): every other numeric
        column, listed in a warning and the summary, with identifiers (named id/record/index/fid..., all-distinct
        integers, a 0..n−1 or 1..n sequence) and near-copies of y (|corr| > 0.999) refused (``api.covariates``).
        Not for a store path (its covariates were fixed at ingest) or an array X (every column is one).
    transform : None or "log": fit log y (a positive, skewed variable) and predict on y's own scale, the lognormal
        mean, sd and quantiles (``model.transform``); a store path carries its own (``spatialfed ingest --transform``).
    privacy : None; a Gaussian mechanism on everything the workers send (docs/privacy.md):
        ``spatialfed.algorithm.privacy.GaussianMechanism`` or a dict of its settings ``{"noise_multiplier": z,
        "clip": c or {key: c_k}, "delta": 1e-5, "seed": None}`` (the loss is in ``privacy_report_`` and fit.json; not
        with method="fgpr"); or "secure_aggregation" (sync statistics fits, ≥ 3 sites): the server decodes only the
        sum of the sites' statistics, never one site's (docs/secure-aggregation.md).
    checkpoint : a checkpoint file (docs/recovery.md) written atomically during a Dask fit, as
        ``spatialfed.Checkpoint(path, every=K)``: every K aggregations (a path alone: every 10, further apart when a
        write costs over 5 % of the wall time), when the fit is interrupted (KeyboardInterrupt, SIGTERM, a failed
        task or lost cluster), and once at the end. ``FederatedGP.resume(path)`` continues.
    progress : True (progress on stderr: iteration, parameters, max staleness), False (quiet) or "live" (also a live
        Bokeh page of parameters, log-likelihood, arrivals and staleness on 127.0.0.1 during a Dask fit; its address
        is printed). Every fit keeps the same plots; ``save`` writes them as ``report.html``.
    cluster : where the fit runs (``spatialfed.Cluster``, api/options.py): None (the default: in this process for
        small jobs, N·m ≤ runtime.factory.AUTO_THRESHOLD, with no Dask option given, else an embedded Dask
        LocalCluster: ``runtime.factory.choose_runtime``), "simulated" (in this process, on a virtual clock), "dask"
        (an embedded LocalCluster whatever the size), a scheduler address ("tcp://host:8786", "tls://..."), a
        ``distributed.Client`` (not closed by the estimator), a ``spatialfed.runtime`` Runtime object, or
        ``Cluster(address=, client=, n_workers=, jobqueue={"kind": "slurm", ...}, tls=True | DIR, insecure=,
        timeout=, on_worker_error="stop" | "drop", runtime=)``.
    emulation : what an experiment emulates (``spatialfed.Emulation``): ``Emulation(profile="balanced" | "straggler"
        | "graded" | "graded:<min cores>", slowdown=(s_1, ..., s_J), delays="exponential:0.5",
        activations="poisson:RATE", n_sites=J)`` (docs/delays.md; ``n_sites``: the automatic area partition of
        in-memory data without ``groups``); a profile name alone is ``Emulation(profile=name)``.
    Parameters of earlier versions (runtime, preset; scheduler, client, n_dask_workers, jobqueue, tls, insecure, scheduler_timeout,
    on_worker_error; profile, slowdown, delays, activations, n_sites; live, fgpr, secure_aggregation; vecchia_k,
    checkpoint_every, agg_threshold) are accepted for one release with a FutureWarning naming the new spelling.
    Further asynchronous options go in ``strategies`` (BlockScheme fields): ``staleness_bound`` (VAFL's D),
    ``dominance`` (AsyncManifold's arrival-frequency correction), ``alpha_rule``; docs/algorithm.md. The preset
    "section5" is the basic algorithm analysed in the paper's Section 5 (no strategy, α_t = (τ̄+1)⁻¹(τ+1)⁻¹).

    Attributes (after ``fit``)
    --------------------------
    params_ ({"gamma", "delta", "sigma2", "beta"}), variogram_params_ (nugget 1/δ, partial sill σ², sill, range β
    and practical range in the CRS's units, ``api.units``), store_crs_ (the CRS the model's coordinates are in), loglik_ (ℓ_LR at params_, or ℓ_ind for "independent"),
    mu_, Sigma_ (the knot posterior at params_), knots_, trace_ (one row per aggregation; ``time_s`` is wall
    seconds since the fit started on Dask, virtual seconds on the simulated runtime), converged_, stop_reason_,
    n_iter_, wall_time_s_ (real seconds of the whole federated fit, the part before a resume included; cluster
    start-up and shutdown excluded), n_obs_,
    n_workers_, covariate_names_ (['intercept', ...]), covariates_inferred_ (True when ``covariates`` was None and X
    had other columns), slowdowns_, config_ (the resolved FitConfig), privacy_report_ (μ-GDP and (ε, δ) of the fit, or None),
    discarded_stale_ (quantities discarded for staleness > D), dashboard_link_, assignment_ (Dask worker of each
    federated worker), scheduler_address_ (``tls://...`` when ``tls`` is set), checkpoint_writes_ and
    checkpoint_seconds_ (number and total wall seconds of checkpoint writes), resumed_from_, result_, boundary_
    ({"delta" | "sigma2" | "beta": "lower" | "upper"} for a parameter the fit left on a bound of its box, e.g.
    {"delta": "upper"}: nugget ≈ 0; ``api.units.on_bound`` says it in words; fit.json "boundary"), loaded_from_
    (after ``FederatedGP.load``: the directory read; only what save wrote is restored, e.g. no arrivals in monitor_),
    site_blocked_cv_ (each site predicted from the others at params_: ``api.blocked_cv``; None where it does not apply).
    """

    def __init__(self, method="lowrank", mode="async", residual="auto", knots=100, nu=0.5, max_iter=50, tol=1e-5,
                 seed=0, *, anisotropy=False, distance=None, strategies=None, time_budget=None,
                 start=None, domain=None, crs=None, covariates=None, transform=None, privacy=None, checkpoint=None,
                 progress=True, cluster=None, emulation=None, **moved):
        given = options.absorb_moved({"cluster": cluster, "emulation": emulation, "progress": progress,
                                      "strategies": strategies, "privacy": privacy, "residual": residual,
                                      "checkpoint": checkpoint}, moved)
        self.method = method
        self.mode = mode
        self.residual = given["residual"]
        self.knots = knots
        self.nu = nu
        self.anisotropy = anisotropy
        self.distance = distance
        self.max_iter = max_iter
        self.tol = tol
        self.seed = seed
        self.strategies = given["strategies"]
        self.time_budget = time_budget
        self.start = start
        self.domain = domain
        self.crs = crs
        self.covariates = covariates
        self.transform = transform
        self.privacy = given["privacy"]
        self.checkpoint = given["checkpoint"]
        self.progress = given["progress"]
        self.cluster = given["cluster"]
        self.emulation = given["emulation"]

    # --- scikit-learn conventions (get_params, set_params, repr: BaseEstimator's) -----------------------------
    def __sklearn_clone__(self) -> "FederatedGP":
        """An unfitted copy with the same settings; the ``cluster`` is shared, not copied (a client is a live connection)."""
        from sklearn.base import clone

        params = self.get_params(deep=False)
        cluster = params.pop("cluster")
        return type(self)(**{k: clone(v, safe=False) for k, v in params.items()}, cluster=cluster)

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "params_")

    def __setstate__(self, state) -> None:
        """Unpickling (joblib, pickle): a fit on in-memory data predicts from its own copy of the data."""
        super().__setstate__(state)
        inputs.follow_temporary_store(self)

    # --- validation ----------------------------------------------------------------------------------------
    def _check_settings(self) -> None:
        settings.check_settings(self)

    def _config(self, n_workers: int):
        """The resolved FitConfig (or FgprConfig) for J workers (api.settings.config)."""
        return settings.config(self, n_workers)

    @property
    def vecchia_k_(self) -> int:
        """k of the Vecchia residual (K of residual="vecchia:K" / "auto:K", else the default; api.settings)."""
        return settings.vecchia_k(self)

    def _slowdowns(self, n_workers: int) -> np.ndarray:
        return settings.slowdowns(self, n_workers)

    @property
    def _cluster(self) -> options.Cluster:
        return options.cluster_of(self.cluster)

    @property
    def _emulation(self) -> options.Emulation:
        return options.emulation_of(self.emulation)

    # --- fitting -------------------------------------------------------------------------------------------
    @classmethod
    def resume(cls, checkpoint_path, store=None, **overrides) -> "FederatedGP":
        """Continue the fit saved in `checkpoint_path`; returns the fitted estimator.

        Model and algorithm settings come from the checkpoint's meta (written by ``fit(checkpoint=...)``); `store`
        replaces the recorded store path (e.g. moved); `overrides` may change only the stopping rules and the cluster
        settings (``max_iter``, ``tol``, ``time_budget``, ``cluster``, ``checkpoint`` (a path or a Checkpoint; a
        path alone keeps the recorded ``every``), ``progress``; the checkpoint never says where to connect). By
        default it keeps checkpointing to `checkpoint_path`, as often as recorded."""
        from spatialfed.api.resuming import resume

        return resume(cls, checkpoint_path, store, overrides)

    @classmethod
    def load(cls, fit_dir, store=None) -> "FederatedGP":
        """The fitted estimator `save(fit_dir)` (or ``spatialfed fit --out``) wrote, with its settings; `store`: the
        fitted store's new path if it moved (a fit on in-memory data predicts from the copy in fit_dir)."""
        from spatialfed.api.loading import load

        return load(cls, fit_dir, store)

    def fit(self, X, y=None, *, coords=None, groups=None, resume=None) -> "FederatedGP":
        """Fit the model (SPEC §1–4); returns self.

        X : the path of a partitioned Zarr store (SPEC §5: the federated contract; y, coords, groups not given), or
            in-memory data (written to a temporary store, ``api.inputs``): a DataFrame or GeoDataFrame (coordinates
            from ``coords=``, the geometry, or x/y, lon/lat columns in any case; the covariates named by
            ``covariates``, else every other column, announced), or an (n, p) array of covariates (or None) with
            ``coords`` (n, 2).
        y : the observed values (n,), or the name of a column of X.
        coords : an (n, 2) array of x/y (in ``crs``), or a pair of column names of X.
        groups : the sites (partition) of in-memory data: site labels (n,) or the name of a column of X, e.g.
            "agency"; None partitions into ``n_sites`` compact areas for you.
        resume : a checkpoint path or snapshot dict to continue from (its knots and algorithm state are kept; see
            ``FederatedGP.resume``, which also restores the settings)."""
        scripts.check_not_bootstrapping()
        self._check_settings()
        self.__dict__.pop("loaded_from_", None)  # a loaded estimator fitted again is a new fit
        old = self.__dict__.pop("_temporary_store", None)
        if old is not None:
            old.cleanup()      # the previous in-memory fit's store
        store, self._temporary_store, self.covariates_inferred_ = inputs.fit_store(
            X, y, coords=coords, groups=groups, crs=self.crs, n_sites=self._emulation.n_sites, seed=self.seed,
            covariates=self.covariates, transform=self.transform)
        self.groups_column_ = groups if isinstance(groups, str) else None
        return self._fit_store(store, resume)

    def _fit_store(self, store, resume) -> "FederatedGP":
        """fit() on a store path."""
        from spatialfed.data.partition import check_site_sizes, store_minimum
        from spatialfed.data.store import open_store
        from spatialfed.outputs.monitor import FitMonitor
        from spatialfed.runtime import site
        from spatialfed.runtime.driver import Checkpointer, drive

        signals.stop_as_interrupt()  # SIGTERM, SIGHUP stop the fit as Ctrl-C does: checkpoint kept, temp store removed
        tic = time.perf_counter()
        info = open_store(store)  # validates the layout, metadata only: missing or empty worker groups raise here
        check_site_sizes(info.sizes, info.worker_labels, store_minimum(info.attrs))  # also stores not from ingest
        self.transform_ = settings.store_transform(self, info)
        self.runtime_used_, self.runtime_reason_ = self._choose_runtime(info)
        server = resuming.restored_server(self, resume, info.n_workers)
        resumed = None if server is None else {"t": int(server.t), "time_s": float(server.time_s)}
        say = Progress(self.progress)
        monitor = FitMonitor(info.n_workers, live=self.progress == "live" and self.runtime_used_ == "dask")
        asked = options.checkpoint_of(self.checkpoint)  # None: no checkpoint file (a lost cluster's rescue only)
        ckpt = Checkpointer(asked and asked.path, asked and asked.every, resuming.meta(self, info.path),
                            wall_s=getattr(server, "wall_time_s", 0.0))
        c = self._cluster
        cluster = scripts.embedded_cluster(self.runtime_used_, client=c.client, scheduler=c.address,
                                           jobqueue=c.jobqueue)
        say.starting(("an embedded Dask LocalCluster" if cluster else f"the {self.runtime_used_} runtime")
                     + (f" ({self.runtime_reason_})" if self.runtime_reason_ else ""))
        with say, scripts.spawn_safe(cluster), self._open_runtime(info.n_workers) as runtime, closing(monitor):
            knots, domain = self._knots(info, runtime, server)
            space, knots, server_knots = covariance.geometry(self, info, domain, knots)  # chordal: data/space.py
            server = server or self._server(info.n_workers, server_knots, self._config(info.n_workers))
            self.residual_ = settings.site_residual(self, server.config, info.sizes)
            say.started(self, runtime, server, monitor.url)
            specs = site.site_specs(uuid.uuid4().hex[:12], info.path, info.n_workers, knots, covariance.kernel(self),
                                    self.residual_, self.vecchia_k_, space)
            run_tic = time.perf_counter()
            drive(server, runtime, specs, on_event=lambda srv, now: (say.event(srv, now), monitor.on_event(srv, now)),
                  on_result=lambda j, p, q: (say.result(j, p), monitor.on_result(j, p, q)),
                  on_worker_error=c.on_worker_error, checkpointer=ckpt,
                  **settings.delay_models(self, info.n_workers))
            self._fitted(info, server, runtime, knots, domain, ckpt.wall_s + time.perf_counter() - run_tic)
            self.variogram_params_.update(covariance.distance_params(space, self.params_["beta"]))
            self.site_blocked_cv_ = blocked_cv.for_fit(self, server, runtime, specs)  # after the fit's wall time
            self.variogram_params_.update(nu_profile.for_fit(self, server, runtime, specs))  # ν's profile interval
        self.monitor_, self.resumed_from_ = monitor, resumed
        self.checkpoint_writes_, self.checkpoint_seconds_ = ckpt.writes, ckpt.seconds
        self.total_time_s_ = time.perf_counter() - tic
        say.summary(self)
        return self

    def _fitted(self, info, server, runtime, knots, domain, fit_seconds: float) -> None:
        """Set the learned attributes (ending in ``_``) from the finished server and runtime."""
        phi = server.params
        described = runtime.describe()
        self.dashboard_link_ = getattr(runtime, "dashboard_link", None)
        self.scheduler_address_ = _scheduler_address(getattr(runtime, "client", None))
        self.assignment_ = described.get("assignment")
        self.n_tasks_ = described.get("n_tasks")
        self.store_ = str(info.path)
        self.store_fingerprint_ = getattr(info, "fingerprint", None)
        self.store_crs_ = info.crs
        self.n_workers_ = info.n_workers
        self.n_obs_ = int(server.n_obs)
        self.covariate_names_ = list(info.covariate_names)
        self.config_ = server.config
        self.slowdowns_ = self._slowdowns(info.n_workers)
        self.knots_ = np.asarray(knots, dtype=float)
        self.domain_ = domain
        self.params_ = {"gamma": np.asarray(phi.gamma, dtype=float).copy(), "delta": float(phi.delta),
                        "sigma2": float(phi.sigma2), "beta": float(phi.beta)}
        fitted = covariance.fitted(server)  # ν̂ and the anisotropy of an estimated family (api/covariance.py)
        self.params_.update({k: fitted[k] for k in covariance.PARAM_KEYS if k in fitted})
        self.variogram_params_ = {**variogram_params(self.params_, fitted.get("nu", self.nu), info.crs), **fitted}
        self.boundary_ = _on_bound(server)
        self.mu_ = np.asarray(phi.mu, dtype=float).copy()
        self.Sigma_ = np.asarray(phi.Sigma, dtype=float).copy()
        self.loglik_ = None if server.loglik is None else float(server.loglik)
        self.trace_ = [dict(row) for row in server.trace]
        self.converged_ = bool(server.converged)
        self.stop_reason_ = server.stop_reason
        self.dropped_workers_ = [dict(d) for d in server.dropped]
        self.privacy_report_ = getattr(server, "privacy_report", None)  # FgprServer has no privacy option
        self.discarded_stale_ = int(getattr(server, "discarded", 0))
        self.n_iter_ = int(server.iterations)
        self.wall_time_s_ = float(fit_seconds)  # the federated fit, before a resume too (cluster start-up excluded)

    def _choose_runtime(self, info) -> tuple[str, str]:
        """(runtime, why) of a fit on the store `info` (runtime.factory.choose_runtime: "auto" is in-process for
        small jobs without Dask options)."""
        from spatialfed.runtime.factory import choose_runtime, knot_count

        asked = self._cluster.given + self._emulation.given + (["live"] if self.progress == "live" else [])
        m = 0 if self.method in ("independent", "fgpr") else knot_count(self.knots)
        return choose_runtime(self._cluster.runtime, n_obs=sum(info.sizes), n_knots=m, dask_options=asked)

    def _open_runtime(self, n_sites: int):
        """The runtime of this fit as a context manager (runtime.factory.open_runtime; a Runtime object as given)."""
        c = self._cluster
        given = c.runtime if isinstance(c.runtime, Runtime) else getattr(self, "runtime_used_", c.runtime)
        return open_runtime(given, slowdowns=self._slowdowns(n_sites), client=c.client, scheduler=c.address,
                            jobqueue=c.jobqueue, n_dask_workers=c.n_workers, n_sites=n_sites,
                            security=self._security(), timeout=c.timeout, insecure=c.insecure)

    def _security(self):
        """The Security object for `tls` (None: plain TCP; api.settings.security)."""
        return settings.security(self)

    def _knots(self, info, runtime, restored=None):
        """(knots, domain) of this fit (api.knots.layout); a resumed fit keeps the checkpoint's knots."""
        from spatialfed.api.knots import given_domain, layout

        if restored is not None:  # never re-lay the knots out: mu, Sigma and the stored quantities are in that basis
            return np.asarray(restored.knots, dtype=float), given_domain(self.domain, info)
        m = None if self.method in ("independent", "fgpr") else self.knots  # no knots + full residual: Eq. (3)
        return layout(m, self.domain, info, runtime, seed=self.seed)

    def _server(self, n_workers: int, knots, config):
        """A fresh server: FgprServer for method="fgpr", else the server of the config's scheme (servers.server_for)."""
        if self.method == "fgpr":
            from spatialfed.algorithm.fgpr import FgprServer

            return FgprServer(n_workers, Matern(self.nu), config, self.start)
        from spatialfed.algorithm.make_server import server_for

        return server_for(n_workers, knots, covariance.kernel(self), config, self.start)

    # --- results -------------------------------------------------------------------------------------------
    def _check_fitted(self, what: str = "this method") -> None:
        predicting.check_fitted(self, what)

    def predict(self, X, return_std: bool = False, *, coords=None):
        """Predicted mean at new locations (and, with ``return_std``, the sd of a new observation there:
        √(Var[y(s₀) | z] + 1/δ), the ``sd`` column of ``spatialfed predict``). X as in ``fit``: a DataFrame or
        GeoDataFrame of points with the fitted covariates as columns (a GeoDataFrame in another CRS is
        reprojected to the store's), or an (n₀, p) array of covariates (or None) with ``coords`` (n₀, 2)."""
        self._check_fitted("predict")
        pred = predicting.predict(self, *predicting.targets(self, X, coords))
        return (pred["mean"], pred["sd"]) if return_std else pred["mean"]

    def score(self, X, y, sample_weight=None, *, coords=None) -> float:
        """R² of ``predict(X)`` against y (scikit-learn's regressor score, what ``cross_val_score`` uses by
        default; higher is better). For probabilistic scores (RMSE, CRPS, coverage, mean log predictive
        density) use ``predictive_scores``. Array X needs ``coords``; in ``cross_val_score`` use a DataFrame."""
        from sklearn.metrics import r2_score

        return float(r2_score(y, self.predict(X, coords=coords), sample_weight=sample_weight))

    def predictive_scores(self, X, y, *, coords=None) -> dict:
        """{"n", "rmse", "mae", "crps", "coverage95", "mlpd"} of the predictive distribution at X against y (values
        or the name of a column of X; ``outputs.metrics``; mlpd = mean log predictive density, higher is better)."""
        return predicting.scores_at(self, X, y, coords)

    @property
    def result_(self):
        """The fit as a ``spatialfed.outputs.results.FitResult`` (what ``save`` writes)."""
        from spatialfed.outputs.results import FitResult

        self._check_fitted("result_")
        cfg = self.config_
        return FitResult(
            method=self.method, mode="sync" if self.method == "fgpr" else self.mode,
            residual=getattr(self, "residual_", self.residual),
            nu=float(self.variogram_params_["nu"]),
            n_workers=self.n_workers_, n_obs=self.n_obs_, params=self.params_, loglik=self.loglik_,
            knots=self.knots_, iterations=self.n_iter_, wall_time_s=self.wall_time_s_, converged=self.converged_,
            trace=self.trace_, mu=self.mu_, Sigma=self.Sigma_, dropped_workers=self.dropped_workers_,
            extra={"store": self.store_, "runtime": self.runtime_used_, "runtime_reason": self.runtime_reason_,
                   "profile": self._emulation.profile,
                   "slowdowns": np.asarray(self.slowdowns_).tolist(), "seed": self.seed,
                   "stop_reason": self.stop_reason_, "covariate_names": self.covariate_names_,
                   "config": cfg.as_dict(), "discarded_stale": self.discarded_stale_,
                   "variogram_params": dict(self.variogram_params_), "boundary": dict(self.boundary_),
                   "vecchia_k": self.vecchia_k_, "site_blocked_cv": getattr(self, "site_blocked_cv_", None),
                   **loading.saved_settings(self)},
            privacy=self.privacy_report_, store_fingerprint=getattr(self, "store_fingerprint_", None),
        )

    def save(self, out_dir, overwrite: bool = False) -> Path:
        """Write fit.json, model.zarr, trace.csv (SPEC §6), report.html (a written summary above the monitor's
        plots) and, for a fit on in-memory data, data.zarr (its copy, for ``load``) as one atomic set; returns the
        dir. An existing `out_dir` holding anything but this fit's own checkpoint is refused unless
        `overwrite=True`, which replaces the result files (other files stay)."""
        from spatialfed.atomic import refuse_existing
        from spatialfed.outputs.report import data_name
        from spatialfed.outputs.results import write_results

        own = None if self.checkpoint is None else Path(options.checkpoint_of(self.checkpoint).path)
        if Path(out_dir).is_dir():  # a file in the way is write_results' error
            refuse_existing(out_dir, overwrite,
                            keep=(own.name,) if own and own.resolve().parent == Path(out_dir).resolve() else ())
        result = self.result_
        report = lambda path: self.monitor_.write_report(  # noqa: E731
            path, title=f"spatialfed fit report: {data_name(result.extra)}", result=result,
            preset=preset_name(options.scheme_of(self.strategies)[0], settings.noise(self)))
        return write_results(out_dir, result, extras={"report.html": report, **loading.saved_data(self)})


def _on_bound(server) -> dict:
    """{u name: "lower" | "upper"} of the parameters the statistics server left on a bound of its box (empty for
    the other schemes, which have no box)."""
    bounds, names = getattr(server, "bounds", None), getattr(server, "boundary", ())
    if bounds is None or not names:
        return {}
    u = server.params.u
    return {name: "lower" if u[i] <= bounds[0][i] + 1e-9 else "upper"
            for i, name in enumerate(getattr(server, "u_names", U_NAMES)) if name in names}


def _scheduler_address(client) -> str | None:
    try:
        return str(client.scheduler.address)
    except AttributeError:  # pragma: no cover - a client-like object without a scheduler
        return None

