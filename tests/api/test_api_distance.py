"""Distances on the sphere (data/space.py Chordal; the estimator's ``distance``, api/covariance.py): the map's chord is
2R sin(θ/2) of the great-circle angle and its inverse gives the store's points back; a chordal fit through
FederatedGP, sync and async, reaches the centralized optimum of the same model (the Earth-centred points), predicts
as its centralized kriging and keeps it after save/load; ν estimated and the Vecchia residual take it;
``distance=None`` is chordal only for a store whose domain spans more than AUTO_CHORDAL_KM; what a fit cannot take
is one line."""

import numpy as np
import pandas as pd
import pytest
from pyproj import Transformer
from scipy import optimize
from scipy.spatial.distance import cdist

from spatialfed import FederatedGP
from spatialfed.api.covariance import AUTO_CHORDAL_KM
from spatialfed.data import space
from spatialfed.data.store import load_worker, open_store
from spatialfed.errors import DataError
from spatialfed.model.family import EARTH_RADIUS_KM, MaternFamily, unit_vectors
from spatialfed.model.reference import lowrank_kriging, profile_lowrank_loglik


def _frame(n=160, span=(24.0, 16.0), seed=0, range_km=400.0):
    """n points over span° of lon × lat from (−100°, 30°), an exponential field of `range_km` on the sphere, four
    sites by quadrant."""
    rng = np.random.default_rng(seed)
    lon, lat = -100.0 + span[0] * rng.uniform(size=n), 30.0 + span[1] * rng.uniform(size=n)
    x = EARTH_RADIUS_KM * unit_vectors(np.column_stack([lon, lat]))
    C = np.exp(-cdist(x, x) / range_km) + 0.2 * np.eye(n)
    y = 1.0 + np.linalg.cholesky(C) @ rng.standard_normal(n)
    site = (lon > -100.0 + span[0] / 2).astype(int) + 2 * (lat > 30.0 + span[1] / 2)
    return pd.DataFrame({"lon": lon, "lat": lat, "y": y, "site": site})


def _fit(frame, mode="sync", **settings):
    gp = FederatedGP(**{"mode": mode, "knots": 16, "cluster": "simulated", "progress": False, "tol": 1e-7,
                        "max_iter": 200, "crs": "EPSG:4326", **settings})
    return gp.fit(frame[["lon", "lat"]], frame["y"], groups=frame["site"])


def _mapped(gp):
    """(the sites' (x, z, X) and the knots) in Earth-centred coordinates, as the fit's sites hold them."""
    sp = space.chordal(gp.store_crs_)
    parts = [load_worker(gp.store_, j) for j in range(open_store(gp.store_).n_workers)]
    return [(sp.forward(s), z, X) for s, z, X in parts], sp.forward(gp.knots_), sp


