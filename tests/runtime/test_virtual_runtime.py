"""Virtual-clock runtime and heterogeneity profiles: reproducible times, slowdowns, async under a straggler."""

import numpy as np
import pytest
from support import assert_at_maximiser
from support import TRUTH, LowRankReference, simulate

from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.protocol import Augmented
from spatialfed.runtime.heterogeneity import NetworkDelay, extra_wait, profile_slowdowns, resolve_slowdowns
from spatialfed.runtime.virtual import FlopCost, MeasuredCost, VirtualRuntime, run_virtual, settle_time


def test_profiles():
    np.testing.assert_array_equal(profile_slowdowns("balanced", 3), [1, 1, 1])
    np.testing.assert_allclose(profile_slowdowns("straggler", 4), [1, 1, 1, 62 / 3])
    np.testing.assert_allclose(profile_slowdowns("graded", 3), [1, 62 / 32.5, 62 / 3])
    np.testing.assert_array_equal(profile_slowdowns("graded", 1), [1])
    np.testing.assert_array_equal(resolve_slowdowns([1, 2.5], 2), [1, 2.5])
    assert extra_wait(2.0, 3.0) == 4.0
    assert extra_wait(2.0, 3.0, elapsed_s=5.0) == 1.0  # a busy host's contention counts towards s·c
    assert extra_wait(2.0, 3.0, elapsed_s=7.0) == 0.0
    assert NetworkDelay(0.1, 1e3).seconds(500) == pytest.approx(0.6)


@pytest.mark.parametrize("arg, message", [("slow", "unknown heterogeneity profile"), ([1, 2], "2 slowdown factors"),
                                          ([1, 0.5, 1], "≥ 1")])
def test_profile_errors(arg, message):
    with pytest.raises(ValueError, match=message):
        resolve_slowdowns(arg, 3)


@pytest.fixture(scope="module")
def data():
    return simulate(J=3, n=60, side=5, residual="pp")


def test_flop_clock_is_reproducible_and_scales_with_the_slowest_worker(data):
    models, knots, kernel = data
    cfg = FitConfig.of(mode="sync", max_iter=4)
    balanced = run_virtual(models, knots, kernel, cfg)
    again = run_virtual(models, knots, kernel, cfg)
    slowed = run_virtual(models, knots, kernel, cfg, slowdowns="straggler")
    times = np.array([row["time_s"] for row in balanced.trace])
    assert times.tolist() == [row["time_s"] for row in again.trace]
    np.testing.assert_allclose([row["time_s"] for row in slowed.trace], times * 62 / 3, rtol=1e-12)
    task = Augmented(balanced.params, 0, "mu_sigma")
    assert FlopCost().seconds(models[0], task, measured_s=9.9) == pytest.approx(models[0].n * models[0].m ** 2 / 1e9)


def test_network_latency_adds_two_messages_per_synchronous_step(data):
    models, knots, kernel = data
    cfg = FitConfig.of(mode="sync", max_iter=2)
    base = run_virtual(models, knots, kernel, cfg)
    delayed = run_virtual(models, knots, kernel, cfg, network=NetworkDelay(latency_s=0.5))
    # moments + variogram + (t = 0, 1, 2) × 3 steps = 11 synchronous rounds, each two messages; + final pass and value
    delays = [d["time_s"] - b["time_s"] for d, b in zip(delayed.trace, base.trace)]
    assert delays[0] == pytest.approx(2 * 0.5 * 2)  # φ₀ after moments and variogram
    assert delays[-2] == pytest.approx(2 * 0.5 * 11)  # the last theta step
    assert delayed.trace[-1]["step"] == "final" and delays[-1] == pytest.approx(2 * 0.5 * 13)


def test_async_with_a_straggler_reaches_the_lowrank_maximiser():
    models, knots, kernel = simulate(residual="pp")
    u0 = np.log([TRUTH["delta"], TRUTH["sigma2"], TRUTH["beta"]])
    gamma_hat, theta_hat, ll_hat = LowRankReference(models, knots, kernel, "pp").maximise(u0)
    server = run_virtual(models, knots, kernel, FitConfig.of(mode="async", agg_threshold=2, max_iter=500),
                         slowdowns="straggler")
    assert server.converged
    assert_at_maximiser(server, gamma_hat, theta_hat, ll_hat)
    assert max(row["max_staleness"] for row in server.trace) > 10  # the fast workers never waited for the straggler


def test_measured_cost_clock_advances_with_real_compute(data):
    models, knots, kernel = data
    server = run_virtual(models, knots, kernel, FitConfig.of(mode="async", agg_threshold=2, max_iter=3),
                         slowdowns="graded", cost=MeasuredCost())
    times = [row["time_s"] for row in server.trace]
    assert server.done and times[0] > 0 and times == sorted(times)


def test_simultaneous_arrivals_are_one_batch_so_tuned_async_is_sync_when_balanced(data):
    """Equal workers finish together; with every quantity fresh, τ̄ = 0 gives α = 1: the synchronous trajectory."""
    models, knots, kernel = data
    sync = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=5))
    tuned = run_virtual(models, knots, kernel, FitConfig.tuned(agg_threshold=1, max_iter=5))
    assert tuned.trace == sync.trace and tuned.loglik == sync.loglik


def test_settle_time():
    ref = {"delta": 1.0, "sigma2": 2.0, "beta": 0.1, "gamma": [1.0, -2.0]}
    rows = [{**ref, "time_s": 0.0, "beta": 0.2}, {**ref, "time_s": 1.0}, {**ref, "time_s": 2.0, "gamma": [1.01, -2.0]},
            {**ref, "time_s": 3.0, "gamma": [1.0005, -2.0]}, {**ref, "time_s": 4.0}]
    assert settle_time(rows, ref) == 3.0
    assert settle_time(rows[:3], ref) is None


