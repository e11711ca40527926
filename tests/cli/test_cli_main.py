"""The `spatialfed` entry point: --version, one-line errors with their exit codes, and thin command handlers."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import spatialfed
from spatialfed.cli import COMMANDS, build_parser, main
from spatialfed.cli.fit import estimator_settings

CLI = Path(spatialfed.__file__).parent / "cli"


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"spatialfed {spatialfed.__version__}"


def test_python_dash_m_runs_the_same_command_line():
    done = subprocess.run([sys.executable, "-m", "spatialfed", "--version"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"spatialfed {spatialfed.__version__}"


@pytest.mark.parametrize("argv, text", [
    (["fit", "s.zarr", "--out", "o", "--scheduler", "tcp://127.0.0.1:1", "--jobqueue", "slurm"],
     "spatialfed fit: error: give either --scheduler or --jobqueue, not both"),  # ValueError
    (["cluster-script", "lsf"], "spatialfed cluster-script: error: unknown batch system 'lsf'"),  # SpatialFedError
    (["demo", "--out", "{tmp}/a-file/demo"], "Not a directory: '{tmp}/a-file/demo'"),  # OSError
    (["fit", "s.zarr", "--out", "o", "--privacy-noise", "1", "--privacy-clip", "missing.json"],
     "--privacy-clip missing.json: cannot read"),
    (["fit", "s.zarr", "--out", "o", "--privacy-noise", "1", "--privacy-clip", "abc"],
     "--privacy-clip must be a number or key=number pairs separated by commas"),
])
def test_user_errors_are_one_line_without_traceback(tmp_path, capsys, argv, text):
    (tmp_path / "a-file").write_text("")
    assert main([arg.format(tmp=tmp_path) for arg in argv]) == 1
    err = capsys.readouterr().err
    text = text.format(tmp=tmp_path)
    assert text in err and err.count("\n") == 1 and "Traceback" not in err


def _raising(monkeypatch, exc):
    """`spatialfed cluster-script slurm` with a handler that raises `exc`."""
    from spatialfed.cli import cluster_script

    def handler(args):
        raise exc

    monkeypatch.setattr(cluster_script, "run", handler)
    return ["cluster-script", "slurm"]


def test_ctrl_c_exits_130_in_one_line(monkeypatch, capsys):
    """(A real Ctrl-C during a fit: tests/cli/test_cli_resume.py.)"""
    assert main(_raising(monkeypatch, KeyboardInterrupt())) == 130
    assert capsys.readouterr().err == "spatialfed cluster-script: interrupted\n"


def test_a_message_over_several_lines_is_joined(monkeypatch, capsys):
    assert main(_raising(monkeypatch, ValueError("first part,\n   second part"))) == 1
    assert capsys.readouterr().err == "spatialfed cluster-script: error: first part, second part\n"


def test_a_bug_keeps_its_traceback(monkeypatch):
    with pytest.raises(ZeroDivisionError):
        main(_raising(monkeypatch, ZeroDivisionError("a bug, not a user error")))


def test_only_options_given_reach_the_estimator():
    """Defaults are not passed (the estimator's own apply; on --resume the checkpoint's): None means not given."""
    args = build_parser().parse_args(["fit", "s.zarr", "--out", "o", "--quiet"])
    assert estimator_settings(args) == {"progress": False}
    args = build_parser().parse_args(["fit", "s.zarr", "--out", "o", "--max-iter", "50", "--tol", "1e-5",
                                      "--dask-workers", "3", "--tls", "--privacy-noise", "2", "--privacy-clip", "A=1"])
    assert estimator_settings(args) == {
        "max_iter": 50, "tol": 1e-5, "n_dask_workers": 3, "tls": True, "progress": True,
        "privacy": {"noise_multiplier": 2.0, "clip": {"A": 1.0}}}
    from spatialfed import Cluster
    from spatialfed.api.options import spelled

    assert spelled(estimator_settings(args)) == {  # the estimator's spelling, without a FutureWarning
        "max_iter": 50, "tol": 1e-5, "cluster": Cluster(n_workers=3, tls=True), "progress": True,
        "privacy": {"noise_multiplier": 2.0, "clip": {"A": 1.0}}}


def test_the_vecchia_residual_reaches_the_estimator():
    """--vecchia-k K (and --agg-threshold A, --checkpoint-every K) are mapped onto the estimator's spelling silently;
    --residual vecchia:K says the same in one option."""
    from spatialfed import Checkpoint
    from spatialfed.api.options import spelled

    args = build_parser().parse_args(["fit", "s.zarr", "--out", "o", "--residual", "vecchia", "--vecchia-k", "12"])
    assert estimator_settings(args) == {"residual": "vecchia", "vecchia_k": 12, "progress": True}
    assert spelled(estimator_settings(args)) == {"residual": "vecchia:12", "progress": True}
    args = build_parser().parse_args(["fit", "s.zarr", "--out", "o", "--residual", "vecchia:30"])
    assert spelled(estimator_settings(args)) == {"residual": "vecchia:30", "progress": True}
    assert build_parser().parse_args(["fit", "s.zarr", "--out", "o", "--residual", "auto"]).residual == "auto"
    args = build_parser().parse_args(["fit", "s.zarr", "--out", "o", "--vecchia-k", "9", "--agg-threshold", "2",
                                      "--checkpoint-every", "4", "--staleness-bound", "3"])
    settings = {**estimator_settings(args), "checkpoint": "o/checkpoint.zip"}  # as fit_into adds it
    assert spelled(settings) == {"residual": "auto:9", "strategies": {"staleness_bound": 3, "agg_threshold": 2},
                                 "checkpoint": Checkpoint("o/checkpoint.zip", every=4), "progress": True}


@pytest.mark.parametrize("residual, said", [("vecchia:0", "must be an integer ≥ 1"), ("full:3", "--residual full:3: only vecchia:K"),
                                            ("diag", "invalid choice: 'diag'")])
def test_a_bad_residual_is_one_usage_line(residual, said, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["fit", "s.zarr", "--out", "o", "--residual", residual])
    assert said in capsys.readouterr().err


def test_every_command_is_registered_with_a_help():
    text = build_parser().format_help()
    for command in COMMANDS:
        name = command.__name__.rsplit(".", 1)[1].replace("_", "-")
        assert name in text, name


def test_help_and_version_load_no_library_module():
    """`spatialfed --help` lists every command without importing the estimator, the outputs or Dask (fast start)."""
    code = ("import sys\nfrom spatialfed.cli import main\ntry:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed', 'scipy', 'geopandas')"
            " or m.startswith(('spatialfed.api', 'spatialfed.outputs', 'spatialfed.runtime'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "pilot-clip" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_invoked_command_gets_its_full_parser():
    args = build_parser(only="fit").parse_args(["fit", "s.zarr", "--out", "o", "--max-iter", "7"])
    assert args.max_iter == 7 and args.handler.__module__ == "spatialfed.cli.fit"
    with pytest.raises(SystemExit):  # the other commands are names only
        build_parser(only="fit").parse_args(["simulate", "x.zarr", "--workers", "2"])


def test_handlers_are_thin():
    """Every command module has NAME, HELP, register() and run(); each handler body is at most 40 lines (issue 16)."""
    for command in COMMANDS:
        path = Path(command.__file__)
        functions = {node.name: node for node in ast.parse(path.read_text()).body
                     if isinstance(node, ast.FunctionDef)}
        assert {"register", "run"} <= set(functions) and command.NAME and command.HELP, path.name
        body = functions["run"].body
        assert body[-1].end_lineno - body[0].lineno + 1 <= 40, f"{path.name}: run() is longer than 40 lines"


def test_the_covariance_options_reach_the_estimator():
    args = build_parser().parse_args(["fit", "s.zarr", "--out", "o", "--nu", "estimate", "--anisotropy"])
    assert estimator_settings(args) == {"nu": "estimate", "anisotropy": True, "progress": True}
    assert build_parser().parse_args(["fit", "s.zarr", "--out", "o", "--nu", "1.5"]).nu == 1.5


def test_fit_with_estimated_nu_and_anisotropy_reports_them_and_predicts(tmp_path, capsys):
    import json

    from spatialfed.data.simulate import simulate_store

    simulate_store(tmp_path / "s.zarr", 3, 60, test_size=20, seed=4)
    assert main(["fit", str(tmp_path / "s.zarr"), "--nu", "estimate", "--anisotropy", "--knots", "16", "--mode",
                 "sync", "--out", str(tmp_path / "fit")]) == 0
    said = capsys.readouterr().err  # the summary
    vp = json.loads((tmp_path / "fit" / "fit.json").read_text())["variogram_params"]
    assert {"nu_se_log", "nu_95", "range_major", "range_minor", "anisotropy_ratio", "angle_deg", "metric"} <= set(vp)
    assert f"ν̂ = {vp['nu']:.3g}" in said and f"at {vp['angle_deg']:.1f}° from north" in said
    report = (tmp_path / "fit" / "report.html").read_text()
    assert "smoothness ν̂" in report and "anisotropy: major range" in report
    assert main(["predict", str(tmp_path / "fit"), "--store", str(tmp_path / "s.zarr"), "--out",
                 str(tmp_path / "p.csv"), "--quiet"]) == 0
    assert len((tmp_path / "p.csv").read_text().splitlines()) == 21


def test_lonlat_data_over_1000_km_fit_chordal_on_dask_and_map_in_the_stores_crs(tmp_path, capsys):
    """A store ingested from lon/lat spanning ~2,300 km: distance None is chordal; ν estimated with it on an embedded
    Dask cluster (the family's statistics on the workers, the sites' Earth-centred points), then mapped."""
    import json

    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(7)
    lon, lat = rng.uniform(-100, -80, 150), rng.uniform(32, 46, 150)
    y = np.sin(np.radians(lon) * 12) + np.cos(np.radians(lat) * 10) + 0.3 * rng.standard_normal(150)
    pd.DataFrame({"lon": lon, "lat": lat, "y": y}).to_csv(tmp_path / "pts.csv", index=False)
    store, fit = tmp_path / "s.zarr", tmp_path / "fit"
    assert main(["ingest", str(tmp_path / "pts.csv"), str(store), "--x", "lon", "--y", "lat", "--value", "y", "--crs",
                 "EPSG:4326", "--workers", "3"]) == 0
    assert main(["fit", str(store), "--out", str(fit), "--knots", "16", "--nu", "estimate", "--mode", "sync",
                 "--runtime", "dask"]) == 0
    said = capsys.readouterr().err
    vp = json.loads((fit / "fit.json").read_text())["variogram_params"]
    assert vp["distance"] == "chordal" and vp["range_km"] == pytest.approx(vp["range"] / 1000.0)
    assert f"range {vp['range_km']:.4g} km" in said and "° of arc" in said
    assert "chordal distances on the sphere" in (fit / "report.html").read_text()
    assert main(["map", str(fit), "--store", str(store), "--out", str(tmp_path / "m"), "--resolution", "40000",
                 "--runtime", "simulated", "--quiet"]) == 0
    assert (tmp_path / "m" / "map.png").stat().st_size > 0
