"""What the `spatialfed` commands share: argument types, option groups (Dask scheduler, TLS, batch system, runtime,
progress, seed, the fit directory of predict/map) and the helpers that turn them into library keyword arguments.

Options whose default is None were not given on the command line; `given` keeps only the others, so the library's
own defaults apply and an explicit value always wins (e.g. over a checkpoint's settings on `fit --resume`).
"""

from __future__ import annotations

import argparse


# --- argument types ------------------------------------------------------------------------------------------------

def number_list(kind: type, example: str):
    """An argparse type parsing comma-separated values of `kind` (e.g. '100,200'), at least one."""

    def parse(text: str) -> list:
        try:
            values = [kind(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated numbers such as {example}, "
                                             f"got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one number, such as {example}")
        return values

    parse.__name__ = f"{kind.__name__}_list"
    return parse


int_list = number_list(int, "100,200")
float_list = number_list(float, "1,1,4")


def profile_name(text: str) -> str:
    """A heterogeneity profile for argparse: balanced, straggler, graded or graded:<min cores> (e.g. graded:12)."""
    from spatialfed.runtime.heterogeneity import profile_slowdowns

    try:
        profile_slowdowns(text, 1)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def name_list(text: str) -> list[str]:
    """Parse 'a,b' into ['a', 'b'] for argparse."""
    return [v.strip() for v in text.split(",") if v.strip()]


# --- validation ------------------------------------------------------------------------------------------------------

def given(args, names, rename: dict | None = None) -> dict:
    """{keyword: value} of the options in `names` that were given (value not None); `rename` maps an option's dest to
    the library's keyword where they differ (e.g. dask_workers → n_dask_workers)."""
    rename = rename or {}
    return {rename.get(name, name): getattr(args, name) for name in names if getattr(args, name) is not None}


def flag(name: str) -> str:
    """The command-line spelling of an argparse dest: 'max_iter' → '--max-iter'."""
    return "--" + name.replace("_", "-")


def exclusive(args, *names) -> None:
    """Refuse more than one of the options `names` given together (one line naming them)."""
    both = [flag(name) for name in names if getattr(args, name)]
    if len(both) > 1:
        raise ValueError(f"give either {' or '.join(both)}, not both")


# --- shared option groups --------------------------------------------------------------------------------------------

def add_dask(p, runtimes: tuple, runtime_help: str) -> None:
    """--runtime (with this command's choices; default: the library's, auto), --scheduler and --dask-workers."""
    p.add_argument("--runtime", choices=runtimes, default=None, help=runtime_help)
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="address of a running Dask scheduler (tcp://host:8786); default: an embedded LocalCluster")
    p.add_argument("--dask-workers", type=int, default=None, metavar="N",
                   help="worker processes of the embedded LocalCluster (default: min(J, number of cores)); "
                        "use J to give every federated worker its own process")
    p.add_argument("--insecure", action="store_true", default=None,
                   help="allow a plain-TCP --scheduler (or --scheduler-host) off this machine, refused by default: "
                        "any worker that joins it can run code in this process (docs/hpc.md)")


def dask_settings(args) -> dict:
    """runtime, scheduler, n_dask_workers and insecure as given (add_dask)."""
    return given(args, ("runtime", "scheduler", "dask_workers", "insecure"), {"dask_workers": "n_dask_workers"})


def add_tls(p) -> None:
    """--tls and --tls-dir (encrypted, authenticated Dask connections)."""
    sec = p.add_argument_group("encryption (TLS)")
    sec.add_argument("--tls", action="store_true",
                     help="encrypt and authenticate every Dask connection (client, scheduler, workers) with TLS; "
                          "without --tls-dir a temporary self-signed certificate is made in memory")
    sec.add_argument("--tls-dir", default=None, metavar="DIR",
                     help="directory with ca.pem, cert.pem, key.pem (implies --tls; needed for --scheduler "
                          "tls://HOST:PORT started with those files)")


def tls_setting(args):
    """The estimator's tls=: the certificate directory, True for --tls alone, None when neither is given."""
    return args.tls_dir if args.tls_dir else (True if args.tls else None)


JOBQUEUE_OPTIONS = ("jobs", "cores", "memory", "walltime", "queue", "account")


def add_jobqueue(p) -> None:
    """--jobqueue KIND and the job settings (dask-jobqueue)."""
    jq = p.add_argument_group("batch system (dask-jobqueue)")
    jq.add_argument("--jobqueue", choices=["slurm", "pbs", "sge"], default=None,
                    help="start Dask workers as batch jobs instead of an embedded cluster")
    jq.add_argument("--jobqueue-config", default=None, metavar="FILE.yaml",
                    help="job settings from a YAML file (flat keys or a section per system, as for cluster-script); "
                         "options given here override it")
    jq.add_argument("--jobs", type=int, default=None, help="batch jobs (one Dask worker each; default 1)")
    jq.add_argument("--cores", type=int, default=None, help="cores per job (default 1)")
    jq.add_argument("--memory", default=None, help="memory per job (default 4GB)")
    jq.add_argument("--walltime", default=None, help="walltime per job (default 01:00:00)")
    jq.add_argument("--queue", default=None, help="queue / partition")
    jq.add_argument("--account", default=None, help="account / project to charge")
    jq.add_argument("--queue-wait", type=float, default=None, metavar="SECONDS",
                    help="how long to wait for the queue to start a job: the first one, and a replacement once every "
                         "worker has left (default 600)")
    jq.add_argument("--scheduler-host", default="127.0.0.1",
                    help="address the jobqueue scheduler binds to (default 127.0.0.1; use one the compute nodes "
                         "can reach on a real cluster)")


