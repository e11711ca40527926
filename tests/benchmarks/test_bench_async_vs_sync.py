"""benchmarks/bench_async_vs_sync.py: every combination of seeds × profiles × n_j × partitions ×
sizes is run on the real virtual clock, one store per (seed, n_j, partition, sizes), with a summary per group and
per profile computed from the rows."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_async_vs_sync as bench  # noqa: E402

TINY = ["--workers", "3", "--n-per-worker", "60", "--knots", "25", "--range", "0.2", "--seeds", "0-1",
        "--profiles", "balanced,straggler"]


def run(capsys, argv):
    assert bench.main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny grid, run once for the module (stdout captured by hand: capsys is function-scoped)."""
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert bench.main(TINY) == 0
    return json.loads(out.getvalue())


def test_every_combination_is_a_row(tiny):
    rows = tiny["rows"]
    assert [(r["seed"], r["profile"]) for r in rows] == [(0, "balanced"), (0, "straggler"), (1, "balanced"),
                                                        (1, "straggler")]
    for r in rows:
        assert (r["n_per_worker"], r["partition"], r["sizes"], r["workers"], r["knots"], r["beta"]) == (
            60, "random", "equal", 3, 25, 0.2)
        assert r["sync_s"] > 0 and r["sync_rounds"] >= 1 and r["async_rounds"] >= 1 and np.isfinite(r["dloglik"])
        assert r["settled"] == (r["async_s"] is not None) and (r["ratio"] is None) == (not r["settled"])
        if r["settled"]:
            assert r["ratio"] == pytest.approx(r["async_s"] / r["sync_s"], rel=1e-12)
    # on the sites-only clock equal slowdowns make every site answer together: the asynchronous run is the
    # synchronous one; the charged clock (ratio) adds the server's own CPU, measured
    assert all(r["ratio_sites_only"] == pytest.approx(1.0, abs=1e-12) for r in rows if r["profile"] == "balanced")
    assert all(0 < r[key] <= r["wall_s"] + 0.01 for r in rows for key in ("sync_server_s", "async_server_s"))
    assert all(0 < r["async_server_share"] <= 1 + 1e-9 and r["async_fit_s"] >= r["async_s"] for r in rows)
    assert all(r["flop_rate"] > 1e6 for r in rows)
    # the two seeds are two data sets: their synchronous settle times differ
    assert rows[0]["sync_s"] != rows[2]["sync_s"]
    # beside 1e-3, the ratio at a looser and a tighter tolerance
    assert all(set(r["ratio_by_rtol"]) == {"0.01", "0.0001"} for r in rows)
    assert all(v is None or v > 0 for r in rows for v in r["ratio_by_rtol"].values())


def test_settle_ratio_at_each_tolerance():
    """Two traces whose estimates straddle the 1e-3 band: async is later at 1e-3 only (a band-edge effect)."""
    ref = {"delta": 1.0, "sigma2": 2.0, "beta": 0.1, "gamma": [3.0]}

    def trace(*rows):
        return [{"time_s": t, "delta": 1.0 + e, "sigma2": 2.0, "beta": 0.1, "gamma": [3.0]} for t, e in rows]

    sync = trace((0.0, 0.5), (1.0, 9e-4), (2.0, 1e-6))
    asyn = trace((0.0, 0.5), (1.0, 1.1e-3), (1.5, 5e-5), (2.0, 1e-6))
    assert bench.settle_ratio(sync, asyn, ref, 1e-3) == pytest.approx(1.5)
    assert bench.settle_ratio(sync, asyn, ref, 1e-2) == pytest.approx(1.0)
    assert bench.settle_ratio(sync, asyn, ref, 1e-4) == pytest.approx(0.75)
    assert bench.settle_ratio(sync, trace((0.0, 0.5), (1.0, 0.1)), ref, 1e-3) is None


