"""Prediction from a fitted ``FederatedGP`` at new locations: the estimator's ``predict`` and ``score``.

The maths is ``spatialfed.outputs.prediction`` (federated kriging, SPEC §1): the low-rank part from the server's
state (μ, Σ, γ, δ, θ), the residual part by the site holding the nearest observation, which reads its partition of
the fitted store. The fitted attributes give the same ``FittedModel`` that ``load_model`` reads from a fit directory,
so ``gp.predict`` equals ``spatialfed predict`` on the saved fit.
"""

from __future__ import annotations

import numpy as np
from sklearn.exceptions import NotFittedError as _SklearnNotFitted

from spatialfed.errors import SpatialFedError


class NotFittedError(_SklearnNotFitted, SpatialFedError):
    """A FederatedGP method that needs a fitted model was called before ``fit`` (scikit-learn's NotFittedError and
    spatialfed's SpatialFedError: either ``except`` catches it)."""


def check_fitted(gp, what: str = "this method") -> None:
    """Raise NotFittedError (one line, naming the fix) unless `gp` is fitted."""
    if not hasattr(gp, "params_"):
        raise NotFittedError(f"this {type(gp).__name__} is not fitted yet; call fit(X, y) or fit(store) before "
                             f"{what}")


def fitted_model(gp):
    """The ``outputs.prediction.FittedModel`` of a fitted estimator (what ``load_model`` reads from its fit dir)."""
    from spatialfed.outputs.prediction import FittedModel

    return FittedModel.from_estimator(gp)


def targets(gp, X, coords=None):
    """(locations n₀×2 in the store's CRS, design matrix X₀ n₀×p) from predict's X/coords (api.inputs)."""
    from spatialfed.api.inputs import prediction_design, read_points, to_store_crs

    points = read_points(X, coords, gp.crs, drop=(gp.groups_column_,))
    locs = to_store_crs(points, gp.store_crs_)
    return locs, prediction_design(points, gp.covariate_names_)


def predict(gp, locs, X0) -> dict:
    """{"mean", "sd", "sd_latent", "owner"} at locs with covariates X0 (``outputs.prediction.predict_at`` with the
    fit's default predictor: seamless low-rank kriging, or the independence model's for method independent/fgpr), on the
    estimator's runtime."""
    from spatialfed.api.scripts import embedded_cluster, spawn_safe
    from spatialfed.data.store import open_store
    from spatialfed.outputs.domains import default_domain, outside_domain
    from spatialfed.outputs.prediction import (batch_size, default_predictor, open_workers, predict_at,
                                               prediction_runtime)

    from spatialfed.api.loading import prediction_store
    from spatialfed.api.options import cluster_of

    model = fitted_model(gp)
    info = open_store(prediction_store(gp))
    runtime = getattr(gp, "runtime_used_", None) or gp.runtime  # where the fit ran ("auto" resolved)
    c = cluster_of(gp.cluster)
    if c.jobqueue:
        runtime = "dask"
    runtime = prediction_runtime(runtime, info, model, client=c.client, scheduler=c.address,
                                 n_dask_workers=c.n_workers)
    cluster = embedded_cluster(runtime, client=c.client, scheduler=c.address, jobqueue=c.jobqueue)
    with spawn_safe(cluster), open_workers(info, model, runtime, client=c.client, scheduler=c.address,
                                           n_dask_workers=c.n_workers, insecure=c.insecure) as workers:
        outside_domain(locs, default_domain(info, workers), "the study area is the convex hull of the sites' hulls")
        return predict_at(workers, model, locs, X0, default_predictor(model),
                          batch_size(len(model.knots)))


def log_predictive_density(y, mean, sd) -> np.ndarray:
    """log N(y; mean, sd²) per point: the Gaussian predictive density of a new observation."""
    y, mean, sd = (np.asarray(a, dtype=float) for a in (y, mean, sd))
    return -0.5 * np.log(2 * np.pi * sd ** 2) - 0.5 * ((y - mean) / sd) ** 2


def predictive_scores(y, mean, sd) -> dict:
    """{"n", "rmse", "mae", "crps", "coverage95", "mlpd"}: outputs.metrics.scores plus the mean log predictive
    density (higher is better)."""
    from spatialfed.outputs.metrics import scores

    return {**scores(y, mean, sd), "mlpd": float(np.mean(log_predictive_density(y, mean, sd)))}


def scores_at(gp, X, y, coords=None) -> dict:
    """``predictive_scores`` of the estimator's prediction at X against y (values, or the name of a column of a
    DataFrame X), on y's own scale: for a log fit those of its lognormal predictive (outputs.metrics.
    prediction_scores; mlpd of the lognormal density)."""
    from spatialfed.api.inputs import observed_values
    from spatialfed.model import transform
    from spatialfed.outputs.metrics import prediction_scores

    z = observed_values(X, y)
    pred = predict(gp, *targets(gp, X, coords))
    if "mean_log" not in pred:
        return predictive_scores(z, pred["mean"], pred["sd"])
    density = transform.log_density(z, pred["mean_log"], pred["sd_log"])
    return {**prediction_scores(z, pred), "mlpd": float(np.mean(density))}
