"""Where a prediction goes: the locations (a file of points or the store's test group), their design matrix and,
to score the prediction, the values observed there."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from spatialfed.data import points
from spatialfed.data.store import StoreInfo, load_test
from spatialfed.errors import DataError, option
from spatialfed.model import transform

INTERCEPT = "intercept"


@dataclass
class Targets:
    """Prediction locations (n₀×2, store CRS), their design matrix X (n₀×p), for the test group observed z, and for
    locations given in other columns or another CRS their coordinates as given (`PointTable.given_columns`)."""

    locs: np.ndarray
    X: np.ndarray
    observed: np.ndarray | None = None
    given: pd.DataFrame | None = None

    def rows(self, part: slice) -> "Targets":
        """The targets of the rows `part` (one batch)."""
        return Targets(self.locs[part], self.X[part], None if self.observed is None else self.observed[part],
                       None if self.given is None else self.given.iloc[part].reset_index(drop=True))


def design_matrix(frame: pd.DataFrame, names: list[str], source: str) -> np.ndarray:
    """X for the fitted covariates `names` from frame's columns ('intercept' is 1 unless given); clear errors."""
    missing = [c for c in names if c != INTERCEPT and c not in frame.columns]
    if missing:
        raise DataError(f"{source} lacks covariate column(s) {missing} used in the fit (covariates {names}); "
                        "add them, with values at every prediction location")
    cols = [np.ones(len(frame)) if c == INTERCEPT and c not in frame.columns
            else pd.to_numeric(frame[c], errors="coerce").to_numpy(float) for c in names]
    X = np.column_stack(cols) if cols else np.empty((len(frame), 0))
    bad = np.flatnonzero(~np.all(np.isfinite(X), axis=1))
    if bad.size:
        raise DataError(f"{source}: {bad.size} prediction location(s) have missing or non-numeric covariates "
                        f"(first rows {bad[:5].tolist()}); fill them in or drop those rows")
    return X


def table_targets(path, info: StoreInfo, *, x=None, y=None, crs=None, observed=None) -> Targets:
    """Targets from a locations file (`data.points`: coordinate columns `x`, `y` or detected, its CRS or `crs`,
    reprojected to the store's) with the fitted covariates and, when `observed` names a column, its values (on the
    variable's own scale) to score the prediction against; the coordinates as given are kept when they differ
    from the store's x, y (other column names or another CRS)."""
    table = points.read_point_table(path, x=x, y=y, crs=crs).arrived_in(input_crs(info))
    locs = table.in_crs(info.crs)
    moved = not np.array_equal(locs, table.xy) or (not table.from_geometry and table.names != ("x", "y"))
    given = table.given_columns(taken=("x", "y")) if moved else None
    z = None if observed is None else observed_column(table.columns, observed, str(path), table.names)
    return Targets(locs, design_matrix(table.columns, list(info.covariate_names), str(path)), z, given)


def input_crs(info: StoreInfo):
    """The CRS the store's points came in (its "input_crs" attribute: set when ingest projected them), or None."""
    return (getattr(info, "attrs", None) or {}).get("input_crs")


def observed_column(frame: pd.DataFrame, name: str, source: str, coords=()) -> np.ndarray:
    """The observed values of column `name` (numeric, every row); one line naming the columns (the coordinate
    columns `coords` first) or the bad rows."""
    if name not in frame.columns:
        columns = ", ".join(map(str, [*(c for c in coords if c not in frame.columns), *frame.columns]))
        raise DataError(f"{source} has no column {name!r} to score against "
                        f"({option('observed=', '--observed')}); its columns: {columns}")
    z = pd.to_numeric(frame[name], errors="coerce").to_numpy(float)
    bad = np.flatnonzero(~np.isfinite(z))
    if bad.size:
        raise DataError(f"{source}: {bad.size} value(s) of {name!r} are missing or not numbers (first rows "
                        f"{bad[:5].tolist()}); fill them in or drop those rows before scoring")
    return z


def heldout_targets(info: StoreInfo) -> Targets:
    """Targets at the store's held-out test group (with its observed z, back on the variable's own scale when the
    store holds log values)."""
    locs, z, X = load_test(info.path)
    return Targets(locs, X, transform.inverse(z, transform.of_store(info)))
