"""The shared library of the paper's experiment pipelines (Section 6; SPEC §7): configuration and its validation,
the replicate loop (Dask or in-process), result tables and plots.

Every experiment script builds a list of *tasks* (plain dicts), hands them to `run_tasks`, which calls a task
function of this module on each (on an embedded Dask LocalCluster bound to 127.0.0.1 with `client.map`, or in this
process for `--workers 1`), and gets back lists of flat result rows that `write_csv` stores and the plot helpers draw.

Task functions (each is pure in its task dict; the seed fixes the data):

* `fit_pair`: one Monte Carlo replicate of Section 6.1 — simulate, fit the low-rank model (full local covariance,
  synchronous FederatedServer on the virtual clock) and the independence model (the same server with m = 0 knots,
  which is exactly Eq. (3)), return one row per model with σ², β, δ and mean γ.
* `kl_replicate`: Proposition 4's normalised KL divergences for a list of knot counts on one set of locations.
* `convergence_run`: Section 6.2 — simulate, compute the reference estimate (a synchronous fit to tol 1e-10), run
  the synchronous and asynchronous algorithms under a slowdown profile on the virtual clock, and return their
  convergence traces (max relative parameter error against the reference over virtual time) and, on request,
  the prediction RMSE at held-out points over time.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
from spatialfed.algorithm.config import DEFAULT_PRESET
from spatialfed.model.names import Step

HERE = Path(__file__).resolve().parent
SIGMA2, NOISE_SD = 1.0, 2.0          # SPEC §7: σ² = 1, δ = 1/noise_sd² = 0.25
DELTA = 1.0 / NOISE_SD**2
GAMMA = (-1.0, 2.0, 1.0, 1.0, 1.0)
MAX_CORES = 62                        # the paper's cores per worker: slowdown = 62 / cores
KL_NUGGET = 1e-3                      # added to both covariances of the KL (conditioning; the paper's case is 0)
PARTITIONS = ("random", "area", "neighbor")
PRESETS = tuple(dict.fromkeys((DEFAULT_PRESET, "stats", "tuned", "paper", "basic")))   # the library's default first
#: server trace steps that set a new θ: the block scheme's theta aggregation, the statistics scheme's Newton step
THETA_STEPS = ("init", "theta", Step.STATS.value, "final")
RUNTIMES = ("virtual", "dask")


class ConfigError(ValueError):
    """A nonsensical experiment configuration; the message says what to change."""


# ----------------------------------------------------------------------------------------------------------------
# configuration and validation
# ----------------------------------------------------------------------------------------------------------------

def positive_int(value, name: str) -> int:
    """value as an int ≥ 1, else ConfigError."""
    try:
        ok = int(value) == value and int(value) >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def positive_float(value, name: str) -> float:
    try:
        ok = math.isfinite(float(value)) and float(value) > 0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def check_nu(nu) -> float:
    nu = positive_float(nu, "smoothness nu")
    if nu > 10:
        raise ConfigError(f"smoothness nu = {nu} is unusable (choose 0.5, 1.5, 2.5 or another value ≤ 10)")
    return nu


def check_knots(m, n_total: int, name: str = "number of knots m", allow_zero: bool = False) -> int:
    """m knots on the unit square: 1 ≤ m ≤ N (more knots than observations cannot be identified: K would be
    larger than the data it summarises and nearly singular)."""
    if allow_zero and m == 0:
        return 0
    m = positive_int(m, name)
    if m > n_total:
        raise ConfigError(f"{name} = {m} is more knots than can be placed usefully: at most the N = {n_total} "
                          "observations; lower m or raise the sample sizes")
    return m


def slowdowns_from_cores(cores) -> np.ndarray:
    """The paper's cores per worker → slowdown factors 62 / cores (SPEC §4)."""
    cores = np.asarray(cores, dtype=float)
    if cores.ndim != 1 or cores.size == 0 or np.any(~np.isfinite(cores)) or np.any(cores <= 0):
        raise ConfigError(f"cores per worker must be positive numbers, got {cores.tolist()}")
    if np.any(cores > MAX_CORES):
        raise ConfigError(f"at most {MAX_CORES} cores per worker (the paper's largest allocation), got {cores.max()}")
    return MAX_CORES / cores


