"""The related-work options through the estimator and `spatialfed fit`: staleness bound, dominance correction,
delay models, Section 5's preset and privacy noise, recorded in fit.json; and their errors."""

import json
import math

import pytest

from spatialfed import Cluster, Emulation
from spatialfed.api import FederatedGP
from spatialfed.cli import main
from spatialfed.outputs.results import load_fit


def fit_json(out) -> dict:
    return json.loads((out / "fit.json").read_text())


def test_async_options_from_the_command_line(store, tmp_path, capsys):
    out = tmp_path / "fit"
    rc = main(["fit", str(store), "--out", str(out), "--runtime", "simulated", "--preset", "tuned",
               "--agg-threshold", "1", "--slowdown", "1,2,6", "--knots", "9", "--max-iter", "30", "--quiet",
               "--staleness-bound", "1", "--dominance", "--delays", "exponential:0.001",
               "--activations", "poisson:2000"])
    assert rc == 0, capsys.readouterr().err
    fit = load_fit(out)
    config = fit.extra["config"]
    assert config["block"]["staleness_bound"] == 1 and config["block"]["dominance"] is True
    assert max(row["max_staleness"] for row in fit.trace) <= 1 and fit.extra["discarded_stale"] > 0
    assert "privacy" not in fit_json(out)


def test_privacy_from_the_command_line_reports_the_budget(store, tmp_path, capsys):
    out = tmp_path / "private"
    rc = main(["fit", str(store), "--out", str(out), "--runtime", "simulated", "--mode", "sync", "--knots", "9",
               "--max-iter", "3", "--quiet", "--privacy-noise", "1e-7", "--privacy-clip", "100",
               "--privacy-delta", "1e-6"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    assert "privacy:" in captured.out and "GDP" in captured.out
    doc = fit_json(out)
    report = doc["privacy"]
    assert report["delta"] == 1e-6 and report["mechanism"]["clip"] == 100.0
    for row in report["workers"]:
        assert row["mu_gdp"] == pytest.approx(math.sqrt(row["releases"]) / 1e-7)
    assert math.isfinite(doc["loglik"])


def test_section5_preset_and_privacy_object_through_the_estimator(store):
    gp = FederatedGP(mode="async", knots=9, strategies={"preset": "section5", "agg_threshold": 2}, cluster="simulated",
                     max_iter=5, progress=False).fit(store)
    assert gp.config_.block.alpha_rule == "section5" and not gp.config_.block.correction and gp.privacy_report_ is None
    assert gp.discarded_stale_ == 0


@pytest.mark.parametrize("argv, message", [
    (["--privacy-noise", "1"], "needs both --privacy-noise Z and --privacy-clip C"),
    (["--privacy-noise", "1", "--privacy-clip", "A=1,b"], "--privacy-clip must be a number or key=number pairs"),
    (["--privacy-noise", "-1", "--privacy-clip", "1"], "noise_multiplier must be a finite number > 0"),
    (["--delays", "gamma:1"], "exponential"),
    (["--staleness-bound", "-2", "--mode", "async"], "staleness_bound"),
])
def test_bad_options_are_named(store, tmp_path, capsys, argv, message):
    rc = main(["fit", str(store), "--out", str(tmp_path / "o"), "--runtime", "simulated", "--knots", "9",
               "--quiet", *argv])
    assert rc == 1
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_privacy_does_not_apply_to_fgpr(store):
    with pytest.raises(ValueError, match="privacy= applies to method='lowrank'"):
        FederatedGP(method="fgpr", cluster="simulated", privacy={"noise_multiplier": 1.0, "clip": 1.0}).fit(store)


def test_the_options_travel_to_dask_workers(store):
    """The mechanism is pickled into every task and applied on the Dask workers; bound and delays apply there too."""
    gp = FederatedGP(mode="async", knots=9,
                     max_iter=12, progress=False, strategies={"preset": "tuned", "staleness_bound": 2, "agg_threshold": 1},
                     privacy={"noise_multiplier": 1e-7, "clip": 100.0}, cluster=Cluster(n_workers=2), emulation=Emulation(slowdown=[1, 1, 3], delays="exponential:0.002", activations="poisson:500")).fit(store)
    assert max(row["max_staleness"] for row in gp.trace_) <= 2
    releases = {row["worker"]: row["releases"] for row in gp.privacy_report_["workers"]}
    assert sorted(releases) == [0, 1, 2] and min(releases.values()) > 20
    assert math.isfinite(gp.loglik_)


def test_pilot_clip_from_a_public_pilot_store_feeds_the_private_fit(tmp_path, capsys):
    """`spatialfed pilot-clip` on a simulated pilot writes per-key bounds; `fit --privacy-clip FILE.json` uses them,
    and they bound every pilot release (the margin times the largest per-observation norm)."""
    from spatialfed.data.simulate import simulate_store

    pilot, private = tmp_path / "pilot.zarr", tmp_path / "private.zarr"
    simulate_store(pilot, 3, 60, seed=11, test_size=0)
    simulate_store(private, 3, 60, seed=12, test_size=0)
    clip_file = tmp_path / "clip.json"
    assert main(["pilot-clip", str(pilot), "--out", str(clip_file), "--knots", "9", "--margin", "3"]) == 0
    clip = json.loads(clip_file.read_text())
    assert {"A", "b", "XtRX", "XtRr", "grad", "hess", "f", "XtX", "sum_sq"} <= set(clip) and "n" not in clip
    assert all(v > 0 for v in clip.values())
    out = tmp_path / "fit"
    rc = main(["fit", str(private), "--out", str(out), "--runtime", "simulated", "--mode", "sync", "--knots", "9",
               "--max-iter", "3", "--quiet", "--privacy-noise", "1e-7", "--privacy-clip", str(clip_file)])
    assert rc == 0, capsys.readouterr().err
    assert fit_json(out)["privacy"]["mechanism"]["clip"] == clip
    rc = main(["fit", str(private), "--out", str(tmp_path / "bad"), "--runtime", "simulated", "--quiet",
               "--privacy-noise", "1", "--privacy-clip", str(tmp_path / "missing.json")])
    assert rc == 1 and "write one with `spatialfed pilot-clip`" in capsys.readouterr().err
    with pytest.raises(ValueError, match="margin must be a number ≥ 1"):
        from spatialfed.runtime.pilot import pilot_clip

        pilot_clip([], None, None, margin=0.5)
