"""The reports of benchmarks/bench_async_vs_sync.py: a summary per group and per profile of its rows, the bounds the
asynchronous fit is held to on the charged clock, a Markdown table and a figure. Pure functions of the rows (a rows
file can be summarized again without running anything: `--rows PATH --summary-only`)."""

from __future__ import annotations

import numpy as np

LOGLIK_TOL = 1e-6  # |ℓ(async) − ℓ(reference)| of a run that settled on the synchronous optimum


def stats_of(rows) -> dict:
    """runs, settled, on_optimum, mean and worst ratio over the settled runs, and the worst run's labels."""
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    worst = max((r for r in rows if r["ratio"] is not None), key=lambda r: r["ratio"], default=None)
    return {"runs": len(rows), "settled": sum(bool(r["settled"]) for r in rows),
            "on_optimum": sum(abs(r["dloglik"]) <= LOGLIK_TOL for r in rows),
            "mean": float(np.mean(ratios)) if ratios else None, "worst": worst["ratio"] if worst else None,
            "worst_run": None if worst is None else {k: worst[k] for k in
                                                     ("seed", "partition", "sizes", "n_per_worker", "runtime")},
            **settled_by_counts(rows)}


def settled_by_counts(rows) -> dict:
    """How the settled asynchronous runs settled: on the slowest site's epoch answer, on another site's epoch
    answer, or between epochs (an exploration); {} for rows without async_settled_by."""
    by = [r["async_settled_by"] for r in rows if r.get("async_settled_by")]
    if not by:
        return {}
    counts = {"slowest_epoch": 0, "other_epoch": 0, "between_epochs": 0}
    for b in by:
        key = "between_epochs" if b["kind"] != "epoch" else (
            "slowest_epoch" if b["round_trip_share"] == 1.0 else "other_epoch")
        counts[key] += 1
    return {"settled_by": counts}


def summarize(rows, profiles) -> dict:
    """Per (profile, n_per_worker, partition, sizes, runtime) and per profile, in the order given."""
    order = {p: i for i, p in enumerate(profiles)}
    keys = ("profile", "n_per_worker", "partition", "sizes", "runtime")
    groups: dict[tuple, list] = {}
    for row in sorted(rows, key=lambda r: (order[r["profile"]], r["n_per_worker"], r["partition"], r["sizes"])):
        groups.setdefault(tuple(row[k] for k in keys), []).append(row)
    return {"by_group": [{**dict(zip(keys, key)), **stats_of(rs)} for key, rs in groups.items()],
            "by_profile": [{"profile": p, **stats_of([r for r in rows if r["profile"] == p])} for p in profiles],
            "bounds": bounds(rows)}


def bounds(rows) -> list[dict]:
    """The asynchronous fit's bounds on the charged clock, each with the value these rows give (those of profiles not
    run are left out): every run settled on the synchronous optimum, no ratio above 1.10, balanced ≤ 1.02, the
    means of straggler ≤ 0.55, of graded ≤ 0.70 and of graded:12 ≤ 0.85. An unsettled run fails every bound on its
    profile."""
    def ratios(names):
        return [np.inf if r["ratio"] is None else r["ratio"] for r in rows if names is None or r["profile"] in names]

    out = [{"bound": "every run settled, |dloglik| <= 1e-6",
            "value": sum(bool(r["settled"]) and abs(r["dloglik"]) <= LOGLIK_TOL for r in rows), "limit": len(rows)}]
    out[0]["holds"] = out[0]["value"] == len(rows)
    for name, names, how, limit in (("worst ratio", None, max, 1.10), ("worst balanced", {"balanced"}, max, 1.02),
                                    ("mean straggler", {"straggler"}, np.mean, 0.55),
                                    ("mean graded", {"graded"}, np.mean, 0.70),
                                    ("mean graded:12", {"graded:12"}, np.mean, 0.85)):
        got = ratios(names)
        if got:
            value = float(how(got))
            out.append({"bound": f"{name} <= {limit}", "value": value if np.isfinite(value) else None,
                        "limit": limit, "holds": bool(value <= limit)})
    return out


def table(summary) -> str:
    """The summary as a Markdown table (profile × n_j × partition × sizes, then per profile, then the bounds)."""
    def num(v):
        return "—" if v is None else f"{v:.3g}"

    lines = ["| profile | n_j | partition | sizes | runs | settled | on optimum | mean | worst (seed) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for g in summary["by_group"] + [dict(p, n_per_worker="all", partition="all", sizes="all")
                                    for p in summary["by_profile"]]:
        seed = "" if g["worst_run"] is None else f" ({g['worst_run']['seed']})"
        lines.append(f"| {g['profile']} | {g['n_per_worker']} | {g['partition']} | {g['sizes']} | {g['runs']} | "
                     f"{g['settled']} | {g['on_optimum']} | {num(g['mean'])} | {num(g['worst'])}{seed} |")
    for bound in summary["bounds"]:
        value = bound["value"]
        value = f"{value} of {bound['limit']} runs" if isinstance(value, int) else num(value)
        lines.append(f"- {bound['bound']}: {value} ({'holds' if bound['holds'] else 'fails'})")
    return "\n".join(lines)


def figure(rows, profiles, path) -> None:
    """Every row's settle ratio (async / sync, log scale) by profile, one column per n_j × partition, with the
    bound on every run (1.10) and the mean per profile."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import io

    from spatialfed.atomic import write_bytes

    groups = sorted({(r["n_per_worker"], r["partition"]) for r in rows})
    fig, ax = plt.subplots(figsize=(1.6 + 1.7 * len(profiles), 3.6))
    rng = np.random.default_rng(0)
    for i, profile in enumerate(profiles):
        for g, key in enumerate(groups):
            ratios = [r["ratio"] for r in rows if r["profile"] == profile
                      and (r["n_per_worker"], r["partition"]) == key and r["ratio"] is not None]
            x = i + (g - (len(groups) - 1) / 2) * 0.8 / max(len(groups), 1)
            ax.scatter(x + rng.uniform(-0.05, 0.05, len(ratios)), ratios, s=12, color=f"C{g}", alpha=0.8,
                       label=f"n_j {key[0]}, {key[1]}" if i == 0 else None)
        mean = np.mean([r["ratio"] for r in rows if r["profile"] == profile and r["ratio"] is not None] or [np.nan])
        ax.plot([i - 0.42, i + 0.42], [mean, mean], color="k", lw=1.5)
    ax.axhline(1.10, color="red", lw=1, ls="--", label="1.10: no run above")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(range(len(profiles)), profiles)
    ax.set_ylabel("async / sync time to 1e-3")
    ax.set_title(f"{len({r['seed'] for r in rows})} seeds; black: the mean per profile", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format="png")
    plt.close(fig)
    write_bytes(path, buf.getvalue())
