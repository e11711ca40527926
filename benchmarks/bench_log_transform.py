"""Meuse zinc (positive, right-skewed) held out fold by fold: the log transform against the untransformed fit.

    python benchmarks/bench_log_transform.py [--folds 5] [--repeats 4] [--knots 50] [--covariates sqrt_dist]

Each repeat splits the 155 samples into `folds` random folds (seed = the repeat); for each fold it fits
FederatedGP (sync, m knots, 4 area sites; intercept only, as the user guide ingests zinc, or --covariates) to the
other folds' zinc with transform=None and transform="log" and predicts the fold. The scores are on zinc's own scale (ppm) over every held-out
point: for the log fit those of its lognormal predictive (outputs.metrics.prediction_scores: RMSE and MAE of the
lognormal mean, lognormal CRPS, coverage of the [q025, q975] quantile interval); `rmse_median` is the RMSE of the
lognormal median exp(m) instead. Prints one JSON line per transform: {transform, n, rmse, mae, crps, coverage95,
rmse_median, min_mean, folds, repeats, knots, covariates}, then one with the log fit's ratios to the plain one
({"log_vs_none": {"rmse", "crps"}} below 1 = the log fit is better).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import emitter  # noqa: E402

from spatialfed import Emulation  # noqa: E402
from spatialfed.api import FederatedGP  # noqa: E402
from spatialfed.data import datasets  # noqa: E402
from spatialfed.outputs import metrics  # noqa: E402


def meuse() -> pd.DataFrame:
    frame = pd.read_csv(datasets.data_file("meuse", "meuse.csv"))
    return frame.assign(sqrt_dist=np.sqrt(frame["dist"]))[["x", "y", "zinc", "sqrt_dist"]]


def held_out(frame: pd.DataFrame, transform, folds: int, repeats: int, knots: int, covariates: list[str]) -> dict:
    """The pooled held-out predictive columns (mean, sd, and for the log fit its lognormal ones) and observed zinc."""
    pooled: dict[str, list] = {}
    for r in range(repeats):
        fold = np.random.default_rng(r).permutation(len(frame)) % folds
        for k in range(folds):
            train, test = frame[fold != k], frame[fold == k]
            gp = FederatedGP(mode="sync", knots=knots, cluster="simulated", progress=False, transform=transform,
                             covariates=covariates, crs="EPSG:28992", emulation=Emulation(n_sites=4), seed=r)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # e.g. sites of fewer than 20 rows at high fold counts
                gp.fit(train, "zinc")
                pred = predict_columns(gp, test)
            for key, value in {**pred, "observed": test["zinc"].to_numpy(float)}.items():
                pooled.setdefault(key, []).append(value)
    return {key: np.concatenate(value) for key, value in pooled.items()}


def predict_columns(gp: FederatedGP, test: pd.DataFrame) -> dict:
    """Every predictive column at the test points (the estimator's predict gives mean and sd only)."""
    from spatialfed.api import predicting

    return predicting.predict(gp, *predicting.targets(gp, test.drop(columns="zinc")))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--knots", type=int, default=50)
    ap.add_argument("--covariates", default="", help="comma-separated covariate columns (sqrt_dist); default none")
    ap.add_argument("--out", type=Path, default=None, help="also append the JSON lines to this file")
    args = ap.parse_args(argv)
    emit = emitter(args.out)
    covariates = [c for c in args.covariates.split(",") if c]
    frame, rows = meuse(), {}
    for transform in (None, "log"):
        pred = held_out(frame, transform, args.folds, args.repeats, args.knots, covariates)
        z = pred.pop("observed")
        row = {"transform": transform or "none", **metrics.prediction_scores(z, pred),
               "rmse_median": metrics.rmse(z, pred.get("median", pred["mean"])),
               "min_mean": float(pred["mean"].min()), "folds": args.folds, "repeats": args.repeats,
               "knots": args.knots, "covariates": covariates}
        rows[row["transform"]] = row
        emit(row)
    emit({"log_vs_none": {key: rows["log"][key] / rows["none"][key] for key in ("rmse", "crps")}})


if __name__ == "__main__":
    main()
