"""Figure 4 of the paper (Proposition 4): normalised KL divergence from the GP to the low-rank model (full local
covariance) against the number of knots m, with the independence model as the reference.

    python pipelines/kl_divergence.py [--quick|--full] [--out DIR] [--replicates R] [--knots 10,20,50,100,200]

Each replicate draws jittered-grid locations (J workers × n_j, random partition) and, for every m, jittered knots;
KL_N(P‖Q) = [tr(C_Q⁻¹C) − N + log det C_Q − log det C] / (2N) for the latent covariances (σ² = 1, ν = 2.5,
β = 0.113 i.e. effective range 0.3) with a nugget of 1e-3 added to both covariances for conditioning (the smooth
ν = 2.5 kernel makes the N × N covariance numerically singular otherwise; the paper's case is nugget 0).
Writes kl.csv (columns m, kl_lowrank, kl_independent; one row per m and replicate) and fig4_kl_divergence.png.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import experiments as ex
import numpy as np

QUICK = {"J": 10, "n": 100, "ms": (10, 20, 50, 100, 200), "nu": 2.5, "range": 0.3, "replicates": 10}
FULL = {"J": 10, "n": 100, "ms": (10, 20, 50, 100, 200), "nu": 2.5, "range": 0.3, "replicates": 100}


def tasks_for(c: dict, seed: int = 0, nugget: float = ex.KL_NUGGET) -> list[dict]:
    """One task per replicate; validates the configuration."""
    J, n = ex.positive_int(c["J"], "J"), ex.positive_int(c["n"], "n_j")
    R = ex.positive_int(c["replicates"], "replicates")
    ms = [ex.check_knots(m, J * n) for m in c["ms"]]
    if not ms:
        raise ex.ConfigError("give at least one knot count")
    nu = ex.check_nu(c["nu"])
    beta = ex.beta_for_range(nu, ex.positive_float(c["range"], "effective range"))
    if not nugget >= 0:
        raise ex.ConfigError(f"nugget must be ≥ 0, got {nugget}")
    return [{"fn": "kl_replicate", "ms": ms, "nu": nu, "beta": beta, "J": J, "n": n, "seed": seed + r,
             "nugget": nugget, "cost": 1.0}
            for r in range(R)]


def figure(df, title: str):
    from matplotlib.figure import Figure

    ms = sorted(df.m.unique())
    fig = Figure(figsize=(8, 4.8))
    ax = fig.subplots()
    data = [df[df.m == m].kl_lowrank.to_numpy() for m in ms]
    ax.boxplot(data, positions=np.arange(len(ms)), widths=0.5, patch_artist=True, showmeans=True,
               boxprops={"facecolor": ex.COLORS["low-rank"], "alpha": 0.6},
               meanprops={"marker": "^", "markerfacecolor": "green", "markeredgecolor": "green"})
    ind = df.groupby("seed").kl_independent.first().to_numpy()
    ax.boxplot([ind], positions=[len(ms)], widths=0.5, patch_artist=True, showmeans=True,
               boxprops={"facecolor": ex.COLORS["independence"], "alpha": 0.6},
               meanprops={"marker": "^", "markerfacecolor": "green", "markeredgecolor": "green"})
    ax.set_xticks(np.arange(len(ms) + 1))
    ax.set_xticklabels([f"low-rank\nm = {m}" for m in ms] + ["independence\n(no knots)"], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("normalised KL divergence from the GP (nats per observation)")
    ax.set_xlabel("model")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def run(c: dict, out: Path, workers: int, seed: int = 0, publish=None):
    tasks = tasks_for(c, seed)
    rows = ex.run_tasks(tasks, workers, "kl_divergence")
    df = ex.write_csv(out / "kl.csv", rows, ["m", "kl_lowrank", "kl_independent"])
    df["seed"] = [r["seed"] for r in rows]
    fig = figure(df, f"Figure 4: KL divergence vs knots (J = {c['J']}, n_j = {c['n']}, ν = {c['nu']}, "
                     f"range {c['range']}, nugget {ex.KL_NUGGET:g}; {c['replicates']} replicates)")
    ex.save(fig, out / "fig4_kl_divergence.png", publish)
    return df


def main(argv=None) -> int:
    ap = ex.base_parser(__doc__.splitlines()[0], "10 replicates of J = 10 × n_j = 100 (under a minute)",
                        "100 replicates (the paper's setting)")
    ap.add_argument("--knots", default=None, help="comma-separated knot counts (default 10,20,50,100,200)")
    args = ex.finish_args(ap.parse_args(argv), "kl_divergence")
    c = dict(FULL if args.full else QUICK)
    if args.replicates is not None:
        c["replicates"] = args.replicates
    if args.knots is not None:
        try:
            c["ms"] = tuple(int(v) for v in args.knots.split(","))
        except ValueError:
            ex.fail(f"--knots must be comma-separated integers, got {args.knots!r}")
    tic = time.perf_counter()
    try:
        df = run(c, args.out, args.workers, args.seed, args.publish)
    except ex.ConfigError as e:
        ex.fail(str(e))
    print(df.groupby("m")[["kl_lowrank", "kl_independent"]].mean().to_string(float_format=lambda v: f"{v:.4g}"))
    print(f"done in {time.perf_counter() - tic:.0f} s; outputs in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
