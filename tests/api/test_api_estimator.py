"""FederatedGP: scikit-learn conventions, the simulated runtime, the `fit` command, and the errors users meet."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from spatialfed import Checkpoint, Cluster, Emulation
from spatialfed.api import FederatedGP
from spatialfed.cli import main
from spatialfed.data.simulate import simulate_store
from sklearn.exceptions import NotFittedError

from spatialfed.errors import DataError, SpatialFedError, StoreError
from spatialfed.model.matern import Matern
from spatialfed.model.reference import independent_loglik, lowrank_loglik
from spatialfed.data.store import load_worker
from spatialfed.outputs.results import FIT_KEYS, load_fit
from spatialfed.runtime.cluster import SchedulerUnreachableError

J = 4


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("api") / "s.zarr"
    simulate_store(path, J, 60, seed=5, test_size=0)
    return path


def copy_store(store, tmp_path) -> Path:
    dst = tmp_path / "copy.zarr"
    shutil.copytree(store, dst)
    return dst


def test_constructor_only_stores_settings():
    gp = FederatedGP(mode="sync", knots=25, strategies={"agg_threshold": 99}, cluster="tcp://nowhere:1",
                     emulation=Emulation(profile="bogus"))
    assert gp.get_params()["knots"] == 25 and gp.strategies == {"agg_threshold": 99}  # nothing validated yet
    assert not hasattr(gp, "params_") and gp.cluster == "tcp://nowhere:1"
    gp.set_params(emulation=Emulation(profile="graded"), strategies=None)
    assert gp.emulation.profile == "graded"
    assert "mode='sync'" in repr(gp)
    with pytest.raises(ValueError, match="Invalid parameter 'colour'"):  # scikit-learn's set_params
        gp.set_params(colour="red")
    with pytest.raises(SpatialFedError, match="not fitted"):
        gp.save("/nonexistent")
    with pytest.raises(NotFittedError, match="not fitted"):  # scikit-learn's NotFittedError as well
        gp.predict(None, coords=np.zeros((1, 2)))


def test_a_graded_profile_with_its_minimum_cores_sets_the_slowdowns(store):
    """profile='graded:<min cores>' (Figure 6's milder imbalances): cores from 62 down to the minimum, slowdown 62/cores."""
    from spatialfed.runtime.heterogeneity import profile_slowdowns

    gp = FederatedGP(mode="async", knots=16, cluster="simulated", max_iter=3, progress=False, emulation=Emulation(profile="graded:12"))
    gp.fit(store)
    np.testing.assert_allclose(gp.slowdowns_, profile_slowdowns("graded:12", J), rtol=1e-12)
    assert gp.slowdowns_[-1] == pytest.approx(62 / 12) and np.isfinite(gp.loglik_)


def test_simulated_runtime_fit_and_save(store, tmp_path, capsys):
    gp = FederatedGP(mode="async", knots=16, strategies={"preset": "tuned", "agg_threshold": 2}, cluster="simulated",
                     max_iter=8, emulation=Emulation(profile="graded"))  # the block scheme: max_iter counts aggregations
    assert gp.fit(store) is gp
    err = capsys.readouterr().err
    assert "iter" in err and "max staleness" in err and "loglik" in err
    assert gp.n_iter_ == 8 and gp.knots_.shape == (16, 2) and gp.mu_.shape == (16,) and gp.Sigma_.shape == (16, 16)
    assert set(gp.params_) == {"gamma", "delta", "sigma2", "beta"} and gp.params_["gamma"].shape == (5,)
    assert gp.slowdowns_[0] == 1 and gp.slowdowns_[-1] > 1 and gp.config_.agg_threshold == 2
    parts = [load_worker(store, j) for j in range(J)]
    p = gp.params_
    expected = lowrank_loglik(parts, gp.knots_, Matern(0.5), "full", p["gamma"], p["delta"], p["sigma2"], p["beta"])
    assert gp.loglik_ == pytest.approx(expected, rel=1e-9)
    out = gp.save(tmp_path / "out")
    doc = json.loads((out / "fit.json").read_text())
    assert list(doc)[:len(FIT_KEYS)] == list(FIT_KEYS) and doc["mode"] == "async" and doc["n_obs"] == J * 60
    assert "variogram_params" in doc and set(doc) - set(FIT_KEYS) <= {"variogram_params", "store_fingerprint"}
    vp = doc["variogram_params"]  # SPEC §1 in the units users read (unit square: no CRS, planar units)
    assert vp["nugget"] == pytest.approx(1 / p["delta"], rel=1e-12) and vp["distance_unit"] is None
    assert vp["practical_range"] == pytest.approx(p["beta"] * Matern(0.5).effective_range_factor(), rel=1e-12)
    assert [r["iter"] for r in doc["trace"]][-1] == 8


def test_quiet_fit_prints_nothing(store, capsys):
    FederatedGP(mode="sync", knots=9, cluster="simulated", max_iter=2, progress=False).fit(store)
    assert capsys.readouterr().err == ""


def test_given_knots_outside_the_domain_are_refused(store):
    knots = np.array([[0.2, 0.2], [0.8, 0.8], [1.5, 0.5]])
    with pytest.raises(DataError, match="outside the domain"):
        FederatedGP(knots=knots, cluster="simulated", progress=False).fit(store)


@pytest.mark.parametrize("knots", [0, -3, 2.5])
def test_bad_knot_count(store, knots):
    with pytest.raises(DataError, match="knots"):
        FederatedGP(knots=knots, cluster="simulated", progress=False).fit(store)


def test_duplicate_knots_are_refused(store):
    with pytest.raises(DataError, match="duplicate"):
        FederatedGP(knots=np.array([[0.2, 0.2], [0.2, 0.2], [0.5, 0.5]]), cluster="simulated",
                    progress=False).fit(store)


@pytest.mark.parametrize("threshold", [0, J + 1, 2.5])
def test_agg_threshold_outside_1_to_J(store, threshold):
    with pytest.raises(ValueError, match=rf"1\.\.J = 1\.\.{J}"):
        FederatedGP(mode="async", strategies={"agg_threshold": threshold}, cluster="simulated",
                    progress=False).fit(store)


def test_sync_with_partial_threshold(store):
    with pytest.raises(ValueError, match="mode='async'"):
        FederatedGP(mode="sync", strategies={"agg_threshold": 2}, cluster="simulated", progress=False).fit(store)


def test_store_with_missing_worker_group(store, tmp_path):
    bad = copy_store(store, tmp_path)
    shutil.rmtree(bad / "workers" / "3")
    with pytest.raises(StoreError, match="workers/"):
        FederatedGP(cluster="simulated", progress=False).fit(bad)


def test_store_with_empty_worker_group(store, tmp_path):
    bad = copy_store(store, tmp_path)
    g = zarr.open_group(str(bad), path="workers/1", mode="a")
    for name, shape in (("locs", (0, 2)), ("z", (0,)), ("X", (0, 5))):
        del g[name]
        g.create_array(name, shape=shape, dtype="float64")
    with pytest.raises(StoreError, match="workers/1"):
        FederatedGP(cluster="simulated", progress=False).fit(bad)


def test_missing_store(tmp_path):
    with pytest.raises(StoreError, match="not a Zarr"):
        FederatedGP(cluster="simulated", progress=False).fit(tmp_path / "nothing.zarr")


def test_unreachable_scheduler_is_named(store):
    gp = FederatedGP(progress=False, cluster=Cluster(address="tcp://127.0.0.1:9", timeout=1))
    with pytest.raises(SchedulerUnreachableError, match=r"tcp://127\.0\.0\.1:9"):
        gp.fit(store)


@pytest.mark.parametrize("settings, message", [
    ({"method": "fgpr", "strategies": {"agg_threshold": 2}}, "does not apply to method='fgpr'"),
    ({"method": "independent", "residual": "pp"}, "full local covariance"),
    ({"method": "kriging"}, "method must be one of"),
    ({"mode": "fast"}, "mode must be one of"),
    ({"residual": "diag"}, "residual must be one of"),
    ({"cluster": "spark"}, "cluster must be one of"),
    ({"emulation": Emulation(profile="bogus")}, "profile must be one of"),
    ({"emulation": Emulation(slowdown=[1, 2])}, "one per worker"),
    ({"emulation": Emulation(slowdown=[1, 1, 0.5, 1])}, "≥ 1"),
    ({"nu": -1}, "nu"),
    ({"cluster": {"address": "tcp://127.0.0.1:1", "runtime": "simulated"}}, "cluster='simulated' runs in this process"),
    ({"progress": "loud"}, "progress must be True, False or 'live'"),
    ({"cluster": 3}, "cluster must be a scheduler address"),
])
def test_invalid_settings(store, settings, message):
    with pytest.raises(ValueError, match=message):
        FederatedGP(**{"cluster": "simulated", "progress": False, **settings}).fit(store)


def test_fit_command_simulated(store, tmp_path, capsys):
    out = tmp_path / "cli"
    rc = main(["fit", str(store), "--out", str(out), "--runtime", "simulated", "--mode", "async",
               "--agg-threshold", "2", "--slowdown", "1,1,2,4", "--knots", "16", "--max-iter", "4", "--quiet",
               "--preset", "tuned"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "wrote" in captured.out and captured.err == ""
    fit = load_fit(out)
    assert fit.iterations == 4 and fit.extra["slowdowns"] == [1.0, 1.0, 2.0, 4.0]


def test_fit_command_reports_errors(store, tmp_path, capsys):
    rc = main(["fit", str(store), "--out", str(tmp_path / "o"), "--runtime", "simulated", "--agg-threshold", "9",
               "--quiet"])
    assert rc == 1
    assert "agg_threshold must be an integer in 1..J = 1..4" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_fit_help_lists_the_spec_options(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = capsys.readouterr().out
    for opt in ("--out", "--method", "--mode", "--residual", "--knots", "--nu", "--agg-threshold", "--max-iter",
                "--tol", "--runtime", "--profile", "--slowdown", "--scheduler", "--seed"):
        assert opt in text


def test_independent_method_fits_eq3_with_no_knots(store, tmp_path):
    start = {"delta": 0.25, "sigma2": 1.0, "beta": 0.1}
    gp = FederatedGP(method="independent", mode="sync", cluster="simulated", start=start, progress=False).fit(store)
    assert gp.knots_.shape == (0, 2) and gp.converged_
    parts = [load_worker(store, j) for j in range(J)]
    p = gp.params_
    assert gp.loglik_ == pytest.approx(independent_loglik(parts, Matern(0.5), p["gamma"], p["delta"], p["sigma2"],
                                                          p["beta"]), rel=1e-9)
    fit = load_fit(gp.save(tmp_path / "ind"))
    assert fit.method == "independent" and fit.knots.shape == (0, 2)


@pytest.fixture(scope="module")
def projected_store(tmp_path_factory):
    """A store in metres (EPSG:28992, no truth): knots come from the workers' bounding boxes or a domain file."""
    from spatialfed.data.store import write_store

    rng = np.random.default_rng(1)
    parts = []
    for j in range(3):
        locs = np.column_stack([180_000 + 4_000 * rng.uniform(size=40) + 1_000 * j,
                                330_000 + 3_000 * rng.uniform(size=40)])
        X = np.column_stack([np.ones(40), rng.standard_normal(40)])
        parts.append((locs, X @ [1.0, 0.5] + rng.standard_normal(40), X))
    path = tmp_path_factory.mktemp("proj") / "p.zarr"
    write_store(path, parts, partition="area", crs="EPSG:28992", covariate_names=["intercept", "x"])
    return path, parts


def test_knots_default_to_the_workers_bounding_boxes(projected_store):
    path, parts = projected_store
    gp = FederatedGP(mode="sync", knots=12, cluster="simulated", max_iter=2, progress=False).fit(path)
    allx = np.vstack([p[0] for p in parts])
    assert gp.knots_.shape == (12, 2)
    assert np.all(gp.knots_ >= allx.min(axis=0) - 1e-3) and np.all(gp.knots_ <= allx.max(axis=0) + 1e-3)


def test_knots_inside_a_domain_file(projected_store, tmp_path):
    import geopandas as gpd
    import shapely

    path, _ = projected_store
    box = shapely.box(181_000, 330_500, 184_000, 332_500)
    gpd.GeoSeries([box], crs="EPSG:28992").to_file(tmp_path / "dom.gpkg")
    gp = FederatedGP(mode="sync", knots=9, cluster="simulated", max_iter=2, domain=tmp_path / "dom.gpkg",
                     progress=False).fit(path)
    assert shapely.contains_xy(box.buffer(1e-6), gp.knots_[:, 0], gp.knots_[:, 1]).all()
    with pytest.raises(DataError, match="outside the domain"):
        FederatedGP(knots=np.array([[180_100.0, 330_100.0], [182_000.0, 331_000.0]]), cluster="simulated",
                    domain=tmp_path / "dom.gpkg",
                    progress=False).fit(path)


@pytest.mark.parametrize("preset", ["paper", "basic", "tuned"])
def test_async_presets(store, preset):
    from spatialfed.algorithm.config import FitConfig

    if not hasattr(FitConfig, preset) and preset != "paper":
        pytest.skip(f"FitConfig.{preset} not available")
    gp = FederatedGP(mode="async", knots=9, cluster="simulated", max_iter=2,
                     strategies={"preset": preset, "omega": 0.5, "agg_threshold": 2}, progress=False).fit(store)
    assert gp.config_.block.omega == 0.5  # strategies override the preset
    assert gp.config_.block.moving_average == (preset == "paper")


def test_unknown_preset(store):
    with pytest.raises(ValueError, match="preset must be one of"):
        FederatedGP(mode="async", cluster="simulated", strategies="fastest", progress=False).fit(store)


def test_the_default_preset_is_the_statistics_scheme(store):
    """No preset: one round trip of statistics per iteration (StatsServer); privacy noise selects the block scheme; a
    block-scheme strategy with the statistics scheme is refused in one line naming the fix."""
    gp = FederatedGP(mode="async", knots=9, cluster="simulated", max_iter=40, progress=False).fit(store)
    assert gp.config_.scheme_name == "stats" and gp.config_.agg_threshold == 1 and gp.converged_
    private = FederatedGP(mode="sync", knots=9, cluster="simulated", max_iter=2, progress=False,
                          privacy={"noise_multiplier": 1e-3, "clip": 1e6, "seed": 0})
    assert private._config(J).scheme_name == "block"
    with pytest.raises(ValueError, match="staleness_bound .*strategies='tuned'"):
        FederatedGP(mode="async", cluster="simulated", strategies={"staleness_bound": 3}, progress=False).fit(store)


@pytest.mark.parametrize("preset", ["stats", "tuned", "paper"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_each_preset_converges_on_a_small_problem(store, preset, mode):
    """Every preset ends converged (stop by tol) on the small store, at the same ℓ_LR maximiser as the exact sync fit
    (on the reproducible model clock: the order of the answers, not this machine's speed, is what is checked)."""
    from spatialfed.runtime.virtual import FlopCost, VirtualRuntime

    ref = FederatedGP(mode="sync", knots=9, cluster="simulated", max_iter=50, tol=1e-9, progress=False).fit(store)
    model_clock = VirtualRuntime(slowdowns="straggler", cost=FlopCost(), charge_server=False)
    gp = FederatedGP(mode=mode, knots=9, cluster=model_clock, max_iter=300, strategies=preset, 
                     progress=False, emulation=Emulation(profile="straggler")).fit(store)
    if (preset, mode) == ("paper", "async"):  # Eq. 19's moving average keeps it moving (docs/algorithm.md): it says so
        assert not gp.converged_ and gp.stop_reason_ == "max_iter"
        return
    assert gp.converged_ and gp.stop_reason_ == "tol", gp.stop_reason_
    assert gp.loglik_ == pytest.approx(ref.loglik_, abs=1e-3)


def test_the_parameters_of_earlier_versions_warn_and_land_in_their_objects():
    """scheduler=, runtime=, preset=, profile=, live=, fgpr=, secure_aggregation=, vecchia_k=, checkpoint_every= ... still
    work for one release: a FutureWarning names the new spelling and the value is where it now lives; the
    constructor has about 20 parameters."""
    import inspect

    import warnings

    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        gp = FederatedGP(scheduler="tcp://10.0.0.1:8786", n_dask_workers=3, profile="straggler", live=True)
    lines = [str(w.message) for w in said if issubclass(w.category, FutureWarning)]
    assert len(lines) == 4 and lines[0].startswith("FederatedGP(scheduler=...) is now cluster=Cluster(address=...)")
    assert "emulation=Emulation(profile=...)" in lines[2] and "progress='live'" in lines[3]
    assert gp.cluster == Cluster(address="tcp://10.0.0.1:8786", n_workers=3)
    assert gp.emulation == Emulation(profile="straggler") and gp.progress == "live"
    with pytest.warns(FutureWarning, match="strategies=.*method='fgpr'"):
        assert FederatedGP(method="fgpr", fgpr={"lr": 0.2}).strategies == {"lr": 0.2}
    with pytest.warns(FutureWarning, match="privacy='secure_aggregation'"):
        assert FederatedGP(secure_aggregation=True).privacy == "secure_aggregation"
    with pytest.warns(FutureWarning, match=r"FederatedGP\(vecchia_k=\.\.\.\) is now residual='vecchia:30'"):
        gp = FederatedGP(residual="vecchia", vecchia_k=30)
    assert gp.residual == "vecchia:30" and gp.vecchia_k_ == 30
    with pytest.warns(FutureWarning, match="is now residual='auto:30'"):  # the default residual keeps its K
        assert FederatedGP(vecchia_k=30).residual == "auto:30"
    with pytest.warns(FutureWarning, match=r"checkpoint=Checkpoint\(path, every=\.\.\.\)"):
        assert FederatedGP(checkpoint="c.zip", checkpoint_every=3).checkpoint == Checkpoint("c.zip", every=3)
    with pytest.warns(FutureWarning, match=r"strategies=\{'agg_threshold': \.\.\.\}"):
        gp = FederatedGP(agg_threshold=2, strategies={"omega": 0.5})
    assert gp.strategies == {"omega": 0.5, "agg_threshold": 2} and "agg_threshold" not in gp.get_params()
    with pytest.warns(FutureWarning, match=r"FederatedGP\(runtime=\.\.\.\) is now cluster='simulated'"):
        gp = FederatedGP(runtime="simulated")
    assert gp.cluster == Cluster(runtime="simulated") and gp._cluster.runtime == "simulated"
    with pytest.warns(FutureWarning, match=r"cluster=Cluster\(runtime=\.\.\.\)"):  # beside a client: its field
        assert FederatedGP(runtime="dask", cluster="tcp://10.0.0.1:8786").cluster == \
            Cluster(address="tcp://10.0.0.1:8786", runtime="dask")
    with pytest.warns(FutureWarning, match=r"FederatedGP\(preset=\.\.\.\) is now strategies='tuned'"):
        assert FederatedGP(preset="tuned").strategies == "tuned"
    with pytest.warns(FutureWarning, match=r"is now strategies=\{'preset': 'paper', 'omega': 0.5\}"):
        gp = FederatedGP(preset="paper", strategies={"omega": 0.5})
    assert gp.strategies == {"preset": "paper", "omega": 0.5} and "preset" not in gp.get_params()
    with pytest.raises(ValueError, match="name two presets"):
        FederatedGP(preset="paper", strategies={"preset": "tuned"})
    with pytest.raises(ValueError, match="two neighbour counts"):  # refused before the warning
        FederatedGP(residual="vecchia:20", vecchia_k=30)
    with pytest.raises(ValueError, match="checkpoint_every needs the file to write"):
        FederatedGP(checkpoint_every=3)
    with pytest.raises(TypeError, match=r"unexpected keyword argument\(s\) \['colour'\]"):
        FederatedGP(colour="red")
    # the model (method, residual, knots, nu, anisotropy, distance, ...) and fit settings flat, as scikit-learn's; the
    # cluster, emulation, checkpoint and strategies in objects
    assert len(FederatedGP._get_param_names()) <= 22
    assert "moved" not in FederatedGP._get_param_names() and "**moved" in str(inspect.signature(FederatedGP))
