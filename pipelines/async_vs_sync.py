"""Figures 5–12 of the paper (Section 6.2): asynchronous against synchronous fitting of the low-rank model.

    python pipelines/async_vs_sync.py --figure 5|6|7|8|9|10|11|12 [--quick|--full] [--out DIR] [--replot]
                                      [--runtime virtual|dask] [--preset stats|tuned|paper|basic]
                                      [--beside paper|stats|tuned|basic|none]

(`fig5_ablation.py` … `fig12_partitions.py` are the same with the figure fixed.) Each panel simulates one SPEC §7
data set (full local covariance, ν = 0.5, β = 0.1 unless the figure varies them), computes the reference estimate
(a synchronous fit run to tol 1e-10) and runs the synchronous and the asynchronous algorithm with the workers slowed
by 62 / cores (the paper's cores per worker). The default runtime is the virtual clock (`FlopCost`: reproducible,
independent of this machine's load); `--runtime dask` runs real fits on an embedded Dask cluster with the slowdowns
emulated (wall-clock seconds; on a 2-core machine the workers share cores, so wall times mix in contention).

Presets: `--preset` (default: the library's DEFAULT_PRESET, `stats`: one round trip of sufficient statistics per
iteration, SPEC §2b) is drawn beside `--beside` (default `paper`: the seed paper's block scheme, Eqs. 15, 18, 19 with
Remark 8's values; `none`: one preset only). Each panel shows the synchronous (dashed) and asynchronous (solid) curve
of each preset in the preset's colour, and the async/sync settle-time ratio of each preset in its corner.

Convergence is the maximum relative error of (δ, σ², β, γ₁..γ₅) against the reference over time; "settle time"
is the time from which it stays ≤ 1e-3. Writes trace.csv (one row per theta aggregation or statistics step),
summary.csv (per panel, preset and mode: settle time, iterations, round trips (stats), final error, and
`ratio_vs_sync` = async settle / sync settle of the same preset; rmse.csv for Figure 9) and fig<N>_*.png.

Figure 7 also runs the block presets' asynchronous algorithm with VAFL's staleness bound D = 10 ("async, bounded
staleness": quantities older than D iterations are discarded and re-asked; docs/algorithm.md); the stats preset has
no staleness bound (its stale sites enter as second-order Taylor models) and refuses one.

Figure 5 (strategy ablation) runs, for Agg_threshold 2, 4 and 8 under the graded profile, the paper's asynchronous
algorithm (block scheme) with no strategy, each strategy alone and all three, every arm with the same fixed step size
α (`--alpha`, default 1: the synchronous step) so that only the strategies differ. These strategies do not exist in
the stats scheme (it refuses them), so the stats default enters each panel as two reference arms, "stats sync" and
"stats async" with its own settings (Agg_threshold 1: it is the same run in every panel).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex
import numpy as np
from spatialfed.algorithm.config import DEFAULT_PRESET

NAMES = {5: "fig5_ablation", 6: "fig6_imbalance", 7: "fig7_unequal_sizes", 8: "fig8_worker_counts",
         9: "fig9_prediction", 10: "fig10_local_sizes", 11: "fig11_kernels", 12: "fig12_partitions"}
TITLES = {5: "Figure 5: asynchronous strategies (graded cores 62→3)",
          6: "Figure 6: async vs sync under core imbalance",
          7: "Figure 7: async vs sync with unequal local sizes (graded cores)",
          8: "Figure 8: async vs sync across worker counts (graded cores)",
          9: "Figure 9: prediction RMSE at held-out points over time",
          10: "Figure 10: async vs sync across local sample sizes (graded cores)",
          11: "Figure 11: async vs sync across kernels (graded cores)",
          12: "Figure 12: async vs sync across partition schemes (graded cores)"}
QUICK = {"J": 10, "n": 200, "m": 100, "max_iter": 1500, "tol": 1e-6, "imbalance": (62, 31, 12, 3),
         "sizes_range": (100, 300), "Js": (5, 10, 20), "ns": (150, 200, 300), "agg": (2, 4, 8), "m_pred": 100,
         "test_size": 100, "area_J": 9, "max_iter_ablation": 200, "staleness_bound": 10}
FULL = {"J": 10, "n": 5000, "m": 100, "max_iter": 3000, "tol": 1e-7, "imbalance": (62, 31, 12, 3),
        "sizes_range": (2500, 7500), "Js": (5, 20, 40), "ns": (6000, 8000, 10000), "agg": (2, 4, 8), "m_pred": 500,
        "test_size": 100, "area_J": 9, "staleness_bound": 10}
KERNELS = [(0.5, 0.1), (0.5, 0.3), (0.5, 0.7), (1.5, 0.1), (1.5, 0.3), (1.5, 0.7)]   # (ν, effective range)
BESIDE = "paper"        # the preset drawn beside --preset unless --beside says otherwise
#: Figure 5's reference arms (the stats default's runs, the same in every panel): panel id of their tasks
REFERENCE = "reference"
PRESET_COLORS = {"stats": "#1f77b4", "paper": "#d62728", "tuned": "#2ca02c", "basic": "#9467bd"}
MODE_STYLES = {"sync": "--", "async": "-", ex.BOUNDED: "-."}
ARM_COLORS = dict(zip(ex.ABLATION_ARMS, ["#7f7f7f", "#ff7f0e", "#2ca02c", "#9467bd", "#d62728"]))


def presets_of(preset: str, beside: str | None = BESIDE) -> list[str]:
    """The presets a figure shows: `preset`, then `beside` unless it is None, "none" or the same."""
    for name in (preset, beside):
        if name not in (None, "none") and name not in ex.PRESETS:
            raise ex.ConfigError(f"unknown preset {name!r}; choose one of {ex.PRESETS}")
    return [preset] + ([beside] if beside not in (None, "none", preset) else [])


def with_ratios(summary):
    """summary plus `ratio_vs_sync`: settle time of each asynchronous row / the same panel's and preset's
    synchronous settle time (NaN when either never settles, or for Figure 5's arms, which have no sync run)."""
    import pandas as pd

    summary = summary.copy()
    summary["settle_s"] = pd.to_numeric(summary["settle_s"], errors="coerce")
    sync = summary[summary["mode"] == "sync"].set_index(["panel", "preset"])["settle_s"]
    sync = sync[~sync.index.duplicated()]

    def ratio(row):
        if row["mode"] == "sync" or row["mode"] not in MODE_STYLES or (row["panel"], row["preset"]) not in sync.index:
            return np.nan
        a, b = row["settle_s"], sync[(row["panel"], row["preset"])]
        return float(a) / float(b) if np.isfinite(a) and np.isfinite(b) and b > 0 else np.nan

    summary["ratio_vs_sync"] = [ratio(r) for _, r in summary.iterrows()] if len(summary) else []
    return summary


def ratio_note(summary, panel, presets) -> str:
    """'async/sync settle: stats 0.65 · paper 1.58' for one panel (n.s.: a run that never settles)."""
    parts = []
    for preset in presets:
        s = summary[(summary.panel == panel) & (summary.preset == preset)].set_index("mode")
        if not {"sync", "async"} <= set(s.index):
            continue
        a, b = s.at["async", "settle_s"], s.at["sync", "settle_s"]
        text = (f"{a / b:.2f}" if np.isfinite(a) and np.isfinite(b) else
                "async n.s." if np.isfinite(b) else "sync n.s.")
        parts.append(f"{preset} {text}")
    return ("async/sync settle\n" + "\n".join(parts)) if parts else ""


def panels_for(figure: int, c: dict, preset, alpha: float, seed: int, profile: str = "graded"):
    """[(panel id, label, task)] for one figure, one task per panel, preset and mode (Figure 5: per arm, plus the
    reference arms of every preset but "paper" under panel REFERENCE); `preset` is a name or a list of names.
    Validates the configuration."""
    presets = [preset] if isinstance(preset, str) else list(preset)
    for name in presets:
        presets_of(name, None)
    J, n = ex.positive_int(c["J"], "J"), ex.positive_int(c["n"], "n_j")
    m = ex.check_knots(c["m"], J * n)
    max_iter = ex.positive_int(c["max_iter"] if figure != 5 else c.get("max_iter_ablation", c["max_iter"]),
                               "max_iter")
    common = {"fn": "convergence_run", "experiment": NAMES[figure], "m": m, "max_iter": max_iter, "tol": c["tol"],
              "seed": seed}
    graded = ex.profile_cores(profile, J)
    out = []
    if figure == 5:
        for A in c["agg"]:
            A = ex.positive_int(A, "Agg_threshold")
            if A > J:
                raise ex.ConfigError(f"Agg_threshold {A} exceeds the number of workers J = {J}")
            for arm, flags in ex.ABLATION_ARMS.items():
                out.append((f"A={A}", f"Agg_threshold = {A}", dict(common, panel=f"A={A}", J=J, n=n, cores=graded,
                                                                 agg_threshold=A, arms={arm: flags}, alpha=alpha,
                                                                 preset="paper", cost=J * n**3)))
        ref_max_iter = ex.positive_int(c["max_iter"], "max_iter")
        out += [(REFERENCE, "reference arms", dict(common, panel=REFERENCE, J=J, n=n, cores=graded, preset=p,
                                                   modes=(mode,), max_iter=ref_max_iter, cost=J * n**3))
                for p in presets if p != "paper" for mode in ("sync", "async")]
    elif figure in (6, 9):
        for low in c["imbalance"]:
            cores = ex.graded_cores(J, float(low))
            ex.slowdowns_from_cores(cores)
            label = "balanced (62 cores each)" if low == ex.MAX_CORES else f"cores 62→{low:g}"
            task = dict(common, panel=f"min{low:g}", J=J, n=n, cores=cores, cost=J * n**3)
            if figure == 9:
                task.update(m=ex.check_knots(c["m_pred"], J * n), test_size=ex.positive_int(c["test_size"],
                                                                                           "test size"))
            out.append((f"min{low:g}", label, task))
    elif figure == 7:
        lo, hi = (ex.positive_int(v, "local size") for v in c["sizes_range"])
        desc = np.linspace(hi, lo, J).round().astype(int)         # graded cores are descending: worker 0 fastest
        rng = np.random.default_rng(seed + 7)
        layouts = {"aligned": desc, "unaligned": rng.permutation(desc), "inverse": desc[::-1]}
        for name, sizes in layouts.items():
            more = {"aligned": "more", "inverse": "fewer"}.get(name, "random")
            out.append((name, f"{name}: more cores ↔ {more} data",
                        dict(common, panel=name, sizes=[int(s) for s in sizes], cores=graded,
                             m=ex.check_knots(c["m"], int(sizes.sum())), cost=float(np.sum(sizes.astype(float)**3)))))
    elif figure == 8:
        for Jp in c["Js"]:
            Jp = ex.positive_int(Jp, "J")
            out.append((f"J={Jp}", f"J = {Jp} workers", dict(common, panel=f"J={Jp}", J=Jp, n=n,
                                                            m=ex.check_knots(c["m"], Jp * n),
                                                            cores=ex.profile_cores(profile, Jp), cost=Jp * n**3)))
    elif figure == 10:
        for nj in c["ns"]:
            nj = ex.positive_int(nj, "n_j")
            out.append((f"n={nj}", f"n_j = {nj}", dict(common, panel=f"n={nj}", J=J, n=nj, cores=graded,
                                                      cost=J * nj**3)))
    elif figure == 11:
        for nu, rng_ in KERNELS:
            beta = ex.beta_for_range(nu, rng_)
            out.append((f"nu={nu},r={rng_}", f"ν = {nu}, β = {beta:.3f} (range {rng_})",
                        dict(common, panel=f"nu={nu},r={rng_}", J=J, n=n, nu=nu, beta=beta, cores=graded,
                             cost=J * n**3)))
    elif figure == 12:
        for scheme in ex.PARTITIONS:
            Jp = ex.positive_int(c["area_J"], "J for the area partition") if scheme == "area" else J
            out.append((scheme, f"{scheme} partition (J = {Jp})",
                        dict(common, panel=scheme, J=Jp, n=n, partition=scheme, cores=ex.profile_cores(profile, Jp),
                             m=ex.check_knots(c["m"], Jp * n), cost=Jp * n**3)))
    else:
        raise ex.ConfigError(f"unknown figure {figure}; choose one of {sorted(NAMES)}")
    if figure != 5:   # one task per preset and mode: more parallelism (each recomputes the cheap reference fit)
        D = ex.positive_int(c["staleness_bound"], "staleness bound D") if figure == 7 else None

        def modes(p):   # Figure 7: also VAFL's bound D, a block-scheme setting (the stats preset refuses it)
            return ("sync", "async") + ((ex.BOUNDED,) if figure == 7 and p != "stats" else ())

        out = [(pid, lab, dict(t, preset=p, modes=(mode,), staleness_bound=D if mode == ex.BOUNDED else None))
               for pid, lab, t in out for p in presets for mode in modes(p)]
    return out


def run_dask(tasks, workers):
    """The same panels on an embedded Dask cluster (FederatedGP, runtime='dask', slowdowns emulated)."""
    import tempfile

    from spatialfed.algorithm.config import FitConfig
    from spatialfed.api import FederatedGP
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.data.simulate import simulate_store
    from spatialfed.data.store import load_worker
    from spatialfed.model.matern import Matern
    from spatialfed.runtime.cluster import make_cluster
    from spatialfed.runtime.virtual import run_virtual

    rows, refs = [], {}
    with tempfile.TemporaryDirectory() as tmp, make_cluster(None, n_workers=workers) as handle:
        for task in tasks:
            if task.get("modes") != ("sync",):
                continue   # run_dask fits sync and async for the panel of the ("sync",) task (not the bounded one)
            if task.get("arms") or task.get("test_size"):
                raise ex.ConfigError("--runtime dask covers the async-vs-sync convergence figures (6–8, 10–12); "
                                     "Figures 5 and 9 need the virtual clock")
            store = Path(tmp) / f"{task['panel']}.zarr".replace("=", "_").replace(",", "_")
            kw = {"nu": task.get("nu", 0.5), "beta": task.get("beta", 0.1),
                  "partition": task.get("partition", "random"),
                      "seed": task["seed"]}
            kernel = Matern(kw["nu"])
            knots = jittered_unit_grid(task["m"], seed=task["seed"] + 10_000)
            if task["panel"] not in refs:   # one store and reference per panel, shared by its presets
                if task.get("sizes") is not None:
                    info = simulate_store(store, sizes=task["sizes"], **kw)
                else:
                    info = simulate_store(store, task["J"], task["n"], **kw)
                parts = [load_worker(info.path, j) for j in range(info.n_workers)]
                ref = run_virtual(ex._parts_models(parts, knots, kernel), knots, kernel,
                                  FitConfig.of(mode="sync", max_iter=100, tol=1e-10)).params
                refs[task["panel"]] = (info.n_workers, {"gamma": ref.gamma, "delta": ref.delta,
                                                        "sigma2": ref.sigma2, "beta": ref.beta})
            J, ref = refs[task["panel"]]
            slow = ex.slowdowns_from_cores(task["cores"]).tolist()
            preset = task["preset"]
            base = {"experiment": task["experiment"], "panel": task["panel"], "preset": preset, "J": J,
                    "m": task["m"]}
            for mode in ("sync", "async"):
                gp = FederatedGP(mode=mode, residual="full", knots=knots, nu=kw["nu"], max_iter=task["max_iter"],
                                 tol=task["tol"], runtime="dask", slowdown=slow, client=handle.client, seed=0,
                                 preset=preset, progress=False).fit(str(store))
                tr = [r for r in gp.trace_ if r["step"] in ex.THETA_STEPS]
                times = np.array([r["time_s"] for r in tr])
                errs = np.array([ex.max_rel_error(r, ref) for r in tr])
                rows += [{**base, "kind": "trace", "mode": mode, "time_s": t, "error": e} for t, e in zip(times, errs)]
                rows.append({**base, "kind": "summary", "mode": mode, "settle_s": ex.settle(times, errs, 1e-3),
                             "iterations": gp.n_iter_, "final_error": float(errs[-1]), "end_s": float(times[-1]),
                             "stop_reason": gp.stop_reason_, "slowdowns": " ".join(f"{v:.3g}" for v in slow)})
                ex.say(f"dask {task['panel']} {mode}: {gp.n_iter_} iterations, {times[-1]:.1f} s")
    return rows


def spread_reference(df, panels):
    """Figure 5: the REFERENCE rows (the stats default's runs, one data set for every panel) copied into each panel."""
    import pandas as pd

    ref = df[df.panel == REFERENCE]
    rest = df[df.panel != REFERENCE]
    return pd.concat([rest] + [ref.assign(panel=p) for p in panels], ignore_index=True) if len(ref) else df


def series_styles(figure: int, presets: list[str], series) -> dict:
    """{series: {"color", "linestyle"}}: colour = preset (Figure 5's arms: the arm), line style = mode."""
    styles = {}
    for name in series:
        if name in ARM_COLORS:
            styles[name] = {"color": ARM_COLORS[name], "linestyle": "-"}
            continue
        preset, mode = name.split(" ", 1)
        styles[name] = {"color": PRESET_COLORS.get(preset, "#8c564b"), "linestyle": MODE_STYLES.get(mode, "-")}
    return styles


def run(figure: int, c: dict, out: Path, workers: int, preset: str = DEFAULT_PRESET, alpha: float = 1.0,
        seed: int = 0, runtime: str = "virtual", publish=None, profile: str = "graded", replot: bool = False,
        beside: str | None = BESIDE):
    """Run one figure into out/ (replot: redraw from out/'s CSV files); returns (trace, summary) DataFrames.
    `preset` and `beside`: presets_of."""
    import pandas as pd

    presets = presets_of(preset, beside)
    panels = panels_for(figure, c, presets, alpha, seed, profile)
    tasks = [t for _, _, t in panels]
    ids = [p for p in dict.fromkeys(p for p, _, _ in panels) if p != REFERENCE]
    if replot:
        parts = [pd.read_csv(out / f) for f in ("trace.csv", "summary.csv", "rmse.csv") if (out / f).exists()]
        df = pd.concat(parts, ignore_index=True)
        if "preset" not in df:   # written before the preset column: one preset
            df["preset"] = preset
    else:
        ex.say(f"{NAMES[figure]}: {len(tasks)} tasks on {workers} worker(s), runtime {runtime}, presets {presets}")
        rows = (run_dask(tasks, workers) if runtime == "dask"
                else ex.run_tasks(tasks, workers, NAMES[figure]))
        df = spread_reference(pd.DataFrame(rows), ids)
    df["series"] = np.where(df["mode"].isin(list(MODE_STYLES)), df["preset"].astype(str) + " " + df["mode"],
                            df["mode"])
    trace = df[df.kind == "trace"].dropna(axis=1, how="all")
    summary = with_ratios(df[df.kind == "summary"].dropna(axis=1, how="all"))
    if not replot:
        trace.to_csv(out / "trace.csv", index=False)
        summary.to_csv(out / "summary.csv", index=False)
    labels = {p: lab for p, lab, _ in panels}
    cores = {p: t["cores"] for p, _, t in panels}
    clock = "wall" if runtime == "dask" else "virtual"
    shown = list(dict.fromkeys(summary["series"]))
    if figure == 5:
        shown = [a for a in ex.ABLATION_ARMS if a in shown] + [s for s in shown if s not in ex.ABLATION_ARMS]
    styles = series_styles(figure, presets, shown)
    refs = [p for p in presets if p != "paper"]
    notes = {p: ratio_note(summary, p, refs if figure == 5 else presets) for p in ids}
    plot = {"modes": shown, "styles": styles, "notes": notes, "mode_column": "series"}
    if figure == 5:
        ref = (f";\n{' and '.join(refs)} preset (sync dashed, async solid, its own Agg_threshold: the same runs in "
               "every panel) as reference" if refs else "")
        title = (f"{TITLES[figure]} — {clock} clock\nthe paper's strategies (block scheme), every arm α = {alpha:g}"
                 f"{ref}")
        fig = ex.convergence_figure(trace, summary, ids, title, labels, None, **plot)
    else:
        title = (f"{TITLES[figure]} — {clock} clock\n{' beside '.join(presets)} preset"
                 f"{'s' if len(presets) > 1 else ''}: async solid, sync dashed")
        if figure == 9:
            rm = df[df.kind == "rmse"].dropna(axis=1, how="all")
            if not replot:
                rm.to_csv(out / "rmse.csv", index=False)
            fig = ex.convergence_figure(rm, summary, ids, title, labels, cores, value="rmse",
                                        ylabel="prediction RMSE at 100 held-out points", **plot)
        else:
            fig = ex.convergence_figure(trace, summary, ids, title, labels, None if figure == 11 else cores, **plot)
    ex.save(fig, out / f"{NAMES[figure]}.png", publish)
    return trace, summary


def main(argv=None, figure: int | None = None) -> int:
    ap = ex.base_parser(__doc__.splitlines()[0], "J = 10, n_j = 200, m = 100 (about 1–3 min on 2 cores)",
                        "the paper's sizes (n_j = 5000 and more: hours on the virtual clock)",
                        replicates=False, runtime=True)
    if figure is None:
        ap.add_argument("--figure", type=int, choices=sorted(NAMES), required=True)
    ap.add_argument("--profile", default="graded",
                    help="cores per worker for Figures 5, 7, 8, 10–12: graded (62→3, default), graded:<min cores>, "
                         "straggler or balanced (Figures 6 and 9 sweep the imbalance themselves)")
    ap.add_argument("--replot", action="store_true", help="redraw the figure from the CSV files in --out")
    ap.add_argument("--alpha", type=float, default=1.0, help="Figure 5: the fixed step size of every arm (default 1)")
    ap.add_argument("--beside", default=BESIDE, choices=list(ex.PRESETS) + ["none"],
                    help=f"the preset drawn beside --preset in every panel (default {BESIDE}; none: only --preset)")
    args = ap.parse_args(argv)
    fig_no = figure or args.figure
    args = ex.finish_args(args, NAMES[fig_no])
    if not 0 < args.alpha <= 1:
        ex.fail(f"--alpha must be in (0, 1], got {args.alpha}")
    c = dict(FULL if args.full else QUICK)
    tic = time.perf_counter()
    try:
        _, summary = run(fig_no, c, args.out, args.workers, args.preset, args.alpha, args.seed, args.runtime,
                         args.publish, args.profile, args.replot, args.beside)
    except ex.ConfigError as e:
        ex.fail(str(e))
    cols = [k for k in ("panel", "preset", "mode", "settle_s", "ratio_vs_sync", "iterations", "rounds", "final_error",
                        "max_error_late", "end_s")
            if k in summary]
    print(summary[cols].to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"done in {time.perf_counter() - tic:.0f} s; outputs in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
