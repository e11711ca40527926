"""Monitoring: the trace and arrivals of a real (in-process) fit, the HTML report and the live page in Chromium."""

import asyncio
import json
import os
import subprocess
import time
import urllib.request

import numpy as np
import pytest

from browser import CHROMIUM, FLAGS, devtools_caller, screenshot
from conftest import grid_knots, simulate_parts
from spatialfed import Cluster
from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.protocol import evaluate
from spatialfed.algorithm.server import FederatedServer
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.data.store import write_store
from spatialfed.outputs.monitor import FitMonitor
from spatialfed.outputs.report import site_times, summary_facts
from spatialfed.outputs.results import FitResult

BROWSER_REQUIRED = os.environ.get("SPATIALFED_REQUIRE_BROWSER") == "1"


def drive(monitor: FitMonitor):
    """Run a small asynchronous fit in this process, feeding the monitor's hooks as a runtime does."""
    parts = simulate_parts(J=3, n=40, nu=0.5, seed=3)
    knots, kernel = grid_knots(3), Matern(0.5)
    models = [LocalModel(*p, knots, kernel, "full") for p in parts]
    server = FederatedServer(3, knots, kernel, FitConfig.of(mode="async", agg_threshold=2, max_iter=6))
    pending = []
    while not server.done:
        pending += server.dispatch()
        j, p = pending.pop(0)
        q = evaluate(models[j], p, j)
        monitor.on_result(j, p, q)
        server.receive(q, now=len(monitor.arrivals) * 0.01)
        monitor.on_event(server, len(monitor.arrivals) * 0.01)
    return server


def fit_result(server, store) -> FitResult:
    """The FitResult of an in-process fit, as FederatedGP.result_ builds it."""
    phi = server.params
    return FitResult(method="lowrank", mode="async", residual="full", nu=0.5, n_workers=3, n_obs=server.n_obs,
                     params={"gamma": np.asarray(phi.gamma), "delta": phi.delta, "sigma2": phi.sigma2,
                             "beta": phi.beta},
                     loglik=server.loglik, knots=grid_knots(3), iterations=server.iterations,
                     wall_time_s=12.5, converged=server.converged, trace=server.trace,
                     extra={"store": str(store), "covariate_names": ["intercept", "elevation"],
                            "stop_reason": server.stop_reason, "runtime": "simulated"})


@pytest.fixture(scope="module")
def monitored(tmp_path_factory):
    monitor = FitMonitor(3, live=True)
    server = drive(monitor)
    tmp = tmp_path_factory.mktemp("report")
    store = tmp / "s.zarr"
    write_store(store, simulate_parts(J=3, n=40, nu=0.5, seed=3), partition="area", crs="EPSG:28992",
                covariate_names=["intercept", "elevation"])
    report = monitor.write_report(tmp / "report.html", result=fit_result(server, store), preset="tuned")
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
    for settle_s in (4.0, 12.0, 30.0):   # a loaded machine connects the live page's websocket late
        png = screenshot(url, tmp_path / f"{which}.png", tmp_path / "profile", settle_s=settle_s)
        if plot_pixels(png) > 200:
            break
    assert plot_pixels(png) > 200, f"no plotted lines or points visible in the {which} screenshot"


def test_fit_writes_report_and_serves_live_page(tmp_path):
    """FederatedGP(progress="live") serves the page during a Dask fit; save() writes report.html beside fit.json."""
    from spatialfed.api import FederatedGP
    from spatialfed.data.simulate import simulate_store

    store = tmp_path / "s.zarr"
    simulate_store(store, 2, 60, nu=0.5, beta=0.1, test_size=0, seed=4)
    gp = FederatedGP(mode="sync", knots=9, max_iter=3, progress="live", cluster=Cluster(n_workers=2)).fit(store)
    assert gp.monitor_.trace_rows and {a["worker"] for a in gp.monitor_.arrivals} == {0, 1}
    out = gp.save(tmp_path / "fit")
    assert (out / "report.html").exists() and (out / "fit.json").exists()


# --- the written summary at the top of report.html ----------------------------------------------------------------
def summary_text(html: str) -> str:
    """The summary section's text, tags removed."""
    import re

    section = html[html.index('<section id="summary"'):html.index("</section>")]
    return re.sub(r"<[^>]+>", " ", section)