def graded_cores(J: int, min_cores: float = 3.0) -> np.ndarray:
    """Cores per worker linspace(62, min_cores, J) (the paper's Figure 5(a)-style imbalance; 62 = balanced)."""
    if not 0 < min_cores <= MAX_CORES:
        raise ConfigError(f"min_cores must be in (0, {MAX_CORES}], got {min_cores}")
    return np.linspace(MAX_CORES, min_cores, J) if J > 1 else np.array([float(MAX_CORES)])


def profile_cores(profile, J: int) -> np.ndarray:
    """Cores per worker of a named heterogeneity profile (balanced, straggler, graded) or a 'graded:<min>' spec
    (runtime/heterogeneity.py profile_slowdowns: cores = 62 / slowdown)."""
    if isinstance(profile, str):
        from spatialfed.runtime.heterogeneity import profile_slowdowns
        try:
            return MAX_CORES / profile_slowdowns(profile, J)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return np.asarray(profile, dtype=float)


def beta_for_range(nu: float, effective_range: float) -> float:
    """β whose Matérn correlation falls to 0.05 at effective_range (SPEC §1's parameterisation)."""
    from spatialfed.model.matern import Matern

    return Matern(nu).beta_from_range(effective_range)


def base_parser(description: str, quick: str, full: str, replicates: bool = True, runtime: bool = False):
    """The options every experiment script shares."""
    ap = argparse.ArgumentParser(description=description,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=f"--quick (default): {quick}\n--full: {full}")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="full", action="store_false", help="small sizes, minutes on 2 cores (default)")
    size.add_argument("--full", dest="full", action="store_true", help="the paper's sizes (hours to days)")
    ap.set_defaults(full=False)
    ap.add_argument("--out", type=Path, default=None, help="output directory (default out/<experiment>)")
    ap.add_argument("--workers", type=int, default=None,
                    help="Dask worker processes for the replicates (default: cores; 1 = in this process)")
    if replicates:
        ap.add_argument("--replicates", type=int, default=None, help="Monte Carlo replicates (overrides the mode)")
    ap.add_argument("--seed", type=int, default=0, help="base random seed (default 0)")
    if runtime:
        ap.add_argument("--runtime", choices=RUNTIMES, default="virtual",
                        help="virtual: reproducible virtual clock with flop costs and slowdowns (default); "
                             "dask: real fits on an embedded Dask cluster with emulated slowdowns (wall seconds)")
        ap.add_argument("--preset", choices=PRESETS, default=DEFAULT_PRESET,
                        help=f"settings of both modes: {DEFAULT_PRESET} (the library's default), stats (one round "
                             "trip of sufficient statistics per iteration, SPEC §2b), tuned (FitConfig.tuned), paper "
                             "(SPEC §4 defaults, all three strategies) or basic (none); the last three run the "
                             "block scheme")
    ap.add_argument("--publish", type=Path, default=None, help="also copy the figures into this directory "
                                                               "(e.g. docs/figures)")
    return ap


def finish_args(args, name: str):
    """Resolve --out and --workers, validate them; returns args."""
    if args.out is None:
        args.out = Path("out") / name
    if args.workers is None:
        args.workers = max(1, min(os.cpu_count() or 1, 8))
    try:
        positive_int(args.workers, "--workers")
        if getattr(args, "replicates", None) is not None:
            positive_int(args.replicates, "--replicates")
    except ConfigError as e:
        fail(str(e))
    args.out.mkdir(parents=True, exist_ok=True)
    return args


