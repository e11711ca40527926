"""Small jobs stay small (issue 14): the command line imports heavy libraries only where they are used.

Importing `spatialfed.cli` or any command module loads no scientific library beyond NumPy; an in-process fit (runtime
auto on the 155-point Meuse data) never imports Dask; Bokeh is imported only when report.html is drawn, not by the
fit. Each check runs in a fresh interpreter (`sys.modules` of this test process is shared with the other tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

MEUSE = Path(__file__).resolve().parents[2] / "data" / "meuse" / "meuse.csv"
#: top-level packages the command line must not import before a command runs (each costs 0.1-2 s CPU)
HEAVY = ("sklearn", "bokeh", "distributed", "dask", "zarr", "geopandas", "pyproj", "shapely", "pandas", "scipy",
         "matplotlib", "tqdm", "xarray", "rasterio")
ENTRIES = ("spatialfed.cli", "spatialfed.cli.args", "spatialfed.cli.simulate", "spatialfed.cli.ingest",
           "spatialfed.cli.fit", "spatialfed.cli.predict", "spatialfed.cli.map", "spatialfed.cli.demo",
           "spatialfed.cli.cluster_script", "spatialfed.cli.pilot_clip")


def loaded_after(code: str) -> dict:
    """Run `code` in a fresh interpreter; the JSON object its last stdout line prints."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


HEAVY_NOW = f"sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))"


@pytest.mark.parametrize("entry", ENTRIES)
def test_importing_a_command_module_loads_no_heavy_library(entry):
    heavy = loaded_after(f"import json, sys\nimport {entry}\nprint(json.dumps({{'heavy': {HEAVY_NOW}}}))")["heavy"]
    assert heavy == [], f"import {entry} loads {heavy}: import them inside the function that uses them"


def test_in_process_fit_imports_no_dask_and_bokeh_only_for_the_report(tmp_path):
    """Meuse ingest, then an API fit without save (no report: no Bokeh), then `spatialfed fit` (writes report.html:
    Bokeh, the check's positive control); runtime auto runs both fits in this process, so Dask is never imported."""
    store, out = tmp_path / "meuse.zarr", tmp_path / "fit"
    code = f"""
import json, sys
from spatialfed.cli import main
seen = {{}}
assert main(["ingest", {str(MEUSE)!r}, {str(store)!r}, "--x", "x", "--y", "y", "--value", "zinc",
             "--crs", "EPSG:28992", "--workers", "4"]) == 0
seen["ingest"] = {HEAVY_NOW}
from spatialfed.api import FederatedGP
gp = FederatedGP(mode="sync", knots=16, max_iter=3, progress=False).fit({str(store)!r})
seen["runtime"] = gp.runtime_used_
seen["api_fit"] = {HEAVY_NOW}
assert main(["fit", {str(store)!r}, "--out", {str(out)!r}, "--mode", "sync", "--knots", "16", "--max-iter", "3",
             "--quiet"]) == 0
seen["cli_fit"] = {HEAVY_NOW}
print(json.dumps(seen))
"""
    seen = loaded_after(code)
    assert seen["runtime"] == "simulated"  # auto chose this process: the premise of the checks below
    for step in ("ingest", "api_fit", "cli_fit"):
        assert not {"dask", "distributed"} & set(seen[step]), (step, seen[step])
    assert "bokeh" not in seen["api_fit"], seen["api_fit"]
    assert "bokeh" in seen["cli_fit"] and (out / "report.html").stat().st_size > 0


def test_the_command_skips_the_exit_collection():
    """spatialfed's main() registers gc.freeze as the interpreter's last exit handler: the final collection over every
    object of the libraries it loaded (~0.6 CPU s of a Meuse fit) is skipped."""
    code = ("import atexit, gc, io, contextlib\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
            "from spatialfed.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main([])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "frozen True"
