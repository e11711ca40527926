"""`spatialfed fit`: fit a federated low-rank GP on a partitioned store and write fit.json, model.zarr, trace.csv."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from spatialfed.api import METHODS, MODES, PRESETS, PROFILES, RESIDUALS, RUNTIMES
from spatialfed.cli.args import float_list

CHECKPOINT_NAME = "checkpoint.pkl"


def register_fit(subparsers) -> None:
    """Register `spatialfed fit` (SPEC §6)."""
    p = subparsers.add_parser(
        "fit", help="fit the federated low-rank GP (or a baseline: independent, fgpr) on a partitioned store",
        description="Fits the knot-based low-rank spatial GP across the store's workers with the block-wise "
                    "algorithm, synchronously or asynchronously, on Dask (each partition is read and kept on the "
                    "Dask worker that serves it) or on a virtual clock; writes fit.json, model.zarr and trace.csv.")
    p.add_argument("store", metavar="STORE.zarr", nargs="?", default=None,
                   help="partitioned Zarr store (spatialfed simulate / ingest); with --resume, default: the "
                        "checkpoint's store")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output directory for the result files (required unless --resume, whose DIR is the default)")
    p.add_argument("--method", choices=METHODS, default="lowrank", help="model (default lowrank)")
    p.add_argument("--mode", choices=MODES, default="async", help="synchronous or asynchronous (default async)")
    p.add_argument("--residual", choices=RESIDUALS, default="full",
                   help="residual structure R_j: full local covariance, modified or plain predictive process "
                        "(default full)")
    p.add_argument("--knots", type=int, default=100, help="number of knots m (default 100)")
    p.add_argument("--nu", type=float, default=0.5, help="Matérn smoothness ν (default 0.5)")
    p.add_argument("--agg-threshold", type=int, default=None, metavar="A",
                   help="async: aggregate once A new quantities of the current step arrived (1..J; default "
                        "ceil(0.2·J))")
    p.add_argument("--preset", choices=PRESETS, default="paper",
                   help="async strategy settings: paper (gradient correction, staleness weights, moving average with "
                        "Remark 8's defaults), tuned (see docs/algorithm.md), basic (all off) or section5 (all off, "
                        "the step size of the paper's convergence analysis); default paper")
    p.add_argument("--max-iter", type=int, default=50, help="maximum iterations (default 50)")
    p.add_argument("--tol", type=float, default=1e-5, help="relative parameter change to stop at (default 1e-5)")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS", help="stop after this long")
    p.add_argument("--runtime", choices=RUNTIMES, default="dask",
                   help="dask (default; partitions stay on Dask workers) or simulated (virtual clock, in-process)")
    p.add_argument("--profile", choices=PROFILES, default="balanced",
                   help="emulated compute heterogeneity: balanced, straggler (last worker 62/3× slower) or graded")
    p.add_argument("--slowdown", type=float_list, default=None, metavar="s1,..,sJ",
                   help="explicit slowdown factor ≥ 1 per worker (overrides --profile)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="address of a running Dask scheduler (tcp://host:8786); default: an embedded LocalCluster")
    p.add_argument("--dask-workers", type=int, default=None, metavar="N",
                   help="worker processes of the embedded LocalCluster (default: min(J, number of cores)); "
                        "use J to give every federated worker its own process")
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
    jq.add_argument("--scheduler-host", default="127.0.0.1",
                    help="address the jobqueue scheduler binds to (default 127.0.0.1; use one the compute nodes "
                         "can reach on a real cluster)")
    sec = p.add_argument_group("encryption (TLS)")
    sec.add_argument("--tls", action="store_true",
                     help="encrypt and authenticate every Dask connection (client, scheduler, workers) with TLS; "
                          "without --tls-dir a temporary self-signed certificate is made in memory")
    sec.add_argument("--tls-dir", default=None, metavar="DIR",
                     help="directory with ca.pem, cert.pem, key.pem (implies --tls; needed for --scheduler "
                          "tls://HOST:PORT started with those files)")
    ck = p.add_argument_group("checkpoint and resume (docs/recovery.md)")
    ck.add_argument("--checkpoint-every", type=int, default=None, metavar="K",
                    help="write OUT/checkpoint.pkl atomically every K aggregations, when the fit is interrupted, "
                         "and at the end (Dask runtime)")
    ck.add_argument("--resume", default=None, metavar="DIR",
                    help="continue the fit checkpointed in DIR/checkpoint.pkl (or a checkpoint file): model and "
                         "algorithm settings come from the checkpoint; --max-iter, --tol, --time-budget and the "
                         "cluster options given explicitly override it")
    fg = p.add_argument_group("FGPR (--method fgpr; docs/fgpr.md)")
    fg.add_argument("--local-steps", type=int, default=None, metavar="E",
                    help="local optimiser steps per round (default 5)")
    fg.add_argument("--batch-size", type=int, default=None, metavar="M", help="mini-batch size (default 64)")
    fg.add_argument("--optimizer", choices=["adam", "sgd"], default=None,
                    help="local optimiser: adam (rate lr/√round, default) or sgd (step lr/t, t the local step count)")
    fg.add_argument("--lr", type=float, default=None, help="learning rate β₁ (default 0.1)")
    fg.add_argument("--batching", choices=["uniform", "nearest"], default=None,
                    help="mini-batches: uniform random points (default) or a random point and its nearest neighbours")
    fg.add_argument("--participation", type=int, default=None, metavar="K",
                    help="clients drawn per round (1..J; default all)")
    ao = p.add_argument_group("asynchronous options from related work (docs/algorithm.md, docs/delays.md)")
    ao.add_argument("--staleness-bound", type=int, default=None, metavar="D",
                    help="VAFL's bound: discard quantities more than D iterations old and wait for fresh ones")
    ao.add_argument("--dominance", action="store_true",
                    help="AsyncManifold's arrival-frequency correction of the aggregation weights")
    ao.add_argument("--delays", default=None, metavar="MODEL",
                    help="extra task delays: exponential:MEAN[,..] | poisson:RATE[,..]:UNIT | exponential:vafl | "
                         "poisson:vafl")
    ao.add_argument("--activations", default=None, metavar="MODEL",
                    help="Poisson-process activations: poisson:RATE[,..] (per second)")
    pv = p.add_argument_group("privacy noise on the shared summaries (docs/privacy.md)")
    pv.add_argument("--privacy-noise", type=float, default=None, metavar="Z",
                    help="Gaussian mechanism noise multiplier z (noise sd = z × sensitivity)")
    pv.add_argument("--privacy-clip", default=None, metavar="C|KEY=C,..|FILE.json",
                    help="public per-observation clipping bound(s): one number, key=value pairs, or the JSON file "
                         "of `spatialfed pilot-clip`")
    pv.add_argument("--privacy-delta", type=float, default=1e-5, metavar="DELTA",
                    help="δ at which ε is reported (default 1e-5)")
    p.add_argument("--domain", default=None, metavar="FILE",
                   help="polygon file (GeoPackage, GeoJSON, shapefile) bounding the study region: knots are laid out "
                        "inside it (default: [0,1]² for simulated stores, else the workers' bounding boxes)")
    p.add_argument("--seed", type=int, default=0, help="seed of the knot jitter (default 0)")
    p.add_argument("--on-worker-error", choices=["stop", "drop"], default="stop",
                   help="when a worker's computation fails: stop with an error naming it (default), or drop it and "
                        "continue with the others (recorded in fit.json as dropped_workers)")
    p.add_argument("--live", action="store_true",
                   help="serve a live monitoring page on 127.0.0.1 while the fit runs (its address is printed)")
    p.add_argument("--quiet", action="store_true", help="no progress display on stderr")
    p.set_defaults(handler=run_fit)


def run_fit(args) -> None:
    """Handler of `spatialfed fit`."""
    from spatialfed.api import FederatedGP

    if args.jobqueue and args.scheduler:
        raise ValueError("give either --scheduler or --jobqueue, not both")
    if args.resume:
        return _resume(args)
    if args.store is None or args.out is None:
        raise ValueError("spatialfed fit needs STORE.zarr and --out DIR (or --resume DIR)")
    jobqueue = _jobqueue(args)
    tls = args.tls_dir if args.tls_dir else (True if args.tls else None)
    gp = FederatedGP(
        method=args.method, mode=args.mode, residual=args.residual, knots=args.knots, nu=args.nu,
        agg_threshold=args.agg_threshold, max_iter=args.max_iter, tol=args.tol, runtime=args.runtime,
        profile=args.profile, slowdown=args.slowdown, scheduler=args.scheduler, seed=args.seed,
        n_dask_workers=args.dask_workers, jobqueue=jobqueue, domain=args.domain, time_budget=args.time_budget,
        progress=not args.quiet, preset=args.preset, live=args.live, tls=tls,
        checkpoint=None if args.checkpoint_every is None else Path(args.out) / CHECKPOINT_NAME,
        checkpoint_every=args.checkpoint_every, on_worker_error=args.on_worker_error, fgpr=_fgpr(args),
        strategies=_strategies(args), privacy=_privacy(args), delays=args.delays, activations=args.activations,
    )
    gp.fit(args.store)
    _report(gp, args.out)


def _fgpr(args) -> dict | None:
    """FgprConfig settings given on the command line (None when none is given)."""
    names = ("local_steps", "batch_size", "optimizer", "lr", "batching", "participation")
    given = {name: getattr(args, name) for name in names if getattr(args, name) is not None}
    if given and args.method != "fgpr":
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise ValueError(f"{flags} apply to --method fgpr only")
    return given or None


def _strategies(args) -> dict | None:
    """FitConfig settings of the related-work options given on the command line (None when none is given)."""
    given = {}
    if args.staleness_bound is not None:
        given["staleness_bound"] = args.staleness_bound
    if args.dominance:
        given["dominance"] = True
    return given or None


def _privacy(args) -> dict | None:
    """GaussianMechanism settings from --privacy-noise/--privacy-clip/--privacy-delta (None when off)."""
    if args.privacy_noise is None and args.privacy_clip is None:
        return None
    if args.privacy_noise is None or args.privacy_clip is None:
        raise ValueError("privacy noise needs both --privacy-noise Z and --privacy-clip C (docs/privacy.md)")
    text = args.privacy_clip
    if text.endswith(".json"):  # written by `spatialfed pilot-clip`
        try:
            clip = {str(k): float(v) for k, v in json.loads(Path(text).read_text()).items()}
        except (OSError, ValueError, AttributeError) as exc:
            raise ValueError(f"--privacy-clip {text}: cannot read a {{key: bound}} JSON object ({exc}); "
                             "write one with `spatialfed pilot-clip`") from None
    elif "=" in text:
        try:
            clip = {key.strip(): float(value) for key, value in (item.split("=") for item in text.split(","))}
        except ValueError:
            raise ValueError(f"--privacy-clip must be a number or key=number pairs separated by commas, got {text!r}")
    else:
        clip = float(text)
    return {"noise_multiplier": args.privacy_noise, "clip": clip, "delta": args.privacy_delta}


def _jobqueue(args):
    if not args.jobqueue:
        return None
    from spatialfed.runtime.jobscript import resolve_options

    options = resolve_options(args.jobqueue, config=args.jobqueue_config, jobs=args.jobs, cores=args.cores,
                              memory=args.memory, walltime=args.walltime, queue=args.queue, account=args.account)
    return {"kind": args.jobqueue, **options, "host": args.scheduler_host, "wait_for_workers": 600}


def _resume(args) -> None:
    """`spatialfed fit --resume DIR`: settings from the checkpoint; options given explicitly override the stopping
    rules and the cluster settings."""
    from spatialfed.api import FederatedGP

    path = Path(args.resume)
    ckpt = path / CHECKPOINT_NAME if path.is_dir() else path
    out = args.out or (str(path) if path.is_dir() else str(path.parent))
    defaults = {"max_iter": 50, "tol": 1e-5, "time_budget": None}
    overrides = {k: getattr(args, k) for k, v in defaults.items() if getattr(args, k) != v}
    if args.scheduler:
        overrides["scheduler"] = args.scheduler
    if args.jobqueue:
        overrides["jobqueue"] = _jobqueue(args)
    if args.dask_workers is not None:
        overrides["n_dask_workers"] = args.dask_workers
    if args.tls or args.tls_dir:
        overrides["tls"] = args.tls_dir if args.tls_dir else True
    if args.checkpoint_every is not None:
        overrides["checkpoint_every"] = args.checkpoint_every
    overrides["checkpoint"] = str(Path(out) / CHECKPOINT_NAME)
    overrides["progress"] = not args.quiet
    gp = FederatedGP.resume(ckpt, store=args.store, **overrides)
    _report(gp, out)


def _report(gp, out_dir) -> None:
    out = gp.save(out_dir)
    p = gp.params_
    print(f"wrote {out}: loglik {gp.loglik_:.6g}, δ={p['delta']:.6g} σ²={p['sigma2']:.6g} β={p['beta']:.6g}, "
          f"{gp.n_iter_} iterations, {'converged' if gp.converged_ else 'not converged (' + str(gp.stop_reason_) + ')'}"
          f", {gp.wall_time_s_:.2f} s")
    if gp.privacy_report_ is not None:
        r = gp.privacy_report_
        print(f"privacy: {r['mu_gdp']:.4g}-GDP, i.e. (ε = {r['epsilon']:.4g}, δ = {r['delta']:g}) per worker "
              "(worker-level adjacency; docs/privacy.md)")
    sys.stdout.flush()
