"""One overwrite rule for every output (issue 28, item 7): an existing output is refused in one line naming
`--overwrite` (command line) or `overwrite=True` (Python); with it the output is replaced, atomically, once the new
one is complete. The refusals themselves (exit 1, nothing changed) are cases of tests/test_bad_input.py."""

import json

import pytest

from spatialfed.api import Checkpoint, FederatedGP
from spatialfed.cli import main
from spatialfed.data.simulate import simulate_store
from spatialfed.errors import OutputError

FIT = ["--runtime", "simulated", "--max-iter", "3", "--quiet"]


@pytest.fixture(scope="module")
def small_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("overwrite") / "s.zarr"
    simulate_store(path, 3, 30, test_size=10, seed=5)
    return path


def _knots(fit_dir) -> int:
    return len(json.loads((fit_dir / "fit.json").read_text())["knots"])


def test_fit_out_is_refused_then_replaced_with_overwrite(small_store, tmp_path, capsys):
    out = tmp_path / "fit"
    assert main(["fit", str(small_store), "--out", str(out), "--knots", "9", *FIT]) == 0
    assert main(["fit", str(small_store), "--out", str(out), "--knots", "16", *FIT]) == 1
    assert capsys.readouterr().err.strip() == (f"spatialfed fit: error: {out} already exists; choose another path or "
                                               "pass --overwrite to replace it")
    assert _knots(out) == 9  # untouched
    (out / "notes.txt").write_text("mine\n")
    assert main(["fit", str(small_store), "--out", str(out), "--knots", "16", *FIT, "--overwrite"]) == 0
    assert _knots(out) == 16 and (out / "notes.txt").read_text() == "mine\n"  # the result set replaced, notes kept
    assert not (out / "checkpoint.zip").exists() and not list(tmp_path.glob(".*tmp*"))


def test_predict_and_map_out_are_replaced_with_overwrite(small_store, tmp_path, capsys):
    fit = tmp_path / "fit"
    assert main(["fit", str(small_store), "--out", str(fit), "--knots", "9", *FIT]) == 0
    pred = tmp_path / "pred.csv"
    pred.write_text("an older table\n")
    predict = ["predict", str(fit), "--store", str(small_store), "--out", str(pred), "--runtime", "simulated",
               "--quiet"]
    assert main(predict) == 1 and "pass --overwrite" in capsys.readouterr().err
    assert pred.read_text() == "an older table\n"
    assert main([*predict, "--overwrite"]) == 0 and pred.read_text().startswith("x,y,")
    maps = tmp_path / "map"
    maps.mkdir()
    (maps / "stale.png").write_text("an older map\n")
    draw = ["map", str(fit), "--store", str(small_store), "--out", str(maps), "--runtime", "simulated", "--quiet",
            "--resolution", "0.2", "--no-sites", "--covariates", str(_covariate_grid(tmp_path))]
    assert main(draw) == 1 and "pass --overwrite" in capsys.readouterr().err
    assert (maps / "stale.png").exists()
    assert main([*draw, "--overwrite"]) == 0
    assert (maps / "map.json").exists() and not (maps / "stale.png").exists()  # the directory replaced whole


def _covariate_grid(tmp_path):
    import numpy as np
    import pandas as pd

    g = np.linspace(-0.1, 1.1, 25)
    x, y = (a.ravel() for a in np.meshgrid(g, g))
    path = tmp_path / "cov.csv"
    pd.DataFrame({"x": x, "y": y, **{f"x{i}": np.zeros_like(x) for i in range(1, 6)}}).to_csv(path, index=False)
    return path


def test_estimator_save_is_refused_then_replaced_with_overwrite(small_store, tmp_path):
    out = tmp_path / "fit"
    gp = FederatedGP(cluster="simulated", knots=9, max_iter=3, progress=False).fit(small_store)
    gp.save(out)
    with pytest.raises(OutputError, match=r"fit already exists; choose another path or pass overwrite=True"):
        gp.save(out)
    other = FederatedGP(cluster="simulated", knots=16, max_iter=3, progress=False).fit(small_store)
    assert other.save(out, overwrite=True) == out and _knots(out) == 16
    # a directory holding only the fit's own checkpoint is not an output yet: save needs no overwrite=True
    own = tmp_path / "own"
    FederatedGP(cluster="simulated", knots=9, max_iter=3, progress=False,
                checkpoint=Checkpoint(own / "checkpoint.zip", every=1)).fit(small_store).save(own)
    assert _knots(own) == 9 and (own / "checkpoint.zip").exists()


