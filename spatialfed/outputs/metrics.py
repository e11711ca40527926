"""Scores of probabilistic predictions on held-out data: RMSE, MAE, mean Gaussian CRPS and interval coverage."""

from __future__ import annotations

import numpy as np
from scipy import stats

from spatialfed.model import transform


def _check(observed, mean, sd=None):
    """Arrays of equal length, finite, sd > 0."""
    observed, mean = np.asarray(observed, dtype=float).ravel(), np.asarray(mean, dtype=float).ravel()
    arrays = [observed, mean] + ([] if sd is None else [np.asarray(sd, dtype=float).ravel()])
    if len({a.size for a in arrays}) != 1 or observed.size == 0:
        raise ValueError(f"observed, mean and sd must be non-empty and of equal length, got {[a.size for a in arrays]}")
    if not all(np.all(np.isfinite(a)) for a in arrays):
        raise ValueError("observed, mean and sd must be finite")
    if sd is not None and np.any(arrays[2] <= 0):
        raise ValueError("predictive sd must be > 0 for CRPS and coverage")
    return arrays


def rmse(observed, mean) -> float:
    """√(mean (y − ŷ)²)."""
    y, m = _check(observed, mean)
    return float(np.sqrt(np.mean((y - m) ** 2)))


def mae(observed, mean) -> float:
    """mean |y − ŷ|."""
    y, m = _check(observed, mean)
    return float(np.mean(np.abs(y - m)))


def crps_gaussian(observed, mean, sd) -> np.ndarray:
    """CRPS(N(μ, σ²), y) per point, checked (model.transform.crps_normal)."""
    return transform.crps_normal(*_check(observed, mean, sd))


def coverage(observed, mean, sd, level: float = 0.95) -> float:
    """Share of y inside the central `level` interval μ ± Φ⁻¹((1 + level)/2) σ."""
    y, m, s = _check(observed, mean, sd)
    return float(np.mean(np.abs(y - m) <= stats.norm.ppf(0.5 + level / 2) * s))


def scores(observed, mean, sd) -> dict:
    """{"n", "rmse", "mae", "crps", "coverage95"}: the held-out summary written to metrics.json."""
    y, m, s = _check(observed, mean, sd)
    return {"n": int(y.size), "rmse": rmse(y, m), "mae": mae(y, m), "crps": float(np.mean(crps_gaussian(y, m, s))),
            "coverage95": coverage(y, m, s, 0.95)}


def prediction_scores(observed, pred: dict) -> dict:
    """`scores` of a prediction {"mean", "sd", ...}: Gaussian, or, for a prediction back-transformed from the log
    scale (model.transform.back: it has "mean_log", "sd_log"), of its lognormal predictive on the variable's own
    scale: RMSE and MAE of the lognormal mean, the lognormal CRPS, coverage of the [q025, q975] quantile interval."""
    if "mean_log" not in pred:
        return scores(observed, pred["mean"], pred["sd"])
    y, mu, s = _check(observed, pred["mean_log"], pred["sd_log"])
    if np.any(y <= 0):
        raise ValueError("observed values must be > 0 to score a log-transformed prediction")
    mean = np.asarray(pred["mean"], dtype=float).ravel()
    inside = (y >= np.asarray(pred["q025"]).ravel()) & (y <= np.asarray(pred["q975"]).ravel())
    return {"n": int(y.size), "rmse": rmse(y, mean), "mae": mae(y, mean),
            "crps": float(np.mean(transform.crps_lognormal(y, mu, s))), "coverage95": float(np.mean(inside))}


def table(rows: dict) -> str:
    """Markdown table of scores, one row per method name: n, RMSE, MAE, CRPS, 95% coverage."""
    lines = ["| method | n | RMSE | MAE | CRPS | 95% coverage |", "|---|---|---|---|---|---|"]
    lines += [f"| {name} | {s['n']} | {s['rmse']:.4f} | {s['mae']:.4f} | {s['crps']:.4f} | {s['coverage95']:.3f} |"
              for name, s in rows.items()]
    return "\n".join(lines)


def seam_ratio(values, owner) -> float:
    """Seam statistic of a map: the mean |Δ value| of adjacent cells (4-neighbours) owned by different
    sites over that of adjacent cells owned by the same site. `values` and `owner` are rasters of one shape; cells
    with a non-finite value or owner, or a negative owner, are not cells of the map. 1 means the boundaries between
    the owners' regions are invisible in the values; NaN if either kind of pair is missing or the within-site
    differences are all zero."""
    v, o = np.asarray(values, dtype=float), np.asarray(owner, dtype=float)
    if v.ndim != 2 or v.shape != o.shape:
        raise ValueError(f"values and owner must be rasters of one shape, got {v.shape} and {o.shape}")
    ok = np.isfinite(v) & np.isfinite(o) & (o >= 0)
    across, within = [], []
    for a, b in (((slice(None), slice(1, None)), (slice(None), slice(None, -1))),
                 ((slice(1, None), slice(None)), (slice(None, -1), slice(None)))):
        pair = ok[a] & ok[b]
        diff = np.abs(v[a] - v[b])[pair]
        same = (o[a] == o[b])[pair]
        across.append(diff[~same])
        within.append(diff[same])
    across, within = np.concatenate(across), np.concatenate(within)
    if not across.size or not within.size or not within.mean() > 0:
        return float("nan")
    return float(across.mean() / within.mean())
