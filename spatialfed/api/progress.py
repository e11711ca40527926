"""Progress of a fit on stderr: what runs where, one line per iteration, and a closing summary."""

from __future__ import annotations

import sys

import numpy as np


class Progress:
    """One line per iteration (iteration, clock, parameters, max staleness) — rewritten in place on a terminal —
    or nothing when quiet. A context manager: leaving it ends the current line."""

    def __init__(self, enabled: bool, stream=None):
        self.enabled = bool(enabled)
        self.stream = stream or sys.stderr
        self.seen = 0
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.pending_cr = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finish()

    def line(self, text: str) -> None:
        if self.enabled:
            self._clear()
            print(text, file=self.stream, flush=True)

    def _clear(self):
        if self.pending_cr:
            print(file=self.stream)
            self.pending_cr = False

    def started(self, gp, runtime, server, monitor_url=None) -> None:
        """Where the fit runs and with which settings."""
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
                   f"{gp.mode} fit, {gp.residual} residual, Agg_threshold = {config.agg_threshold}")
        self.line(f"{setting}, m = {len(np.asarray(getattr(server, 'knots', [])))} knots, ν = {gp.nu}, slowdowns = "
                  f"{np.array2string(gp._slowdowns(J), precision=2, separator=',')}")

    def event(self, server, now: float) -> None:
        if not self.enabled:
            return
        rows = server.trace[self.seen:]
        self.seen = len(server.trace)
        for row in rows:
            if row["step"] not in ("init", "theta", "fgpr"):
                continue
            text = (f"iter {row['iter']:>3}  t={row['time_s']:7.2f}s  δ={row['delta']:.4g}  σ²={row['sigma2']:.4g}  "
                    f"β={row['beta']:.4g}  γ=[{', '.join(f'{g:.3g}' for g in row['gamma'])}]  "
                    f"max staleness {row['max_staleness']}"
                    + (f"  loglik≈{row['loglik']:.8g}" if row.get("loglik") is not None else ""))
            if self.tty:
                print("\r\033[K" + text, end="", file=self.stream, flush=True)
                self.pending_cr = True
            else:
                print(text, file=self.stream, flush=True)

    def finish(self):
        if self.enabled:
            self._clear()

    def summary(self, gp) -> None:
        if self.enabled:
            state = "converged" if gp.converged_ else f"stopped ({gp.stop_reason_})"
            loglik = "n/a" if gp.loglik_ is None else f"{gp.loglik_:.6g}"
            self.line(f"{state} after {gp.n_iter_} iterations in {gp.wall_time_s_:.2f} s; loglik = {loglik}")
            vp = getattr(gp, "variogram_params_", None)
            if vp is not None:
                from spatialfed.api.units import describe

                self.line(describe(vp))
