"""What both real-data pipelines do once their store and map inputs exist: fit, compare on held-out data, map, report.

`run_pipeline`: one Dask cluster for everything; the federated low-rank fit (FederatedGP on Dask), the independence
model baseline, held-out scores of low-rank vs independence vs pooled OLS (`spatialfed predict`'s driver), the
low-rank and independence maps (`spatialfed map`'s driver), a held-out figure and report.md; `publish` copies the
PNGs to docs/.

The independence-model baseline (Eq. 3) is fitted federated too, as `FederatedGP(method="independent")`: the same
server and workers with no knots.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from spatialfed.data.store import open_store
from spatialfed.model.matern import Matern
from spatialfed.api import FederatedGP
from spatialfed.outputs import metrics
from spatialfed.outputs.maps import heldout_figure, make_map
from spatialfed.atomic import write_text
from spatialfed.outputs.prediction import predict, write_prediction
from spatialfed.runtime.cluster import default_n_workers, make_cluster

#: held-out comparison: label -> (fit directory name, predictor)
COMPARED = {"low-rank (federated)": ("fit_lowrank", "lowrank"),
            "independence model": ("fit_independent", "independent"),
            "pooled OLS": ("fit_lowrank", "ols")}


def write_json(path, doc) -> Path:
    """`doc` as indented JSON, written atomically (spatialfed.atomic)."""
    return write_text(path, json.dumps(doc, indent=1) + "\n")


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
    gp.save(out / "fit_lowrank", overwrite=True)  # a re-run replaces its results
    FederatedGP(method="independent", mode="sync", nu=nu, domain=domain, client=client, progress=False,
                max_iter=(fit_options or {}).get("max_iter", 50)).fit(store).save(out / "fit_independent",
                                                                                overwrite=True)
    frames, scores = {}, {}
    for label, (fit, predictor) in COMPARED.items():
        frames[label], scores[label] = predict(out / fit, store, domain=out / "domain.gpkg", predictor=predictor,
                                               client=client)
        write_prediction(frames[label], out / f"heldout_{predictor}.csv", overwrite=True)
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
                                    predictor=predictor, client=handle.client, overwrite=True,
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