def test_summary_is_computed_from_the_rows(tiny):
    rows, summary = tiny["rows"], tiny["summary"]
    assert [s["profile"] for s in summary["by_profile"]] == ["balanced", "straggler"]
    for s in summary["by_profile"]:
        mine = [r for r in rows if r["profile"] == s["profile"]]
        ratios = [r["ratio"] for r in mine if r["settled"]]
        assert s["runs"] == 2 and s["settled"] == len(ratios) >= 1
        assert s["on_optimum"] == sum(abs(r["dloglik"]) <= bench.LOGLIK_TOL for r in mine)
        assert s["mean"] == pytest.approx(np.mean(ratios), rel=1e-12)
        assert s["worst"] == pytest.approx(max(ratios), rel=1e-12)
        worst = next(r for r in rows if r["profile"] == s["profile"] and r["ratio"] == s["worst"])
        assert s["worst_run"]["seed"] == worst["seed"]
    groups = summary["by_group"]
    assert [(g["profile"], g["n_per_worker"], g["partition"], g["sizes"]) for g in groups] == [
        ("balanced", 60, "random", "equal"), ("straggler", 60, "random", "equal")]
    assert [g["mean"] for g in groups] == pytest.approx([s["mean"] for s in summary["by_profile"]], rel=1e-12)


def test_summary_counts_unsettled_and_off_optimum_runs():
    """A run that never settled has no ratio: it counts against `settled`, not in the mean or the worst."""
    base = {"n_per_worker": 40, "partition": "random", "sizes": "equal", "runtime": "simulated"}
    rows = [dict(base, seed=0, profile="graded", ratio=0.5, settled=True, dloglik=0.0),
            dict(base, seed=1, profile="graded", ratio=0.9, settled=True, dloglik=2e-6),
            dict(base, seed=2, profile="graded", ratio=None, settled=False, dloglik=-1e-3),
            dict(base, seed=0, profile="graded", partition="area", ratio=1.2, settled=True, dloglik=0.0)]
    summary = bench.summarize(rows, ["graded"])
    (whole,) = summary["by_profile"]
    assert (whole["runs"], whole["settled"], whole["on_optimum"]) == (4, 3, 2)
    assert whole["mean"] == pytest.approx((0.5 + 0.9 + 1.2) / 3) and whole["worst"] == 1.2
    assert whole["worst_run"]["partition"] == "area"
    assert [(g["partition"], g["runs"], g["worst"]) for g in summary["by_group"]] == [("area", 1, 1.2),
                                                                                      ("random", 3, 0.9)]
    settled, worst = summary["bounds"][:2]  # graded only: no balanced, straggler or graded:12 bound
    assert len(summary["bounds"]) == 3 and (settled["value"], settled["holds"]) == (2, False)
    assert worst["value"] is None and not worst["holds"]  # the unsettled run is the worst
    assert summary["bounds"][2]["bound"].startswith("mean graded <=") and summary["bounds"][2]["value"] is None
    text = bench.table(summary)  # the Markdown table on stderr
    assert "| graded | all | all | all | 4 | 3 | 2 | 0.867 | 1.2 (0) |" in text
    assert "| graded | 40 | area | equal | 1 | 1 | 1 | 1.2 | 1.2 (0) |" in text
    assert "- every run settled, |dloglik| <= 1e-6: 2 of 4 runs (fails)" in text


def test_bounds_of_settled_rows():
    base = {"n_per_worker": 40, "partition": "random", "sizes": "equal", "runtime": "simulated", "settled": True,
            "dloglik": 0.0}
    rows = [dict(base, seed=0, profile="balanced", ratio=1.01), dict(base, seed=0, profile="straggler", ratio=0.3),
            dict(base, seed=0, profile="graded", ratio=0.6), dict(base, seed=0, profile="graded:12", ratio=0.8),
            dict(base, seed=1, profile="graded:12", ratio=1.06)]
    got = {b["bound"]: (b["value"], b["holds"]) for b in bench.bounds(rows)}
    assert got == {"every run settled, |dloglik| <= 1e-6": (5, True), "worst ratio <= 1.1": (1.06, True),
                   "worst balanced <= 1.02": (1.01, True), "mean straggler <= 0.55": (pytest.approx(0.3), True),
                   "mean graded <= 0.7": (pytest.approx(0.6), True), "mean graded:12 <= 0.85": (pytest.approx(0.93), False)}
    rows.append(dict(base, seed=1, profile="graded", ratio=1.2))
    got = {b["bound"]: (b["value"], b["holds"]) for b in bench.bounds(rows)}
    assert got["worst ratio <= 1.1"] == (1.2, False) and got["mean graded <= 0.7"] == (pytest.approx(0.9), False)


