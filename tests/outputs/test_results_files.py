"""Result files of SPEC §6: exact fit.json keys, model.zarr, trace.csv, atomic writes, readers."""

import json
import time

import numpy as np
import pytest

from spatialfed.errors import OutputError
from spatialfed.outputs.results import (
    FIT_KEYS,
    TRACE_KEYS,
    FitResult,
    load_fit,
    load_trace_csv,
    write_results,
)
from support import full_disk_beside_slow_parent_writes


def make_result(m=9, p=3, n_trace=4, loglik=-123.5):
    rng = np.random.default_rng(0)
    A = rng.standard_normal((m, m))
    trace = [{"iter": i, "time_s": 0.1 * i, "step": "theta", "delta": 0.25 + i, "sigma2": np.float64(1.1),
              "beta": 0.1, "gamma": np.arange(p) * 1.0 + i, "max_staleness": np.int64(i % 2),
              "loglik": -10.5 if i % 2 else None} for i in range(n_trace)]
    return FitResult(method="lowrank", mode="async", residual="full", nu=0.5, n_workers=4, n_obs=600,
                     params={"gamma": np.array([1.0, -2.0, 0.5])[:p], "delta": np.float64(0.25), "sigma2": 1.2,
                             "beta": 0.1},
                     loglik=loglik, knots=rng.uniform(size=(m, 2)), iterations=np.int64(7), wall_time_s=1.5,
                     converged=np.bool_(True), trace=trace, mu=rng.standard_normal(m), Sigma=A @ A.T,
                     extra={"store": "/x.zarr", "slowdowns": np.ones(4), "config": {"a": 1.0, "time_budget": None}})


def test_fit_json_has_exactly_the_spec_keys(tmp_path):
    res = make_result()
    write_results(tmp_path / "out", res)
    doc = json.loads((tmp_path / "out" / "fit.json").read_text())
    assert list(doc) == list(FIT_KEYS)
    assert set(doc["params"]) == {"gamma", "delta", "sigma2", "beta"}
    assert all(list(row) == list(TRACE_KEYS) for row in doc["trace"])
    assert doc["knots"] == np.asarray(res.knots).tolist()
    assert doc["loglik"] == -123.5 and doc["converged"] is True and doc["iterations"] == 7
    assert isinstance(doc["trace"][1]["max_staleness"], int)


def test_round_trip_model_zarr_and_trace_csv(tmp_path):
    res = make_result()
    out = write_results(tmp_path / "out", res)
    back = load_fit(out)
    np.testing.assert_array_equal(back.mu, res.mu)
    np.testing.assert_array_equal(back.Sigma, res.Sigma)
    np.testing.assert_array_equal(back.knots, res.knots)
    assert back.params["gamma"] == [1.0, -2.0, 0.5]
    assert back.extra["slowdowns"] == [1.0, 1.0, 1.0, 1.0]
    rows = load_trace_csv(out)
    assert len(rows) == 4
    assert rows[2]["gamma"] == [2.0, 3.0, 4.0] and rows[2]["delta"] == 2.25 and rows[3]["max_staleness"] == 1
    header = (out / "trace.csv").read_text().splitlines()[0].split(",")
    assert header == ["iter", "time_s", "step", "delta", "sigma2", "beta", "gamma_0", "gamma_1", "gamma_2",
                      "max_staleness", "loglik"]
    assert rows[1]["loglik"] == -10.5 and np.isnan(rows[0]["loglik"])
    import zarr

    g = zarr.open_group(str(out / "model.zarr"), mode="r")
    assert g.attrs["params"]["delta"] == 0.25 and g["Sigma"].shape == (9, 9)


