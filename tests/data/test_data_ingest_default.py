"""ingest's default partition is `area` (issue 14): compact regions, one per site; `random` stays available."""

from pathlib import Path

import numpy as np
import pytest

from spatialfed.cli import main
from spatialfed.data.ingest import ingest
from spatialfed.data.store import load_worker, open_store

MEUSE = Path(__file__).resolve().parents[2] / "data" / "meuse" / "meuse.csv"


def _bbox_area(path, j):
    locs = load_worker(path, j)[0]
    return float(np.prod(np.ptp(locs, axis=0)))


def test_cli_ingest_defaults_to_area_partitions(tmp_path):
    out = tmp_path / "m.zarr"
    assert main(["ingest", str(MEUSE), str(out), "--x", "x", "--y", "y", "--value", "zinc",
                 "--crs", "EPSG:28992"]) == 0
    info = open_store(out)
    assert info.partition == "area" and info.n_workers == 4
    # compact blocks: each site's bounding box covers well under the whole region (random sites span all of it)
    whole = float(np.prod(np.ptp(np.vstack([load_worker(out, j)[0] for j in range(4)]), axis=0)))
    assert max(_bbox_area(out, j) for j in range(4)) < 0.6 * whole


@pytest.mark.parametrize("scheme", ["random", "area"])
def test_library_ingest_default_is_area_and_random_stays_available(tmp_path, scheme):
    default, _ = ingest(MEUSE, tmp_path / "d.zarr", x="x", y="y", value="zinc", crs="EPSG:28992")
    chosen, _ = ingest(MEUSE, tmp_path / "c.zarr", x="x", y="y", value="zinc", crs="EPSG:28992", partition=scheme)
    assert default.partition == "area" and chosen.partition == scheme
    same = all(np.array_equal(load_worker(default.path, j)[0], load_worker(chosen.path, j)[0]) for j in range(4))
    assert same == (scheme == "area")
