"""Figures 1–3 of the paper (Section 6.1): low-rank against independence, boxplots of σ², β, δ and mean γ.

    python pipelines/lowrank_vs_independent.py --figure 1|2|3 [--quick|--full] [--out DIR] [--replicates R]

(`fig1_kernels.py`, `fig2_local_sizes.py`, `fig3_worker_counts.py` are the same with the figure fixed.)
Each replicate simulates the SPEC §7 data (p = 5 covariates, γ = (−1, 2, 1, 1, 1), δ = 0.25, σ² = 1, random
partition), and fits the low-rank model (full local covariance, m jittered knots) and the independence model
(Eq. 3, the same federated server with m = 0) synchronously. Writes estimates.csv (one row per replicate and model),
rmse.csv (Monte Carlo bias/sd/RMSE per group, model and parameter) and fig<N>_*.png.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex
import numpy as np

RANGES = (0.1, 0.3, 0.7)
SETTINGS = {
    1: {"name": "fig1_kernels", "title": "Figure 1: estimates across kernels (ν, effective range)",
        "quick": {"J": 10, "n": 100, "m": 100, "nus": (0.5, 1.5, 2.5), "replicates": 6},
        "full": {"J": 10, "n": 100, "m": 100, "nus": (0.5, 1.5, 2.5), "replicates": 100}},
    2: {"name": "fig2_local_sizes", "title": "Figure 2: estimates across local sample sizes n_j (m = n_j)",
        "quick": {"J": 10, "ns": (100, 150, 200), "nu": 2.5, "range": 0.3, "replicates": 8},
        "full": {"J": 10, "ns": (200, 400, 800), "nu": 2.5, "range": 0.3, "replicates": 100}},
    3: {"name": "fig3_worker_counts", "title": "Figure 3: estimates across worker counts J",
        "quick": {"Js": (10, 20, 40), "n": 50, "m": 100, "nu": 2.5, "range": 0.3, "replicates": 6},
        "full": {"Js": (10, 20, 40, 80), "n": 100, "m": 200, "nu": 2.5, "range": 0.3, "replicates": 100}},
}


def groups_and_tasks(figure: int, cfg: dict, seed: int):
    """(groups in plot order, truth per group, tasks) for one figure; validates the configuration."""
    R = ex.positive_int(cfg["replicates"], "replicates")
    tasks, groups, betas = [], [], {}
    if figure == 1:
        J, n = ex.positive_int(cfg["J"], "J"), ex.positive_int(cfg["n"], "n_j")
        m = ex.check_knots(cfg["m"], J * n)
        for nu in cfg["nus"]:
            nu = ex.check_nu(nu)
            for rng in RANGES:
                g = f"ν={nu}, range {rng}"
                groups.append(g)
                betas[g] = ex.beta_for_range(nu, rng)
                tasks += [{"fn": "fit_pair", "group": g, "nu": nu, "beta": betas[g], "J": J, "n": n, "m": m,
                           "seed": seed + r,
                               "cost": J * n**3} for r in range(R)]
    elif figure == 2:
        J, nu = ex.positive_int(cfg["J"], "J"), ex.check_nu(cfg["nu"])
        beta = ex.beta_for_range(nu, cfg["range"])
        for n in cfg["ns"]:
            n = ex.positive_int(n, "n_j")
            m = ex.check_knots(cfg.get("m") or n, J * n)
            g = f"n_j={n}, m={m}"
            groups.append(g)
            betas[g] = beta
            tasks += [{"fn": "fit_pair", "group": g, "nu": nu, "beta": beta, "J": J, "n": n, "m": m, "seed": seed + r,
                           "cost": J * n**3} for r in range(R)]
    else:
        n, nu = ex.positive_int(cfg["n"], "n_j"), ex.check_nu(cfg["nu"])
        beta = ex.beta_for_range(nu, cfg["range"])
        for J in cfg["Js"]:
            J = ex.positive_int(J, "J")
            m = ex.check_knots(cfg["m"], J * n)
            g = f"J={J}"
            groups.append(g)
            betas[g] = beta
            tasks += [{"fn": "fit_pair", "group": g, "nu": nu, "beta": beta, "J": J, "n": n, "m": m, "seed": seed + r,
                           "cost": J * n**3 + m**3} for r in range(R)]
    return groups, betas, tasks


def summarise(df):
    """Monte Carlo bias, sd and RMSE of each parameter per group and model."""
    import pandas as pd

    rows = []
    for (g, model), d in df.groupby(["group", "model"], sort=False):
        truth = {"sigma2": ex.SIGMA2, "beta": float(d.beta_true.iloc[0]), "delta": ex.DELTA,
                 "gamma_mean": float(np.mean(ex.GAMMA))}
        for param, t in truth.items():
            x = d[param].to_numpy()
            rows.append({"group": g, "model": model, "param": param, "truth": t, "mean": x.mean(),
                         "bias": x.mean() - t, "sd": x.std(ddof=1) if len(x) > 1 else 0.0,
                         "rmse": float(np.sqrt(np.mean((x - t) ** 2))), "replicates": len(x)})
    return pd.DataFrame(rows)


def run(figure: int, cfg: dict, out: Path, workers: int, seed: int = 0, publish=None):
    """Run one figure's experiment into out/; returns (estimates, rmse) DataFrames."""
    spec = SETTINGS[figure]
    groups, betas, tasks = groups_and_tasks(figure, cfg, seed)
    ex.say(f"{spec['name']}: {len(tasks)} replicate fits on {workers} worker(s)")
    rows = ex.run_tasks(tasks, workers, spec["name"])
    df = ex.write_csv(out / "estimates.csv", rows)
    rmse = summarise(df)
    rmse.to_csv(out / "rmse.csv", index=False)
    truth = {"sigma2": ex.SIGMA2, "beta": betas, "delta": ex.DELTA, "gamma_mean": float(np.mean(ex.GAMMA))}
    R = cfg["replicates"]
    fig = ex.boxplot_figure(df, groups, {1: "kernel (smoothness ν, effective range)", 2: "local sample size",
                                         3: "number of workers"}[figure],
                            f"{spec['title']} — {R} replicates", truth)
    ex.save(fig, out / f"{spec['name']}.png", publish)
    return df, rmse


def main(argv=None, figure: int | None = None) -> int:
    doc = __doc__.splitlines()[0]
    ap = ex.base_parser(doc, "sizes in SETTINGS['quick'] (about 1–2 min on 2 cores)",
                        "the paper's sizes (100 replicates; Figure 2 with n_j = 800 takes hours)")
    if figure is None:
        ap.add_argument("--figure", type=int, choices=(1, 2, 3), required=True)
    args = ap.parse_args(argv)
    fig_no = figure or args.figure
    args = ex.finish_args(args, SETTINGS[fig_no]["name"])
    cfg = dict(SETTINGS[fig_no]["full" if args.full else "quick"])
    if args.replicates is not None:
        cfg["replicates"] = args.replicates
    tic = time.perf_counter()
    try:
        _, rmse = run(fig_no, cfg, args.out, args.workers, args.seed, args.publish)
    except ex.ConfigError as e:
        ex.fail(str(e))
    table = rmse[rmse.param.isin(["sigma2", "beta"])].pivot_table(index=["group", "param"], columns="model",
                                                                   values="rmse", sort=False)
    print(f"Monte Carlo RMSE (σ², β):\n{table.to_string(float_format=lambda v: f'{v:.4f}')}")
    print(f"done in {time.perf_counter() - tic:.0f} s; outputs in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
