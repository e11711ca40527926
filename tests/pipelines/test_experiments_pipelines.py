"""The experiment pipelines (pipelines/experiments.py and the figure scripts): configuration checks, the task
functions on tiny data, and the paper's findings on small configurations (Section 6; the slow ones are marked)."""

import sys
from pathlib import Path

import numpy as np
import pytest

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"
sys.path.insert(0, str(PIPELINES))

import async_vs_sync
import experiments as ex
import kl_divergence
import lowrank_vs_independent

# ---------------------------------------------------------------- configuration validation

@pytest.mark.parametrize("main, argv, message", [
    (kl_divergence.main, ["--knots", "10,5000"], "more knots than can be placed"),
    (kl_divergence.main, ["--knots", "10,-5"], "positive integer"),
    (kl_divergence.main, ["--knots", "ten"], "comma-separated integers"),
    (kl_divergence.main, ["--replicates", "0"], "--replicates must be a positive integer"),
    (lambda a: lowrank_vs_independent.main(a, figure=2), ["--replicates", "-3"], "positive integer"),
    (lambda a: async_vs_sync.main(a, figure=7), ["--profile", "weird"], "unknown heterogeneity profile"),
    (lambda a: async_vs_sync.main(a, figure=8), ["--profile", "graded:0"], "minimum cores"),
    (lambda a: async_vs_sync.main(a, figure=5), ["--alpha", "3"], "--alpha must be in (0, 1]"),
    (lambda a: async_vs_sync.main(a, figure=6), ["--workers", "0"], "--workers must be a positive integer"),
    (lambda a: async_vs_sync.main(a, figure=6), ["--preset", "fast"], "invalid choice: 'fast'"),
    (lambda a: async_vs_sync.main(a, figure=7), ["--beside", "fast"], "invalid choice: 'fast'"),
])
def test_nonsense_configurations_fail_with_a_clear_message(main, argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv + ["--out", str(tmp_path)])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_library_checks():
    with pytest.raises(ex.ConfigError, match="positive integer"):
        ex.positive_int(-100, "n_j")
    with pytest.raises(ex.ConfigError, match="more knots"):
        ex.check_knots(101, 100)
    with pytest.raises(ex.ConfigError, match="at most 62 cores"):
        ex.slowdowns_from_cores([62, 80])
    with pytest.raises(ex.ConfigError, match="Agg_threshold 8 exceeds"):
        async_vs_sync.panels_for(5, {**async_vs_sync.QUICK, "J": 4}, "tuned", 1.0, 0)
    with pytest.raises(ex.ConfigError, match="positive integer"):
        lowrank_vs_independent.groups_and_tasks(2, {"J": 10, "ns": (100, -5), "nu": 2.5, "range": 0.3,
                                                    "replicates": 2}, 0)
    np.testing.assert_allclose(ex.slowdowns_from_cores(ex.graded_cores(3)), [1.0, 62 / 32.5, 62 / 3])


def test_settle_and_error():
    assert ex.settle([0, 1, 2, 3], [1, 1e-2, 1e-4, 1e-5], 1e-3) == 2
    assert ex.settle([0, 1, 2], [1, 1e-4, 1e-2], 1e-3) is None
    ref = {"delta": 1.0, "sigma2": 2.0, "beta": 0.1, "gamma": [1.0, -2.0]}
    assert ex.max_rel_error({**ref, "beta": 0.11}, ref) == pytest.approx(0.1)


# ---------------------------------------------------------------- task functions on tiny data

def test_fit_pair_fits_both_models():
    task = {"fn": "fit_pair", "nu": 1.5, "beta": 0.1, "J": 3, "n": 40, "m": 16, "seed": 1, "group": "g"}
    rows = ex.run_tasks([task], 1)
    assert [r["model"] for r in rows] == ["low-rank", "independence"]
    for r in rows:
        assert r["converged"] and r["sigma2"] > 0 and r["beta"] > 0 and np.isfinite(r["loglik"])


def test_convergence_run_rows_default_preset_is_the_statistics_scheme():
    """Without a preset, convergence_run fits with the library's default (stats: one round trip of statistics per
    iteration, SPEC §2b): trace rows are its Newton steps, both modes settle on the block scheme's reference."""
    from spatialfed.algorithm.config import DEFAULT_PRESET

    rows = ex.convergence_run(experiment="t", panel="p", J=3, n=60, m=16, cores=[62, 31, 3], max_iter=60,
                              tol=1e-6, test_size=10, seed=2)   # seeds 0, 1: δ̂ → ∞ (flat), no reference
    assert {r["kind"] for r in rows} == {"trace", "summary", "rmse"}
    assert {r["preset"] for r in rows} == {DEFAULT_PRESET} == {"stats"}
    summary = [r for r in rows if r["kind"] == "summary"]
    assert [r["mode"] for r in summary] == ["sync", "async"]
    steps = {r["step"] for r in rows if r["kind"] == "trace"}
    assert "stats" in steps and "theta" not in steps, steps
    assert summary[1]["agg_threshold"] == 1                # the statistics scheme's own Agg_threshold
    for r in summary:                                     # both modes reach the reference estimate and settle
        assert r["final_error"] < 1e-5 and r["settle_s"] is not None, r
        assert r["rounds"] < r["iterations"] or r["mode"] == "sync"   # async: answers per site < aggregations
    assert len([r for r in rows if r["kind"] == "rmse" and r["mode"] == "sync"]) >= 3


