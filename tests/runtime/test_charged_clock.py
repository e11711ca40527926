"""The charged virtual clock: the server is one processor on the sites' timeline (runtime/virtual.py), and the sites'
flops are counted at this machine's calibrated rate."""

import time

import numpy as np
import pytest
from support import simulate

from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.protocol import STATS_STEP, Augmented
from spatialfed.algorithm.stats_server import StatsServer
from spatialfed.model.params import Params
from spatialfed.runtime.virtual import FlopCost, VirtualRuntime, run_virtual


@pytest.fixture(scope="module")
def data():
    return simulate(J=3, n=60, side=5, residual="full")


def request(models, t=0):
    m, p = models[0].m, models[0].p
    return Augmented(Params(np.zeros(m), np.eye(m), np.zeros(p), 2.0, 1.0, 0.2), t, STATS_STEP)


def test_a_request_leaves_after_the_server_computed_and_answers_meanwhile_wait_for_it(data):
    """charge(c) moves the clock by c: a request made after it finishes c later; answers that arrived while the
    server computed reach it together, at the moment it is free."""
    models, _, _ = data
    cost = FlopCost(rate=1e9)
    rt = VirtualRuntime(models, cost=cost)
    rt.start()
    one = cost.seconds(models[0], request(models), 0.0)
    rt.charge(0.5)
    for j in range(3):
        rt.submit(j, request(models))
    batches = rt.completed()
    first = next(batches)
    assert rt.now() == pytest.approx(0.5 + one) and len(first) == 3  # equal sites: one batch, after the charge
    rt.submit(0, request(models, 1))  # answers at now + one; the server then computes for 3·one
    rt.charge(3 * one)
    rt.submit(1, request(models, 1))  # leaves only now: answers at 0.5 + 5·one
    second = next(batches)
    assert [ev.site for ev in second] == [0] and rt.now() == pytest.approx(0.5 + 4 * one)  # waited for the server
    assert rt.server_s == pytest.approx(0.5 + 3 * one)
    rt.charge(10.0)
    third = next(batches)  # arrived long before: delivered when the server is free, not in the past
    assert [ev.site for ev in third] == [1] and rt.now() == pytest.approx(10.5 + 4 * one)


def test_without_charge_server_the_clock_ignores_the_server(data):
    models, _, _ = data
    rt = VirtualRuntime(models, cost=FlopCost(), charge_server=False)
    rt.start()
    rt.charge(5.0)
    assert rt.now() == 0.0 and rt.server_s == 5.0


class SlowServer(StatsServer):
    """A StatsServer whose every receive burns `burn` CPU seconds (a stand-in for an expensive decision)."""

    burn = 0.02

    def receive(self, qs, now):
        end = time.process_time() + self.burn
        while time.process_time() < end:
            pass
        return super().receive(qs, now)


def test_the_driver_charges_every_server_call(data):
    """The same sync fit on the charged clock ends at least receives × burn later than on the sites-only clock, and
    the runtime's server_s counts at least that CPU; the estimate is the same."""
    models, knots, kernel = data
    cfg = FitConfig.of(mode="sync", max_iter=6)
    free = run_virtual(models, knots, kernel, server=SlowServer(3, knots, kernel, cfg), cost=FlopCost())
    receives = []
    charged = run_virtual(models, knots, kernel, server=SlowServer(3, knots, kernel, cfg), cost=FlopCost(),
                          charge_server=True, on_event=lambda server, now: receives.append(now))
    assert charged.loglik == pytest.approx(free.loglik, rel=1e-12)
    lag = charged.trace[-1]["time_s"] - free.trace[-1]["time_s"]
    assert lag >= len(receives) * SlowServer.burn * 0.99


def test_calibrated_rate_is_measured_once_per_problem_shape(data):
    models, _, _ = data
    a, b = FlopCost.calibrated(models), FlopCost.calibrated(models)
    assert a.rate == b.rate and np.isfinite(a.rate) and a.rate > 1e6
    # a statistics request of the median site costs about what it takes here (within the timer's noise)
    tic = time.process_time()
    for k in range(5):
        from spatialfed.model.stats import site_statistics

        site_statistics(models[1], np.array([0.3 + 0.01 * k, 0.1, np.log(0.3)]))
    measured = (time.process_time() - tic) / 5
    assert 0.1 * measured <= a.seconds(models[1], request(models), 0.0) <= 10 * measured
