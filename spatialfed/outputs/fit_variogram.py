"""The report's variogram panel: the empirical semivariogram the sites send at the start against the fitted one.

At the start every site sends the binned sums Σ ½(e_i − e_k)² and pair counts of its OLS residuals over pairs within
it (algorithm/start.py step 2, `LocalModel.variogram`); pooled, bin k's semivariance is γ̂_k = Σ_j S_jk / Σ_j N_jk at
the bin's centre. The fitted model's semivariogram is γ(h) = 1/δ + σ²(1 − ρ(h; β)) for h > 0 (Eq. 23's Matérn ρ;
the nugget 1/δ, the partial sill σ²), drawn for the starting estimate and for the current one.
"""

from __future__ import annotations

import numpy as np

from spatialfed.model.matern import Matern

CURVE_POINTS = 120


class PooledVariogram:
    """The sites' binned semivariogram sums, pooled as they arrive (the "variogram" step's answers)."""

    def __init__(self):
        self.edges: np.ndarray | None = None
        self.sum_sq: np.ndarray | None = None
        self.count: np.ndarray | None = None

    def add(self, edges, xi: dict) -> None:
        """One site's answer `xi` ({"sum_sq", "count"} per bin, the last entry the pairs out of range) to bins `edges`."""
        nb = len(edges) - 1
        s, c = (np.asarray(xi[k], dtype=float)[:nb] for k in ("sum_sq", "count"))
        if self.edges is None or len(self.edges) != len(edges):
            self.edges, self.sum_sq, self.count = np.asarray(edges, dtype=float), np.zeros(nb), np.zeros(nb)
        self.sum_sq += s
        self.count += c

    def points(self) -> dict:
        """{"lag", "gamma", "pairs"} of the bins holding pairs (empty before any site answered)."""
        if self.edges is None:
            return {"lag": [], "gamma": [], "pairs": []}
        keep = self.count > 0
        centres = 0.5 * (self.edges[:-1] + self.edges[1:])
        return {"lag": centres[keep].tolist(), "gamma": (self.sum_sq[keep] / self.count[keep]).tolist(),
                "pairs": self.count[keep].astype(int).tolist()}


def model_curve(row: dict | None, nu: float | None, max_lag: float | None) -> dict:
    """{"lag", "gamma"}: γ(h) = 1/δ + σ²(1 − ρ(h; β)) on (0, max_lag] for the estimate of trace row `row`; empty when
    the row, ν or the lags are unknown."""
    if row is None or nu is None or not max_lag or not all(np.isfinite(float(row.get(k, np.nan)))
                                                         for k in ("delta", "sigma2", "beta")):
        return {"lag": [], "gamma": []}
    h = np.linspace(max_lag / CURVE_POINTS, max_lag, CURVE_POINTS)
    rho = Matern(float(nu)).correlation(h, float(row["beta"]))
    return {"lag": h.tolist(), "gamma": (1.0 / float(row["delta"]) + float(row["sigma2"]) * (1.0 - rho)).tolist()}
