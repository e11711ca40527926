"""Monitoring: the trace and arrivals of a real (in-process) fit, the HTML report and the live page in Chromium."""

import os
import urllib.request

import numpy as np
import pytest

from browser import CHROMIUM, screenshot
from conftest import grid_knots, simulate_parts
from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.protocol import evaluate
from spatialfed.algorithm.server import FederatedServer
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.outputs.monitor import FitMonitor

BROWSER_REQUIRED = os.environ.get("SPATIALFED_REQUIRE_BROWSER") == "1"


def drive(monitor: FitMonitor):
    """Run a small asynchronous fit in this process, feeding the monitor's hooks as a runtime does."""
    parts = simulate_parts(J=3, n=40, nu=0.5, seed=3)
    knots, kernel = grid_knots(3), Matern(0.5)
    models = [LocalModel(*p, knots, kernel, "full") for p in parts]
    server = FederatedServer(3, knots, kernel, FitConfig(mode="async", agg_threshold=2, max_iter=6))
    pending = []
    while not server.done:
        pending += server.dispatch()
        j, p = pending.pop(0)
        q = evaluate(models[j], p, j)
        monitor.on_result(j, p, q)
        server.receive(q, now=len(monitor.arrivals) * 0.01)
        monitor.on_event(server, len(monitor.arrivals) * 0.01)
    return server


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    monitor = FitMonitor(3, live=True)
    server = drive(monitor)
    report = monitor.write_report(tmp_path_factory.mktemp("report") / "report.html")
    yield monitor, server, report
    monitor.close()


def test_monitor_collects_trace_and_arrivals(monitored):
    monitor, server, _ = monitored
    assert len(monitor.trace_rows) == len(server.trace) > 0
    assert {a["worker"] for a in monitor.arrivals} == {0, 1, 2}
    assert {"mu_sigma", "gamma", "theta"} <= {a["step"] for a in monitor.arrivals}
    assert all(a["staleness"] >= 0 for a in monitor.arrivals)
    assert max(a["staleness"] for a in monitor.arrivals) > 0  # Agg_threshold 2 < J: something was stale


def test_report_is_standalone_html(monitored):
    _, _, report = monitored
    html = report.read_text()
    assert "cdn.bokeh.org" not in html  # BokehJS inlined: opens offline
    for title in ("noise precision", "field variance", "length scale", "arrivals at the server", "staleness"):
        assert title in html


def test_live_page_is_served_on_loopback(monitored):
    monitor, _, _ = monitored
    assert monitor.url.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(monitor.url, timeout=10) as response:
        assert response.status == 200
        assert "bokeh" in response.read().decode().lower()


def plot_pixels(png) -> int:
    """Pixels of the parameter-line blue (#1f77b4) and the theta-arrival red (#d62728) in a screenshot."""
    import matplotlib.image as mpimg

    img = (mpimg.imread(png)[..., :3] * 255).astype(int)
    count = 0
    for rgb in ((31, 119, 180), (214, 39, 40)):
        count += int(np.sum(np.all(np.abs(img - np.array(rgb)) < 12, axis=-1)))
    return count


@pytest.mark.skipif(CHROMIUM is None and not BROWSER_REQUIRED, reason="Debian's chromium is not installed")
@pytest.mark.parametrize("which", ["report", "live"])
def test_plots_render_in_headless_chromium(monitored, tmp_path, which):
    assert CHROMIUM is not None, "chromium is required (SPATIALFED_REQUIRE_BROWSER=1) but not installed"
    monitor, _, report = monitored
    url = report.resolve().as_uri() if which == "report" else monitor.url
    png = screenshot(url, tmp_path / f"{which}.png", tmp_path / "profile")
    assert plot_pixels(png) > 200, f"no plotted lines or points visible in the {which} screenshot"


def test_fit_writes_report_and_serves_live_page(tmp_path):
    """FederatedGP(live=True) serves the page during a Dask fit; save() writes report.html beside fit.json."""
    from spatialfed.api import FederatedGP
    from spatialfed.data.simulate import simulate_store

    store = tmp_path / "s.zarr"
    simulate_store(store, 2, 60, nu=0.5, beta=0.1, test_size=0, seed=4)
    gp = FederatedGP(mode="sync", knots=9, max_iter=3, live=True, progress=False, n_dask_workers=2).fit(store)
    assert gp.monitor_.trace_rows and {a["worker"] for a in gp.monitor_.arrivals} == {0, 1}
    out = gp.save(tmp_path / "fit")
    assert (out / "report.html").exists() and (out / "fit.json").exists()
