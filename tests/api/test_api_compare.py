"""Model choice by prediction (api/compare.py, `spatialfed compare`): each candidate is the estimator's own fit, AIC
and the site-blocked CV are its ℓ and ``site_blocked_cv_``, the paired CV difference is the difference of the totals,
and on an anisotropic field both measures choose the anisotropic model."""

import json

import numpy as np
import pytest

from spatialfed import FederatedGP, compare_models
from spatialfed.api.compare import Comparison, candidate, label
from spatialfed.cli import main
from spatialfed.model.family import MaternFamily

SETTINGS = dict(mode="sync", knots=16, cluster="simulated", progress=False)


@pytest.fixture(scope="module")
def field():
    """An anisotropic Matérn-1/2 field (ranges 0.3 along 30° from north, 0.06 across), 3 sites (strips by x)."""
    rng = np.random.default_rng(2)
    locs = rng.uniform(size=(360, 2))
    C = MaternFamily(0.5, anisotropy=True).cross(locs, locs, 1.0, [np.log(0.3), np.log(5.0), np.radians(30.0)])
    z = np.linalg.cholesky(C + 0.05 * np.eye(len(locs))) @ rng.standard_normal(len(locs))
    return locs, z, (locs[:, 0] * 3).astype(int)


def test_the_rows_are_the_estimators_fits_and_anisotropy_wins_by_both(field):
    locs, z, groups = field
    table = compare_models(None, z, candidates=["nu=0.5", "anisotropy"], coords=locs, groups=groups, **SETTINGS)
    assert [r.label for r in table.rows] == ["nu=0.5", "anisotropy"]
    direct = FederatedGP(**SETTINGS, anisotropy=True).fit(None, z, coords=locs, groups=groups)
    row = table.rows[1]
    assert row.loglik == direct.loglik_ and row.cv_crps == direct.site_blocked_cv_["crps"]
    assert row.n_params == 5 and table.rows[0].n_params == 3
    assert row.aic == pytest.approx(-2 * direct.loglik_ + 10, rel=1e-14)
    assert table.best_by_aic == table.best_by_cv == "anisotropy" and table.agree
    assert abs(row.covariance["angle_deg"] - 30.0) < 15.0
    d, se = table.cv_difference("nu=0.5", "anisotropy")  # the paired mean is the difference of the totals
    assert d == pytest.approx(table.rows[0].cv_crps - row.cv_crps, rel=1e-10) and d > 0 and se > 0
    said = str(table)
    assert "best by AIC and by site-blocked CV CRPS: anisotropy" in said and "ratio" in said
    frame = table.to_frame()
    assert list(frame.index) == ["nu=0.5", "anisotropy"] and frame.loc["anisotropy", "q"] == 5
    saved = json.loads(table.to_json())
    assert saved["best_by_cv"] == "anisotropy" and saved["rows"][1]["aic"] == pytest.approx(row.aic)


def test_a_disagreement_is_said_with_its_paired_difference(field):
    locs, z, groups = field
    table = compare_models(None, z, candidates=["nu=0.5", "anisotropy"], coords=locs, groups=groups, **SETTINGS)
    a, b = table.rows
    swapped = Comparison((a, type(b)(**{**b.__dict__, "loglik": a.loglik - 100.0})))  # AIC now prefers nu=0.5
    assert swapped.best_by_aic == "nu=0.5" and swapped.best_by_cv == "anisotropy" and swapped.agree is False
    assert "AIC and prediction disagree: best by AIC nu=0.5, by site-blocked CV CRPS anisotropy (lower by" in \
        str(swapped)


@pytest.mark.parametrize("spec, settings", [
    ("nu=estimate,anisotropy", {"nu": "estimate", "anisotropy": True}),
    ("nu=1.5", {"nu": 1.5}),
    (" anisotropy = off ", {"anisotropy": False}),
    ({"nu": 2.5}, {"nu": 2.5}),
    ("nu=estimate,distance=chordal", {"nu": "estimate", "distance": "chordal"}),
])
def test_candidates_are_read_from_text_or_dicts(spec, settings):
    assert candidate(spec) == settings
    assert label({"nu": 1.5, "anisotropy": True}) == "nu=1.5, anisotropy"
    assert label({"distance": "planar", "nu": 0.5}) == "nu=0.5, distance=planar"


@pytest.mark.parametrize("call, message", [
    (lambda: candidate("knots=9"), "a candidate sets nu, anisotropy, distance"),
    (lambda: candidate(""), "a candidate sets"),
    (lambda: compare_models("s.zarr", candidates=["nu=0.5"], nu=1.5), r"\['nu'\] differ between candidates"),
    (lambda: compare_models("s.zarr", candidates=[]), "at least one candidate"),
])
def test_bad_candidates_are_one_line(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_the_command_prints_the_table_and_writes_json(tmp_path, capsys):
    from spatialfed.data.simulate import simulate_store

    simulate_store(tmp_path / "s.zarr", 3, 60, test_size=0, seed=4)
    out = tmp_path / "cmp.json"
    argv = ["compare", str(tmp_path / "s.zarr"), "--candidate", "nu=0.5", "--candidate", "nu=estimate", "--knots",
            "9", "--runtime", "simulated", "--quiet", "--out", str(out)]
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert said.splitlines()[0].startswith("candidate") and "nu=estimate" in said and f"wrote {out}" in said
    rows = json.loads(out.read_text())["rows"]
    assert [r["label"] for r in rows] == ["nu=0.5", "nu=estimate"] and rows[1]["n_params"] == 4
    assert main(argv) != 0  # an existing file is refused before the fits
    assert "--overwrite" in capsys.readouterr().err
    assert main(["compare", str(tmp_path / "s.zarr"), "--candidate", "range=3"]) != 0
    assert "a candidate sets nu, anisotropy, distance" in capsys.readouterr().err