def test_the_chord_is_that_of_the_great_circle_angle_and_maps_back():
    sp = space.chordal("EPSG:3035")  # a projected CRS in metres (LAEA Europe)
    rng = np.random.default_rng(2)
    lonlat = np.column_stack([rng.uniform(-10, 30, 50), rng.uniform(35, 65, 50)])
    s = np.column_stack(Transformer.from_crs("EPSG:4326", "EPSG:3035", always_xy=True).transform(*lonlat.T))
    x = sp.forward(s)
    lon, lat = np.radians(lonlat).T
    hav = np.sin((lat[:, None] - lat) / 2) ** 2 + np.cos(lat[:, None]) * np.cos(lat) * np.sin((lon[:, None] - lon) / 2) ** 2
    theta = 2 * np.arcsin(np.sqrt(hav))
    R = EARTH_RADIUS_KM * 1000.0
    np.testing.assert_allclose(cdist(x, x), 2 * R * np.sin(theta / 2), rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(sp.back(x), s, atol=1e-6)
    assert sp.arc_degrees(2 * R * np.sin(theta[0, 1] / 2)) == pytest.approx(np.degrees(theta[0, 1]), rel=1e-9)
    assert sp.km == pytest.approx(1e-3)


def test_a_chordal_fit_reaches_the_centralized_optimum_sync_and_async():
    frame = _frame()
    fits = {mode: _fit(frame, mode, distance="chordal") for mode in ("sync", "async")}
    parts, knots, sp = _mapped(fits["sync"])
    family = MaternFamily(0.5)  # isotropic in the Earth-centred points: the chordal Matérn
    f = lambda u: -profile_lowrank_loglik(parts, knots, family, fits["sync"].residual_, u)[0]  # noqa: E731
    u0 = np.log([fits["sync"].params_[k] for k in ("delta", "sigma2", "beta")])
    res = optimize.minimize(f, u0, method="Nelder-Mead", options={"xatol": 1e-9, "fatol": 1e-12, "maxiter": 20000})
    for mode, gp in fits.items():
        assert abs(gp.loglik_ + res.fun) <= 1e-6, (mode, gp.loglik_, -res.fun)
        vp = gp.variogram_params_
        assert vp["distance"] == "chordal"
        assert vp["range_km"] == pytest.approx(gp.params_["beta"] / 1000.0)
        assert vp["range_arc_deg"] == pytest.approx(sp.arc_degrees(gp.params_["beta"]))
    planar = _fit(frame, distance="planar")
    assert planar.variogram_params_["distance"] == "planar" and abs(planar.loglik_ - fits["sync"].loglik_) > 1e-3


def test_a_chordal_fit_predicts_as_its_centralized_kriging_and_after_load(tmp_path):
    from spatialfed.api.predicting import fitted_model
    from spatialfed.outputs.prediction import open_workers, predict_at

    gp = _fit(_frame(seed=1), distance="chordal")
    model = fitted_model(gp)
    rng = np.random.default_rng(3)
    lonlat = np.column_stack([rng.uniform(-100, -76, 30), rng.uniform(30, 46, 30)])
    locs0 = np.column_stack(Transformer.from_crs("EPSG:4326", gp.store_crs_, always_xy=True).transform(*lonlat.T))
    X0 = np.ones((30, 1))
    with open_workers(open_store(gp.store_), model, "simulated") as workers:
        pred = predict_at(workers, model, locs0, X0, "lowrank")
    parts, knots, sp = _mapped(gp)
    p = gp.params_
    mean, var = lowrank_kriging(parts, pred["owner"], sp.forward(locs0), X0, knots, MaternFamily(0.5), gp.residual_,
                                p["gamma"], p["delta"], p["sigma2"], [np.log(p["beta"])])
    np.testing.assert_allclose(pred["mean"], mean, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(pred["sd_latent"] ** 2, var, rtol=1e-6, atol=1e-9)
    gp.save(tmp_path / "fit")
    again = FederatedGP.load(tmp_path / "fit")
    assert again.variogram_params_["distance"] == "chordal"
    new = pd.DataFrame({"lon": lonlat[:, 0], "lat": lonlat[:, 1]})
    np.testing.assert_allclose(again.predict(new), gp.predict(new), rtol=1e-12)
    seamless = gp.predict(new)  # the default predictor: its boundary exchange laid out in the store's coordinates
    assert np.all(np.isfinite(seamless)) and np.max(np.abs(seamless - pred["mean"])) < 1.0


@pytest.mark.parametrize("settings", [{"nu": "estimate"}, {"residual": "vecchia"}], ids=["nu", "vecchia"])
def test_estimated_nu_and_the_vecchia_residual_take_chordal_distances(settings):
    """ℓ at the estimate equals the centralized one of the same model (Earth-centred points, the sites' Vecchia
    plan for vecchia) at the same u."""
    gp = _fit(_frame(seed=2), distance="chordal", **settings)
    parts, knots, _ = _mapped(gp)
    family = MaternFamily(None if "nu" in settings else 0.5)
    u = np.log([gp.params_[k] for k in ("delta", "sigma2", "beta")] + ([gp.params_["nu"]] if "nu" in settings else []))
    ref = profile_lowrank_loglik(parts, knots, family, gp.residual_, u)[0]
    assert gp.residual_ == settings.get("residual", "full")
    assert gp.loglik_ == pytest.approx(ref, rel=1e-8)


def test_distance_none_is_chordal_only_for_a_store_spanning_more_than_the_threshold():
    assert AUTO_CHORDAL_KM == 1000.0
    wide, narrow = _fit(_frame(n=60)), _fit(_frame(n=60, span=(6.0, 5.0), range_km=150.0))  # ~2,900 km, ~780 km
    assert wide.variogram_params_["distance"] == "chordal" and "range_km" in wide.variogram_params_
    assert narrow.variogram_params_["distance"] == "planar" and "range_km" not in narrow.variogram_params_
    rng = np.random.default_rng(0)
    planar = FederatedGP(knots=9, cluster="simulated", progress=False).fit(
        None, rng.standard_normal(60), coords=rng.uniform(size=(60, 2)) * 1e4, groups=np.arange(60) % 3)
    assert planar.variogram_params_["distance"] == "planar"  # no CRS: no longitude/latitude


@pytest.mark.parametrize("settings, error, says", [
    ({"distance": "sphere"}, ValueError, "distance must be one of 'planar', 'chordal'"),
    ({"distance": "chordal", "anisotropy": True}, ValueError, "anisotropy=True takes planar distances"),
    ({"distance": "chordal", "method": "fgpr"}, ValueError, "method='fgpr' takes planar distances"),
])
def test_settings_a_chordal_fit_cannot_take_are_one_line(settings, error, says):
    with pytest.raises(error) as err:
        _fit(_frame(n=40), **settings)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_chordal_distances_on_a_store_without_a_crs_are_refused_in_one_line():
    rng = np.random.default_rng(0)
    with pytest.raises(DataError) as err:
        FederatedGP(knots=9, cluster="simulated", progress=False, distance="chordal").fit(
            None, rng.standard_normal(60), coords=rng.uniform(size=(60, 2)) * 1e4, groups=np.arange(60) % 3)
    assert "planar units" in str(err.value) and "\n" not in str(err.value)


def test_a_chordal_fit_resumed_from_its_checkpoint_keeps_its_knots_in_the_stores_coordinates(tmp_path):
    """The checkpoint holds the server's Earth-centred knots: the resumed estimator takes them back to the store's
    coordinates (knots_, to pyproj's round trip) and its sites to the same model (ℓ and predictions)."""
    from spatialfed import Checkpoint

    frame = _frame(seed=4)
    path = tmp_path / "ckpt.zip"
    gp = _fit(frame, distance="chordal", checkpoint=Checkpoint(path, every=1))
    resumed = FederatedGP.resume(path)
    assert resumed.variogram_params_["distance"] == "chordal" and resumed.knots_.shape == gp.knots_.shape
    np.testing.assert_allclose(resumed.knots_, gp.knots_, rtol=0, atol=1e-2)  # metres
    assert resumed.loglik_ == pytest.approx(gp.loglik_, abs=1e-9)
    new = frame[["lon", "lat"]].iloc[:5]
    np.testing.assert_allclose(resumed.predict(new), gp.predict(new), rtol=1e-6)


def test_points_over_the_whole_globe_get_m_knots_on_the_sphere():
    """The equal-area plane of global data is a disk, and the sites' bounding boxes reach past it: the knots are laid
    out over the part of the domain that maps to the sphere, m of them, and the fit and its predictions run."""
    rng = np.random.default_rng(5)
    v = rng.standard_normal((240, 3))
    v /= np.linalg.norm(v, axis=1)[:, None]
    frame = pd.DataFrame({"lon": np.degrees(np.arctan2(v[:, 1], v[:, 0])), "lat": np.degrees(np.arcsin(v[:, 2]))})
    frame["y"] = v[:, 2] + 0.3 * rng.standard_normal(240)
    frame["site"] = ((frame["lon"] + 180) // 120).astype(int)
    with pytest.warns(UserWarning, match="distortion"):  # the projection of the globe, as ingest says
        gp = _fit(frame, max_iter=30)
    sp = space.chordal(gp.store_crs_)
    assert gp.variogram_params_["distance"] == "chordal" and len(gp.knots_) == 16
    assert sp.has_lonlat(gp.knots_).all() and not sp.has_lonlat([[4.0 * sp.radius, 0.0]]).any()
    assert np.all(np.isfinite(gp.predict(frame[["lon", "lat"]].iloc[:20])))