@pytest.fixture(scope="module")
def ten_workers():
    """J = 10 × 100 points, full residual: the benchmark's design at a test's size."""
    models, knots, kernel = simulate(J=10, n=100, residual="full")
    reference = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=100, tol=1e-10))
    phi = reference.params
    return (models, knots, kernel), {"delta": phi.delta, "sigma2": phi.sigma2, "beta": phi.beta, "gamma": phi.gamma}


def settle_ratio(data, reference, config, profile):
    """Time until async settles within 1e-3 of the converged estimate, over the same for sync (the benchmark)."""
    models, knots, kernel = data
    sync = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=100, tol=1e-10), slowdowns=profile)
    fit = run_virtual(models, knots, kernel, config, slowdowns=profile)
    settled = settle_time(fit.trace, reference)
    return fit, None if settled is None else settled / settle_time(sync.trace, reference)


def test_tuned_async_beats_sync_when_graded_and_ties_when_balanced(ten_workers):
    data, reference = ten_workers
    tuned = FitConfig.tuned(agg_threshold=2, max_iter=300, tol=1e-10)
    assert settle_ratio(data, reference, tuned, "balanced")[1] == 1.0
    assert settle_ratio(data, reference, tuned, "graded")[1] < 1.0


def test_strategies_stabilise_what_diverges_without_them(ten_workers):
    """Full Newton steps (α = 1) on stale quantities diverge; with every strategy on (α_t = 1/(1 + τ̄_t)) they settle."""
    data, reference = ten_workers
    none, none_ratio = settle_ratio(data, reference, FitConfig.basic(agg_threshold=2, alpha=1.0, max_iter=150),
                                    "graded")
    every = FitConfig.of(mode="async", agg_threshold=2, alpha=1.0, alpha_rule="staleness", T_c=0, omega=0.5, t_M=2,
                      max_iter=300, tol=1e-10)
    stable, stable_ratio = settle_ratio(data, reference, every, "graded")
    assert none_ratio is None and stable_ratio is not None
    assert none.loglik < stable.loglik - 10


def test_staleness_bound_wins_where_plain_async_plateaus_with_inverse_sizes():
    """Figure 7's inverse case at a test's size (sizes 40→120 against cores 62→3, the slowest worker holds the most):
    tuned async plateaus on the slowest worker's stale quantity and does not settle in 600 iterations; with VAFL's
    staleness bound D = 10 it settles before sync (measured: 0.34 s against 0.45 s). From the variogram start this
    store had before 28 Nov (σ²₀ 1.68, β₀ 0.94 against 1.08 and 0.20), where the stale quantity matters."""
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.data.simulate import simulate as simulate_data
    from spatialfed.model.local import LocalModel
    from spatialfed.model.matern import Matern

    kernel, knots = Matern(0.5), jittered_unit_grid(36, seed=10_000)
    sizes = np.linspace(120, 40, 10).round().astype(int)[::-1]
    models = [LocalModel(*part, knots, kernel, "full")
              for part in simulate_data(sizes=[int(s) for s in sizes], nu=0.5, beta=0.1, seed=0).parts()]
    slowdowns = 62 / np.linspace(62, 3, 10)
    start = {"delta": 0.24826438384316782, "sigma2": 1.675244167153152, "beta": 0.9430600031973192}
    phi = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=100, tol=1e-10), start=start).params
    reference = {"delta": phi.delta, "sigma2": phi.sigma2, "beta": phi.beta, "gamma": phi.gamma}
    sync = settle_time(run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=100, tol=1e-10),
                                   slowdowns=slowdowns, start=start).trace, reference)
    plain, bounded = (run_virtual(models, knots, kernel, FitConfig.tuned(agg_threshold=2, max_iter=600, tol=1e-10,
                                                                         staleness_bound=D), slowdowns=slowdowns,
                                  start=start)
                      for D in (None, 10))
    assert settle_time(plain.trace, reference) is None
    assert settle_time(bounded.trace, reference) < 0.8 * sync


def test_the_alarm_rings_at_its_time_unless_replaced_and_never_outlives_the_work(data):
    """Runtime.alarm, the server's timer: one ALARM event at the newest time set, none once cancelled, and none
    when nothing else is outstanding (the loop ends instead)."""
    from spatialfed.runtime.interface import ACTIVATION, ALARM, ALARM_SITE

    models, _, _ = data
    rt = VirtualRuntime(models)
    rt.start()
    rt.wake(0, 5.0)
    rt.alarm(2.0)
    rt.alarm(3.0)  # replaces 2.0
    seen = []
    for batch in rt.completed():
        seen += [(rt.now(), ev.site, ev.request) for ev in batch]
        if len(seen) == 2:
            rt.wake(1, 9.0)
            rt.alarm(8.0)
            rt.alarm(None)  # cancelled
            rt.alarm(12.0)  # later than every other event: never rings
    assert seen == [(3.0, ALARM_SITE, ALARM), (5.0, 0, ACTIVATION), (9.0, 1, ACTIVATION)]


def test_an_alarm_set_in_the_past_rings_at_once(data):
    from spatialfed.runtime.interface import ALARM

    models, _, _ = data
    rt = VirtualRuntime(models)
    rt.start()
    rt.wake(0, 5.0)
    rings = []
    for batch in rt.completed():
        rings += [(rt.now(), ev.request) for ev in batch]
        if len(rings) == 1:
            rt.wake(1, 9.0)
            rt.alarm(2.0)  # before now (5.0): due now, not lost
    assert rings[1] == (5.0, ALARM) and len(rings) == 3