def test_one_store_per_data_set(monkeypatch, capsys):
    """Both modes and both profiles run on one simulated store per (seed, n_j, partition, sizes)."""
    import spatialfed.data.simulate as simulate

    made = []
    real = simulate.simulate_store

    def counted(path, *args, **kw):
        made.append((kw["seed"], kw["partition"], kw["sizes"]))
        return real(path, *args, **kw)

    monkeypatch.setattr(simulate, "simulate_store", counted)
    # graded:62 slows no site (62 cores each): a second profile that costs what balanced costs
    out = run(capsys, ["--workers", "3", "--n-per-worker", "60", "--knots", "9", "--range", "0.2", "--seeds", "3",
                       "--profiles", "balanced,graded:62", "--partition", "random,area", "--sizes", "equal,inverse"])
    assert len(made) == 4 and len(set(map(str, made))) == 4
    assert (3, "area", [30, 60, 90]) in made  # Figure 7's inverse layout: 0.5·n_j up to 1.5·n_j
    assert len(out["rows"]) == 8
    inverse = [r for r in out["rows"] if r["sizes"] == "inverse"]
    assert all(r["site_sizes"] == [30, 60, 90] for r in inverse)
    assert {(g["partition"], g["sizes"]) for g in out["summary"]["by_group"]} == {
        (p, s) for p in ("random", "area") for s in ("equal", "inverse")}


def test_seed_and_size_lists():
    assert bench.parse_seeds("0-4,7") == [0, 1, 2, 3, 4, 7]
    assert bench.parse_seeds("0-9") == list(range(10))
    assert bench.parse_seeds(5) == [5]
    assert bench.parse_sizes("equal,aligned;10,20,30", 3) == ["equal", "aligned", "10,20,30"]
    spec = bench.StoreSpec(seed=4, n_per_worker=200, sizes="unaligned")
    aligned = bench.site_sizes(bench.StoreSpec(4, 200, sizes="aligned"), 10)
    assert aligned[0] == 300 and aligned[-1] == 100 and sum(aligned) == 2000
    assert sorted(bench.site_sizes(spec, 10)) == sorted(aligned) and bench.site_sizes(spec, 10) != aligned
    assert bench.site_sizes(bench.StoreSpec(0, 200, sizes="10,20,30"), 3) == [10, 20, 30]
    specs = bench.store_specs([0, 1], [200, 500], ["random"], ["equal", "10,20,30"])
    assert [(s.seed, s.n_per_worker, s.sizes) for s in specs] == [
        (0, 200, "equal"), (0, 500, "equal"), (0, 20, "10,20,30"), (1, 200, "equal"), (1, 500, "equal"),
        (1, 20, "10,20,30")]


@pytest.mark.parametrize("argv, flag", [(["--seeds", "3-1"], "--seeds"), (["--seeds", "a"], "--seeds"),
                                        (["--sizes", "big"], "--sizes"), (["--sizes", "10,20"], "--sizes"),
                                        (["--partition", "column:site"], "--partition"),
                                        (["--profiles", "fast"], "--profiles"), (["--jobs", "0"], "--jobs"),
                                        (["--seeds", "0-1", "--store", "x.zarr"], "--store"),
                                        (["--seed", "1", "--seeds", "2"], "--seeds")])
def test_bad_options_are_one_line(capsys, argv, flag):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert flag in err and "Traceback" not in err


