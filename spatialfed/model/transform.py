"""A positive, skewed variable (concentrations, rainfall) fitted on the log scale and predicted on its own.

With transform "log" the sites hold w = log z and the GP is fitted to w (SPEC §1 unchanged). Its predictive
distribution of a new observation is w₀ | data ~ N(m, s²) (m the predicted mean, s the `sd` of a new observation,
nugget included), so z₀ = exp(w₀) is lognormal and the back-transform is exact, not a plug-in exp(m):

    mean   E[z₀]   = exp(m + s²/2)                      (minimises the expected squared error: the point prediction)
    sd     SD[z₀]  = exp(m + s²/2) · √(exp(s²) − 1)
    median         = exp(m)                             (minimises the expected absolute error)
    q025, q975     = exp(m ∓ 1.959964 s)                (the 95% interval: exact quantiles, never below 0)

The log-scale m and s are kept as mean_log and sd_log (what the scores below need).
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from spatialfed.errors import DataError

TRANSFORMS = ("none", "log")
Z975 = float(stats.norm.ppf(0.975))


def check_transform(transform) -> str:
    """The transform's name ("none" for None); one line naming the choices otherwise."""
    name = "none" if transform is None else transform
    if name not in TRANSFORMS:
        raise DataError(f"transform must be None or 'log' (a positive, skewed variable fitted on the log scale), "
                        f"got {transform!r}")
    return name


def forward(z, transform, what: str = "the values") -> np.ndarray:
    """w = log z for "log" (z > 0 checked: one line naming how many are not, and the fix), z for "none"."""
    z = np.asarray(z, dtype=float)
    if check_transform(transform) == "none":
        return z
    bad = ~(z > 0)
    if bad.any():
        raise DataError(f"transform='log' needs positive values, but {int(bad.sum())} of {z.size} of {what} are ≤ 0 "
                        f"(smallest {np.nanmin(z):.6g}); drop or correct them, or fit without the log transform")
    return np.log(z)


def inverse(w, transform) -> np.ndarray:
    """z = exp w for "log" (values a store holds back on their own scale), w for "none"."""
    w = np.asarray(w, dtype=float)
    return np.exp(w) if check_transform(transform) == "log" else w


def of_store(info) -> str:
    """The transform a store's values were written with (its "transform" attribute; "none" when absent)."""
    return check_transform((getattr(info, "attrs", None) or {}).get("transform"))


def back(pred: dict, transform) -> dict:
    """The prediction on the variable's own scale (module docstring): `pred`'s "mean" and "sd" (of a new
    observation, log scale) become the lognormal mean and sd, with median, q025, q975, mean_log, sd_log added;
    "none" returns `pred` as it is."""
    if check_transform(transform) == "none":
        return pred
    m, s = np.asarray(pred["mean"], dtype=float), np.asarray(pred["sd"], dtype=float)
    mean = np.exp(m + s ** 2 / 2)
    return {**pred, "mean": mean, "sd": mean * np.sqrt(np.expm1(s ** 2)), "median": np.exp(m),
            "q025": np.exp(m - Z975 * s), "q975": np.exp(m + Z975 * s), "mean_log": m, "sd_log": s}


def crps_normal(z, mu, sigma) -> np.ndarray:
    """CRPS(N(μ, σ²), z) = σ [t(2Φ(t) − 1) + 2φ(t) − 1/√π], t = (z − μ)/σ (Gneiting & Raftery 2007), per point."""
    z, mu, sigma = (np.asarray(a, dtype=float) for a in (z, mu, sigma))
    t = (z - mu) / sigma
    return sigma * (t * (2 * stats.norm.cdf(t) - 1) + 2 * stats.norm.pdf(t) - 1 / np.sqrt(np.pi))


def crps_lognormal(z, mu, sigma) -> np.ndarray:
    """CRPS(LN(μ, σ²), z) = z[2Φ(t) − 1] − 2 exp(μ + σ²/2)[Φ(t − σ) + Φ(σ/√2) − 1], t = (log z − μ)/σ
    (Baran & Lerch 2015, Eq. 5), per point; z > 0."""
    z, mu, sigma = (np.asarray(a, dtype=float) for a in (z, mu, sigma))
    t = (np.log(z) - mu) / sigma
    Phi = stats.norm.cdf
    return z * (2 * Phi(t) - 1) - 2 * np.exp(mu + sigma ** 2 / 2) * (Phi(t - sigma) + Phi(sigma / np.sqrt(2)) - 1)


def log_density(z, mu, sigma) -> np.ndarray:
    """log LN(z; μ, σ²) = log N(log z; μ, σ²) − log z, per point."""
    z, mu, sigma = (np.asarray(a, dtype=float) for a in (z, mu, sigma))
    return stats.norm.logpdf(np.log(z), mu, sigma) - np.log(z)
