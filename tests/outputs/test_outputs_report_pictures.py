"""Pictures of report.html and of the live page, rendered by headless Chromium: every iteration of a fit with the
default preset is drawn (a point per round trip in each estimate's panel), and the semivariogram panel shows the
sites' bins and the fitted model."""

import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import ndimage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from browser import CHROMIUM, screenshot  # noqa: E402

from spatialfed.api import FederatedGP  # noqa: E402
from spatialfed.data import datasets  # noqa: E402
from spatialfed.outputs import monitor as M  # noqa: E402

BROWSER_REQUIRED = os.environ.get("SPATIALFED_REQUIRE_BROWSER") == "1"
needs_browser = pytest.mark.skipif(CHROMIUM is None and not BROWSER_REQUIRED,
                                   reason="Debian's chromium is not installed")
#: click the "against round trips" tab (BokehJS draws its widgets inside shadow roots)
ROUND_TRIPS_TAB = """(() => {
  const find = (root) => {
    for (const el of root.querySelectorAll('*')) {
      if (el.classList && el.classList.contains('bk-tab') && el.textContent.includes('round trips')) return el;
      if (el.shadowRoot) { const f = find(el.shadowRoot); if (f) return f; }
    }
    return null;
  };
  const tab = find(document);
  if (tab) tab.click();
  return !!tab;
})()"""


def blobs(png, rgb, tol=10) -> int:
    """Connected regions of the colour `rgb` in a screenshot (the markers drawn in it)."""
    import matplotlib.image as mpimg

    img = (mpimg.imread(png)[..., :3] * 255).astype(int)
    mask = np.all(np.abs(img - np.array(rgb)) <= tol, axis=-1)
    return int(ndimage.label(mask)[1])


def hex_rgb(color: str) -> tuple:
    return tuple(int(color[i:i + 2], 16) for i in (1, 3, 5))


@pytest.fixture(scope="module")
def default_fit(tmp_path_factory):
    d = tmp_path_factory.mktemp("pictures")
    frame = pd.read_csv(datasets.data_file("meuse", "meuse.csv"))[["x", "y", "zinc"]]
    gp = FederatedGP(knots=30, cluster="simulated", progress=False, crs="EPSG:28992", transform="log")
    gp.fit(frame, "zinc")   # the default preset (stats), asynchronous
    gp.save(d / "fit")
    return gp, d


def expected_points(rows) -> tuple[int, int]:
    """(estimates, those with a log-likelihood) of trace.csv's rows at distinct round trips: every row but the final
    one, which repeats the last estimate."""
    assert rows[-1]["step"] == "final"
    drawn = rows[:-1]
    return len(drawn), sum(row.get("loglik") is not None for row in drawn)


def test_every_iteration_of_the_default_preset_is_an_estimate_point(default_fit):
    gp, _ = default_fit
    cols = M.trace_columns(gp.trace_)
    assert len(cols["delta"]) == len(gp.trace_) >= 5  # every row of trace.csv, not just the start and the end
    assert cols["round"][:3] == [0, 1, 2] and cols["round"][-1] == cols["round"][-2]
    assert np.isfinite(cols["loglik"][1:]).all()


@needs_browser
@pytest.mark.parametrize("which", ["report", "live"])
def test_pictures_show_a_point_per_round_trip_and_the_variogram(default_fit, tmp_path, which):
    assert CHROMIUM is not None, "chromium is required (SPATIALFED_REQUIRE_BROWSER=1) but not installed"
    gp, d = default_fit
    live = None
    if which == "live":   # the live page of the same fit, drawn from the monitor's rows
        live = M.FitMonitor(gp.n_workers_, live=True)
        live.trace_rows, live.variogram, live.nu = gp.monitor_.trace_rows, gp.monitor_.variogram, gp.nu
    try:
        url = (d / "fit" / "report.html").resolve().as_uri() if live is None else live.url
        n_points, n_ll = expected_points(gp.trace_)
        for settle_s in (5.0, 15.0):   # a loaded machine connects the live page's websocket late
            png = screenshot(url, tmp_path / f"{which}.png", tmp_path / "profile", settle_s=settle_s,
                             size=(1300, 1100), before=ROUND_TRIPS_TAB)
            if blobs(png, hex_rgb(M.PARAM_COLORS[1])) >= 3 * n_points:
                break
    finally:
        if live is not None:
            live.close()
    assert blobs(png, hex_rgb(M.PARAM_COLORS[1])) == 3 * n_points   # δ, σ², β: one marker per round trip
    assert blobs(png, hex_rgb(M.LOGLIK_COLORS[1])) == n_ll          # ℓ at every round trip that has it
    assert blobs(png, (255, 127, 14), tol=6) >= len(gp.monitor_.variogram.points()["lag"]) - 2  # the bins
    assert blobs(png, (44, 160, 44), tol=6) >= 1                    # the fitted semivariogram's line


def test_the_report_of_an_in_memory_fit_names_its_saved_copy_not_the_temporary_store(default_fit):
    gp, d = default_fit
    html = (d / "fit" / "report.html").read_text()
    temporary = str(gp.store_)
    assert temporary not in html   # gone with the estimator: the report names what stays
    assert "in-memory data (a DataFrame or arrays), saved as data.zarr beside this report" in html
