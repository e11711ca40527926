"""Monitoring a fit: a live Bokeh page on 127.0.0.1 while it runs, and the same plots as a standalone HTML report.

The plots: δ, σ² and β over time (one point per theta aggregation), the log-likelihood over time where the trace
has it, and every quantity's arrival at the server — per worker and sub-step, and with its staleness τ = t − t_j
(Eq. 18). One `build_layout` draws both the live page and the report, so they always show the same thing.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from spatialfed.atomic import write_text

TRACE_FIELDS = ("time_s", "iter", "delta", "sigma2", "beta", "loglik")
ARRIVAL_FIELDS = ("time_s", "worker", "step", "iter", "staleness", "color")
STEP_COLORS = {"moments": "#7f7f7f", "variogram": "#bcbd22", "mu_sigma": "#1f77b4", "gamma": "#2ca02c",
               "theta": "#d62728", "value": "#9467bd"}


def _empty(fields) -> dict:
    return {name: [] for name in fields}


def trace_columns(rows) -> dict:
    """Columns for the parameter plots from server trace rows (theta aggregations and the initial state)."""
    cols = _empty(TRACE_FIELDS)
    for row in rows:
        if row.get("step") not in ("init", "theta", "final"):
            continue
        for name in TRACE_FIELDS:
            cols[name].append(row.get(name, float("nan")) if row.get(name) is not None else float("nan"))
    return cols


def build_layout(trace: ColumnDataSource, arrivals: ColumnDataSource, n_workers: int):
    """The monitoring plots, drawn from two sources: parameters/log-likelihood and arrivals."""
    from bokeh.layouts import column, gridplot  # Bokeh (about 1 s to import) only when a page is drawn
    from bokeh.models import HoverTool
    from bokeh.plotting import figure

    tools = "pan,wheel_zoom,box_zoom,reset,save"
    params = []
    for name, label in (("delta", "δ (noise precision)"), ("sigma2", "σ² (field variance)"), ("beta", "β (length scale)")):
        p = figure(title=label, x_axis_label="time (s)", y_axis_type="log", height=240, width=275, tools=tools)
        p.line("time_s", name, source=trace, line_width=2)
        p.scatter("time_s", name, source=trace, size=5)
        p.add_tools(HoverTool(tooltips=[("iteration", "@iter"), (name, f"@{name}{{0.0000}}"), ("time", "@time_s{0.00} s")]))
        params.append(p)
    ll = figure(title="log-likelihood ℓ_LR", x_axis_label="time (s)", height=240, width=275, tools=tools)
    ll.line("time_s", "loglik", source=trace, line_width=2, color="#9467bd")
    ll.scatter("time_s", "loglik", source=trace, size=5, color="#9467bd")
    arr = figure(title="arrivals at the server (colour: sub-step)", x_axis_label="time (s)", y_axis_label="worker",
                 height=260, width=500, tools=tools, y_range=(-0.5, n_workers - 0.5))
    arr.scatter("time_s", "worker", source=arrivals, color="color", size=6, alpha=0.8, legend_field="step")
    arr.legend.location = "top_left"
    arr.legend.label_text_font_size = "8pt"
    stale = figure(title="staleness τ = t − t_j of each arrival", x_axis_label="time (s)", y_axis_label="τ",
                   height=260, width=500, tools=tools)
    stale.scatter("time_s", "staleness", source=arrivals, color="color", size=6, alpha=0.8)
    for p in (arr, stale):
        p.add_tools(HoverTool(tooltips=[("worker", "@worker"), ("step", "@step"), ("iteration", "@iter"),
                                        ("staleness", "@staleness")]))
    return column(gridplot([params + [ll]], toolbar_location="right"), gridplot([[arr, stale]], toolbar_location="right"))


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
        if live:
            self._start_live(port)

    # --- runtime hooks ------------------------------------------------------------------------------
    def on_result(self, j: int, p, q) -> None:
        """A quantity from worker j for task p reached the client (p None: the partition-load summary)."""
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
        new = server.trace[len(self.trace_rows):]
        self.trace_rows.extend(dict(row) for row in new)

    # --- outputs ------------------------------------------------------------------------------------
    def sources(self) -> tuple[ColumnDataSource, ColumnDataSource]:
        """Fresh data sources holding everything collected so far."""
        from bokeh.models import ColumnDataSource

        arrivals = _empty(ARRIVAL_FIELDS)
        for row in self.arrivals:
            for name in ARRIVAL_FIELDS:
                arrivals[name].append(row[name])
        return ColumnDataSource(trace_columns(self.trace_rows)), ColumnDataSource(arrivals)

    def write_report(self, path, title: str = "spatialfed fit report", result=None, preset: str | None = None) -> Path:
        """Standalone HTML (BokehJS inlined: opens offline), written atomically: a written summary (data, settings,
        estimates with units, convergence, time per site — ``outputs.report``) above the monitoring plots.

        result: the fit's ``FitResult`` (``FederatedGP.result_``); without it the summary has what the monitor saw
        (sites, the last trace row's estimates, iterations, time per site). preset: the asynchronous preset's name.
        """
        from spatialfed.outputs.report import report_page, summary_facts, summary_html, trace_facts

        facts = (summary_facts(result, self.arrivals, preset) if result is not None
                 else trace_facts(self.trace_rows, self.arrivals, self.n_workers))
        page = report_page(title, summary_html(facts), build_layout(*self.sources(), self.n_workers))
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
        trace, arrivals = self.sources()
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

        doc.title = "spatialfed: live fit"
        doc.add_root(build_layout(trace, arrivals, self.n_workers))
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