def test_rewrite_replaces_results_and_keeps_other_files(tmp_path):
    out = tmp_path / "out"
    write_results(out, make_result(m=9))
    (out / "notes.txt").write_text("mine")
    write_results(out, make_result(m=4, loglik=-1.0))
    assert (out / "notes.txt").read_text() == "mine"
    back = load_fit(out)
    assert back.loglik == -1.0 and back.mu.shape == (4,)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
    leftovers += [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_failed_write_leaves_previous_results_intact(tmp_path):
    out = tmp_path / "out"
    write_results(out, make_result(loglik=-5.0))
    bad = make_result()
    bad.trace[0] = {"iter": 0}  # missing keys: the write must fail before touching out/
    with pytest.raises(ValueError, match="trace row is missing"):
        write_results(out, bad)
    assert load_fit(out).loglik == -5.0
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_full_disk_in_model_zarr_leaves_nothing_once_zarr_is_idle(tmp_path, monkeypatch):
    full_disk_beside_slow_parent_writes(monkeypatch, "knots/zarr.json")
    with pytest.raises(OutputError, match="File too large"):
        write_results(tmp_path / "out", make_result())
    time.sleep(0.6)  # longer than the slow sibling: whatever it would write has been written
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == []


def test_non_finite_loglik_is_null_not_nan(tmp_path):
    out = write_results(tmp_path / "o", make_result(loglik=float("nan")))
    text = (out / "fit.json").read_text()
    assert "NaN" not in text and json.loads(text)["loglik"] is None


def test_load_fit_names_incomplete_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="fit.json"):
        load_fit(tmp_path)


def test_extras_join_the_atomic_set(tmp_path):
    out = tmp_path / "out"
    (tmp_path / "out").mkdir()
    (out / "checkpoint.ckpt").write_text("keep")
    write_results(out, make_result(loglik=-5.0), extras={"report.html": lambda p: p.write_text("<html>1</html>")})
    assert (out / "report.html").read_text() == "<html>1</html>"

    def fails(p):
        p.write_text("half")
        raise RuntimeError("report failed")

    with pytest.raises(RuntimeError, match="report failed"):
        write_results(out, make_result(loglik=-1.0), extras={"report.html": fails})
    assert load_fit(out).loglik == -5.0 and (out / "report.html").read_text() == "<html>1</html>"
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.ckpt", "fit.json", "model.zarr", "report.html",
                                                     "trace.csv"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staged directory left behind
    with pytest.raises(ValueError, match="plain file name"):
        write_results(out, make_result(), extras={"fit.json": lambda p: None})


def test_out_naming_a_file_is_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(OutputError, match=r"exists and is a file, not a directory; choose another out_dir"):
        write_results(tmp_path / "f", make_result())
    with pytest.raises(OutputError, match="is a file, not a directory"):
        write_results(tmp_path / "f" / "sub", make_result())
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


@pytest.mark.parametrize(("edit", "named"), [
    (lambda d: d.update(nu=2.5), "nu"),
    (lambda d: d.update(knots=[[x + 0.05, y] for x, y in d["knots"]]), "knots"),
    (lambda d: d.update(n_workers=7), "n_workers"),
    (lambda d: d["params"].update(delta=d["params"]["delta"] * 1000), "params"),
    (lambda d: d["params"].update(gamma=d["params"]["gamma"][:-1]), "params, params.gamma"),
])
def test_a_hand_edited_fit_json_is_refused(tmp_path, edit, named):
    """fit.json and model.zarr are written from one result: a fit.json edited afterwards no longer matches."""
    write_results(tmp_path / "fit", make_result())
    assert load_fit(tmp_path / "fit").nu == 0.5  # unedited: read as written
    path = tmp_path / "fit" / "fit.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=rf"fit\.json does not match .*model\.zarr in {named}: the fit directory "
                                         r"was edited after the fit wrote it; run the fit again"):
        load_fit(tmp_path / "fit")


def test_an_edited_fit_json_stops_predict_with_one_line(tmp_path, capsys):
    from spatialfed.cli import main
    from spatialfed.data.simulate import simulate_store

    store, fit = tmp_path / "s.zarr", tmp_path / "fit"
    simulate_store(store, 3, 40, test_size=20, seed=3)
    assert main(["fit", str(store), "--out", str(fit), "--knots", "9", "--quiet"]) == 0
    doc = json.loads((fit / "fit.json").read_text())
    doc["params"]["delta"] *= 1000  # the edit that dropped coverage from 0.97 to 0.37
    (fit / "fit.json").write_text(json.dumps(doc))
    capsys.readouterr()
    assert main(["predict", str(fit), "--store", str(store), "--out", str(tmp_path / "pred.csv")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "does not match" in err and "params" in err, err
    assert not (tmp_path / "pred.csv").exists()
