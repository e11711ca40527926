"""`spatialfed fit STORE.zarr --out DIR`: fit a federated low-rank GP on a partitioned store and write fit.json,
model.zarr and trace.csv (SPEC §6); `--resume DIR` continues a checkpointed fit (docs/recovery.md).

Every fit keeps DIR/checkpoint.zip while it runs (every 10 aggregations, at most 5 % of the wall time, and when it
is interrupted): a fit that loses its cluster (every Dask worker, or the scheduler) or is stopped by Ctrl-C ends with
one line naming the `spatialfed fit --resume DIR` command that continues it. Without --checkpoint-every the file is
removed once fit.json is written, and when the fit failed before it had anything worth continuing.

Every estimator option defaults to None ("not given"): the estimator's own defaults apply to a new fit, and on
`--resume` only the options given on the command line override the checkpoint's values.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from spatialfed.errors import OutputError

from spatialfed.cli.args import (add_dask, add_jobqueue, add_quiet, add_tls, dask_settings, exclusive, flag,
                                 float_list, given, jobqueue_settings, profile_name, tls_setting)

CHECKPOINT_NAME = "checkpoint.zip"  # a ZIP of JSON and .npy arrays (algorithm/checkpoint.py)
LEGACY_CHECKPOINT_NAME = "checkpoint.pkl"  # the same format under its earlier name: still read by --resume DIR
#: options handed to FederatedGP under their own name when given
ESTIMATOR_OPTIONS = ("method", "mode", "residual", "knots", "nu", "anisotropy", "distance", "agg_threshold", "preset",
                     "max_iter", "tol",
                     "time_budget", "profile", "slowdown", "domain", "seed", "on_worker_error", "delays",
                     "activations", "checkpoint_every", "vecchia_k", "secure_aggregation")
#: FgprConfig settings (--method fgpr)
FGPR_OPTIONS = ("local_steps", "batch_size", "optimizer", "lr", "batching", "participation")

NAME = "fit"


def _smoothness(text: str):
    """--nu: a number or "estimate"."""
    if text.strip().lower() == "estimate":
        return "estimate"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'estimate', got {text!r}") from None
HELP = "fit the federated low-rank GP (or a baseline: independent, fgpr) on a partitioned store"


def register(subparsers) -> None:
    """Register `spatialfed fit` (SPEC §6)."""
    from spatialfed.api import METHODS, MODES, PRESETS, PROFILES, RESIDUAL_CHOICES, RUNTIMES
    from spatialfed.model.names import DISTANCES

    p = subparsers.add_parser(
        NAME, help=HELP,
        description="Fits the knot-based low-rank spatial GP across the store's sites, synchronously or "
                    "asynchronously. By default (--preset stats) each iteration is one round trip in which every "
                    "site sends the sufficient statistics of its data at the current parameters and the server "
                    "takes an exact profile-likelihood Newton step (async: the same steps at the slowest site's pace, "
                    "while faster sites answer where models of every site's statistics lead, to pick better "
                    "steps); --preset tuned/paper/basic/section5 run the paper's block-wise "
                    "Algorithms 1-3 instead. Runs on Dask (each partition is read and kept on the Dask worker that "
                    "serves it) or in this process on a virtual clock; writes fit.json, model.zarr and trace.csv.")
    p.add_argument("store", metavar="STORE.zarr", nargs="?", default=None,
                   help="partitioned Zarr store (spatialfed simulate / ingest); with --resume, default: the "
                        "checkpoint's store")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="output directory for the result files (required unless --resume, whose DIR is the default); "
                        "an existing one is refused unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the result files of an existing DIR (atomically, once the new fit is complete)")
    p.add_argument("--method", choices=METHODS, default=None, help="model (default lowrank)")
    p.add_argument("--mode", choices=MODES, default=None, help="synchronous or asynchronous (default async)")
    p.add_argument("--residual", type=residual_arg, default=None, metavar="|".join(RESIDUAL_CHOICES) + "[:K]",
                   help="residual structure R_j: auto (default: full up to 1,000 points per site, vecchia above), "
                        "full local covariance, its Vecchia approximation (sites of any size; preset stats), "
                        "modified or plain predictive process; vecchia:K and auto:K: K neighbours per point of the "
                        "Vecchia residual (default 15)")
    p.add_argument("--vecchia-k", type=int, default=None, metavar="K",
                   help="neighbours per point of the Vecchia residual (default 15; as --residual vecchia:K, auto:K)")
    p.add_argument("--knots", type=knots_arg, default=None, metavar="M|FILE",
                   help="number of knots m (default 100: a jittered grid over the domain), or a file of knot points "
                        "(CSV, GeoPackage, GeoParquet; columns --x/--y or detected, in --crs or the file's own CRS, "
                        "else the store's), reprojected to the store's CRS")
    p.add_argument("--x", default=None, metavar="COL", help="x / longitude column of --knots FILE (default: "
                   "detected, any case: x/y, lon/lat, longitude/latitude, easting/northing; or the point geometry)")
    p.add_argument("--y", default=None, metavar="COL", help="y / latitude column of --knots FILE")
    p.add_argument("--crs", default=None, metavar="CRS",
                   help="CRS of --knots FILE, e.g. EPSG:4326 (default: the file's own, else the store's)")
    p.add_argument("--nu", type=_smoothness, default=None, metavar="NU|estimate",
                   help="Matérn smoothness ν (default 0.5), or 'estimate': fitted with the other parameters within "
                        "0.2–4 (ν̂ with a 95%% interval in fit.json; docs/equations.md, Covariance options)")
    p.add_argument("--anisotropy", action="store_true", default=None,
                   help="geometric anisotropy: a major range along an angle from north and a minor range across "
                        "it, fitted (statistics scheme; the maps krige with it)")
    p.add_argument("--distance", choices=DISTANCES, default=None,
                   help="planar (in the store's CRS) or chordal (on the sphere: valid for the Matérn at every ν; "
                        "ranges also in km and degrees of arc); default chordal for a store with a CRS whose "
                        "domain spans more than 1,000 km, else planar")
    p.add_argument("--agg-threshold", type=int, default=None, metavar="A",
                   help="async: aggregate once A new answers arrived (1..J; default 1 with the default preset "
                        "stats, where each answer is a whole site's statistics; ceil(0.2·J) with the block "
                        "presets tuned/paper/basic/section5)")
    p.add_argument("--preset", choices=PRESETS, default=None,
                   help="how an iteration reaches the sites: stats (default: one round trip of sufficient "
                        "statistics per iteration, exact Newton steps; stale sites as second-order models in async "
                        "mode), tuned (the block scheme: gradient correction, uniform weights, staleness-scaled step; "
                        "the default with --privacy-noise), paper (the paper's strategies with Remark 8's values, for "
                        "reproducing it), basic (all off) or section5 (all off, the step size of the paper's "
                        "convergence analysis); docs/algorithm.md")
    p.add_argument("--max-iter", type=int, default=None, help="maximum iterations (default 50)")
    p.add_argument("--tol", type=float, default=None, help="relative parameter change to stop at (default 1e-5)")
    p.add_argument("--time-budget", type=float, default=None, metavar="SECONDS", help="stop after this long")
    p.add_argument("--profile", type=profile_name, default=None, metavar="|".join(PROFILES) + "|graded:MIN",
                   help="emulated compute heterogeneity: balanced, straggler (last worker 62/3× slower), graded "
                   "(cores 62 down to 3 per worker) or graded:MIN (62 down to MIN, e.g. graded:12)")
    p.add_argument("--slowdown", type=float_list, default=None, metavar="s1,..,sJ",
                   help="explicit slowdown factor ≥ 1 per worker (overrides --profile)")
    add_dask(p, RUNTIMES, "auto (default: in this process when observations × knots ≤ 500,000 and no option needs "
             "Dask, else Dask), dask (partitions stay on Dask workers) or simulated (virtual clock, in-process)")
    add_jobqueue(p)
    add_tls(p)
    ck = p.add_argument_group("checkpoint and resume (docs/recovery.md)")
    ck.add_argument("--checkpoint-every", type=int, default=None, metavar="K",
                    help="write OUT/checkpoint.zip atomically every K aggregations, when the fit is interrupted, "
                         "and at the end, and keep it (without this option: every 10 aggregations, at most 5 %% of "
                         "the wall time, removed once fit.json is written)")
    ck.add_argument("--resume", default=None, metavar="DIR",
                    help="continue the fit checkpointed in DIR/checkpoint.zip (or a checkpoint file): model and "
                         "algorithm settings come from the checkpoint; --max-iter, --tol, --time-budget, "
                         "--checkpoint-every and the cluster options given here override its values (defaults do "
                         "not); model options given here are refused")
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
    pv.add_argument("--privacy-delta", type=float, default=None, metavar="DELTA",
                    help="δ at which ε is reported (default 1e-5)")
    pv.add_argument("--secure-aggregation", action="store_true", default=None,
                    help="mask every site's statistics so that the server decodes only their sum, never one site's "
                         "(--mode sync, at least 3 sites; docs/secure-aggregation.md)")
    p.add_argument("--domain", default=None, metavar="FILE",
                   help="polygon file (GeoPackage, GeoJSON, shapefile) bounding the study region: knots are laid out "
                        "inside it (default: [0,1]² for simulated stores, else the workers' bounding boxes)")
    p.add_argument("--seed", type=int, default=None, help="seed of the knot jitter (default 0)")
    p.add_argument("--on-worker-error", choices=["stop", "drop"], default=None,
                   help="when a worker's computation fails: stop with an error naming it (default), or drop it and "
                        "continue with the others (recorded in fit.json as dropped_workers)")
    p.add_argument("--live", action="store_true",
                   help="serve a live monitoring page on 127.0.0.1 while the fit runs (its address is printed)")
    add_quiet(p)
    p.set_defaults(handler=run)


def residual_arg(text: str) -> str:
    """--residual: a structure, or vecchia:K / auto:K (api.options.residual_k)."""
    from spatialfed.api.options import residual_k
    from spatialfed.errors import command_line
    from spatialfed.model.names import RESIDUAL_CHOICES

    try:
        with command_line():  # the message names --residual
            name = residual_k(text)[0]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if name not in RESIDUAL_CHOICES:
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(RESIDUAL_CHOICES)}, "
                                         "vecchia:K, auto:K)")
    return text


def knots_arg(text: str):
    """--knots: an integer m, or the path of a file of knot points (read once the store's CRS is known)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        float(text)
    except ValueError:
        return text
    raise argparse.ArgumentTypeError(f"invalid int value {text!r}: give a whole number of knots or a file of knot "
                                     "points")


def knot_points(args):
    """The knots of --knots FILE as an (m, 2) array in the store's CRS (data.points: the table-of-points reader of
    predict --locations), or --knots M unchanged; --x/--y/--crs without a knots file are refused."""
    if not isinstance(args.knots, str):
        used = [flag(name) for name in ("x", "y", "crs") if getattr(args, name) is not None]
        if used:
            raise ValueError(f"{', '.join(used)} describe the points of --knots FILE; give --knots FILE or drop them")
        return args.knots
    from spatialfed.data.points import read_point_table
    from spatialfed.data.store import open_store

    if args.store is None:
        raise ValueError("--knots FILE needs STORE.zarr (its CRS is where the knots are placed)")
    return read_point_table(args.knots, x=args.x, y=args.y, crs=args.crs).in_crs(open_store(args.store).crs)


def run(args) -> None:
    """Handler of `spatialfed fit`: FederatedGP(**given options).fit(STORE), or FederatedGP.resume(checkpoint,
    **given options); then save DIR and print one summary line."""
    exclusive(args, "scheduler", "jobqueue")
    if args.resume:
        checkpoint, out = resume_paths(args.resume, args.out)
    elif args.store is None or args.out is None:
        raise ValueError("spatialfed fit needs STORE.zarr and --out DIR (or --resume DIR)")
    else:
        checkpoint, out = None, args.out
    settings = estimator_settings(args)
    from spatialfed.outputs.lock import output_lock

    check_out_path(out)
    with output_lock(out):  # one writer per DIR for the whole run; a second run is refused at once
        fit_into(out, checkpoint, settings, args)


def fit_into(out, checkpoint, settings: dict, args) -> None:
    """The fit of `run` into `out`, which this process holds the lock of."""
    from spatialfed.api import FederatedGP
    from spatialfed.api.options import spelled

    check_out(out, overwrite=args.overwrite or bool(args.resume))
    settings["checkpoint"] = str(Path(out) / CHECKPOINT_NAME)  # always: a lost cluster or Ctrl-C can be resumed
    implicit = not args.resume and args.checkpoint_every is None  # nobody asked to keep it after the fit
    existed, before = Path(out).exists(), identity(Path(settings["checkpoint"]))
    try:
        if args.resume:
            check_resumable(checkpoint, settings)
            gp = FederatedGP.resume(checkpoint, store=args.store, **spelled(settings))
        else:
            gp = FederatedGP(**spelled(settings)).fit(args.store)  # the estimator's spelling (api.options)
    except KeyboardInterrupt:
        if Path(settings["checkpoint"]).exists():  # main prints "spatialfed fit: interrupted; <this>"
            raise KeyboardInterrupt(f"resume with `{resume_command(out)}` (the checkpoint {settings['checkpoint']} "
                                    "keeps the fit so far)") from None
        raise
    except Exception as exc:
        from spatialfed.runtime.driver import ClusterLostError

        kept = getattr(exc, "checkpoint", None) is not None  # drive saved the state (a lost cluster, a failed site)
        if implicit and not (kept and (isinstance(exc, ClusterLostError) or (exc.iteration or 0) >= 1)):
            discard(Path(settings["checkpoint"]), Path(out), existed, before)  # nothing worth continuing
            if kept:  # so the resume hint is void too
                raise type(exc)(exc.reason) from None
        elif kept:
            raise type(exc)(f"{exc.reason}; the checkpoint {exc.checkpoint} (iteration {exc.iteration}) keeps the "
                            f"fit: continue it with `{resume_command(out)}`{elsewhere(settings)}") from None
        raise
    try:
        report(gp, out)
    except OutputError as exc:  # e.g. a full disk: the previous results stand, the new fit is in its checkpoint
        if not Path(settings["checkpoint"]).exists():
            raise
        raise OutputError(f"{exc}; the new fit is kept in {settings['checkpoint']}: once the cause is fixed, "
                          f"`{resume_command(out)}` writes its results (or delete that file)") from None
    if implicit:
        Path(settings["checkpoint"]).unlink(missing_ok=True)  # fit.json holds the result now


def check_out(out, overwrite: bool = False) -> None:
    """Refuse an --out that exists and is not a directory, or lies under a file, or (unless `overwrite`) holds
    anything, before anything runs (the checkpoint goes there too)."""
    from spatialfed.atomic import refuse_existing

    out = Path(out)
    check_out_path(out)
    resumable = checkpoint_in(out).is_file()
    refuse_existing(out, overwrite, alternative=f", or continue the fit it keeps with `{resume_command(out)}`"
                    if resumable else "")


def check_out_path(out) -> None:
    """Refuse an --out that is a file or lies under one."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"cannot write results to {out}: it exists and is a file, not a directory; choose another "
                          "--out")
    above = next((parent for parent in out.parents if parent.exists()), None)
    if above is not None and not above.is_dir():
        raise OutputError(f"cannot write results to {out}: {above} is a file, not a directory; choose another --out")


def resume_command(out) -> str:
    """The command that continues the fit checkpointed in `out`."""
    import shlex

    return f"spatialfed fit --resume {shlex.quote(str(out))}"


def elsewhere(settings) -> str:
    """How to resume on the same cluster when the fit ran on a scheduler of its own (given again: api.resuming)."""
    if settings.get("scheduler"):
        return (f" (add --scheduler {settings['scheduler']} to continue on the same cluster: a checkpoint never "
                "says where to connect)")
    if settings.get("jobqueue"):
        return " (add the same --jobqueue options to submit new batch jobs: a checkpoint never says what to submit)"
    return ""


def identity(path: Path):
    """(inode, mtime) of `path`, None when missing: a checkpoint (re)written by this fit has another identity."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


def discard(checkpoint: Path, out: Path, existed: bool, before) -> None:
    """Remove the checkpoint this fit wrote though nobody asked for it (one an earlier fit left is kept), and `out`
    when this fit created it and it is now empty."""
    if identity(checkpoint) != before:
        checkpoint.unlink(missing_ok=True)
    if not existed:
        with contextlib.suppress(OSError):
            out.rmdir()


def resume_paths(resume, out) -> tuple[Path, str]:
    """(checkpoint file to read, output directory) of `--resume DIR|FILE [--out DIR]`."""
    path = Path(resume)
    checkpoint = checkpoint_in(path) if path.is_dir() else path
    return checkpoint, out or str(path if path.is_dir() else path.parent)


def checkpoint_in(folder: Path) -> Path:
    """The checkpoint file of `folder`: CHECKPOINT_NAME, or LEGACY_CHECKPOINT_NAME when only that one exists."""
    legacy = folder / LEGACY_CHECKPOINT_NAME
    return legacy if legacy.is_file() and not (folder / CHECKPOINT_NAME).is_file() else folder / CHECKPOINT_NAME


def check_resumable(checkpoint, settings) -> None:
    """Refuse stopping rules given for a checkpoint of a finished fit: the resume would return that fit unchanged."""
    from spatialfed.algorithm.checkpoint import read_checkpoint

    rules = [name for name in ("max_iter", "tol", "time_budget") if name in settings]
    if rules and str(read_checkpoint(checkpoint)["phase"]) in ("final", "value", "done"):  # it left the loop
        raise ValueError(f"{checkpoint} holds a finished fit, which {', '.join(map(flag, rules))} cannot extend; "
                         "resume a checkpoint written while the fit ran, or start a new fit (docs/recovery.md)")


def estimator_settings(args) -> dict:
    """FederatedGP keyword arguments of the options given on the command line (progress always: --quiet)."""
    settings = {**given(args, ESTIMATOR_OPTIONS), **dask_settings(args)}
    if args.knots is not None or args.x or args.y or args.crs:
        settings["knots"] = knot_points(args)
    derived = {"jobqueue": jobqueue_settings(args), "tls": tls_setting(args), "live": args.live or None,
               "fgpr": fgpr_settings(args), "strategies": strategy_settings(args), "privacy": privacy_settings(args)}
    settings.update({name: value for name, value in derived.items() if value is not None})
    settings["progress"] = not args.quiet
    return settings


def fgpr_settings(args) -> dict | None:
    """FgprConfig settings given on the command line (None when none is given)."""
    settings = given(args, FGPR_OPTIONS)
    if settings and args.method != "fgpr" and not args.resume:  # on resume the checkpoint knows the method
        raise ValueError(f"{', '.join(flag(name) for name in settings)} apply to --method fgpr only")
    return settings or None


def strategy_settings(args) -> dict | None:
    """FitConfig settings of the related-work options given on the command line (None when none is given)."""
    settings = given(args, ("staleness_bound",))
    if args.dominance:
        settings["dominance"] = True
    return settings or None


def privacy_settings(args) -> dict | None:
    """GaussianMechanism settings from --privacy-noise/--privacy-clip/--privacy-delta (None when off)."""
    if args.privacy_noise is None and args.privacy_clip is None:
        return None
    if args.privacy_noise is None or args.privacy_clip is None:
        raise ValueError("privacy noise needs both --privacy-noise Z and --privacy-clip C (docs/privacy.md)")
    return {"noise_multiplier": args.privacy_noise, "clip": parse_clip(args.privacy_clip),
            **given(args, ("privacy_delta",), {"privacy_delta": "delta"})}


def parse_clip(text: str):
    """--privacy-clip: one bound, key=bound pairs, or the {key: bound} JSON file of `spatialfed pilot-clip`."""
    if text.endswith(".json"):
        try:
            return {str(k): float(v) for k, v in json.loads(Path(text).read_text()).items()}
        except (OSError, ValueError, AttributeError) as exc:
            raise ValueError(f"--privacy-clip {text}: cannot read a {{key: bound}} JSON object ({exc}); "
                             "write one with `spatialfed pilot-clip`") from None
    try:
        if "=" in text:
            return {key.strip(): float(value) for key, value in (item.split("=") for item in text.split(","))}
        return float(text)
    except ValueError:
        raise ValueError(f"--privacy-clip must be a number or key=number pairs separated by commas (or the .json "
                         f"file of `spatialfed pilot-clip`), got {text!r}") from None


def report(gp, out_dir) -> None:
    """Save the fit into `out_dir` and print its summary (and the privacy loss when noise was added)."""
    out = gp.save(out_dir, overwrite=True)  # check_out refused an existing DIR before the fit unless told
    p = gp.params_
    state = "converged" if gp.converged_ else f"not converged ({gp.stop_reason_})"
    print(f"wrote {out}: loglik {gp.loglik_:.6g}, δ={p['delta']:.6g} σ²={p['sigma2']:.6g} β={p['beta']:.6g}, "
          f"{gp.n_iter_} iterations, {state}, {gp.wall_time_s_:.2f} s")
    if gp.privacy_report_ is not None:
        r = gp.privacy_report_
        print(f"privacy: {r['mu_gdp']:.4g}-GDP, i.e. (ε = {r['epsilon']:.4g}, δ = {r['delta']:g}) per worker "
              "(worker-level adjacency; docs/privacy.md)")
    sys.stdout.flush()
