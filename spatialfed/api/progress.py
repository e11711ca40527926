"""Progress of a fit on stderr: every phase named as it runs, the iterations with an ETA, and a closing summary.

Two displays, one content. In a terminal or a notebook the iterations drive a ``tqdm`` bar (``tqdm.auto``: a widget
in Jupyter when ipywidgets is installed) over ``max_iter`` with the current parameters and an ETA — an upper bound,
as the tolerance may stop the fit earlier — and under it a second bar names the phase running now, ticking every
second: "starting an embedded Dask LocalCluster", "loading the partitions of 100 sites", "initial values: moments",
"initial values: variogram", "iter 3: statistics" (with the sites that answered, 37/100, and tqdm's ETA from their
rate), "final pass". Elsewhere (logs, pipes) one plain line per iteration with its ETA and, from a heartbeat thread,
a status line — "initial values: variogram (40/100 sites answered, 11 s, eta ≈ 17s)" — for an initialisation phase
that has run 1 s (shorter ones stay silent) and for any phase whenever nothing was printed for `every_s` seconds
(10); its ETA comes from the sites' answers so far or, before the first, from the last phase of the same kind (the
previous round trip). Quiet (``progress=False``, ``--quiet``) prints nothing and starts no thread. On Dask the sites'
answers arrive one by one; in this process (the virtual clock) a pass computes every site before any answer arrives,
so its count jumps at the end while its clock ticks.

The phases come from the fit's own events: ``starting`` (before the runtime), ``started`` (the runtime is up: then
loading the partitions), ``result`` (every answer of a site, ``drive``'s on_result), ``event`` (the server moved
on: its phase, iteration and trace, ``drive``'s on_event). Code deeper in the API names a phase of the fit in
progress with the module function ``phase(label)`` (e.g. the default domain's bounding boxes, api/knots.py).
"""

from __future__ import annotations

import sys
import threading
import time
from contextvars import ContextVar

import numpy as np


def interactive(stream) -> bool:
    """Whether `stream` is shown live: a terminal, or a Jupyter kernel's output (its stderr is not a TTY)."""
    if bool(getattr(stream, "isatty", lambda: False)()):
        return True
    return "ipykernel" in sys.modules and stream in (sys.stderr, sys.stdout)


def eta(elapsed: float, done: int, total: int | None) -> str:
    """'eta ≤ 12s' from the mean wall time per iteration so far (an upper bound: the fit may converge earlier)."""
    if not total or done <= 0 or done >= total:
        return ""
    return f"eta ≤ {elapsed / done * (total - done):.0f}s"


#: what a site computes for each request step, as the phase names it
STEP_NAMES = {"moments": "moments", "variogram": "variogram", "mu_sigma": "μ, Σ", "gamma": "γ", "theta": "θ",
              "stats": "statistics", "pilot": "pilot statistics", "value": "final log-likelihood", "fgpr": "local updates"}
#: the Progress of the fit running in this thread (``phase`` reaches it)
_ACTIVE: ContextVar = ContextVar("spatialfed_progress", default=None)


def phase(label: str, total: int | None = None) -> None:
    """Name the phase the fit in progress (in this thread) is in; nothing outside a fit or when it is quiet."""
    current = _ACTIVE.get()
    if current is not None:
        current.phase(label, total, announce=True)


def slowdowns_text(s) -> str:
    """The slowdown factors on one short line: '1 (every site)' when equal, else the first and last few."""
    s = np.asarray(s, dtype=float)
    if s.size and np.all(s == s[0]):
        return f"{s[0]:g} (every site)"
    return np.array2string(s, precision=2, separator=",", threshold=12, edgeitems=3)


#: the trace rows shown as lines: the starting values, each iteration's step, and the final row
SHOWN_STEPS = ("init", "pilot", "theta", "fgpr", "stats", "final")
ITER_STEPS = ("theta", "fgpr", "stats")


