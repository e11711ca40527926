"""Options from related work on the asynchronous server: VAFL's staleness bound D, AsyncManifold's dominance
correction of the weights, and the basic asynchronous algorithm of Section 5 as a named configuration."""

import numpy as np
import pytest
from support import simulate
from test_algorithm_server import START, pending, run, through_initial_pass

from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.protocol import evaluate
from spatialfed.algorithm.strategies import dominance_weights, section5_step_size, uniform_weights
from spatialfed.model.reference import lowrank_loglik
from spatialfed.runtime.virtual import run_virtual

GRADED = [1.0, 1.0, 1.5, 2.0, 8.0]


@pytest.fixture(scope="module")
def data():
    return simulate(J=3, n=60, side=5, residual="pp")


@pytest.fixture(scope="module")
def data5():
    return simulate(J=5, n=60, side=5, residual="pp")


def test_too_stale_quantities_are_discarded_and_their_workers_refreshed(data):
    models = data[0]
    server = through_initial_pass(data, FitConfig.basic(agg_threshold=1, staleness_bound=1))
    slow = server.next_task(2)  # worker 2 takes (1, mu_sigma) and is slow
    for _ in range(3):  # worker 0 alone drives iteration 1: the t = 0 quantities are 1 iteration old, D = 1 allows it
        run(server, models, 0)
    assert server.t == 2 and server.discarded == 0
    run(server, models, 0)  # (2, mu_sigma): now the t = 0 quantities of workers 1 and 2 are 2 > D old
    assert server.discarded == 2 and (1, "mu_sigma") not in server._Q and (2, "mu_sigma") not in server._Q
    assert pending(server, 1)[0] == (2, "mu_sigma") and pending(server, 2)[0] == (2, "mu_sigma")  # refreshed
    server.receive(evaluate(models[2], slow, 2), now=1.0)  # staleness 1: kept, but worker 1 is still missing
    assert server.trace[-1]["step"] == "theta"
    run(server, models, 1)
    assert server.trace[-1]["step"] == "mu_sigma" and server.trace[-1]["max_staleness"] == 1


def test_aggregation_waits_for_a_fresh_quantity_from_every_worker(data):
    models = data[0]
    server = through_initial_pass(data, FitConfig.basic(agg_threshold=1, staleness_bound=0))
    run(server, models, 0)  # Num.mu_sigma reaches Agg_threshold, but D = 0 needs every worker's quantity at t = 1
    assert server.t == 1 and server.counters["mu_sigma"] == 1 and server.discarded == 2  # t = 0 entries dropped
    assert not any(row["iter"] == 1 and row["step"] == "mu_sigma" for row in server.trace)
    assert pending(server, 1)[0] == (1, "mu_sigma")  # the refreshed worker computes the current step first
    run(server, models, 1)
    run(server, models, 2)
    assert server.trace[-1]["step"] == "mu_sigma" and server.trace[-1]["max_staleness"] == 0


@pytest.mark.parametrize("D", [0, 4])
def test_bound_holds_for_every_aggregate_and_the_fit_reaches_the_optimum(data5, D):
    models, knots, kernel = data5
    cfg = FitConfig.tuned(agg_threshold=1, staleness_bound=D, max_iter=300, tol=1e-7)
    server = run_virtual(models, knots, kernel, cfg, slowdowns=GRADED, start=START)
    free = run_virtual(models, knots, kernel, FitConfig.tuned(agg_threshold=1, max_iter=300, tol=1e-7),
                       slowdowns=GRADED, start=START)
    assert max(row["max_staleness"] for row in server.trace) <= D
    assert max(row["max_staleness"] for row in free.trace) > D  # the bound did something
    assert server.discarded > 0 and server.converged
    assert server.loglik == pytest.approx(free.loglik, abs=1e-4)


def test_no_bound_and_a_large_bound_give_identical_fits(data5):
    models, knots, kernel = data5
    runs = [run_virtual(models, knots, kernel, FitConfig.tuned(agg_threshold=2, staleness_bound=D, max_iter=40),
                        slowdowns=GRADED, start=START) for D in (None, 10_000)]
    assert runs[0].trace == runs[1].trace and runs[1].discarded == 0


def test_dominance_weights_penalise_frequent_reporters():
    w = dominance_weights(uniform_weights(3), [8, 1, 1])
    assert w.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(w, np.array([1 / 8, 1, 1]) / (2 + 1 / 8))
    np.testing.assert_allclose(dominance_weights(uniform_weights(4), [5, 5, 5, 5]), uniform_weights(4))


def test_dominance_correction_applies_in_eq18_window_and_keeps_the_optimum(data5):
    models, knots, kernel = data5
    T_c = 12
    cfg = FitConfig.tuned(agg_threshold=2, dominance=True, T_c=T_c, max_iter=300, tol=1e-7)
    server = run_virtual(models, knots, kernel, cfg, slowdowns=GRADED, start=START)
    plain = run_virtual(models, knots, kernel, FitConfig.tuned(agg_threshold=2, T_c=T_c, max_iter=300, tol=1e-7),
                        slowdowns=GRADED, start=START)
    assert server._arrivals[0] > 3 * server._arrivals[4]  # the fast worker reports far more often
    first = [row["beta"] for row in server.trace if row["step"] == "theta"][:T_c]
    assert first != [row["beta"] for row in plain.trace if row["step"] == "theta"][:T_c]  # the weights differ
    sync = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=60, tol=1e-9), start=START)
    assert server.loglik == pytest.approx(sync.loglik, abs=1e-5)  # uniform after T_c: the same optimum


def test_section5_step_size_is_lemma_11():
    w = np.array([0.5, 0.25, 0.25])
    assert section5_step_size(1.0, w, [0, 2, 4]) == pytest.approx(1 / ((1 + 1.5) * (1 + 4)))
    assert section5_step_size(0.8, w, [0, 0, 0]) == 0.8


def test_section5_is_the_basic_algorithm_and_converges_linearly(data5):
    """Theorem 12: with α_t ∝ (τ̄+1)⁻¹(τ+1)⁻¹ the basic algorithm converges linearly; its error contracts."""
    models, knots, kernel = data5
    cfg = FitConfig.section5(agg_threshold=2, max_iter=300, tol=1e-9)
    b = cfg.block
    assert not (b.correction or b.adaptive_weights or b.moving_average) and b.alpha_rule == "section5"
    server = run_virtual(models, knots, kernel, cfg, slowdowns=GRADED, start=START)
    best = server.params
    rows = [row for row in server.trace if row["step"] == "theta"]
    err = np.array([abs(np.log(row["beta"] / best.beta)) + abs(np.log(row["sigma2"] / best.sigma2)) for row in rows])
    quarter = len(err) // 4
    assert err[quarter] < 0.5 * err[0] + 1e-12 and err[2 * quarter] < 0.5 * err[quarter] + 1e-12
    parts = [(lm.locs, lm.z, lm.X) for lm in models]
    expected = lowrank_loglik(parts, knots, kernel, "pp", best.gamma, best.delta, best.sigma2, best.beta)
    assert server.loglik == pytest.approx(expected, abs=1e-8)
    sync = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=60, tol=1e-9), start=START)
    assert server.loglik == pytest.approx(sync.loglik, abs=1e-5)


def test_staleness_bound_is_validated():
    with pytest.raises(ValueError, match="staleness_bound"):
        FitConfig.of(mode="async", staleness_bound=-1)
    with pytest.raises(ValueError, match="staleness_bound"):
        FitConfig.of(mode="async", staleness_bound=1.5)