def jobqueue_settings(args) -> dict | None:
    """The estimator's jobqueue= from --jobqueue and its options (YAML file values, overridden by given options)."""
    if not args.jobqueue:
        return None
    from spatialfed.runtime.jobscript import resolve_options
    from spatialfed.runtime.walltime import QUEUE_WAIT_S

    options = resolve_options(args.jobqueue, config=args.jobqueue_config,
                              **{name: getattr(args, name) for name in JOBQUEUE_OPTIONS})
    wait = QUEUE_WAIT_S if args.queue_wait is None else args.queue_wait
    if not wait > 0:  # also nan
        raise ValueError(f"--queue-wait must be a positive number of seconds, got {args.queue_wait:g}")
    return {"kind": args.jobqueue, **options, "host": args.scheduler_host, "wait_for_workers": wait,
            "queue_wait": wait}


def add_quiet(p) -> None:
    """--quiet: no progress display on stderr."""
    p.add_argument("--quiet", action="store_true", help="no progress display on stderr")


# --- predict and map -------------------------------------------------------------------------------------------------

def add_fitted(p, runtimes: tuple, predictors: tuple) -> None:
    """What predict and map share: the fit directory, the store, the predictor, the domain and where it runs."""
    p.add_argument("fit_dir", metavar="DIR", help="output directory of `spatialfed fit` (fit.json, model.zarr)")
    p.add_argument("--store", required=True, metavar="STORE.zarr", help="the partitioned store the model was fitted on")
    p.add_argument("--predictor", choices=predictors, default=None,
                   help="seamless (federated low-rank kriging, the sites' residuals tied at their boundaries and "
                        "blended over the sites near each point: no jumps at the boundaries between sites; default "
                        "for lowrank fits), lowrank (the "
                        "same, the residual from the site holding the nearest observation alone: the owner "
                        "predictor), independent (each point kriged by its owner alone), personal (one worker's "
                        "data, see --worker) or ols (pooled least squares)")
    p.add_argument("--worker", type=int, default=None, metavar="J", help="the worker for --predictor personal")
    p.add_argument("--domain", default=None, metavar="hull|bbox|FILE",
                   help="hull (default: the convex hull of the sites' hulls, each grown by its sampling spacing, so "
                        "the study area has no holes where sites meet), bbox (its bounding box) or a polygon file "
                        "(GeoPackage, shapefile, GeoJSON), reprojected to the store's CRS when it has another; "
                        "[0,1]² for simulated stores")
    add_dask(p, runtimes, "auto (default: in this process for small stores, observations × knots ≤ 500,000, else "
                          "Dask), dask (each worker's part runs where its partition lives) or simulated (loads the "
                          "partitions in this process)")


def add_point_columns(p, what: str) -> None:
    """--x, --y, --crs: the coordinate columns and CRS of the table of points `what` names (as for ingest)."""
    p.add_argument("--x", default=None, metavar="COL",
                   help=f"x / longitude column of {what} (default: detected, any case: x/y, lon/lat, long/lat, "
                        "lng/lat, longitude/latitude, easting/northing; or the point geometry)")
    p.add_argument("--y", default=None, metavar="COL", help=f"y / latitude column of {what}")
    p.add_argument("--crs", default=None, metavar="CRS",
                   help=f"CRS of {what}, e.g. EPSG:4326 (reprojected to the store's CRS); default: the file's own "
                        "(GeoPackage, GeoParquet), else the store's")


def point_columns(args) -> dict:
    """{"x", "y", "crs"} of add_point_columns."""
    return {"x": args.x, "y": args.y, "crs": args.crs}


def fitted_settings(args) -> dict:
    """Keyword arguments of outputs.prediction.predict / outputs.maps.make_map from add_fitted's options."""
    return {**given(args, ("predictor", "worker", "domain")), **dask_settings(args)}


def store_summary(info) -> str:
    """One line describing a written store (simulate, ingest); the CRS by its short name (an EPSG code or the CRS's
    own name, never its WKT)."""
    from spatialfed.data.crs import crs_name

    sizes = info.sizes if len(info.sizes) <= 10 else f"{min(info.sizes)}..{max(info.sizes)}"
    return (f"wrote {info.path}: {info.n_workers} workers, {sum(info.sizes)} rows (sizes {sizes}), "
            f"partition {info.partition}, crs {crs_name(info.crs) or 'none (planar units)'}, "
            f"covariates {info.covariate_names}"
            f"{', with test group' if info.has_test else ''}")