def test_report_opens_with_a_written_summary(monitored):
    _, server, report = monitored
    html = report.read_text()
    assert html.index('id="summary"') < html.index('id="plots"')   # the words come before the plots
    text = summary_text(html)
    phi = server.params
    for fact in ("J = 3 sites", "N = 120 observations", "CRS EPSG:28992", "mode async", "preset tuned",
                 "residual full", "m = 9 knots", "ν = 0.5", "intercept", "elevation",
                 f"nugget variance 1/δ = {1 / phi.delta:.4g}", f"partial sill σ² = {phi.sigma2:.4g}",
                 f"range β = {phi.beta:.4g} m", f"after {server.iterations} iterations",
                 f"{server.loglik:.8g}", "wall time 12.50 s"):
        assert fact in text, f"{fact!r} missing from the summary: {text}"
    assert ("converged" in text) and (server.converged or f"stopped: {server.stop_reason}" in text)
    # practical range for ν = 0.5: exp(−h/β) = 0.05 at h = β ln 20 (SPEC §1)
    assert f"= {phi.beta * np.log(20.0):.4g} m" in text
    assert "tasks answered" in text and "s per task" in text


def test_summary_facts_follow_the_maths(monitored):
    monitor, server, _ = monitored
    facts = summary_facts(fit_result(server, "/no/such/store.zarr"), monitor.arrivals, "tuned")
    assert facts["crs"] is None and facts["store"] == "/no/such/store.zarr"   # a moved store: the report says less
    assert facts["nugget"] == pytest.approx(1 / server.params.delta, rel=1e-12)
    assert facts["practical_range"] == pytest.approx(server.params.beta * np.log(20.0), rel=1e-9)
    assert sum(r["tasks"] for r in facts["sites"]) == len(monitor.arrivals)


def test_site_times_count_tasks_and_mean_interval():
    arrivals = [{"worker": 0, "time_s": t} for t in (0.0, 1.0, 3.0)] + [{"worker": 2, "time_s": 5.0}]
    rows = site_times(arrivals, 3)
    assert [r["tasks"] for r in rows] == [3, 0, 1]
    assert rows[0]["s_per_task"] == pytest.approx(1.5) and rows[1]["s_per_task"] is None is rows[2]["s_per_task"]


def test_report_without_a_result_summarises_what_the_monitor_saw(monitored, tmp_path):
    monitor, server, _ = monitored
    text = summary_text(monitor.write_report(tmp_path / "r.html").read_text())
    assert "J = 3 sites" in text and f"nugget variance 1/δ = {1 / server.params.delta:.4g}" in text
    assert "convergence unknown" in text and "tasks answered" in text


async def _evaluate(ws_url: str, url: str, expression: str, settle_s: float):
    from tornado.websocket import websocket_connect

    conn = await websocket_connect(ws_url, max_message_size=64 * 2**20)
    call = devtools_caller(conn)

    await call("Emulation.setDeviceMetricsOverride", width=1100, height=900, deviceScaleFactor=1, mobile=False)
    await call("Page.enable")
    await call("Page.navigate", url=url)
    deadline = time.monotonic() + settle_s
    while True:   # until BokehJS has drawn (the value says "ready") or settle_s has passed
        await asyncio.sleep(0.5)
        value = (await call("Runtime.evaluate", expression=expression, returnByValue=True))["result"].get("value")
        if (value or {}).get("ready") or time.monotonic() > deadline:
            conn.close()
            return value


def evaluate_in_chromium(url: str, expression: str, profile, settle_s: float = 30.0):
    """Open url in headless Chromium, return the value of a JavaScript expression once its "ready" entry is true
    (BokehJS has drawn) or after settle_s seconds."""
    profile.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([CHROMIUM, *FLAGS, "--remote-debugging-port=0", f"--user-data-dir={profile}",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file, deadline = profile / "DevToolsActivePort", time.time() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.time() < deadline and proc.poll() is None, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            target = next(t for t in json.load(response) if t["type"] == "page")
        return asyncio.run(_evaluate(target["webSocketDebuggerUrl"], url, expression, settle_s))
    finally:
        proc.terminate()
        proc.wait(timeout=20)


LAYOUT_JS = """(() => {
  const s = document.getElementById('summary').getBoundingClientRect();
  const p = document.getElementById('plots').getBoundingClientRect();
  return {summary_top: s.top, summary_bottom: s.bottom, plots_top: p.top, plots_height: p.height,
          text: document.getElementById('summary').innerText, ready: p.height > 300};
})()"""


@pytest.mark.skipif(CHROMIUM is None and not BROWSER_REQUIRED, reason="Debian's chromium is not installed")
def test_summary_is_visible_above_the_plots_in_headless_chromium(monitored, tmp_path):
    assert CHROMIUM is not None, "chromium is required (SPATIALFED_REQUIRE_BROWSER=1) but not installed"
    _, server, report = monitored
    box = evaluate_in_chromium(report.resolve().as_uri(), LAYOUT_JS, tmp_path / "profile")
    assert 0 <= box["summary_top"] < box["summary_bottom"] <= box["plots_top"] < 900, box   # on the first screen
    assert box["plots_height"] > 300, "BokehJS drew no plots below the summary"
    for fact in ("Data", "Settings", "Estimates", "Convergence", "Time", "EPSG:28992", "practical range"):
        assert fact in box["text"], f"{fact!r} not visible in the rendered summary"
