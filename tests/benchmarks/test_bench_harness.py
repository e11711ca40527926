"""benchmarks/harness.py: the helpers the benchmark scripts share (JSON rows, the simulated store, output gaps),
and benchmarks/ free of import loops."""

import ast
import contextlib
import io
import json
import sys
from pathlib import Path

from test_layers import strongly_connected

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import harness  # noqa: E402

from spatialfed.data.store import open_store  # noqa: E402


def test_emit_prints_one_json_line_and_appends_it_to_the_file(tmp_path):
    out, rows = io.StringIO(), tmp_path / "rows.jsonl"
    with contextlib.redirect_stdout(out):
        emit = harness.emitter(rows)
        emit({"a": 1})
        emit({"b": [2.5]})
    assert out.getvalue() == rows.read_text() == '{"a": 1}\n{"b": [2.5]}\n'


def test_make_store_writes_the_area_partitioned_store_it_reports(tmp_path, capsys):
    made = harness.make_store(tmp_path / "s.zarr", 90, 3, seed=2, test=12)
    info = open_store(tmp_path / "s.zarr")
    assert info.n_workers == 3 and sum(info.sizes) == 90 and info.has_test
    assert made["simulate_s"] >= 0 and made["ingest_s"] >= 0 and made["sim_peak_rss_mb"] > 0
    assert "simulated 90 points" in capsys.readouterr().err


def test_gaps_notes_the_first_line_and_passes_the_text_through():
    screen = io.StringIO()
    gaps = harness.Gaps(screen)
    gaps.write("partial")
    assert gaps.first_s is None
    gaps.write(" line\n")
    got = gaps.stop()
    assert screen.getvalue() == "partial line\n" and got["first_output_s"] is not None
    assert got["longest_silence_s"] >= 0


def test_the_benchmark_scripts_import_one_another_without_a_loop():
    scripts = {p.stem: p for p in (REPO / "benchmarks").glob("*.py")}
    edges = {}
    for name, path in scripts.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                deps |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level:
                deps.add(node.module or "")
        edges[name] = {dep for dep in deps if dep in scripts and dep != name}
    assert not strongly_connected(edges)
    assert "harness" in edges["bench_million"] and "bench_million" not in edges["bench_first_output"]
