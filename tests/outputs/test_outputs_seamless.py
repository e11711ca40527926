"""Seamless prediction (issue 30): partition-of-unity weights, continuity across an owners' boundary, the blend's
owner predictor deep inside a region, sites that answer from their own data only, and the seam statistic (the
boundary exchange's maths: tests/outputs/test_outputs_exchange.py)."""

import numpy as np
import pytest

from spatialfed.cli import main
from spatialfed.data.store import load_test, open_store
from spatialfed.outputs import prediction as pr
from spatialfed.outputs import seamless
from spatialfed.outputs.metrics import seam_ratio

KEYS = ("mean", "sd", "sd_latent")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """Two area sites × 150 points (noise sd 0.5: the residual part matters) and a quick in-process fit."""
    d = tmp_path_factory.mktemp("seamless")
    store, fit = d / "sim.zarr", d / "fit"
    assert main(["simulate", str(store), "--workers", "2", "--n-per-worker", "150", "--partition", "area",
                 "--noise-sd", "0.5", "--test-size", "200", "--seed", "4", "--quiet"]) == 0
    assert main(["fit", str(store), "--out", str(fit), "--runtime", "simulated", "--knots", "16", "--mode", "sync",
                 "--max-iter", "8", "--quiet"]) == 0
    return store, fit, pr.load_model(fit)


def test_weights_are_a_partition_of_unity():
    rng = np.random.default_rng(0)
    d = rng.random((4, 500))
    w = seamless.blend_weights(d, 0.2)
    assert np.all(w >= 0) and np.allclose(w.sum(axis=0), 1.0, rtol=0, atol=1e-14)
    owner, excess = d.argmin(axis=0), np.sort(d, axis=0)[1] - d.min(axis=0)
    deep = excess >= 0.2
    assert deep.any() and (~deep).any()
    np.testing.assert_array_equal(w[owner[deep], np.flatnonzero(deep)], 1.0)   # the owner alone, deep inside
    assert np.all(w[owner[~deep], np.flatnonzero(~deep)] < 1.0)                  # shared within the band
    tie = seamless.blend_weights(np.array([[0.3], [0.3], [0.9]]), 0.2)
    np.testing.assert_allclose(tie.ravel(), [0.5, 0.5, 0.0], rtol=0, atol=1e-15)  # on the boundary: halves
    # continuous: a distance moved by ε moves every weight by O(ε)
    for eps in (1e-3, 1e-6):
        moved = seamless.blend_weights(d + eps * rng.standard_normal(d.shape), 0.2)
        assert np.abs(moved - w).max() < 30 * eps
    with pytest.raises(ValueError, match="band half-width"):
        seamless.blend_weights(d, 0.0)


def _boundary_point(models, y=0.5):
    """A point where the two sites' nearest-observation distances are equal (the owners' boundary), by bisection
    along the horizontal line at y, and the line's direction across it."""
    def gap(x):
        p = np.array([[x, y]])
        return float(models[0].nearest_distance(p)[0] - models[1].nearest_distance(p)[0])

    lo, hi = 0.0, 1.0
    assert np.sign(gap(lo)) != np.sign(gap(hi)), "the two area sites should meet along y = 0.5"
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if np.sign(gap(mid)) == np.sign(gap(lo)) else (lo, mid)
    return np.array([0.5 * (lo + hi), y]), np.array([1.0, 0.0])


def test_mean_and_sd_continuous_across_the_boundary(fitted):
    """Two points ε apart on either side of the owners' boundary: the seamless mean and sd differ by O(ε); the
    owner predictor's jump stays (so the check can fail)."""
    store, _, model = fitted
    with pr.open_workers(open_store(store), model, "simulated") as workers:
        s, n = _boundary_point(workers.models)
        X = np.ones((2, model.params.gamma.size))
        gaps, owner_gaps = [], []
        for eps in (1e-2, 1e-4, 1e-6):
            pts = np.array([s - eps * n, s + eps * n])
            got = pr.predict_at(workers, model, pts, X, "seamless")
            ref = pr.predict_at(workers, model, pts, X, "lowrank")
            assert got["owner"][0] != got["owner"][1]   # the two points lie in different owners' regions
            gaps.append([abs(got[k][1] - got[k][0]) for k in KEYS])
            owner_gaps.append(abs(ref["mean"][1] - ref["mean"][0]))
    gaps = np.array(gaps)
    assert np.all(gaps[2] < 1e-4) and np.all(gaps[2] <= gaps[0])
    assert min(owner_gaps) > 100 * gaps[2, 0] and min(owner_gaps) > 1e-3  # the seam the owner predictor leaves


