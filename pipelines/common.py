"""What both real-data pipelines do once their store and map inputs exist: fit, compare on held-out data, map, report.

`run_pipeline`: one Dask cluster for everything; the federated low-rank fit (FederatedGP on Dask), the independence
model baseline, held-out scores of low-rank vs independence vs pooled OLS (`spatialfed predict`'s driver), the
low-rank and independence maps (`spatialfed map`'s driver), a held-out figure and report.md; `publish` copies the
PNGs to docs/.

`fit_independence` maximises the independence-model likelihood ℓ_ind = Σ_j log N(z_j; X_jγ, C_jj + δ⁻¹I) (Eq. 3)
centrally over (γ, log δ, log σ², log β) with L-BFGS. It is a stand-in for `spatialfed fit --method independent`
(not available yet): it loads every partition into this process, which is fine for the public data of the pipelines.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from scipy import optimize

from spatialfed.data.store import load_worker, open_store
from spatialfed.model.matern import Matern
from spatialfed.model.reference import independent_loglik
from spatialfed.api import FederatedGP
from spatialfed.outputs import metrics
from spatialfed.outputs.maps import heldout_figure, make_map
from spatialfed.outputs.prediction import predict, write_json, write_prediction
from spatialfed.outputs.results import FitResult, write_results
from spatialfed.runtime.cluster import default_n_workers, make_cluster

#: held-out comparison: label -> (fit directory name, predictor)
COMPARED = {"low-rank (federated)": ("fit_lowrank", "lowrank"),
            "independence model": ("fit_independent", "independent"),
            "pooled OLS": ("fit_lowrank", "ols")}


def fit_independence(store, nu: float, start: dict, knots, out_dir):
    """Fit Eq. (3) from `start` ({"gamma","delta","sigma2","beta"}) and write fit.json/model.zarr to out_dir."""
    info = open_store(store)
    parts = [load_worker(info.path, j) for j in range(info.n_workers)]
    kernel, p = Matern(nu), len(start["gamma"])

    def negloglik(x):
        delta, sigma2, beta = np.exp(x[p:])
        return -independent_loglik(parts, kernel, x[:p], delta, sigma2, beta)

    x0 = np.concatenate([start["gamma"], np.log([start["delta"], start["sigma2"], start["beta"]])])
    tic = time.perf_counter()
    res = optimize.minimize(negloglik, x0, method="L-BFGS-B")
    delta, sigma2, beta = np.exp(res.x[p:])
    result = FitResult(
        method="independent", mode="sync", residual="full", nu=nu, n_workers=info.n_workers,
        n_obs=int(sum(len(z) for _, z, _ in parts)),
        params={"gamma": res.x[:p], "delta": delta, "sigma2": sigma2, "beta": beta}, loglik=-res.fun,
        knots=knots, iterations=int(res.nit), wall_time_s=time.perf_counter() - tic, converged=bool(res.success),
        extra={"covariate_names": info.covariate_names, "store": str(info.path),
               "note": "centralized L-BFGS fit of Eq. (3) (pipelines/common.py)"})
    return write_results(out_dir, result)


def small_png(source, target) -> None:
    """Copy a figure as a 256-colour palette PNG (a third of the size; for the figures committed under docs/)."""
    from PIL import Image

    with Image.open(source) as im:
        im.convert("RGB").quantize(256, dither=Image.Dither.NONE).save(target, optimize=True)


def fit_and_score(store, out, client, *, domain, knots: int, nu: float, mode: str, fit_options=None):
    """Federated low-rank fit and independence baseline written into out/, each COMPARED method scored at the store's
    test group (heldout_<predictor>.csv, metrics.json); returns (estimator, frames, scores)."""
    out = Path(out)
    domain.to_geoseries().to_file(out / "domain.gpkg")
    gp = FederatedGP(mode=mode, residual="full", knots=knots, nu=nu, domain=domain, client=client,
                     progress=False, **(fit_options or {})).fit(store)
    gp.save(out / "fit_lowrank")
    fit_independence(store, nu, gp.params_, gp.knots_, out / "fit_independent")
    frames, scores = {}, {}
    for label, (fit, predictor) in COMPARED.items():
        frames[label], scores[label] = predict(out / fit, store, domain=out / "domain.gpkg", predictor=predictor,
                                               client=client)
        write_prediction(frames[label], out / f"heldout_{predictor}.csv")
    write_json(out / "metrics.json", scores)
    return gp, frames, scores


def fit_line(gp) -> str:
    """One report line describing a federated low-rank fit."""
    p, nu = gp.params_, gp.nu
    return (f"federated low-rank fit ({gp.mode}, {gp.residual} residual, m = {len(gp.knots_)} knots, ν = {nu}): "
            f"γ = {np.round(p['gamma'], 4).tolist()}, δ = {p['delta']:.4g} (noise sd {p['delta'] ** -0.5:.4g}), "
            f"σ² = {p['sigma2']:.4g}, β = {p['beta']:.4g} (effective range {Matern(nu).range_from_beta(p['beta']):.4g}),"
            f" {gp.n_iter_} iterations, {'converged' if gp.converged_ else 'not converged'}, loglik {gp.loglik_:.4f}")


def cluster(n_workers: int, dask_workers: int | None):
    """An embedded Dask cluster with min(J, cores) worker processes unless told otherwise."""
    return make_cluster(None, n_workers=dask_workers or min(n_workers, default_n_workers()))


def run_pipeline(name: str, store, out, *, domain, map_inputs: dict, knots: int, nu: float, mode: str,
                 dask_workers: int | None, publish: Path | None, description: str, fit_options=None) -> str:
    """Fit, score on the store's test group, map (low-rank and independence) and write report.md; returns it.

    `domain`: a Domain for the knots and the map (also written to out/domain.gpkg); `map_inputs`: further keyword
    arguments of make_map (covariates, overlay, resolution, units, title); `fit_options`: more FederatedGP settings.
    """
    out = Path(out)
    tic = time.perf_counter()
    info = open_store(store)
    with cluster(info.n_workers, dask_workers) as handle:
        gp, frames, scores = fit_and_score(store, out, handle.client, domain=domain, knots=knots, nu=nu, mode=mode,
                                           fit_options=fit_options)
        maps = {predictor: make_map(out / fit, store, out / f"map_{predictor}", domain=out / "domain.gpkg",
                                    predictor=predictor, client=handle.client,
                                    **{**map_inputs, "title": f"{map_inputs['title']} — {label}"})
                for label, (fit, predictor) in list(COMPARED.items())[:2]}
    heldout = heldout_figure(out / "heldout.png", frames, map_inputs["units"],
                             f"{name}: {scores[next(iter(scores))]['n']} held-out sites")
    report = "\n".join([
        f"# {name}", "", description, "",
        f"- store: {info.n_workers} workers ({info.partition}), sizes {info.sizes}, CRS {info.crs}, "
        f"covariates {info.covariate_names}",
        f"- {fit_line(gp)}",
        "", "Held-out scores (sd is that of a new observation; CRPS for the Gaussian predictive):", "",
        metrics.table(scores), "",
        f"Figures: {', '.join(str(m['png'].relative_to(out)) for m in maps.values())}, {heldout.name}. "
        f"Run time {time.perf_counter() - tic:.0f} s.", ""])
    (out / "report.md").write_text(report)
    if publish is not None:
        slug = name.lower().replace(" ", "_")
        figures = {f"{slug}_map_{predictor}.png": m["png"] for predictor, m in maps.items()}
        publish_figures(publish, {**figures, f"{slug}_heldout.png": heldout})
    return report


def publish_figures(directory: Path, figures: dict) -> None:
    """Write each figure (target name -> source path) into the docs directory as a small PNG."""
    directory.mkdir(parents=True, exist_ok=True)
    for target, source in figures.items():
        small_png(source, directory / target)