def test_stats_preset_refuses_the_block_schemes_settings():
    with pytest.raises(ex.ConfigError, match="staleness bound"):
        ex.async_config("stats", None, 10, 1e-6, staleness_bound=10)
    with pytest.raises(ex.ConfigError, match="strategies='tuned'"):
        ex.async_config("stats", None, 10, 1e-6, correction=True)
    assert ex.sync_config("stats", 10, 1e-6).scheme_name == "stats" and ex.sync_config("paper", 10, 1e-6).scheme_name == "block"


def test_parser_default_preset_is_the_librarys():
    from spatialfed.algorithm.config import DEFAULT_PRESET

    args = ex.base_parser("x", "q", "f", replicates=False, runtime=True).parse_args([])
    assert args.preset == DEFAULT_PRESET and ex.PRESETS[0] == DEFAULT_PRESET


def test_panels_show_the_default_beside_the_paper_preset():
    """Figures 6–8: one task per panel, preset and mode, default preset first; Figure 7's staleness bound only for the
    block scheme; Figure 5: the paper's arms per panel plus the default's sync and async reference arms once."""
    presets = async_vs_sync.presets_of(async_vs_sync.DEFAULT_PRESET)
    assert presets == ["stats", "paper"]
    assert async_vs_sync.presets_of("paper") == ["paper"] and async_vs_sync.presets_of("stats", "none") == ["stats"]
    for figure, n_panels in ((6, 4), (8, 3)):
        tasks = [t for _, _, t in async_vs_sync.panels_for(figure, async_vs_sync.QUICK, presets, 1.0, 0)]
        assert len(tasks) == n_panels * 4
        assert {(t["preset"], t["modes"]) for t in tasks} == {(p, (m,)) for p in presets for m in ("sync", "async")}
    tasks = [t for _, _, t in async_vs_sync.panels_for(7, async_vs_sync.QUICK, presets, 1.0, 0)]
    bounded = [t for t in tasks if t["modes"] == (ex.BOUNDED,)]
    assert len(tasks) == 3 * 5 and {t["preset"] for t in bounded} == {"paper"}
    assert all(t["staleness_bound"] == 10 for t in bounded)
    assert all(t["staleness_bound"] is None for t in tasks if t["modes"] != (ex.BOUNDED,))
    panels = async_vs_sync.panels_for(5, async_vs_sync.QUICK, presets, 1.0, 0)
    refs = [t for p, _, t in panels if p == async_vs_sync.REFERENCE]
    assert [(t["preset"], t["modes"]) for t in refs] == [("stats", ("sync",)), ("stats", ("async",))]
    arms = [t for p, _, t in panels if p != async_vs_sync.REFERENCE]
    assert len(arms) == 3 * len(ex.ABLATION_ARMS) and {t["preset"] for t in arms} == {"paper"}


def test_settle_ratio_per_preset():
    import pandas as pd

    summary = pd.DataFrame([
        {"panel": "a", "preset": "stats", "mode": "sync", "settle_s": 2.0},
        {"panel": "a", "preset": "stats", "mode": "async", "settle_s": 1.0},
        {"panel": "a", "preset": "paper", "mode": "sync", "settle_s": 1.0},
        {"panel": "a", "preset": "paper", "mode": "async", "settle_s": None},
        {"panel": "a", "preset": "paper", "mode": ex.BOUNDED, "settle_s": 3.0},
        {"panel": "a", "preset": "paper", "mode": "none", "settle_s": 3.0}])
    got = async_vs_sync.with_ratios(summary)["ratio_vs_sync"].tolist()
    assert got[1] == pytest.approx(0.5) and got[4] == pytest.approx(3.0)
    assert all(np.isnan(got[i]) for i in (0, 2, 3, 5))
    assert async_vs_sync.ratio_note(async_vs_sync.with_ratios(summary), "a", ["stats", "paper"]) == \
        "async/sync settle\nstats 0.50\npaper async n.s."


TINY = {**async_vs_sync.QUICK, "J": 3, "n": 60, "m": 16, "max_iter": 60, "max_iter_ablation": 20,
        "imbalance": (3,), "agg": (2,)}