def test_deep_inside_a_region_the_blend_is_the_owner_predictor(fitted):
    """Without the boundary exchange the blend is the owner predictor wherever the owner's weight is 1; with it
    the same points move (the exchange ties every site's residual to its neighbours')."""
    store, _, model = fitted
    locs0, _, X0 = load_test(store)
    with pr.open_workers(open_store(store), model, "simulated") as workers:
        h = seamless.band_width(workers)
        got = seamless.predict_block(workers, model, locs0, X0, h)
        ref = pr.predict_at(workers, model, locs0, X0, "lowrank")
        tied = pr.predict_at(workers, model, locs0, X0, "seamless")
        d = np.array([lm.nearest_distance(locs0) for lm in workers.models])
    deep = seamless.blend_weights(d, h).max(axis=0) == 1.0
    assert 20 <= deep.sum() < len(locs0)  # both kinds of points are present
    for key in KEYS:
        np.testing.assert_allclose(got[key][deep], ref[key][deep], rtol=1e-12, atol=0, err_msg=key)
    np.testing.assert_array_equal(got["owner"], ref["owner"])
    assert np.abs(got["mean"][~deep] - ref["mean"][~deep]).max() > 1e-6  # the band does blend
    assert np.abs(tied["mean"][deep] - ref["mean"][deep]).max() > 1e-6   # the exchange reaches inside


class Spy:
    """The real runtime, recording every site call's name, sites, and the sizes of what came back (a spy)."""

    def __init__(self, runtime):
        self.runtime, self.log = runtime, []

    def __getattr__(self, name):
        return getattr(self.runtime, name)

    def call(self, name, calls):
        out = self.runtime.call(name, calls)
        for j, args in calls.items():
            n0 = len(args[0]) if args and np.ndim(args[0]) == 2 else None
            sizes = [np.shape(v)[0] for v in (out[j].values() if isinstance(out[j], dict) else [out[j]])
                     if np.ndim(v) > 0]
            self.log.append((name, j, n0, sizes))
        return out


def test_sites_answer_from_their_own_data_only(fitted):
    """Through the real code path: the predictor asks only for distances, the spacing, the bounds and, at points
    the server chooses, residual kriging and the exchange posteriors, each answer sized by the points asked; a
    change to site 1's data changes the prediction where site 1's weight is positive, and site 0's answers not at
    all."""
    store, _, model = fitted
    locs0, _, X0 = load_test(store)
    with pr.open_workers(open_store(store), model, "simulated") as workers:
        spy = Spy(workers)
        before = pr.predict_at(spy, model, locs0, X0, "seamless")
        assert {name for name, *_ in spy.log} == {"spacing", "bounds", "nearest_distance", "residual_kriging",
                                                  "anchor_posterior"}
        for name, j, n0, sizes in spy.log:
            small = (name == "spacing") or (name == "bounds" and sizes == [4])
            assert small or (sizes and all(s == n0 for s in sizes)), (name, j, n0, sizes)
        kriged = [(j, n0) for name, j, n0, _ in spy.log if name == "residual_kriging"]
        assert sorted(j for j, _ in kriged) == [0, 1] and sum(n for _, n in kriged) > len(locs0)
        h = seamless.band_width(workers)
        w1 = seamless.blend_weights(np.array([lm.nearest_distance(locs0) for lm in workers.models]), h)[1]
        site0 = workers.models[0].residual_kriging(locs0, model.params, locs0[:5])
        site0_u = workers.models[0].anchor_posterior(locs0[:5], model.params)
        lm1 = workers.models[1]
        lm1.z = lm1.z + 3.0 * np.sin(7 * lm1.locs[:, 0])   # site 1's data change; nobody else's
        lm1.clear_cache()
        after = pr.predict_at(workers, model, locs0, X0, "seamless")
        again0 = workers.models[0].residual_kriging(locs0, model.params, locs0[:5])
        again0_u = workers.models[0].anchor_posterior(locs0[:5], model.params)
    for key in site0:
        np.testing.assert_array_equal(again0[key], site0[key])
    for key in site0_u:
        np.testing.assert_array_equal(again0_u[key], site0_u[key])
    assert np.all(np.abs(after["mean"][w1 > 0.05] - before["mean"][w1 > 0.05]) > 0)


