"""Progress of a fit on stderr: what runs where, the iterations with an ETA, and a closing summary.

In a terminal or a notebook the iterations drive a ``tqdm`` bar (``tqdm.auto``: a widget in Jupyter when ipywidgets
is installed) over ``max_iter`` with the current parameters and an ETA — an upper bound, as the tolerance may stop
the fit earlier; elsewhere (logs, pipes) one plain line per iteration, each with its ETA. The time before the first
iteration (cluster start-up, loading the partitions, the starting values φ₀) is announced and shown as "init".
"""

from __future__ import annotations

import sys
import time

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


class Progress:
    """The iterations (iteration, clock, parameters, max staleness, ETA) as a tqdm bar on a terminal or in a notebook,
    else one line each; nothing when quiet. A context manager: leaving it closes the bar."""

    def __init__(self, enabled: bool, stream=None):
        self.enabled = bool(enabled)
        self.stream = stream or sys.stderr
        self.seen = 0
        self.tty = interactive(self.stream)
        self.bar = None
        self.total = None
        self.tic = time.perf_counter()

    def starting(self, what: str) -> None:
        """Announce the initialisation (before the runtime starts: a cluster can take seconds to come up)."""
        self.tic = time.perf_counter()
        self.line(f"spatialfed fit: starting {what} ...")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.finish()

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

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
        self.total = int(gp.max_iter) if gp.max_iter else None
        if self.enabled and self.tty:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc="init", unit="iter", file=self.stream, dynamic_ncols=True,
                            leave=True)
        self.tic = time.perf_counter()

    def event(self, server, now: float) -> None:
        if not self.enabled:
            return
        rows = server.trace[self.seen:]
        self.seen = len(server.trace)
        for row in rows:
            if row["step"] not in ("init", "theta", "fgpr", "stats"):
                continue
            text = (f"iter {row['iter']:>3}  t={row['time_s']:7.2f}s  δ={row['delta']:.4g}  σ²={row['sigma2']:.4g}  "
                    f"β={row['beta']:.4g}  γ=[{', '.join(f'{g:.3g}' for g in row['gamma'])}]  "
                    f"max staleness {row['max_staleness']}"
                    + (f"  loglik≈{row['loglik']:.8g}" if row.get("loglik") is not None else ""))
            done = int(row["iter"])
            if self.bar is not None:
                self.bar.set_description("fit" if done else "init", refresh=False)
                self.bar.set_postfix_str(text.split(maxsplit=2)[2], refresh=False)  # without "iter N"
                self.bar.update(max(0, min(done, self.total or done) - self.bar.n))
            else:
                later = eta(time.perf_counter() - self.tic, done, self.total)
                print(text + (f"  {later}" if later else ""), file=self.stream, flush=True)

    def finish(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def summary(self, gp) -> None:
        self.finish()
        if self.enabled:
            state = "converged" if gp.converged_ else f"stopped ({gp.stop_reason_})"
            loglik = "n/a" if gp.loglik_ is None else f"{gp.loglik_:.6g}"
            self.line(f"{state} after {gp.n_iter_} iterations in {gp.wall_time_s_:.2f} s; loglik = {loglik}")
            vp = getattr(gp, "variogram_params_", None)
            if vp is not None:
                from spatialfed.api.units import describe

                self.line(describe(vp))
