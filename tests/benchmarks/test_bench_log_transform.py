"""benchmarks/bench_log_transform.py: on Meuse zinc the log fit's held-out RMSE and CRPS on the ppm scale beat the
plain fit's, with 95% coverage in [0.92, 0.98] (one repeat of 5 folds: 155 held-out predictions)."""

import contextlib
import io
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_log_transform as bench  # noqa: E402


def test_the_log_fit_beats_the_plain_one_on_zincs_own_scale():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        bench.main(["--repeats", "1"])
    plain, log, ratio = (json.loads(line) for line in out.getvalue().splitlines())
    assert plain["transform"] == "none" and log["transform"] == "log" and plain["n"] == log["n"] == 155
    assert ratio["log_vs_none"]["rmse"] < 1 and ratio["log_vs_none"]["crps"] < 1
    assert 0.92 <= log["coverage95"] <= 0.98
    assert log["min_mean"] > 0
