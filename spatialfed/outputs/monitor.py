"""Monitoring a fit: a live Bokeh page on 127.0.0.1 while it runs, and the same plots as a standalone HTML report.

The plots: δ, σ² and β and the log-likelihood (where the trace has it) at every iteration — one point per
aggregation of the server's estimate (a statistics round of the default preset, a theta aggregation of the block
scheme, an FGPR round), against time and, on a second tab, against the round trips; every quantity's arrival at the
server, per worker and sub-step, and its staleness τ = t − t_j (Eq. 18); and the sites' pooled empirical
semivariogram against the fitted one (`outputs.fit_variogram`). One `build_layout` draws both the live page and the
report, so they always show the same thing.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from spatialfed.atomic import write_text
from spatialfed.outputs.fit_variogram import PooledVariogram, model_curve

TRACE_FIELDS = ("time_s", "iter", "round", "delta", "sigma2", "beta", "loglik")
#: (line, marker) colours of the estimates' panels: the markers' own colour lets a picture count the points drawn
PARAM_COLORS, LOGLIK_COLORS = ("#1f77b4", "#0b3c8c"), ("#9467bd", "#5a2d91")
#: trace rows that carry a new estimate: the start, every aggregation (stats, theta, FGPR rounds) and the end
ESTIMATE_STEPS = ("init", "stats", "theta", "fgpr", "final")
ARRIVAL_FIELDS = ("time_s", "worker", "step", "iter", "staleness", "color")
STEP_COLORS = {"moments": "#7f7f7f", "variogram": "#bcbd22", "mu_sigma": "#1f77b4", "gamma": "#2ca02c",
               "theta": "#d62728", "value": "#9467bd"}


def _empty(fields) -> dict:
    return {name: [] for name in fields}


def estimate_rows(rows) -> list[dict]:
    """The trace rows that carry an estimate (ESTIMATE_STEPS), in order."""
    return [row for row in rows if row.get("step") in ESTIMATE_STEPS]


def trace_columns(rows) -> dict:
    """Columns for the parameter plots from server trace rows: every estimate, "round" its number of round trips
    (0 the start; the final row repeats the last)."""
    cols = _empty(TRACE_FIELDS)
    for i, row in enumerate(estimate_rows(rows)):
        row = {**row, "round": i - (row.get("step") == "final")}
        for name in TRACE_FIELDS:
            cols[name].append(row.get(name, float("nan")) if row.get(name) is not None else float("nan"))
    return cols


def _estimate_panels(trace, x: str, x_label: str, tools: str) -> list:
    """δ, σ², β (log scale) and ℓ against `x` ("time_s" or "round"), a point per estimate joined by lines."""
    from bokeh.models import HoverTool
    from bokeh.plotting import figure

    panels = []
    for name, label, (line, marker) in (("delta", "δ (noise precision)", PARAM_COLORS),
                                        ("sigma2", "σ² (field variance)", PARAM_COLORS),
                                        ("beta", "β (length scale)", PARAM_COLORS),
                                        ("loglik", "log-likelihood ℓ_LR", LOGLIK_COLORS)):
        p = figure(title=label, x_axis_label=x_label, y_axis_type="linear" if name == "loglik" else "log",
                   height=240, width=275, tools=tools)
        p.line(x, name, source=trace, line_width=2, color=line)
        p.scatter(x, name, source=trace, size=7, color=marker)
        p.add_tools(HoverTool(tooltips=[("iteration", "@iter"), ("round trips", "@round"), (name, f"@{name}{{0.0000}}"),
                                        ("time", "@time_s{0.00} s")]))
        panels.append(p)
    return panels


def build_layout(trace: ColumnDataSource, arrivals: ColumnDataSource, n_workers: int, variogram=None):
    """The monitoring plots, drawn from the sources of `FitMonitor.sources`: the estimates (tabs: against time and
    against round trips), arrivals and, when `variogram` = (bins, start curve, current curve) is given, the
    semivariogram panel."""
    from bokeh.layouts import column, gridplot, row  # Bokeh (about 1 s to import) only when a page is drawn
    from bokeh.models import HoverTool, TabPanel, Tabs
    from bokeh.plotting import figure

    tools = "pan,wheel_zoom,box_zoom,reset,save"
    tabs = Tabs(tabs=[TabPanel(child=gridplot([_estimate_panels(trace, x, label, tools)], toolbar_location="right"),
                               title=title)
                      for x, label, title in (("time_s", "time (s)", "against time"),
                                              ("round", "round trips", "against round trips"))])
    arr = figure(title="arrivals at the server (colour: sub-step)", x_axis_label="time (s)", y_axis_label="worker",
                 height=260, width=420, tools=tools, y_range=(-0.5, n_workers - 0.5))
    arr.scatter("time_s", "worker", source=arrivals, color="color", size=6, alpha=0.8, legend_field="step")
    arr.legend.location = "top_left"
    arr.legend.label_text_font_size = "8pt"
    stale = figure(title="staleness τ = t − t_j of each arrival", x_axis_label="time (s)", y_axis_label="τ",
                   height=260, width=420, tools=tools)
    stale.scatter("time_s", "staleness", source=arrivals, color="color", size=6, alpha=0.8)
    for p in (arr, stale):
        p.add_tools(HoverTool(tooltips=[("worker", "@worker"), ("step", "@step"), ("iteration", "@iter"),
                                        ("staleness", "@staleness")]))
    bottom = [arr, stale] + ([] if variogram is None else [_variogram_panel(*variogram, tools)])
    return column(tabs, row(*bottom))


def _variogram_panel(bins, start, current, tools: str):
    """The pooled empirical semivariogram (points; hover: the pairs of each bin) and the model's at the start
    (dashed) and now (solid)."""
    from bokeh.models import HoverTool
    from bokeh.plotting import figure

    p = figure(title="semivariogram: sites' bins, model", x_axis_label="lag (map units)",
               y_axis_label="γ(h)", height=260, width=340, tools=tools)
    dots = p.scatter("lag", "gamma", source=bins, size=6, color="#ff7f0e", legend_label="sites' bins")
    p.line("lag", "gamma", source=start, line_dash="dashed", color="#7f7f7f", line_width=1.5, legend_label="start")
    p.line("lag", "gamma", source=current, color="#2ca02c", line_width=2, legend_label="fitted")
    p.add_tools(HoverTool(renderers=[dots], tooltips=[("lag", "@lag{0.000}"), ("γ̂", "@gamma{0.0000}"),
                                                      ("pairs", "@pairs")]))
    p.legend.location = "top_left"
    p.legend.label_text_font_size = "8pt"
    return p


class FitMonitor:
    """Collects the trace and per-worker arrivals of a running fit; optionally serves them live on 127.0.0.1.

    Pass `on_result` and `on_event` to the runtime (they are the hooks of `run_dask`); call `write_report` at the
    end and `close` to stop the live page.
    """

    def __init__(self, n_workers: int, *, live: bool = False, port: int | None = None):
        self.n_workers = int(n_workers)
        self.trace_rows: list[dict] = []
        self.arrivals: list[dict] = []
        self._server = None
        self._thread = None
        self._server_t = 0
        self._pending: list[dict] = []
        self.variogram = PooledVariogram()   # the sites' binned semivariances of the start
        self.nu: float | None = None          # the fit's Matérn ν (from the server), for the model's curve
        if live:
            self._start_live(port)

    # --- runtime hooks ------------------------------------------------------------------------------
    def on_result(self, j: int, p, q) -> None:
        """A quantity from worker j for task p reached the client (p None: the partition-load summary)."""
        xi = getattr(q, "xi", None)
        if p is not None and p.step == "variogram" and isinstance(xi, dict) and "secagg" not in xi:
            self.variogram.add(p.extra["edges"], xi)  # masked answers: the decoded sum arrives in on_event
        if p is not None:
            self._pending.append({"worker": int(j), "step": p.step, "iter": int(p.t),
                                  "staleness": max(self._server_t - int(p.t), 0),
                                  "color": STEP_COLORS.get(p.step, "#17becf")})

    def on_event(self, server, now: float) -> None:
        """The server processed a quantity at `now` (the fit's clock): record arrivals, new trace rows, t."""
        for row in self._pending:
            row["time_s"] = float(now)
        self.arrivals.extend(self._pending)
        self._pending = []
        self._server_t = int(server.t)
        pooled = getattr(server, "pooled_variogram", None)  # secure aggregation: only the sum was decoded
        if pooled is not None and self.variogram.edges is None:
            self.variogram.add(*pooled)
        self.nu = getattr(getattr(server, "kernel", None), "nu", self.nu)
        new = server.trace[len(self.trace_rows):]
        self.trace_rows.extend(dict(row) for row in new)

    # --- outputs ------------------------------------------------------------------------------------
    def sources(self) -> tuple:
        """Fresh data sources holding everything collected so far: trace, arrivals and the variogram's three
        (`build_layout`'s arguments)."""
        from bokeh.models import ColumnDataSource

        arrivals = _empty(ARRIVAL_FIELDS)
        for row in self.arrivals:
            for name in ARRIVAL_FIELDS:
                arrivals[name].append(row[name])
        variogram = tuple(ColumnDataSource(data) for data in self.variogram_data())
        return ColumnDataSource(trace_columns(self.trace_rows)), ColumnDataSource(arrivals), variogram

    def variogram_data(self) -> tuple[dict, dict, dict]:
        """(the sites' pooled bins, the model's semivariogram at the start, at the current estimate)."""
        bins, rows = self.variogram.points(), estimate_rows(self.trace_rows)
        edges = self.variogram.edges
        max_lag = float(edges[-1]) if edges is not None else max(bins["lag"], default=None)
        return (bins, model_curve(rows[0] if rows else None, self.nu, max_lag),
                model_curve(rows[-1] if rows else None, self.nu, max_lag))

    def write_report(self, path, title: str = "spatialfed fit report", result=None, preset: str | None = None) -> Path:
        """Standalone HTML (BokehJS inlined: opens offline), written atomically: a written summary (data, settings,
        estimates with units, convergence, time per site — ``outputs.report``) above the monitoring plots.

        result: the fit's ``FitResult`` (``FederatedGP.result_``); without it the summary has what the monitor saw
        (sites, the last trace row's estimates, iterations, time per site). preset: the asynchronous preset's name.
        """
        from spatialfed.outputs.report import report_page, summary_facts, summary_html, trace_facts

        facts = (summary_facts(result, self.arrivals, preset) if result is not None
                 else trace_facts(self.trace_rows, self.arrivals, self.n_workers))
        trace, arrivals, variogram = self.sources()
        page = report_page(title, summary_html(facts), build_layout(trace, arrivals, self.n_workers, variogram))
        return write_text(path, page)

    @property
    def url(self) -> str | None:
        """Address of the live page, or None when not serving."""
        return None if self._server is None else f"http://127.0.0.1:{self._port}/"

    def _start_live(self, port: int | None) -> None:
        """Serve the live page from a Bokeh server on its own IO loop in a daemon thread, bound to 127.0.0.1."""
        from bokeh.application import Application
        from bokeh.application.handlers.function import FunctionHandler
        from bokeh.server.server import Server
        from tornado.ioloop import IOLoop

        self._port = port or _free_port()
        ready = threading.Event()

        def serve():
            import asyncio

            asyncio.set_event_loop(asyncio.new_event_loop())
            loop = IOLoop.current()
            self._server = Server({"/": Application(FunctionHandler(self._make_document))}, io_loop=loop,
                                  address="127.0.0.1", port=self._port,
                                  allow_websocket_origin=[f"127.0.0.1:{self._port}", f"localhost:{self._port}"])
            self._server.start()
            self._loop = loop
            ready.set()
            loop.start()

        self._thread = threading.Thread(target=serve, name="spatialfed-monitor", daemon=True)
        self._thread.start()
        ready.wait(10)

    def _make_document(self, doc) -> None:
        """One browser session: plots fed by a 500 ms periodic callback streaming the new rows."""
        trace, arrivals, variogram = self.sources()
        seen = {"trace": len(trace.data["time_s"]), "arrivals": len(arrivals.data["time_s"])}

        def update():
            new_trace = trace_columns(self.trace_rows)
            k = seen["trace"]
            if len(new_trace["time_s"]) > k:
                trace.stream({name: values[k:] for name, values in new_trace.items()})
                seen["trace"] = len(new_trace["time_s"])
            rows = self.arrivals[seen["arrivals"]:]
            if rows:
                arrivals.stream({name: [row[name] for row in rows] for name in ARRIVAL_FIELDS})
                seen["arrivals"] += len(rows)
            for source, data in zip(variogram, self.variogram_data()):
                if data != source.data:
                    source.data = data

        doc.title = "spatialfed: live fit"
        doc.add_root(build_layout(trace, arrivals, self.n_workers, variogram))
        doc.add_periodic_callback(update, 500)

    def close(self) -> None:
        """Stop the live page (if any)."""
        if self._server is not None:
            loop, server = self._loop, self._server
            loop.add_callback(server.stop)
            loop.add_callback(loop.stop)
            self._thread.join(timeout=5)
            self._server = None


def _free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

