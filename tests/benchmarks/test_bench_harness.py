"""benchmarks/harness.py, what the benchmark scripts share, and the scripts' import graph: no script imports another
in a loop (every import counts, those inside functions too), and the shared pieces live in the harness."""

import ast
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO / "tests"))
import harness  # noqa: E402
from test_layers import strongly_connected  # noqa: E402


def script_imports() -> dict[str, set[str]]:
    """For each benchmarks/*.py, the other benchmark scripts it imports (module level or inside a function)."""
    names = {p.stem for p in BENCH.glob("*.py")}
    edges = {}
    for path in BENCH.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                deps.add(node.module.split(".")[0])
        edges[path.stem] = (deps & names) - {path.stem}
    return edges


def test_the_benchmarks_import_each_other_in_no_loop():
    assert not strongly_connected(script_imports())


def test_the_loop_check_sees_a_planted_loop():
    edges = script_imports()
    edges["harness"] = edges["harness"] | {"bench_million"}  # the harness importing a script that imports it
    assert ["bench_million", "harness"] in strongly_connected(edges)


def test_shared_helpers_are_defined_once():
    """say, PeakRSS, Gaps, emitter and make_store are defined in the harness and in no script."""
    shared = {"say", "PeakRSS", "Gaps", "emitter", "make_store"}
    twice = []
    for path in BENCH.glob("*.py"):
        if path.stem == "harness":
            continue
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        twice += [f"{path.name}: {name}" for name in sorted(defined & shared)]
    assert not twice, twice


def test_emitter_prints_a_row_a_line_and_appends_to_the_rows_file(tmp_path, capsys):
    rows = tmp_path / "rows.jsonl"
    emit = harness.emitter(rows)
    emit({"a": 1})
    emit({"b": [2, 3]})
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [{"a": 1}, {"b": [2, 3]}]
    assert [json.loads(line) for line in rows.read_text().splitlines()] == [{"a": 1}, {"b": [2, 3]}]


def test_gaps_times_the_first_line_and_the_longest_silence(tmp_path):
    with open(tmp_path / "out.txt", "w") as sink:
        gaps = harness.Gaps(sink)
        time.sleep(0.05)
        gaps.write("first\n")
        time.sleep(0.15)
        gaps.write("partial ")            # no line end: not an output event
        gaps.write("second\n")
        out = gaps.stop()
    assert 0.05 <= out["first_output_s"] < out["longest_silence_s"]
    assert out["longest_silence_s"] >= 0.15


def test_peak_rss_sees_an_allocation():
    import numpy as np

    with harness.PeakRSS(children=False, interval=0.01) as mem:
        before = mem.peak
        block = np.ones(64 * 2**20 // 8)  # 64 MB, touched
        time.sleep(0.05)
    assert mem.peak - before >= 48 * 2**20 and block.sum() > 0
