"""Model choice by prediction: candidate covariance models fitted on the same data, side by side by ℓ, AIC and the
federated site-blocked CV score (``FederatedGP.site_blocked_cv_``, api/blocked_cv.py; docs/equations.md "site-blocked
CV"). The likelihood can prefer a model that predicts worse (docs/results.md, "Covariance options"), so the
comparison names the best candidate by each and says when they disagree.

    >>> table = compare_models("meuse.zarr", mode="sync", knots=25)        # ν = 0.5, ν estimated, anisotropy, both
    >>> print(table); table.best_by_cv, table.agree
    >>> compare_models(frame, "zinc", candidates=["nu=0.5", {"nu": "estimate"}], crs="EPSG:28992", groups="strip")

AIC = −2ℓ + 2q with q the covariance parameters fitted (3 for (δ, σ², β), +1 for ν, +2 for the anisotropy); the
mean model is the same for every candidate, so it does not change the ranking.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from spatialfed.api import covariance

#: the settings a candidate may change; the rest are shared by every candidate
KEYS = ("nu", "anisotropy", "distance")
#: the candidates compared by default: the default model and each option alone and together
DEFAULT = ({"nu": 0.5}, {"nu": covariance.ESTIMATE}, {"anisotropy": True},
           {"nu": covariance.ESTIMATE, "anisotropy": True})
#: the CV score the best candidate is named by (lower is better; RMSE and MLPD are reported beside it)
SCORE = "crps"


def candidate(spec) -> dict:
    """The settings of a candidate: a dict of KEYS, or its text "nu=estimate,anisotropy" ("key=value" or a key
    alone for True, comma-separated; numbers as numbers)."""
    if isinstance(spec, dict):
        settings = dict(spec)
    elif isinstance(spec, str):
        settings = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, eq, value = (s.strip() for s in part.partition("="))
            settings[key] = _value(value) if eq else True
    else:
        raise ValueError(f"a candidate is a dict or a text such as 'nu=estimate,anisotropy', got {spec!r}")
    unknown = sorted(set(settings) - set(KEYS))
    if unknown or not settings:
        raise ValueError(f"a candidate sets {', '.join(KEYS)} (e.g. 'nu=1.5', 'nu=estimate,anisotropy' or "
                         f"'distance=chordal'), got {spec!r}")
    return settings


def _value(text: str):
    low = text.lower()
    if low in ("true", "on", "yes"):
        return True
    if low in ("false", "off", "no"):
        return False
    try:
        return float(text)
    except ValueError:
        return text


def label(settings: dict) -> str:
    """A candidate's name in tables: "nu=0.5", "nu=estimate, anisotropy"."""
    words = []
    for key in KEYS:
        if key in settings:
            value = settings[key]
            words.append(key if value is True else f"{key}={value:g}" if isinstance(value, float) else
                         f"{key}={value}")
    return ", ".join(words)


@dataclass(frozen=True)
class Row:
    """One fitted candidate: its settings, ℓ, q, AIC, the site-blocked CV scores (None where they do not apply)
    and what the fit reports about its covariance (ν̂, the ranges, the parameters on a bound)."""

    label: str
    settings: dict
    loglik: float
    n_params: int
    cv_rmse: float | None
    cv_crps: float | None
    cv_mlpd: float | None
    converged: bool
    n_iter: int
    seconds: float
    covariance: dict = field(default_factory=dict)
    on_bound: list = field(default_factory=list)
    per_site: tuple = ()                  # (site, n_j, CRPS_j) of the CV score

    @property
    def aic(self) -> float:
        return -2.0 * self.loglik + 2.0 * self.n_params


