"""Which columns of an in-memory table are covariates: the user's list (``FederatedGP(covariates=[...])``, as
``spatialfed ingest --covariates``), or, when none is given, every other numeric column, screened and said out loud.

Inferred covariates are listed in a warning and in the fit's summary, and two kinds of column are refused with the
fix (``covariates=[...]``), because fitting them is a silent mistake rather than a model:
- an obvious identifier: named like one (``ID_NAMES``, or ending in ``_id``), an integer column whose values are all
  distinct, or a sequence 0..n−1 / 1..n in row order;
- a near-copy of the target: |corr(column, y)| > ``COPY_CORR``, which makes the spatial model fit nothing.
The list a refusal suggests instead (``suggested``) leaves out, and names, every other refused column, any column
that reads as a second measurement of y (its values within ``SECOND_MEASUREMENT`` of y's sd of y, root mean
square: the same quantity on the same scale, not an explanatory variable, which may correlate as strongly with y
on a scale of its own) and any column with missing values (its rows would be dropped from the fit).
"""

from __future__ import annotations


import numpy as np
import pandas as pd

from spatialfed.errors import DataError, warn

ID_NAMES = ("id", "fid", "gid", "oid", "objectid", "record", "index", "row", "rowid", "row_id", "key", "uid")
COPY_CORR = 0.999
SECOND_MEASUREMENT = 0.5


def select(cov: pd.DataFrame, z: np.ndarray, covariates) -> tuple[pd.DataFrame, bool]:
    """(the covariate columns to fit, whether they were inferred): `covariates` a list of column names of `cov` (the
    table without the coordinates, the target and the groups column; [] = intercept only), or None to infer."""
    if covariates is not None:
        if isinstance(covariates, str):
            raise DataError(f"covariates must be a list of column names, e.g. covariates=[{covariates!r}], "
                            f"got the string {covariates!r}")
        names = [str(c) for c in covariates]
        missing = [c for c in names if c not in cov.columns]
        if missing:
            raise DataError(f"covariates={names}: column(s) {missing} are not among X's columns {list(cov.columns)} "
                            "(the coordinates, y and groups columns are not covariates)")
        return cov[names], False
    for name in cov.columns:
        refusal = _refusal(name, cov[name], z)
        if refusal:
            keep, left = suggested(cov, z)
            why = f" (left out: {'; '.join(left)})" if left else ""
            fix = f"covariates={keep!r}{why}, or covariates=[] for the intercept only" if keep else \
                f"covariates=[] for the intercept only{why}"
            raise DataError(f"X's column {name!r} {refusal}, and every column of X besides the coordinates, y and "
                            f"groups is taken as a covariate unless you name them: pass {fix}")
    return cov, True


def suggested(cov: pd.DataFrame, z: np.ndarray) -> tuple[list[str], list[str]]:
    """(the columns safe to suggest as covariates, why each other column is left out)."""
    keep, left = [], []
    for name in cov.columns:
        values = pd.to_numeric(cov[name], errors="coerce").to_numpy(float)
        missing = int((~np.isfinite(values)).sum())
        ok = np.isfinite(values) & np.isfinite(z)
        gap = np.sqrt(np.mean((values[ok] - z[ok]) ** 2)) / np.std(z[ok]) if ok.sum() >= 3 and np.std(z[ok]) > 0 \
            else np.inf
        refusal = _refusal(str(name), cov[name], z)
        if refusal:
            left.append(f"{name!r} {refusal}")
        elif missing:
            left.append(f"{name!r} is missing in {missing} of {len(values)} rows ({missing / len(values):.0%}), which "
                        "would be dropped")
        elif gap < SECOND_MEASUREMENT:
            left.append(f"{name!r} differs from y by {gap:.2f} of y's sd (root mean square): a second measurement "
                        "of y?")
        else:
            keep.append(str(name))
    return keep, left


def _correlation(values: np.ndarray, z: np.ndarray) -> float | None:
    """corr(values, z) over the rows where both are finite (None when undefined)."""
    ok = np.isfinite(values) & np.isfinite(z)
    if ok.sum() < 3 or not (np.std(values[ok]) > 0 and np.std(z[ok]) > 0):
        return None
    return float(np.corrcoef(values[ok], z[ok])[0, 1])


def _refusal(name: str, column: pd.Series, z: np.ndarray) -> str | None:
    """Why an inferred covariate column is refused (None: it is kept)."""
    lower = name.strip().lower()
    if lower in ID_NAMES or lower.endswith("_id"):
        return "is named like an identifier"
    values = pd.to_numeric(column, errors="coerce").to_numpy(float)
    n = len(values)
    finite = values[np.isfinite(values)]
    if n >= 3 and len(finite) == n and np.all(finite == np.round(finite)):
        if np.array_equal(finite, np.arange(n)) or np.array_equal(finite, np.arange(1, n + 1)):
            return f"is the row sequence {int(finite[0])}..{int(finite[-1])} (an identifier)"
        if pd.api.types.is_integer_dtype(column) and len(np.unique(finite)) == n:
            return f"holds {n} distinct integers, one per row (an identifier)"
    r = _correlation(values, z)
    if r is not None and abs(r) > COPY_CORR:
        return f"is a near-copy of y (correlation {r:.4f})"
    return None


def announce(names) -> None:
    """The warning that lists inferred covariates (nothing when there are none)."""
    if len(names):
        warn(f"covariates inferred from X's other columns: {list(names)} (plus the intercept); name them "
             "with FederatedGP(covariates=[...]), or covariates=[] for the intercept only")
