"""`spatialfed demo`: the path a new user tries first (simulate, asynchronous fit, report, map) in one command."""

import json

import pytest

from spatialfed.cli import main


@pytest.mark.slow
def test_demo_writes_the_fit_the_report_and_the_map(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--dask-workers", "2"]) == 0
    said = capsys.readouterr()
    printed = said.out
    assert "FutureWarning" not in said.err and " is now " not in said.err  # the demo uses today's spelling
    assert printed.startswith("demo finished in ") and "the asynchronous fit took " in printed
    assert "a synchronous fit of the same networks " in printed
    for name in ("store", "fit", "report", "map", "mean", "sd"):
        assert f"  {name:8s} " in printed
    fit = json.loads((out / "fit" / "fit.json").read_text())
    assert fit["mode"] == "async" and fit["n_workers"] == 5 and fit["nu"] == 1.5
    from spatialfed.outputs.results import load_fit

    assert load_fit(out / "fit").extra["config"]["scheme"] == "stats"  # the library's default, not the block scheme
    assert "slowdowns 1, 1, 1, 20.7, 1" in (out / "fit" / "report.html").read_text()
    for path in ("fit/report.html", "map/map.png", "map/mean.tif", "map/sd.tif"):
        assert (out / path).stat().st_size > 0, path