def test_a_second_prediction_into_a_directory_keeps_the_metrics_json_there(small_store, tmp_path, capsys):
    """metrics.json is an output too: predicting the test group again into the same directory (another --out)
    is refused before any site starts, naming it; --overwrite replaces it; a prediction without scores
    (--locations) writes no metrics.json and is not refused."""
    fit = tmp_path / "fit"
    assert main(["fit", str(small_store), "--out", str(fit), "--knots", "9", *FIT]) == 0
    pred = ["predict", str(fit), "--store", str(small_store), "--runtime", "simulated", "--quiet", "--out"]
    assert main([*pred, str(tmp_path / "pred.csv")]) == 0
    metrics = tmp_path / "metrics.json"
    metrics.write_text('{"rmse": "an earlier prediction"}\n')
    capsys.readouterr()
    assert main([*pred, str(tmp_path / "other.csv")]) == 1
    assert capsys.readouterr().err.strip() == (f"spatialfed predict: error: {metrics} already exists; predict into "
                                               "another directory or pass --overwrite to replace it")
    assert not (tmp_path / "other.csv").exists() and "earlier" in metrics.read_text()
    assert main([*pred, str(tmp_path / "other.csv"), "--overwrite"]) == 0
    assert json.loads(metrics.read_text())["n"] == 10 and (tmp_path / "other.csv").exists()
    locations = tmp_path / "locs.csv"
    locations.write_text("x,y,x1,x2,x3,x4,x5\n0.5,0.5,0,0,0,0,0\n")
    before = metrics.read_text()
    assert main([*pred, str(tmp_path / "at.csv"), "--locations", str(locations)]) == 0
    assert metrics.read_text() == before


def test_a_second_demo_is_refused_and_overwrite_lets_it_run(tmp_path, monkeypatch, capsys):
    """`spatialfed demo` into an existing directory stops before simulating, naming --overwrite; a new or empty
    directory (a first demo, as .ci/run runs it in a fresh temporary directory) and --overwrite go on to the
    simulation (stubbed here: the demo itself is tests/cli/test_cli_demo.py, slow)."""
    import spatialfed.demo
    from spatialfed.errors import DataError

    def simulated(store, seed):
        raise DataError(f"reached the simulation of {store.name}")

    monkeypatch.setattr(spatialfed.demo, "simulate_networks", simulated)
    out = tmp_path / "spatialfed-demo"
    out.mkdir()
    assert main(["demo", "--out", str(out)]) == 1  # empty: not an output yet
    assert capsys.readouterr().err.strip() == "spatialfed demo: error: reached the simulation of networks.zarr"
    (out / "notes.txt").write_text("mine\n")
    assert main(["demo", "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip() == (f"spatialfed demo: error: {out} already exists; choose another path "
                                               "or pass --overwrite to replace it")
    assert main(["demo", "--out", str(out), "--overwrite"]) == 1
    assert "reached the simulation" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path / "spatialfed-demo")
    assert main(["demo"]) == 1 and "reached the simulation" in capsys.readouterr().err  # the default, new


def test_pilot_clip_refuses_an_existing_clip_file(small_store, tmp_path, capsys):
    clip = tmp_path / "clip.json"
    clip.write_text("{}\n")
    assert main(["pilot-clip", str(small_store), "--out", str(clip), "--knots", "9"]) == 1
    assert capsys.readouterr().err.strip() == (f"spatialfed pilot-clip: error: {clip} already exists; choose another "
                                               "path or pass --overwrite to replace it")
    assert clip.read_text() == "{}\n"
    assert main(["pilot-clip", str(small_store), "--out", str(clip), "--knots", "9", "--max-iter", "2",
                 "--overwrite"]) == 0
    assert len(json.loads(clip.read_text())) > 0


def test_fit_overwrite_on_a_full_disk_keeps_the_old_results_and_names_the_new_fits_checkpoint(small_store, tmp_path,
                                                                                              monkeypatch, capsys):
    from support import full_disk_beside_slow_parent_writes

    out = tmp_path / "fit"
    assert main(["fit", str(small_store), "--out", str(out), "--knots", "9", *FIT]) == 0
    before = (out / "fit.json").read_text()
    with monkeypatch.context() as m:
        full_disk_beside_slow_parent_writes(m, "zarr.json", delay=0.0)  # model.zarr cannot be written
        capsys.readouterr()
        assert main(["fit", str(small_store), "--out", str(out), "--knots", "16", "--overwrite", *FIT]) == 1
    err = capsys.readouterr().err.strip()
    ckpt = out / "checkpoint.zip"
    assert len(err.splitlines()) == 1 and f"the new fit is kept in {ckpt}" in err and "--resume" in err, err
    assert (out / "fit.json").read_text() == before and ckpt.exists()
    assert main(["fit", "--resume", str(out), "--quiet"]) == 0  # space freed: the resume writes the new fit
    assert _knots(out) == 16
