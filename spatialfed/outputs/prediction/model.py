"""The fitted model prediction needs (φ, knots, ν, residual), from a fit directory or a fitted estimator, and the
checks that a store and a predictor suit it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spatialfed.data import space as spaces
from spatialfed.data.space import Chordal, Linear
from spatialfed.data.store import StoreInfo
from spatialfed.errors import DataError, option
from spatialfed.model import transform
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params
from spatialfed.model.vecchia_order import VECCHIA_K
from spatialfed.outputs.results import check_same_store, load_fit

PREDICTORS = ("seamless", "lowrank", "independent", "personal", "ols")


@dataclass(frozen=True)
class FittedModel:
    """What prediction needs from a fit directory: the server's state φ, the knots, ν and the residual structure."""

    params: Params
    knots: np.ndarray
    nu: float
    residual: str
    method: str
    covariate_names: list[str] | None
    store: str | None = None              # the store the fit was made on, and its fingerprint (fit.json)
    store_fingerprint: str | None = None
    vecchia_k: int = VECCHIA_K            # neighbours of the Vecchia residual (fit.json "vecchia_k")
    transform: str = "none"               # "log": fitted on log values, predicted on their own scale (fit.json)
    space: Linear | Chordal | None = None  # data/space.py: a fitted anisotropy's As, or chordal distances

    @property
    def kernel(self) -> Matern:
        return Matern(self.nu)

    def to_space(self, locs) -> np.ndarray:
        """Points in the coordinates the kriging works in (`space`: As, or Earth-centred x/y/z), else as given."""
        locs = np.asarray(locs, dtype=float)
        return locs if self.space is None else self.space.forward(locs)

    @property
    def space_knots(self) -> np.ndarray:
        """The knots in those coordinates (the sites' are mapped alike: runtime.site.site_specs)."""
        return self.to_space(self.knots)

    @classmethod
    def from_estimator(cls, gp) -> "FittedModel":
        """The FittedModel of a fitted `FederatedGP` (what `load_model` reads from the directory it saves)."""
        return cls(_params(gp.params_, gp.mu_, gp.Sigma_, len(gp.knots_)),
                   np.asarray(gp.knots_, dtype=float).reshape(-1, 2), float(gp.variogram_params_["nu"]),
                   getattr(gp, "residual_", gp.residual), gp.method, list(gp.covariate_names_),
                   vecchia_k=gp.vecchia_k_, transform=getattr(gp, "transform_", "none"),
                   space=_space(gp.variogram_params_, gp.store_crs_))


def _params(p: dict, mu, Sigma, m: int) -> Params:
    """φ from the fitted (γ, δ, σ², β) and the low-rank part (μ, Σ; zeros for fits without one: m knots)."""
    mu = np.zeros(m) if mu is None else mu
    Sigma = np.zeros((m, m)) if Sigma is None else Sigma
    return Params(mu, Sigma, np.asarray(p["gamma"], dtype=float), p["delta"], p["sigma2"], p["beta"])


def load_model(fit_dir) -> FittedModel:
    """The FittedModel of a `spatialfed fit` output directory (fit.json + model.zarr)."""
    try:
        fit = load_fit(fit_dir)
    except FileNotFoundError as exc:
        where = option("the directory FederatedGP.save wrote", "the --out directory of `spatialfed fit`")
        raise DataError(f"{exc}; give {where}") from None
    knots = np.asarray(fit.knots, dtype=float).reshape(-1, 2)
    m = len(knots)
    if fit.method == "lowrank" and (fit.mu is None or fit.Sigma is None or m == 0):
        raise DataError(f"{fit_dir} has no μ, Σ or knots (model.zarr missing or damaged); run `spatialfed fit` again")
    params = _params(fit.params, fit.mu, fit.Sigma, m)  # non-low-rank fits: no low-rank part
    return FittedModel(params, knots, float(fit.nu), fit.residual, fit.method, fit.extra.get("covariate_names"),
                       fit.extra.get("store"), fit.store_fingerprint, int(fit.extra.get("vecchia_k", VECCHIA_K)),
                       transform.check_transform(fit.extra.get("transform")),
                       _space(fit.extra.get("variogram_params", {}), fit.extra.get("store_crs")))


def _space(vp: dict, crs) -> Linear | Chordal | None:
    """The space of a fit's variogram_params: Linear for an anisotropy's "metric", Chordal for "distance":
    "chordal" (the store's CRS), else None (planar, isotropic)."""
    if vp.get("distance") == "chordal":
        return spaces.chordal(crs)
    value = vp.get("metric")
    if value is None:
        return None
    A = np.asarray(value, dtype=float)
    if A.shape != (2, 2) or not np.all(np.isfinite(A)) or abs(np.linalg.det(A)) < 1e-12:
        raise DataError(f"fit.json's anisotropy metric {value!r} is not an invertible 2×2 matrix; run `spatialfed "
                        "fit` again")
    return Linear(tuple(tuple(float(v) for v in row) for row in A))


def check_store(model: FittedModel, info: StoreInfo) -> None:
    """Raise unless `info` is the store the model was fitted on (its fingerprint, results.check_same_store) and has
    the covariates the model was fitted with."""
    check_same_store(model.store_fingerprint, info, recorded_store=model.store)
    names = list(info.covariate_names)
    if len(names) != model.params.gamma.size or (model.covariate_names and names != list(model.covariate_names)):
        raise DataError(f"store {info.path} has covariates {names}, but the fit used "
                        f"{model.covariate_names or model.params.gamma.size}; predict with the store the model was "
                        "fitted on")


def default_predictor(model: FittedModel) -> str:
    """`seamless` for low-rank fits, `independent` for the baselines' fits."""
    return "seamless" if model.method == "lowrank" else "independent"


def check_predictor(predictor: str, worker: int | None, n_workers: int) -> None:
    """Raise ValueError for an unknown predictor, or `personal` without a valid worker index."""
    if predictor not in PREDICTORS:
        raise ValueError(f"predictor must be one of {PREDICTORS}, got {predictor!r}")
    if predictor == "personal" and (worker is None or not 0 <= int(worker) < n_workers):
        raise ValueError(f"personalised prediction needs a worker index 0..{n_workers - 1} "
                         f"({option('worker=J', '--worker J')}), "
                         f"got {worker!r}")
