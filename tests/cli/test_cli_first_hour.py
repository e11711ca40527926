"""Small things a new user trips on (issue 28, item 8), each through the command line or the estimator: coordinate
columns in any case, small sites warned about once, one rule for the default number of sites, progress lines that
number the iterations the summary counts, and `fit --help` saying what the default scheme does."""

import re

import numpy as np
import pandas as pd
import pytest

from spatialfed.api import FederatedGP
from spatialfed.cli import main
from spatialfed.data.partition import MIN_SITE_ROWS
from spatialfed.data.store import open_store


def _table(n=200, seed=0):
    rng = np.random.default_rng(seed)
    x, y = rng.uniform(0, 1000, n), rng.uniform(0, 1000, n)
    return pd.DataFrame({"X": x, "Y": y, "z": np.sin(x / 200) + np.cos(y / 300) + rng.normal(scale=0.3, size=n)})


def test_upper_case_coordinate_columns_are_detected_by_the_estimator():
    frame = _table()
    gp = FederatedGP(cluster="simulated", knots=9, max_iter=2, progress=False).fit(frame, "z")
    lower = FederatedGP(cluster="simulated", knots=9, max_iter=2, progress=False).fit(
        frame.rename(columns={"X": "x", "Y": "y"}), "z")
    assert gp.covariate_names_ == ["intercept"]     # X and Y are the coordinates, not covariates
    np.testing.assert_allclose(gp.predict(frame.iloc[:7]), lower.predict(frame.iloc[:7]), rtol=1e-9)


def test_small_sites_are_warned_about_once_and_the_sizes_are_not_listed(tmp_path, capsys):
    _table().to_csv(tmp_path / "t.csv", index=False)
    assert main(["ingest", str(tmp_path / "t.csv"), str(tmp_path / "s.zarr"), "--x", "X", "--y", "Y",
                 "--value", "z", "--workers", "15"]) == 0
    err = capsys.readouterr().err  # the command line prints each warning as one line
    small = [line for line in err.splitlines() if "sites have fewer than" in line]
    assert small == [f"spatialfed ingest: warning: 15 of 15 sites have fewer than {MIN_SITE_ROWS} rows (smallest 13): "
                     "such sites add almost no pairs to the starting variogram and their summaries nearly reveal "
                     "their rows; use at most 10 sites (--workers), or leave it out for the default of about 500 rows "
                     "per site"]
    assert "13, 13, 13" not in err and "sizes 13..14" in err


def test_the_command_line_and_python_choose_the_same_number_of_sites(tmp_path):
    frame = _table()
    frame.to_csv(tmp_path / "t.csv", index=False)
    assert main(["ingest", str(tmp_path / "t.csv"), str(tmp_path / "s.zarr"), "--x", "X", "--y", "Y",
                 "--value", "z"]) == 0
    gp = FederatedGP(cluster="simulated", knots=9, max_iter=2, progress=False).fit(frame, "z")
    assert open_store(tmp_path / "s.zarr").n_workers == gp.n_workers_ == 4
    big = pd.concat([_table(1500, seed=s) for s in range(2)], ignore_index=True)   # 3000 rows: 6 sites of 500
    big.to_csv(tmp_path / "big.csv", index=False)
    assert main(["ingest", str(tmp_path / "big.csv"), str(tmp_path / "b.zarr"), "--x", "X", "--y", "Y",
                 "--value", "z"]) == 0
    assert open_store(tmp_path / "b.zarr").n_workers == 6


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_progress_prints_iteration_0_once_and_ends_on_the_iteration_count(tmp_path, capsys, mode):
    _table().to_csv(tmp_path / "t.csv", index=False)
    assert main(["ingest", str(tmp_path / "t.csv"), str(tmp_path / "s.zarr"), "--x", "X", "--y", "Y",
                 "--value", "z"]) == 0
    capsys.readouterr()
    assert main(["fit", str(tmp_path / "s.zarr"), "--out", str(tmp_path / "f"), "--knots", "16", "--mode", mode,
                 "--max-iter", "40", "--runtime", "simulated"]) == 0
    lines = capsys.readouterr().err.splitlines()
    iters = [int(m.group(1)) for line in lines if (m := re.match(r"iter +(\d+) ", line))]
    assert iters.count(0) == 1 and sum(line.startswith("init ") for line in lines) == 1
    summary = next(i for i, line in enumerate(lines) if re.match(r"(converged|stopped .*) after \d+ iterations", line))
    n = int(re.search(r"after (\d+) iterations", lines[summary]).group(1))
    final = lines[summary - 1]
    assert final.startswith(f"final after {n} iterations"), final
    if iters[-1] < n - 1:   # iterations without a line of their own are named, with why
        assert f"(iter {iters[-1] + 1}" in final and "closing pass at every site" in final


def test_fit_help_says_what_the_default_scheme_and_threshold_are(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "block-wise algorithm, synchronously" not in text
    assert "By default (--preset stats) each iteration is one round trip" in text
    assert "default 1 with the default preset stats" in text