@pytest.mark.parametrize("figure", [6, 5])
def test_figure_with_the_default_beside_the_paper_preset(figure, tmp_path):
    """End to end on tiny data (J = 3, n_j = 60): summary.csv has every preset's curves per panel and the stats
    preset's async/sync settle ratio; Figure 5 carries the stats reference arms in its panel; the PNG is written
    and --replot redraws it from the CSV files."""
    trace, summary = async_vs_sync.run(figure, TINY, tmp_path, 1, publish=tmp_path / "docs")
    panel = "min3" if figure == 6 else "A=2"
    s = summary[summary.panel == panel].set_index("series")
    want = ({"stats sync", "stats async", "paper sync", "paper async"} if figure == 6 else
            set(ex.ABLATION_ARMS) | {"stats sync", "stats async"})
    assert set(s.index) == want and set(trace.series) == want
    assert s.at["stats async", "ratio_vs_sync"] == pytest.approx(
        s.at["stats async", "settle_s"] / s.at["stats sync", "settle_s"])
    assert s.at["stats sync", "final_error"] < 1e-5 and s.at["stats async", "final_error"] < 1e-5
    png = tmp_path / f"{async_vs_sync.NAMES[figure]}.png"
    assert png.stat().st_size > 10_000 and (tmp_path / "docs" / png.name).stat().st_size > 5_000
    png.unlink()
    async_vs_sync.run(figure, TINY, tmp_path, 1, replot=True)
    assert png.is_file()


# ---------------------------------------------------------------- findings (Figure 4: Proposition 4)

def test_kl_lowrank_below_independence_and_decreasing_in_m():
    c = {"J": 5, "n": 60, "ms": (5, 10, 25, 50, 100), "nu": 2.5, "range": 0.3, "replicates": 2}
    rows = ex.run_tasks(kl_divergence.tasks_for(c), 1)
    for r in rows:
        assert r["kl_lowrank"] < r["kl_independent"]
    means = [np.mean([r["kl_lowrank"] for r in rows if r["m"] == m]) for m in c["ms"]]
    assert np.all(np.diff(means) < 0), means


# ---------------------------------------------------------------- findings (slow)

@pytest.mark.slow
def test_beta_rmse_lowrank_below_independence_in_the_figure2_setting():
    cfg = {"J": 10, "ns": (200,), "nu": 2.5, "range": 0.3, "replicates": 8}   # the paper's smallest n_j
    _, _betas, tasks = lowrank_vs_independent.groups_and_tasks(2, cfg, 0)
    df = lowrank_vs_independent.summarise(__import__("pandas").DataFrame(ex.run_tasks(tasks, 2)))
    rmse = df[df.param == "beta"].set_index("model").rmse
    assert rmse["low-rank"] < rmse["independence"], rmse


def _summary(rows):
    return {r["mode"]: r for r in rows if r["kind"] == "summary"}


@pytest.mark.slow
def test_async_faster_than_sync_under_graded_and_within_15_percent_balanced():
    for profile, bound in (("graded", 1.0), ("balanced", 1.15)):
        s = _summary(ex.convergence_run(experiment="t", panel=profile, J=10, n=200, m=100,
                                        cores=ex.profile_cores(profile, 10), max_iter=400, tol=1e-6))
        assert s["sync"]["settle_s"] is not None and s["async"]["settle_s"] is not None
        assert s["async"]["settle_s"] < bound * s["sync"]["settle_s"], (profile, s)


@pytest.mark.slow
def test_all_strategies_stable_where_none_diverges():
    """Figure 5's setting at Agg_threshold 2 (graded cores, every arm α = 1): no strategy diverges, the moving average
    alone is slow, all three together are stable and the fastest (quick-mode measurement: none ends at error 32 after
    peaking at 1e5; moving average only settles at 3.5 s, all strategies at 2.4 s, final error 2e-5)."""
    arms = {k: ex.ABLATION_ARMS[k] for k in ("none", "moving average only", "all strategies")}
    s = _summary(ex.convergence_run(experiment="t", panel="A=2", J=10, n=200, m=100, cores=ex.graded_cores(10),
                                    agg_threshold=2, arms=arms, alpha=1.0, max_iter=200, tol=1e-6))
    assert s["none"]["settle_s"] is None and s["none"]["max_error_late"] > 1.0
    assert s["all strategies"]["settle_s"] < s["moving average only"]["settle_s"]
    assert s["all strategies"]["final_error"] < 1e-4


@pytest.mark.slow
def test_dask_runtime_runs_both_presets_on_one_store_per_panel(tmp_path):
    """--runtime dask: each panel's store and reference are made once and fitted by both presets (the second preset
    used to fail on the existing store); the stats fits reach the reference."""
    trace, summary = async_vs_sync.run(6, TINY, tmp_path, 1, runtime="dask")
    s = summary.set_index("series")
    assert set(s.index) == {"stats sync", "stats async", "paper sync", "paper async"}
    assert s.at["stats sync", "final_error"] < 1e-5 and s.at["stats async", "final_error"] < 1e-5
    assert (tmp_path / "fig6_imbalance.png").is_file()