def fail(message: str) -> None:
    """Print a configuration error and exit with status 2."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------------
# replicate loop
# ----------------------------------------------------------------------------------------------------------------

def _call(task: dict) -> list[dict]:
    """Run one task in a worker process (one BLAS thread; the task names its function)."""
    from spatialfed.runtime.blas import limit_blas_threads

    fn = TASKS[task["fn"]]
    with limit_blas_threads(1):
        return fn(**{k: v for k, v in task.items() if k != "fn"})


def run_tasks(tasks: list[dict], workers: int = 1, label: str = "tasks") -> list[dict]:
    """Run every task (dict with "fn" naming a function of TASKS) and concatenate their rows, in task order.

    workers = 1: in this process. Otherwise an embedded Dask LocalCluster (127.0.0.1, `workers` processes, one
    thread each) and `client.map` over the tasks (largest first, so the stragglers start early)."""
    tic = time.perf_counter()
    if workers <= 1 or len(tasks) <= 1:
        out = []
        for i, task in enumerate(tasks):
            out.append(_call(task))
            say(f"{label}: {i + 1}/{len(tasks)} done ({time.perf_counter() - tic:.0f} s)")
    else:
        from dask.distributed import Client, LocalCluster, as_completed

        env = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
        os.environ.update({k: v for k, v in env.items() if k != "PYTHONPATH"})
        os.environ["PYTHONPATH"] = env["PYTHONPATH"]
        with LocalCluster(n_workers=min(workers, len(tasks)), threads_per_worker=1, processes=True,
                          host="127.0.0.1", dashboard_address=":0",
                          memory_limit=0) as cluster, Client(cluster) as client:
            order = sorted(range(len(tasks)), key=lambda i: -float(tasks[i].get("cost", 0.0)))
            futures = client.map(_call, [tasks[i] for i in order], pure=False)
            index = {f.key: i for f, i in zip(futures, order)}
            results: dict[int, list] = {}
            for done, fut in enumerate(as_completed(futures), 1):
                results[index[fut.key]] = fut.result()
                say(f"{label}: {done}/{len(tasks)} done ({time.perf_counter() - tic:.0f} s)")
            out = [results[i] for i in range(len(tasks))]
    return [row for rows in out for row in rows]


# ----------------------------------------------------------------------------------------------------------------
# tables
# ----------------------------------------------------------------------------------------------------------------

def write_csv(path: Path, rows: list[dict], columns: list[str] | None = None):
    """Write rows (dicts) as CSV; returns the DataFrame."""
    import pandas as pd

    df = pd.DataFrame(rows)
    if columns is not None:
        df = df[columns]
    df.to_csv(path, index=False)
    say(f"wrote {path} ({len(df)} rows)")
    return df


# ----------------------------------------------------------------------------------------------------------------
# Section 6.1: low-rank against independence
# ----------------------------------------------------------------------------------------------------------------

def _parts_models(parts, knots, kernel, residual="full"):
    from spatialfed.model.local import LocalModel

    return [LocalModel(locs, z, X, knots, kernel, residual) for locs, z, X in parts]


def fit_pair(*, nu: float, beta: float, J: int, n: int, m: int, seed: int, group: str = "", max_iter: int = 100,
             **_) -> list[dict]:
    """One Monte Carlo replicate: low-rank (m knots, full residual) and independence (m = 0) fits of one data set.

    Both are synchronous FederatedServer fits (virtual clock; timing irrelevant here). The independence fit starts
    from the low-rank fit's data-driven φ₀ (its first trace row), because the server's variogram start needs knots
    (with m = 0 it has no domain diameter); the low-rank fit's own φ₀ is the server's default."""
    from spatialfed.algorithm.config import FitConfig
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.data.simulate import simulate
    from spatialfed.model.matern import Matern
    from spatialfed.runtime.virtual import run_virtual

    kernel = Matern(nu)
    sim = simulate(J, n, nu=nu, beta=beta, sigma2=SIGMA2, noise_sd=NOISE_SD, seed=seed)
    parts = sim.parts()
    knots = jittered_unit_grid(m, seed=seed + 10_000)
    cfg = FitConfig.of(mode="sync", max_iter=max_iter, tol=1e-6)
    rows = []
    tic = time.perf_counter()
    lr = run_virtual(_parts_models(parts, knots, kernel), knots, kernel, cfg)
    t_lr = time.perf_counter() - tic
    init = lr.trace[0]
    start = {k: init[k] for k in ("gamma", "delta", "sigma2", "beta")}
    none = np.zeros((0, 2))
    tic = time.perf_counter()
    ind = run_virtual(_parts_models(parts, none, kernel), none, kernel, cfg, start=start)
    t_ind = time.perf_counter() - tic
    for model, server, wall in (("low-rank", lr, t_lr), ("independence", ind, t_ind)):
        p = server.params
        rows.append({"group": group, "nu": nu, "beta_true": beta, "J": J, "n": n, "m": m, "seed": seed,
                     "model": model, "sigma2": p.sigma2, "beta": p.beta, "delta": p.delta,
                     "gamma_mean": float(np.mean(p.gamma)), "loglik": server.loglik,
                     "iterations": server.iterations, "converged": server.converged, "wall_s": wall})
    return rows


def kl_replicate(*, ms: list[int], nu: float, beta: float, J: int, n: int, seed: int,
                 nugget: float = KL_NUGGET, **_) -> list[dict]:
    """Normalised KL of the low-rank model (full local covariance) and of the independence model from the GP
    (Proposition 4) on one random partition of jittered-grid locations, for each m in ms (knots jittered too)."""
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.data.partition import random_partition, split
    from spatialfed.model.matern import Matern
    from spatialfed.model.reference import kl_independent, kl_lowrank

    kernel = Matern(nu)
    rng = np.random.default_rng(seed)
    locs = jittered_unit_grid(J * n, seed=rng)
    labels = random_partition(J * n, J, seed=rng)
    loc_parts = [locs[i] for i in split(labels, J)]
    k_ind = kl_independent(loc_parts, kernel, SIGMA2, beta, nugget=nugget)
    return [{"m": int(m), "seed": seed,
             "kl_lowrank": kl_lowrank(loc_parts, jittered_unit_grid(int(m), seed=rng), kernel, SIGMA2, beta,
                                      nugget=nugget),
             "kl_independent": k_ind} for m in ms]


# ----------------------------------------------------------------------------------------------------------------
# Section 6.2: asynchronous against synchronous
# ----------------------------------------------------------------------------------------------------------------

def sync_config(preset: str, max_iter: int, tol: float):
    """The synchronous FitConfig of a preset: the statistics scheme for stats, else the block scheme (Algorithm 1)."""
    from spatialfed.algorithm.config import FitConfig

    if preset == "stats":
        return FitConfig.preset("stats", mode="sync", max_iter=max_iter, tol=tol)
    if preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {PRESETS}")
    return FitConfig.of(mode="sync", max_iter=max_iter, tol=tol)


def async_config(preset: str, agg_threshold: int | None, max_iter: int, tol: float, **changes):
    """The asynchronous FitConfig of a preset (stats | tuned | paper | basic), or an explicit ablation arm.
    agg_threshold None: the preset's own (stats: 1, the block scheme: ceil(0.2 J))."""
    from spatialfed.algorithm.config import FitConfig

    common = {"agg_threshold": agg_threshold, "max_iter": max_iter, "tol": tol, **changes}
    if preset == "stats":
        if changes.get("staleness_bound") is not None:
            raise ConfigError("a staleness bound D is a block-scheme setting; preset 'stats' refuses it")
        common.pop("staleness_bound", None)
        try:
            return FitConfig.preset("stats", mode="async", **common)
        except ValueError as e:
            raise ConfigError(str(e)) from None
    if preset == "tuned":
        return FitConfig.tuned(**common)
    if preset == "paper":
        return FitConfig.of(mode="async", **common)
    if preset == "basic":
        return FitConfig.basic(**common)
    raise ConfigError(f"unknown preset {preset!r}; choose one of {PRESETS}")


