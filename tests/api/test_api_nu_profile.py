"""The estimator's profile-likelihood interval of ν (api/nu_profile.py): refits with log ν pinned by the statistics
server's box, driven on the fit's runtime, reach the in-process ``algorithm.family_fit.nu_interval`` on the same
data and knots; an open side is None, not the box's bound; save/load keeps it."""

from types import SimpleNamespace

import numpy as np
import pytest

from spatialfed import FederatedGP
from spatialfed.algorithm.family_fit import family_bounds, nu_interval
from spatialfed.api.units import describe
from spatialfed.data.store import load_worker, open_store
from spatialfed.model.family import NU_RANGE, MaternFamily
from tests.conftest import grid_knots, simulate_parts

KNOTS = grid_knots(3)


def _fit(n: int, seed: int = 3, nu: float = 1.5, beta: float = 0.2, mode: str = "sync"):
    parts = simulate_parts(J=3, n=n, nu=nu, beta=beta, seed=seed)
    locs = np.vstack([p[0] for p in parts])
    z = np.concatenate([p[1] for p in parts])
    X = np.vstack([p[2][:, 1:] for p in parts])  # the intercept is the estimator's own
    groups = np.repeat(np.arange(len(parts)), [len(p[1]) for p in parts])
    gp = FederatedGP(mode=mode, knots=KNOTS, cluster="simulated", progress=False, tol=1e-7, max_iter=200,
                     nu="estimate")
    return gp.fit(X, z, coords=locs, groups=groups), z


@pytest.fixture(scope="module")
def identified():
    """300 points of a ν = 1.5 field: the data bound ν from below (ν̂ ≈ 2.4), not from above within ν ≤ 4."""
    return _fit(100)


def _serial_interval(gp, z):
    """family_fit.nu_interval on the fit's stored sites, from the fit's estimate (the refits' box for the other
    coordinates is family_bounds' default; it is not reached here)."""
    parts = [load_worker(gp.store_, j) for j in range(open_store(gp.store_).n_workers)]
    family = MaternFamily(None)
    lower, upper = family_bounds(family, float(np.var(z)), 2.0)
    u = np.log([gp.params_[k] for k in ("delta", "sigma2", "beta", "nu")])
    ends = nu_interval(parts, KNOTS, family, gp.residual_, SimpleNamespace(u=u, loglik=gp.loglik_), lower, upper,
                       gp.variogram_params_["nu_se_log"])
    return [None if e is None else float(np.exp(e)) for e in ends]


@pytest.mark.slow
def test_the_federated_profile_interval_is_the_in_process_one(identified):
    gp, z = identified
    vp = gp.variogram_params_
    serial = _serial_interval(gp, z)
    assert serial[0] is not None and serial[1] is None
    assert vp["nu_95"][0] == pytest.approx(serial[0], rel=1e-3) and vp["nu_95"][1] is None
    assert vp["nu_95"][0] < vp["nu"]  # the interval holds ν̂
    # the Wald interval reaches the box (a number there); the profile likelihood says the side is open
    assert vp["nu_95_wald"][1] == pytest.approx(NU_RANGE[1]) and vp["nu_95_wald"][0] < vp["nu_95"][0]
    assert vp["nu_interval_rounds"] > gp.n_iter_ and vp["nu_interval_s"] > 0
    assert "95 % profile-likelihood interval" in describe(vp) and f"{NU_RANGE[1]:.3g} (open)" in describe(vp)


@pytest.mark.slow
def test_save_and_load_keep_the_interval(identified, tmp_path):
    gp, _ = identified
    gp.save(tmp_path / "fit")
    back = FederatedGP.load(tmp_path / "fit").variogram_params_
    for key in ("nu_95", "nu_95_wald", "nu_interval_rounds", "nu_interval_s", "nu_se_log"):
        assert back[key] == gp.variogram_params_[key], key  # JSON keeps floats exactly


def test_a_weakly_identified_nu_has_no_profile_interval_where_wald_gives_numbers():
    """120 points: ℓ_p drops by less than χ²₁(0.95)/2 over the whole box on both sides."""
    gp, z = _fit(40)
    vp = gp.variogram_params_
    assert vp["nu_95"] is None and _serial_interval(gp, z) == [None, None]
    assert len(vp["nu_95_wald"]) == 2 and all(isinstance(e, float) for e in vp["nu_95_wald"])
    assert "the profile likelihood bounds neither side" in describe(vp)
    assert vp["nu_interval_rounds"] > 0


@pytest.mark.slow
def test_an_async_fit_reports_the_sync_fits_interval(identified):
    """The refits are synchronous whatever the fit's mode (its agg_threshold does not reach them)."""
    sync, _ = identified
    gp, _ = _fit(100, mode="async")
    assert gp.variogram_params_["nu_95"][0] == pytest.approx(sync.variogram_params_["nu_95"][0], rel=1e-3)
    assert gp.variogram_params_["nu_95"][1] is None


@pytest.mark.slow
def test_a_fit_saved_before_the_profile_interval_loads_its_wald_interval_as_such(identified, tmp_path):
    """Such a fit's "nu_95" (fit.json and model.zarr's settings) was the Wald interval."""
    import json

    import zarr

    gp, _ = identified
    gp.save(tmp_path / "fit")

    def older(vp: dict) -> dict:
        vp = {k: v for k, v in vp.items() if k not in ("nu_95_wald", "nu_interval_rounds", "nu_interval_s")}
        return {**vp, "nu_95": gp.variogram_params_["nu_95_wald"]}

    path = tmp_path / "fit" / "fit.json"
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "variogram_params": older(doc["variogram_params"])}))
    group = zarr.open_group(str(tmp_path / "fit" / "model.zarr"), mode="a")
    settings = dict(group.attrs["settings"])
    group.attrs["settings"] = {**settings, "variogram_params": older(settings["variogram_params"])}
    back = FederatedGP.load(tmp_path / "fit").variogram_params_
    assert back["nu_95_wald"] == gp.variogram_params_["nu_95_wald"] and "nu_95" not in back
    assert "95 % Wald interval" in describe(back)