@dataclass(frozen=True)
class Comparison:
    """The candidates' rows in the order given, the best by CV (lowest CRPS) and by AIC, and whether they agree."""

    rows: tuple[Row, ...]

    @property
    def best_by_cv(self) -> str | None:
        scored = [r for r in self.rows if r.cv_crps is not None]
        return min(scored, key=lambda r: r.cv_crps).label if scored else None

    @property
    def best_by_aic(self) -> str:
        return min(self.rows, key=lambda r: r.aic).label

    @property
    def agree(self) -> bool | None:
        """Whether AIC and the site-blocked CV choose the same candidate (None without CV scores)."""
        return None if self.best_by_cv is None else self.best_by_cv == self.best_by_aic

    def cv_difference(self, a: str, b: str) -> tuple[float, float]:
        """(CV CRPS of `a` − that of `b`, its standard error), paired over the sites: the total is the mean of
        e_j = J n_j (CRPS_j(a) − CRPS_j(b)) / N over the J sites, its standard error sd(e)/√J."""
        ra, rb = (next(r for r in self.rows if r.label == x) for x in (a, b))
        sa, sb = ({j: (n, c) for j, n, c in r.per_site} for r in (ra, rb))
        n_total, J = sum(n for n, _ in sa.values()), len(sa)
        e = np.array([J * n * (c - sb[j][1]) / n_total for j, (n, c) in sa.items()])
        return float(e.mean()), float(e.std(ddof=1) / np.sqrt(J)) if J > 1 else float("nan")

    def to_dict(self) -> dict:
        return {"rows": [{**asdict(r), "aic": r.aic} for r in self.rows], "best_by_cv": self.best_by_cv,
                "best_by_aic": self.best_by_aic, "agree": self.agree, "cv_score": SCORE}

    def to_json(self) -> str:
        """to_dict as JSON, a number that is not finite (an undefined standard error) as null."""
        return json.dumps(_finite(self.to_dict()), indent=2, allow_nan=False)

    def to_frame(self):
        """The rows as a pandas DataFrame indexed by label."""
        import pandas as pd

        return pd.DataFrame([{"label": r.label, "loglik": r.loglik, "q": r.n_params, "aic": r.aic,
                              "cv_rmse": r.cv_rmse, "cv_crps": r.cv_crps, "cv_mlpd": r.cv_mlpd,
                              "converged": r.converged} for r in self.rows]).set_index("label")

    def __str__(self) -> str:
        width = max(len("candidate"), *(len(r.label) for r in self.rows))
        lines = [f"{'candidate':<{width}}  {'ℓ':>11}  {'q':>2}  {'AIC':>11}  {'CV RMSE':>9}  {'CV CRPS':>9}  note"]
        for r in self.rows:
            cv = (f"{r.cv_rmse:9.4g}  {r.cv_crps:9.4g}" if r.cv_crps is not None else f"{'—':>9}  {'—':>9}")
            note = "; ".join(filter(None, [_fitted_note(r.covariance), *r.on_bound,
                                           "" if r.converged else "not converged"]))
            lines.append(f"{r.label:<{width}}  {r.loglik:11.3f}  {r.n_params:>2}  {r.aic:11.3f}  {cv}  {note}")
        if self.best_by_cv is None:
            lines.append(f"best by AIC: {self.best_by_aic} (no site-blocked CV score for these fits)")
        elif self.agree:
            lines.append(f"best by AIC and by site-blocked CV CRPS: {self.best_by_aic}")
        else:
            d, se = self.cv_difference(self.best_by_aic, self.best_by_cv)
            lines.append(f"AIC and prediction disagree: best by AIC {self.best_by_aic}, by site-blocked CV CRPS "
                         f"{self.best_by_cv} (lower by {d:.3g} ± {se:.2g}, paired over the sites); for maps prefer "
                         "the one that predicts better")
        return "\n".join(lines)


def _finite(value):
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    return value.item() if isinstance(value, np.generic) else value


def _fitted_note(cov: dict) -> str:
    words = []
    if "nu" in cov and cov.get("nu_estimated"):
        words.append(f"ν̂ = {cov['nu']:.3g}")
    if "anisotropy_ratio" in cov:
        words.append(f"ratio {cov['anisotropy_ratio']:.3g}, angle {cov['angle_deg']:.0f}°")
    return ", ".join(words)


def compare_models(X, y=None, *, candidates=None, coords=None, groups=None, **settings) -> Comparison:
    """Fit each candidate (``candidate``: a dict or text; default DEFAULT) as ``FederatedGP(**settings,
    **candidate).fit(X, y, coords=, groups=)`` and compare them (module docstring). `settings` are shared by
    every candidate and may not set KEYS."""
    from spatialfed.api.estimator import FederatedGP

    shared = sorted(set(settings) & set(KEYS))
    if shared:
        raise ValueError(f"{shared} differ between candidates: give them in candidates=, not as shared settings")
    specs = [candidate(c) for c in (DEFAULT if candidates is None else candidates)]
    if not specs:
        raise ValueError("compare_models needs at least one candidate, e.g. ['nu=0.5', 'nu=estimate']")
    rows = []
    for spec in specs:
        tic = time.perf_counter()
        gp = FederatedGP(**{**settings, **spec}).fit(X, y, coords=coords, groups=groups)
        rows.append(row(gp, spec, time.perf_counter() - tic))
    return Comparison(tuple(rows))


def row(gp, spec: dict, seconds: float) -> Row:
    """The Row of a fitted estimator `gp` of the candidate `spec`."""
    vp = gp.variogram_params_
    cv = gp.site_blocked_cv_ or {}
    cov = {k: vp[k] for k in ("nu", *covariance.FITTED_KEYS, *covariance.DISTANCE_KEYS) if k in vp and k != "metric"}
    cov["nu_estimated"] = gp.nu == covariance.ESTIMATE
    q = 3 + (gp.nu == covariance.ESTIMATE) + 2 * bool(gp.anisotropy)
    return Row(label(spec), spec, float(gp.loglik_), int(q), _score(cv, "rmse"), _score(cv, "crps"),
               _score(cv, "mlpd"), bool(gp.converged_), int(gp.n_iter_), float(seconds), cov,
               [f"{name} on its {side} bound" for name, side in (gp.boundary_ or {}).items()],
               tuple((int(s["site"]), int(s["n"]), float(s["crps"])) for s in cv.get("per_site", ())))


def _score(cv: dict, key: str) -> float | None:
    value = cv.get(key)
    return None if value is None or not math.isfinite(value) else float(value)