def row_line(row: dict, last: int | None = None) -> str:
    """One trace row as a progress line: "init" (φ₀, before iteration 0), "iter t" (an iteration's step) or
    "final" (the estimate after `iter` iterations, numbered 0..iter−1; `last`, the last iteration printed, names the
    ones after it: a closing pass that asks every site again at the estimate, which prints no line of its own)."""
    if row["step"] in ("init", "pilot"):
        head = f"{row['step']:<8}"
    elif row["step"] == "final":
        n = int(row["iter"])
        closing = "" if last is None or last >= n - 1 else \
            f" (iter {last + 1}{'' if last + 1 == n - 1 else f'–{n - 1}'}: the closing pass at every site)"
        head = f"final after {n} iterations{closing}:"
    else:
        head = f"iter {row['iter']:>3}"
    return (f"{head}  t={row['time_s']:7.2f}s  δ={row['delta']:.4g}  σ²={row['sigma2']:.4g}  β={row['beta']:.4g}  "
            f"γ=[{', '.join(f'{g:.3g}' for g in row['gamma'])}]  max staleness {row['max_staleness']}"
            + (f"  loglik{'=' if row['step'] == 'final' else '≈'}{row['loglik']:.8g}"
               if row.get("loglik") is not None else ""))


class Progress:
    """The fit's progress on `stream` (module docstring): the phase running now and the iterations, as tqdm bars on a
    terminal or in a notebook, else as lines; nothing when not `enabled`. A context manager: leaving it closes the
    bars and stops the heartbeat thread (``finish``).

    `every_s`: in a log, the longest silence before a status line of the phase running (seconds)."""

    #: seconds between two looks of the heartbeat thread (a terminal's phase bar ticks at this rate)
    TICK_S = 0.5
    #: in a log, an announced phase that ran this long with nothing printed gets its status line
    ANNOUNCE_S = 1.0

    def __init__(self, enabled: bool, stream=None, every_s: float = 10.0):
        self.enabled = bool(enabled)
        self.stream = stream or sys.stderr
        self.every_s = float(every_s)
        self.seen = 0
        self.last_iter = None  # the last iteration printed
        self.tty = interactive(self.stream)
        self.bar = None  # the iterations (terminal, notebook)
        self.pbar = None  # the phase running now (terminal, notebook)
        self.total = None
        self.tic = time.perf_counter()
        self.lock = threading.RLock()
        self.server = None
        self.n_sites = None
        self.sampled = False  # a pass does not wait for every site (async, FGPR's sampled clients)
        self.open_count = False  # the phase running counts answers without a total
        self.label = None  # the phase running now
        self.kind = None  # what it is ("variogram", "round trip", ...): the ETA of the next one of its kind
        self.phase_total = None  # answers it waits for (None: not counted against a total)
        self.count = 0  # answers so far
        self.phase_tic = self.tic
        self.last_out = self.tic
        self.took: dict[str, float] = {}  # kind -> seconds the last phase of that kind took
        self.key = None  # (step, t) of the answers being counted
        self.state = None  # (phase, t, trace length) of the server at its last event
        self.announce = False
        self.loaded = 0
        self._beat_stop = None
        self._token = None

    # --- the phases ----------------------------------------------------------------------------------------
    def starting(self, what: str) -> None:
        """Announce the start (before the runtime: a cluster can take seconds to come up) and begin showing phases."""
        self.tic = time.perf_counter()
        self.line(f"spatialfed fit: starting {what} ...")
        if not self.enabled:
            return
        if self._token is None:
            self._token = _ACTIVE.set(self)
        if self._beat_stop is None:
            self._beat_stop = threading.Event()
            threading.Thread(target=self._beat, args=(self._beat_stop,), name="spatialfed-progress",
                             daemon=True).start()
        self.phase(f"starting {what.split(' (')[0]}")

    def phase(self, label: str, total: int | None = None, *, announce: bool = False, kind: str | None = None,
              counting: bool = False) -> None:
        """Begin the phase `label` (waiting for `total` answers when given; `counting`: answers counted without a
        total). In a log, an `announce`d phase gets its status line once it ran ANNOUNCE_S (short phases stay
        silent), any phase one after every_s seconds without a line."""
        if not self.enabled:
            return
        with self.lock:
            now = time.perf_counter()
            if self.label is not None and self.kind is not None:
                self.took[self.kind] = now - self.phase_tic
            self.label, self.kind, self.phase_total, self.count, self.key = label, kind or label, total, 0, None
            self.open_count, self.announce = bool(counting), bool(announce)
            self.phase_tic = now
            if self.tty:
                self._phase_bar()

    def _phase_bar(self) -> None:
        from tqdm.auto import tqdm

        if self.pbar is not None:
            self.pbar.close()
        if self.phase_total:
            fmt = "{desc}: {n_fmt}/{total_fmt} sites |{bar}| {elapsed}<{remaining}"
        elif self.open_count:
            fmt = "{desc}: {n_fmt} answers, {elapsed}"
        else:
            fmt = "{desc} … {elapsed}"
        self.pbar = tqdm(total=self.phase_total, desc=self.label, file=self.stream, leave=False, dynamic_ncols=True,
                         bar_format=fmt, unit="site")

    def status(self) -> str:
        """One line on the phase running: what, the answers so far, seconds in it, and an ETA when one is known."""
        elapsed = time.perf_counter() - self.phase_tic
        text = f"{self.label} ("
        if self.phase_total:
            text += f"{self.count}/{self.phase_total} sites answered, "
        elif self.open_count:
            text += f"{self.count} answers, "
        text += f"{elapsed:.0f} s"
        left = self.left(elapsed)
        return text + ("" if left is None else f", eta ≈ {left:.0f}s") + ")"

    def left(self, elapsed: float) -> float | None:
        """Seconds the phase still needs: from its answers' rate, or before the first answer from the last phase of
        its kind (None: unknown)."""
        if self.phase_total and self.count:
            return elapsed / self.count * max(self.phase_total - self.count, 0)
        before = self.took.get(self.kind)
        return None if before is None or self.open_count else max(before - elapsed, 0.0)

    def _beat(self, stop: threading.Event) -> None:
        """The heartbeat: a terminal's phase bar ticks every TICK_S; a log gets the status line of an announced phase
        after ANNOUNCE_S, and of any phase after every_s seconds of silence."""
        while not stop.wait(self.TICK_S):
            with self.lock:
                if self.label is None or stop.is_set():
                    continue
                if self.tty:
                    if self.pbar is not None:
                        self.pbar.refresh()
                    continue
                now = time.perf_counter()
                if (self.announce and self.last_out < self.phase_tic and now - self.phase_tic >= self.ANNOUNCE_S) \
                        or now - self.last_out >= self.every_s:
                    self.line(self.status())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finish()

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        with self.lock:
            if self.bar is not None or self.pbar is not None:
                from tqdm.auto import tqdm

                tqdm.write(text, file=self.stream)
            else:
                print(text, file=self.stream, flush=True)
            self.last_out = time.perf_counter()

    def started(self, gp, runtime, server, monitor_url=None) -> None:
        """Where the fit runs and with which settings; then the partitions load."""
        if monitor_url:
            self.line(f"live monitor: {monitor_url}")
        J = server.n_workers
        client = getattr(runtime, "client", None)
        if client is not None:
            from spatialfed.runtime.cluster import worker_addresses

            self.line(f"spatialfed fit: {J} federated workers on {len(worker_addresses(client))} Dask worker(s); "
                      f"dashboard: {getattr(runtime, 'dashboard_link', None)}")
        else:
            self.line(f"spatialfed fit: {J} federated workers on the virtual clock (this process)")
        config = server.config
        setting = (f"FGPR, {config.local_steps} local {config.optimizer} steps of batch {config.batch_size}"
                   if gp.method == "fgpr" else
                   f"{gp.mode} fit, {getattr(gp, 'residual_', gp.residual)} residual, Agg_threshold = {config.agg_threshold}")
        self.line(f"{setting}, m = {len(np.asarray(getattr(server, 'knots', [])))} knots, ν = {gp.nu}, slowdowns = "
                  f"{slowdowns_text(gp._slowdowns(J))}")
        self.total = int(gp.max_iter) if gp.max_iter else None
        self.server, self.n_sites = server, J
        self.sampled = gp.method == "fgpr" or gp.mode == "async"  # a pass does not wait for every site
        if self.enabled and self.tty:
            from tqdm.auto import tqdm

            with self.lock:
                if self.pbar is not None:  # the iterations' bar goes first, the phase's under it
                    self.pbar.close()
                    self.pbar = None
                self.bar = tqdm(total=self.total, desc="init", unit="iter", file=self.stream, dynamic_ncols=True,
                                leave=True)
        self.tic = time.perf_counter()
        self.phase(f"loading the partitions of {J} sites", J, announce=True, kind="load")

    def result(self, j: int, p) -> None:
        """Site j answered request `p` (None: its partition is loaded); counts it in the phase running."""
        if not self.enabled:
            return
        with self.lock:
            if p is None:
                self.loaded += 1
                self.count += 1
                if self.pbar is not None:
                    self.pbar.update(1)
                if self.n_sites and self.loaded == self.n_sites:
                    self._next_phase()
                return
            key = (str(p.step), int(p.t))
            if key != self.key and self.kind == "round trip":  # the pass's first answer names what the sites compute
                self.label = f"iter {p.t}: {STEP_NAMES.get(key[0], key[0])}"
                if self.pbar is not None:
                    self.pbar.set_description_str(self.label, refresh=False)
            self.key = key
            self.count += 1
            if self.pbar is not None:
                self.pbar.update(1)

    def _next_phase(self) -> None:
        """The phase the server is in now (after its partitions loaded, or after it moved on)."""
        s = self.server
        where = str(getattr(s, "phase", ""))
        J = len(getattr(s, "active", ())) or self.n_sites
        if where in ("moments", "variogram", "pilot"):
            self.phase(f"initial values: {where}", J, announce=True, kind=where)
        elif where == "loop":
            if self.sampled and self.kind == "answers":  # async aggregates often: one phase, renamed, counting on
                self.label = f"iter {s.t}"
                if self.pbar is not None:
                    self.pbar.set_description_str(self.label, refresh=False)
            elif self.sampled:
                self.phase(f"iter {s.t}", counting=True, kind="answers")
            else:
                self.phase(f"iter {s.t}: round trip", J, kind="round trip")
        elif where in ("final", "value"):
            self.phase("final pass", J, announce=True, kind="final")
        elif where == "done":
            self.phase("finishing")

    def event(self, server, now: float) -> None:
        if not self.enabled:
            return
        with self.lock:
            self._event(server)

    def _event(self, server) -> None:
        rows = server.trace[self.seen:]
        self.seen = len(server.trace)
        for row in rows:
            if row["step"] not in SHOWN_STEPS:
                continue
            text = row_line(row, self.last_iter)
            done = int(row["iter"])
            if row["step"] in ITER_STEPS:
                self.last_iter = done
            if self.bar is not None:
                self.bar.set_description("fit" if done else "init", refresh=False)
                self.bar.set_postfix_str("t=" + text.split("  t=", 1)[1], refresh=False)  # without "iter N"
                self.bar.update(max(0, min(done, self.total or done) - self.bar.n))
            else:
                later = eta(time.perf_counter() - self.tic, done, self.total) if row["step"] in ITER_STEPS else ""
                print(text + (f"  {later}" if later else ""), file=self.stream, flush=True)
                self.last_out = time.perf_counter()
        state = (str(server.phase), int(server.t), len(server.trace))
        if state != self.state:
            self.state = state
            self.server = server
            self._next_phase()

    def finish(self):
        """Close the bars, stop the heartbeat and leave the fit (idempotent)."""
        with self.lock:
            for bar in (self.pbar, self.bar):
                if bar is not None:
                    bar.close()
            self.pbar = self.bar = None
            self.label = None
            if self._beat_stop is not None:
                self._beat_stop.set()
                self._beat_stop = None
        if self._token is not None:
            try:
                _ACTIVE.reset(self._token)
            except ValueError:  # finished in another context than it started in
                _ACTIVE.set(None)
            self._token = None

    def summary(self, gp) -> None:
        self.finish()
        if self.enabled:
            state = "converged" if gp.converged_ else f"stopped ({gp.stop_reason_})"
            loglik = "n/a" if gp.loglik_ is None else f"{gp.loglik_:.6g}"
            self.line(f"{state} after {gp.n_iter_} iterations in {gp.wall_time_s_:.2f} s; loglik = {loglik}")
            names = list(getattr(gp, "covariate_names_", []))
            if getattr(gp, "covariates_inferred_", False) and len(names) > 1:
                self.line(f"covariates: {', '.join(names)} (INFERRED from X's other columns: name them with "
                          "covariates=[...])")
            else:
                self.line(f"covariates: {', '.join(names) or 'none'}")
            vp = getattr(gp, "variogram_params_", None)
            if vp is not None:
                from spatialfed.api.units import describe, describe_cv, on_bound

                self.line(describe(vp))
                for phrase in on_bound(getattr(gp, "boundary_", {})):
                    self.line(f"on the boundary: {phrase}")
                cv = describe_cv(getattr(gp, "site_blocked_cv_", None))
                if cv:
                    self.line(cv)