#: the asynchronous algorithm with VAFL's staleness bound D (`staleness_bound` of convergence_run)
BOUNDED = "async, bounded staleness"

#: Figure 5's arms: strategy flags; every arm uses the same fixed step size (`--alpha`)
ABLATION_ARMS = {
    "none": {},
    "correction only": {"correction": True},
    "adaptive weights only": {"adaptive_weights": True},
    "moving average only": {"moving_average": True},
    "all strategies": {"correction": True, "adaptive_weights": True, "moving_average": True},
}


def max_rel_error(row: dict, ref: dict) -> float:
    """max over δ, σ², β and every γ_k of |x − x̂| / |x̂|."""
    a = np.r_[row["delta"], row["sigma2"], row["beta"], row["gamma"]].astype(float)
    b = np.r_[ref["delta"], ref["sigma2"], ref["beta"], ref["gamma"]].astype(float)
    return float(np.max(np.abs(a - b) / np.abs(b)))


def settle(times, errors, rtol: float):
    """Earliest time from which every later error is ≤ rtol (None if the last one is above)."""
    ok = np.asarray(errors) <= rtol
    if ok.size == 0 or not ok[-1]:
        return None
    bad = np.flatnonzero(~ok)
    return float(times[bad[-1] + 1]) if bad.size else float(times[0])


