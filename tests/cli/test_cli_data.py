"""`spatialfed simulate` and `spatialfed ingest` write SPEC §5 stores readable with plain zarr."""

from pathlib import Path

import numpy as np
import pytest
import zarr

from spatialfed.cli import main
from spatialfed.model.matern import Matern

MEUSE = Path(__file__).resolve().parents[2] / "data" / "meuse" / "meuse.csv"


def check_plain_zarr(path, n_workers, p):
    root = zarr.open_group(path, mode="r")
    attrs = dict(root.attrs)
    assert attrs["spatialfed_format"] == 1 and attrs["n_workers"] == n_workers
    assert len(attrs["covariate_names"]) == p
    for j in range(n_workers):
        g = root[f"workers/{j}"]
        n = g["z"].shape[0]
        assert g["locs"].shape == (n, 2) and g["locs"].dtype == np.float64 and g["X"].shape == (n, p)
    return attrs


def test_help_lists_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "simulate" in out and "ingest" in out
    assert main([]) == 2


def test_simulate_command(tmp_path, capsys):
    out = tmp_path / "s.zarr"
    assert main(["simulate", str(out), "--workers", "10", "--n-per-worker", "500", "--partition", "area",
                 "--seed", "1"]) == 0
    attrs = check_plain_zarr(out, 10, 5)
    assert attrs["partition"] == "area" and attrs["crs"] is None and attrs["truth"]["delta"] == 0.25
    assert zarr.open_group(out, mode="r")["test/z"].shape == (100,)
    assert "wrote" in capsys.readouterr().out


def test_simulate_range_sizes_and_errors(tmp_path, capsys):
    out = tmp_path / "r.zarr"
    assert main(["simulate", str(out), "--sizes", "30,60", "--range", "0.3", "--nu", "1.5", "--test-size", "0",
                 "--quiet"]) == 0
    attrs = check_plain_zarr(out, 2, 5)
    assert attrs["truth"]["beta"] == pytest.approx(Matern(1.5).beta_from_range(0.3))
    assert main(["simulate", str(out), "--workers", "2", "--n-per-worker", "5"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["simulate", str(tmp_path / "b.zarr"), "--workers", "2", "--n-per-worker", "5", "--beta", "-1"]) == 1
    assert "beta must be" in capsys.readouterr().err and not (tmp_path / "b.zarr").exists()


def test_ingest_meuse_csv(tmp_path, capsys):
    out = tmp_path / "m.zarr"
    assert main(["ingest", str(MEUSE), str(out), "--x", "x", "--y", "y", "--value", "zinc", "--covariates",
                 "dist,om", "--crs", "EPSG:28992", "--partition", "area", "--workers", "4",
                 "--test-fraction", "0.1"]) == 0
    attrs = check_plain_zarr(out, 4, 3)
    assert attrs["crs"] == "EPSG:28992" and attrs["covariate_names"] == ["intercept", "dist", "om"]
    err = capsys.readouterr().err
    assert "spatialfed ingest: warning: dropped 2 rows with missing values (om: 2)" in err and "held out 15 rows" in err


def test_ingest_errors_exit_1_without_store(tmp_path, capsys):
    out = tmp_path / "m.zarr"
    assert main(["ingest", str(MEUSE), str(out), "--x", "x", "--y", "y", "--value", "zinc", "--crs", "EPSG:4326"]) == 1
    assert "outside lon" in capsys.readouterr().err and not out.exists()
    assert main(["ingest", str(MEUSE), str(out), "--x", "x", "--y", "y", "--value", "zink"]) == 1
    assert "['zink'] not in the table" in capsys.readouterr().err and not out.exists()