def test_a_singular_exchange_falls_back_to_the_blend(fitted, monkeypatch):
    """If the exchange's solve fails (numerically singular), prediction warns in one line and blends alone."""
    import numpy.linalg

    from spatialfed.outputs import exchange

    store, _, model = fitted
    locs0, _, X0 = load_test(store)

    def singular(*args):
        raise numpy.linalg.LinAlgError("the exchange posterior precision is not positive definite (LAPACK info 3)")

    monkeypatch.setattr(exchange, "solve_exchange", singular)
    with pr.open_workers(open_store(store), model, "simulated") as workers:
        with pytest.warns(RuntimeWarning, match="blend of the sites' own kriging alone"):
            got = pr.predict_at(workers, model, locs0, X0, "seamless")
        ref = seamless.predict_block(workers, model, locs0, X0, seamless.band_width(workers))
    for key in KEYS:
        np.testing.assert_allclose(got[key], ref[key], rtol=1e-12, atol=0)


@pytest.mark.parametrize("residual", ["pp", "mpp"])
def test_pp_and_mpp_fits_have_nothing_to_blend(fitted, residual):
    import dataclasses

    store, _, model = fitted
    model = dataclasses.replace(model, residual=residual)
    locs0, _, X0 = load_test(store)
    with pr.open_workers(open_store(store), model, "simulated") as workers:
        got = pr.predict_at(workers, model, locs0, X0, "seamless")
        ref = pr.predict_at(workers, model, locs0, X0, "lowrank")
    for key in KEYS:
        np.testing.assert_array_equal(got[key], ref[key])


def test_default_predictor_is_seamless(fitted):
    _, fit, model = fitted
    assert pr.default_predictor(model) == "seamless"


def test_seam_ratio():
    """A smooth ramp is seamless (1 up to the ramp's slope being the same everywhere); a step at the owners'
    boundary shows; cells off the map and negative owners are skipped; mismatched shapes are refused."""
    x, y = np.meshgrid(np.arange(40.0), np.arange(30.0))
    owner = (x >= 20).astype(float)
    assert seam_ratio(0.1 * x + 0.1 * y, owner) == pytest.approx(1.0, rel=1e-12)
    step = 0.1 * x + 0.1 * y + 5.0 * owner
    assert seam_ratio(step, owner) == pytest.approx(5.1 / 0.1, rel=1e-12)  # every within pair differs by 0.1
    holes = step.copy()
    holes[:, 19] = np.nan            # a missing column: no pair across the boundary is left
    assert np.isnan(seam_ratio(holes, owner))
    assert np.isnan(seam_ratio(step, np.where(x >= 20, -1.0, 0.0)))  # one owner left: no pair across
    with pytest.raises(ValueError, match="one shape"):
        seam_ratio(step, owner[:, :5])


@pytest.mark.slow
def test_the_docs_figure_pipeline(tmp_path):
    """pipelines/seamless_map.py (docs/maps.md's picture) runs and finds the seam it was written to show."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "pipelines" / "seamless_map.py"
    spec = importlib.util.spec_from_file_location("seamless_map", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--out", str(tmp_path)]) == 0
    seam = json.loads((tmp_path / "summary.json").read_text())["seam"]
    assert seam["lowrank"] > 2.0 and seam["seamless"] < 1.5
    assert (tmp_path / "seamless_map.png").read_bytes()[:4] == b"\x89PNG"


def test_map_draws_the_owners_boundaries_only_on_request(fitted, tmp_path, monkeypatch):
    """`spatialfed map` draws no boundary lines by default; --show-owners draws the owners' edges on map.png."""
    from spatialfed.outputs import maps

    store, fit, model = fitted
    real, drawn = maps.build_map_figure, []

    def spy(*args, **kw):
        drawn.append(kw.get("owner"))
        return real(*args, **kw)

    monkeypatch.setattr(maps, "build_map_figure", spy)
    cov = tmp_path / "cov.csv"
    c = (np.arange(20) + 0.5) / 20
    xx, yy = np.meshgrid(c, c)
    pts = {"x": xx.ravel(), "y": yy.ravel(), **{f"x{k}": np.zeros(400) for k in range(1, 6)}}
    import pandas as pd

    pd.DataFrame(pts).to_csv(cov, index=False)
    for extra in ([], ["--show-owners"]):
        assert main(["map", str(fit), "--store", str(store), "--out", str(tmp_path / f"map{len(extra)}"),
                     "--runtime", "simulated", "--resolution", "0.05", "--covariates", str(cov), "--quiet",
                     *extra]) == 0
    assert drawn[0] is None
    grid_owner = np.asarray(drawn[1])
    assert set(np.unique(grid_owner)) == {0, 1}
    png = (tmp_path / "map1" / "map.png").read_bytes()
    assert png[:4] == b"\x89PNG" and png != (tmp_path / "map0" / "map.png").read_bytes()