def run_with_snapshots(models, knots, kernel, config, slowdowns, on_theta=None, cost=None):
    """`run_virtual`, calling on_theta(server, now) after every theta aggregation — so the server's full φ
    (μ, Σ included) can be used for prediction over time (Figure 9)."""
    from spatialfed.runtime.virtual import run_virtual

    seen = [0]

    def on_event(server, now):
        fresh = server.trace[seen[0]:]
        if on_theta is not None and server.phase == "loop" and any(r["step"] in THETA_STEPS[1:3] for r in fresh):
            on_theta(server, now)
        seen[0] = len(server.trace)

    return run_virtual(models, knots, kernel, config, slowdowns, cost=cost, on_event=on_event)


def convergence_run(*, experiment: str, panel: str, J: int | None = None, n: int | None = None,
                    sizes=None, nu: float = 0.5, beta: float = 0.1, m: int = 100, cores=None,
                    partition: str = "random", modes=("sync", "async"), preset: str = DEFAULT_PRESET,
                    staleness_bound: int | None = None,
                    agg_threshold: int | None = None, arms: dict | None = None, alpha: float | None = None,
                    max_iter: int = 200, tol: float = 1e-7, rtol: float = 1e-3, seed: int = 0,
                    test_size: int = 0, **_) -> list[dict]:
    """Sync and async (or the ablation `arms`) on one simulated data set under the slowdowns 62/cores.

    Returns trace rows {kind: "trace", experiment, panel, mode, time_s, iter, error[, rmse]} (one per theta
    aggregation; error = max relative parameter error against the reference, a synchronous fit to tol 1e-10) and
    one {kind: "summary", ..., settle_s, iterations, final_error} row per mode (settle_s: virtual time from which
    the error stays ≤ rtol). `preset` selects both modes' settings (sync_config, async_config; stats: the statistics
    scheme, whose Agg_threshold defaults to 1); the ablation `arms` are block-scheme runs (rows say preset "paper").
    The reference is the same for every preset (both schemes maximise the same profile likelihood)."""
    from spatialfed.algorithm.config import FitConfig
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.data.simulate import simulate
    from spatialfed.model.matern import Matern
    from spatialfed.model.predict import federated_predict
    from spatialfed.runtime.virtual import run_virtual

    kernel = Matern(nu)
    if sizes is not None:
        sim = simulate(sizes=list(sizes), nu=nu, beta=beta, partition=partition, test_size=test_size, seed=seed)
    else:
        sim = simulate(J, n, nu=nu, beta=beta, partition=partition, test_size=test_size, seed=seed)
    parts = sim.parts()
    J = len(parts)
    knots = jittered_unit_grid(m, seed=seed + 10_000)
    models = _parts_models(parts, knots, kernel)
    ref_server = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=100, tol=1e-10))
    rp = ref_server.params
    ref = {"gamma": rp.gamma, "delta": rp.delta, "sigma2": rp.sigma2, "beta": rp.beta}
    slowdowns = slowdowns_from_cores(cores if cores is not None else np.full(J, float(MAX_CORES)))
    runs = {}
    if arms is not None:
        A = agg_threshold or max(1, math.ceil(0.2 * J))
        preset = "paper"   # the paper's strategies, each arm on or off
        for name, flags in arms.items():
            runs[name] = FitConfig.basic(agg_threshold=A, alpha=alpha, max_iter=max_iter, tol=tol, **flags)
    else:
        A = agg_threshold or (None if preset == "stats" else max(1, math.ceil(0.2 * J)))
        for mode in modes:
            if mode == "sync":
                runs[mode] = sync_config(preset, max_iter, tol)
            elif mode == BOUNDED:
                runs[mode] = async_config(preset, A, max_iter, tol, staleness_bound=staleness_bound)
            else:
                runs[mode] = async_config(preset, A, max_iter, tol)
        first_async = next((mode for mode in modes if mode != "sync"), None)
        A = J if first_async is None else runs[first_async].resolved(J).agg_threshold
    base = {"experiment": experiment, "panel": panel, "preset": preset, "J": J, "m": m, "nu": nu, "beta_true": beta,
            "partition": partition, "agg_threshold": A, "seed": seed}
    rows = []
    t_locs, t_z, t_X = sim.test if test_size else (None, None, None)
    for mode, cfg in runs.items():
        snaps = []
        if test_size:

            def on_theta(server, now, snaps=snaps):
                pred = federated_predict(models, t_locs, t_X, server.params, knots, kernel, "full")
                snaps.append((now, float(np.sqrt(np.mean((pred["mean"] - t_z) ** 2)))))
        else:
            on_theta = None
        tic = time.perf_counter()
        server = run_with_snapshots(models, knots, kernel, cfg, slowdowns, on_theta)
        wall = time.perf_counter() - tic
        theta_rows = [r for r in server.trace if r["step"] in THETA_STEPS]
        times = np.array([r["time_s"] for r in theta_rows])
        errors = np.array([max_rel_error(r, ref) for r in theta_rows])
        for r, e in zip(theta_rows, errors):
            rows.append({**base, "kind": "trace", "mode": mode, "time_s": r["time_s"], "iter": r["iter"],
                         "step": r["step"], "error": e})
        for now, rmse in snaps:
            rows.append({**base, "kind": "rmse", "mode": mode, "time_s": now, "rmse": rmse})
        rows.append({**base, "kind": "summary", "mode": mode, "settle_s": settle(times, errors, rtol),
                     "iterations": server.iterations, "rounds": float(getattr(server, "rounds", np.nan)),
                     "final_error": float(errors[-1]),
                     "max_error_late": float(errors[len(errors) // 2:].max()), "end_s": float(times[-1]),
                     "stop_reason": server.stop_reason, "wall_s": wall,
                     "slowdowns": " ".join(f"{v:.3g}" for v in slowdowns),
                     "sizes": " ".join(str(len(p[1])) for p in parts)})
    return rows


TASKS = {"fit_pair": fit_pair, "kl_replicate": kl_replicate, "convergence_run": convergence_run}


# ----------------------------------------------------------------------------------------------------------------
# plots (matplotlib Figure API; no pyplot state)
# ----------------------------------------------------------------------------------------------------------------

COLORS = {"low-rank": "#1f77b4", "independence": "#ff7f0e", "sync": "#444444", "async": "#d62728"}
PARAM_LABELS = {"sigma2": "σ² (marginal variance)", "beta": "β (length scale)", "delta": "δ (noise precision)",
                "gamma_mean": "mean γ (average of γ₁..γ₅)"}


def save(fig, path: Path, publish: Path | None = None, name: str | None = None) -> Path:
    fig.savefig(path, dpi=110, bbox_inches="tight")
    say(f"wrote {path}")
    if publish is not None:   # a 256-colour palette copy (a third of the size), as common.small_png makes; not
        from PIL import Image  # imported from common, which pulls in the map pipelines' Dask and API imports

        publish.mkdir(parents=True, exist_ok=True)
        with Image.open(path) as im:
            im.convert("RGB").quantize(256, dither=Image.Dither.NONE).save(publish / (name or path.name),
                                                                          optimize=True)
    return path


def boxplot_figure(df, groups: list, group_label: str, title: str, truth: dict):
    """2×2 boxplots (σ², β, δ, mean γ) of low-rank against independence for each group; red line: the truth
    (a dict param -> value, or param -> {group: value}); green triangle: the Monte Carlo mean."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(8, 1.3 * len(groups) + 4), 8))
    axes = fig.subplots(2, 2).ravel()
    width = 0.35
    for ax, param in zip(axes, ("sigma2", "beta", "delta", "gamma_mean")):
        for k, model in enumerate(("low-rank", "independence")):
            data = [df[(df.group == g) & (df.model == model)][param].to_numpy() for g in groups]
            pos = np.arange(len(groups)) + (k - 0.5) * width
            bp = ax.boxplot(data, positions=pos, widths=width * 0.9, patch_artist=True, showmeans=True,
                            meanprops={"marker": "^", "markerfacecolor": "green", "markeredgecolor": "green"},
                            flierprops={"markersize": 3})
            for patch in bp["boxes"]:
                patch.set_facecolor(COLORS[model])
                patch.set_alpha(0.6)
        t = truth[param]
        for i, g in enumerate(groups):
            value = t[g] if isinstance(t, dict) else t
            ax.hlines(value, i - 0.45, i + 0.45, colors="red", linewidth=1.5)
        ax.set_xticks(np.arange(len(groups)))
        ax.set_xticklabels([str(g).replace(", ", "\n") for g in groups], fontsize=8)
        ax.set_xlabel(group_label)
        ax.set_ylabel(f"estimate of {PARAM_LABELS[param]}")
        ax.grid(axis="y", alpha=0.3)
        if param in ("sigma2", "beta", "delta"):
            ax.set_yscale("log")
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor=COLORS["low-rank"], alpha=0.6, label="low-rank (full local covariance)"),
               Patch(facecolor=COLORS["independence"], alpha=0.6, label="independence"),
               Line2D([], [], color="red", label="true value"),
               Line2D([], [], marker="^", color="green", linestyle="", label="Monte Carlo mean")]
    fig.legend(handles=handles, loc="upper center", ncol=4, bbox_to_anchor=(0.5, 0.955), fontsize=9)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.92))
    return fig


def convergence_figure(trace, summary, panels: list, title: str, labels: dict | None = None,
                       panel_cores: dict | None = None, value: str = "error", modes=None, ylabel=None,
                       colors: dict | None = None, styles: dict | None = None, notes: dict | None = None,
                       mode_column: str = "mode"):
    """One column per panel: (optional) bar chart of cores per worker on top, the convergence curves below
    (y log scale: max relative parameter error against the reference, or the prediction RMSE).

    The curves are the values of trace[mode_column] (`modes`, in that order). styles: {curve: {"color",
    "linestyle"}} (then one legend for the figure, below the panels); notes: {panel: text} in the panel's top right
    corner."""
    from matplotlib.figure import Figure

    n = len(panels)
    top = panel_cores is not None
    wrap = not top and n > 4          # many panels without core bars: two rows
    ncols = math.ceil(n / 2) if wrap else n
    fig = Figure(figsize=(3.8 * ncols + 0.6, 6.2 if top else (7.2 if wrap else 4.0)))
    grid = fig.subplots(2 if top or wrap else 1, ncols, squeeze=False,
                        gridspec_kw={"height_ratios": [1, 2.4]} if top else None)
    modes = modes or list(dict.fromkeys(trace[mode_column]))
    cmap = dict(colors or {})
    cmap.update({k: v["color"] for k, v in (styles or {}).items()})
    dash = {k: v.get("linestyle", "-") for k, v in (styles or {}).items()}
    palette = ["#444444", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    for c, panel in enumerate(panels):
        if top:
            ax = grid[0, c]
            cores = np.asarray(panel_cores[panel], dtype=float)
            ax.bar(np.arange(cores.size), cores, color="#7f7f7f")
            ax.set_ylim(0, MAX_CORES * 1.08)
            ax.set_xlabel("worker", fontsize=8)
            ax.set_ylabel("cores", fontsize=8)
            ax.set_title((labels or {}).get(panel, panel), fontsize=10)
            ax.tick_params(labelsize=7)
            from matplotlib.ticker import MaxNLocator

            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax = grid[c // ncols, c % ncols] if wrap else grid[-1, c]
        for k, mode in enumerate(modes):
            d = trace[(trace.panel == panel) & (trace[mode_column] == mode)].sort_values("time_s")
            if d.empty:
                continue
            y = np.maximum(d[value].to_numpy(), 1e-8) if value == "error" else d[value].to_numpy()
            ax.plot(d["time_s"], y, label=mode, color=cmap.get(mode, COLORS.get(mode, palette[k % len(palette)])),
                    linewidth=1.4, drawstyle="steps-post", linestyle=dash.get(mode, "-"))
            s = summary[(summary.panel == panel) & (summary[mode_column] == mode)]
            if value == "error" and len(s) and s["settle_s"].notna().all():
                ax.axvline(float(s["settle_s"].iloc[0]), color=cmap.get(mode, COLORS.get(mode, palette[k])),
                           linestyle=":", linewidth=1)
        if value == "error":
            ax.set_yscale("log")
            ax.axhline(1e-3, color="grey", linewidth=0.8, linestyle="--")
            if ax.get_ylim()[1] > 1e4:   # a diverging arm leaves through the top instead of squashing the rest
                ax.set_ylim(top=1e4)
        ax.set_xlabel("virtual time (s)" if "wall" not in title else "wall time (s)")
        if c % ncols == 0:
            ax.set_ylabel(ylabel or "max relative parameter error\nvs converged estimate")
        if not top:
            ax.set_title((labels or {}).get(panel, panel), fontsize=10)
        ax.grid(alpha=0.3)
        if notes and notes.get(panel):
            ax.text(0.98, 0.98, notes[panel], transform=ax.transAxes, ha="right", va="top", fontsize=8,
                    bbox={"facecolor": "white", "alpha": 0.85, "edgecolor": "#bbbbbb"})
        if c == 0 and not styles:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    if styles:
        found = {}
        for ax in grid.ravel():
            for h, name in zip(*ax.get_legend_handles_labels()):
                found.setdefault(name, h)
        names = [m for m in modes if m in found]
        ncol = len(names) if len(names) <= 5 else math.ceil(len(names) / 2)
        rows = math.ceil(len(names) / max(ncol, 1))
        fig.tight_layout(rect=(0, (0.1 + 0.2 * rows) / fig.get_figheight(), 1, 1))
        fig.legend([found[m] for m in names], names, loc="lower center", ncol=max(ncol, 1), fontsize=9,
                   bbox_to_anchor=(0.5, 0.0), frameon=False)
    else:
        fig.tight_layout()
    return fig