def test_rows_file_resumes(tmp_path, monkeypatch, capsys):
    """--rows keeps each finished store's rows; a rerun takes them from the file and simulates nothing."""
    import spatialfed.data.simulate as simulate

    rows_file = tmp_path / "rows.jsonl"
    argv = ["--workers", "3", "--n-per-worker", "40", "--knots", "9", "--seeds", "0-1",
            "--profiles", "balanced,graded:62", "--rows", str(rows_file)]
    first = run(capsys, argv[:7] + ["0"] + argv[8:])  # seed 0 only
    assert len(rows_file.read_text().splitlines()) == 2
    made = []
    real = simulate.simulate_store
    monkeypatch.setattr(simulate, "simulate_store", lambda path, *a, **kw: made.append(kw["seed"]) or real(path, *a,
                                                                                                        **kw))
    both = run(capsys, argv)
    assert made == [1] and both["rows"][:2] == first["rows"]
    assert len(rows_file.read_text().splitlines()) == 4
    again = run(capsys, argv + ["--summary-only"])
    assert made == [1] and again["rows"] == both["rows"] and again["summary"] == both["summary"]
    assert "missing_stores" not in again
    partial = run(capsys, argv[:7] + ["0-2"] + argv[8:] + ["--summary-only"])  # seed 2 was never run
    assert made == [1] and partial["rows"] == both["rows"]
    assert partial["missing_stores"] == [{"seed": 2, "n_per_worker": 40, "partition": "random", "sizes": "equal"}]
    other = run(capsys, argv[:7] + ["0"] + argv[8:] + ["--nu", "1.5"])  # another setting: its own rows, kept beside
    assert made == [1, 0] and other["rows"][0]["nu"] == 1.5
    assert len(rows_file.read_text().splitlines()) == 6


def test_parallel_jobs_give_the_same_rows(tiny, capsys):
    """--jobs 2 runs the stores in two worker processes; the sites-only clock makes its numbers the same, in the
    same order (the charged clock's follow this machine's measured CPU)."""
    par = run(capsys, TINY + ["--jobs", "2"])
    kept = ("seed", "profile", "n_per_worker", "partition", "sizes", "ratio_sites_only", "sync_rounds", "workers")
    strip = [{k: r[k] for k in kept} for r in par["rows"]]
    for got, want in zip(strip, tiny["rows"], strict=True):
        for key, value in got.items():
            assert value == pytest.approx(want[key], rel=1e-9, abs=1e-12) if isinstance(value, float) else \
                value == want[key], key
    assert par["settings"]["jobs"] == 2


def test_a_reused_store_sets_the_number_of_sites(tmp_path, capsys):
    """--store of a store whose J differs from --workers: J is read from the store (rows say 4 sites)."""
    from spatialfed.data.simulate import simulate_store

    path = tmp_path / "four.zarr"
    simulate_store(path, 4, 50, seed=0, test_size=0, beta=0.2)
    out = run(capsys, ["--workers", "3", "--n-per-worker", "50", "--knots", "25", "--range", "0.2", "--seeds", "0",
                       "--profiles", "straggler", "--store", str(path), "--no-sites-only"])
    (row,) = out["rows"]
    assert row["workers"] == 4 and row["async_settled_by"]["site"] in range(4) and "ratio_sites_only" not in row


def test_each_run_names_the_answer_it_settled_on(tiny):
    """async_settled_by: the answer whose arrival the settling trace row follows (on the virtual clock at once)."""
    for r in tiny["rows"]:
        b = r["async_settled_by"]
        assert b["at_s"] == pytest.approx(r["async_s"], rel=1e-12) and 0 <= b["site"] < 3 and b["epochs"] >= 0
        assert b["kind"] in {"epoch", "explore"}
        # straggler: the last worker is the slow one; balanced: every site is as slow as the slowest, and answers
        # only at epoch points (no site is ever free before the epoch ends)
        assert (b["round_trip_share"] == 1.0) == (r["profile"] == "balanced" or b["site"] == 2)
        if r["profile"] == "balanced":
            assert b["kind"] == "epoch"
    for p in tiny["summary"]["by_profile"]:
        assert sum(p["settled_by"].values()) == p["settled"]
    assert bench.settled_by([(1.0, 0, "epoch", 0)], None, np.ones(3)) is None
    # the last answer by the settle time, not the first
    log = [(1.0, 0, "epoch", 0), (2.0, 1, "explore", 1), (3.0, 2, "epoch", 1)]
    assert bench.settled_by(log, 2.0, np.array([1.0, 1.0, 4.0])) == {
        "site": 1, "kind": "explore", "epochs": 1, "at_s": 2.0, "round_trip_share": 0.25}
