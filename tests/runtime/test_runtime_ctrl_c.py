"""A Ctrl-C is never lost (runtime.driver.CtrlC): Python raises KeyboardInterrupt wherever the main thread is, and
inside a finalizer (a Dask Future's __del__, seen in CI) it is printed as "Exception ignored" and dropped, so the
fit ran to its end. Here the SIGINT is raised inside a finalizer during the first aggregation, as in that race."""

import gc
import signal
import warnings

import pytest
from support import simulate

from spatialfed.algorithm.config import FitConfig
from spatialfed.runtime.virtual import run_virtual


class PressesCtrlCWhenCollected:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)  # its KeyboardInterrupt is raised, and swallowed, inside __del__


def test_a_ctrl_c_swallowed_by_a_finalizer_still_stops_the_fit():
    models, knots, kernel = simulate(J=3, n=40, side=3, residual="full", seed=1)
    events = []

    def on_event(server, now):
        events.append(server.t)
        if len(events) == 1:
            PressesCtrlCWhenCollected()  # collected at once (refcount 0): the press happens in its finalizer
            gc.collect()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pytest's "unraisable exception" warning of the swallowed interrupt
        with pytest.raises(KeyboardInterrupt):
            run_virtual(models, knots, kernel, config=FitConfig.of(mode="sync", max_iter=100, tol=1e-12),
                        on_event=on_event)
    assert len(events) <= 2  # stopped at the next batch, not at the end of the fit
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the fit's handler is gone
