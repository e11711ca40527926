"""The real-data map pipelines end to end (slow: each starts a Dask cluster and fits on it), and every pipeline script
importable in the default run (a removed library function broke common.py's import unnoticed, as only the slow
runs imported it)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"


def test_every_pipeline_script_imports():
    """Each pipelines/*.py imports (its main() runs only as a script) in one fresh interpreter."""
    names = sorted(p.stem for p in PIPELINES.glob("*.py"))
    code = f"import sys; sys.path.insert(0, {str(PIPELINES)!r})\nfor name in {names!r}:\n    __import__(name)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("script, extra", [("meuse_zinc_map.py", ["--holdout", "block"]), ("ozone_map.py", [])])
def test_pipeline_runs_and_scores(tmp_path, script, extra):
    done = subprocess.run([sys.executable, str(PIPELINES / script), "--out", str(tmp_path), *extra],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    scores = json.loads((tmp_path / "metrics.json").read_text())
    assert set(scores) == {"low-rank (federated)", "independence model", "pooled OLS"}
    for name in ("report.md", "heldout.png", "map_lowrank/map.png", "map_lowrank/mean.tif", "map_independent/sd.tif"):
        assert (tmp_path / name).is_file(), name
