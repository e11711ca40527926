"""Quiet success and advice in the caller's own words (issue 28, item 6).

Ingesting lon/lat spread over a continent: the "wrote" line names the CRS by its short name (never ~1,700
characters of WKT), and the distortion warning is one line `spatialfed ingest: warning: ...` naming the flag
--target-crs, with no `UserWarning` or echoed source line. From Python the same warning names `target_crs=`.
"""

import re

import numpy as np
import pandas as pd
import pytest

from spatialfed.cli import main
from spatialfed.data.ingest import ingest_frame


def _continent(n=60, seed=2) -> pd.DataFrame:
    """Stations from the Pacific to the mid-Atlantic (lon −120…−20, lat 0…60): no planar CRS keeps distances within
    2 % over them."""
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"lon": rng.uniform(-120, -20, n), "lat": rng.uniform(0, 60, n), "z": rng.normal(size=n)})


def test_cli_ingest_of_lonlat_prints_a_short_crs_and_one_warning_line(tmp_path, capsys):
    table = tmp_path / "stations.csv"
    _continent().to_csv(table, index=False)
    out = tmp_path / "s.zarr"
    assert main(["ingest", str(table), str(out), "--x", "lon", "--y", "lat", "--value", "z", "--crs", "EPSG:4326",
                 "--workers", "3"]) == 0
    captured = capsys.readouterr()
    wrote = captured.out.strip().splitlines()
    assert len(wrote) == 1 and wrote[0].startswith(f"wrote {out}: 3 workers, 60 rows")
    assert re.search(r", crs WGS 84 / LAEA centred [0-9.]+N [0-9.]+W, ", wrote[0]) and len(wrote[0]) < 250, wrote[0]
    assert "PROJCRS" not in captured.out and "LambertAzimuthal" not in captured.out
    warnings = [line for line in captured.err.splitlines() if "warning" in line.lower()]
    assert len(warnings) == 1, captured.err
    assert warnings[0].startswith("spatialfed ingest: warning: lon/lat spans UTM zones ")
    assert warnings[0].endswith("split the study area or give --target-crs"), warnings[0]
    assert "UserWarning" not in captured.err and "warnings.warn" not in captured.err


def test_python_ingest_warning_names_the_parameter(tmp_path):
    with pytest.warns(UserWarning, match=r"more than 2% distortion.*give target_crs=$") as record:
        info, _ = ingest_frame(_continent(), tmp_path / "s.zarr", x="lon", y="lat", value="z", crs="EPSG:4326",
                               n_workers=3)
    assert not any("--" in str(w.message) for w in record)
    assert info.crs.startswith("PROJCRS")  # the store keeps the full definition; only the display is short
