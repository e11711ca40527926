"""FederatedServer: buffers ℙ_j and ℚ, counters, Agg_threshold = J as the synchronous algorithm (SPEC §4)."""

import numpy as np
import pytest
from support import TRUTH, simulate

from spatialfed.algorithm import start as starting
from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.protocol import Quantity, evaluate
from spatialfed.algorithm.server import FederatedServer
from spatialfed.model import blocks
from spatialfed.model.reference import lowrank_loglik
from spatialfed.runtime.virtual import run_virtual

START = {"gamma": TRUTH["gamma"], "delta": TRUTH["delta"], "sigma2": TRUTH["sigma2"], "beta": TRUTH["beta"]}


@pytest.fixture(scope="module")
def data():
    return simulate(J=3, n=60, side=5, residual="pp")


def run(server, models, j):
    """Worker j takes the front of ℙ_j, computes it and answers."""
    p = server.next_task(j)
    server.receive(evaluate(models[j], p, j), now=0.0)
    return p


def through_initial_pass(data, config):
    """A server past the moments summary and Algorithm 1's synchronous pass (t = 0), now at t = 1."""
    models, knots, kernel = data
    server = FederatedServer(len(models), knots, kernel, config, start=START)
    while server.t == 0:
        for j in range(len(models)):
            run(server, models, j)
    return server


def pending(server, j):
    return [(p.t, p.step) for p in server.buffer(j)]


def test_worker_buffer_is_substep_aware_fifo(data):
    models = data[0]
    server = through_initial_pass(data, FitConfig.basic(agg_threshold=1))
    assert all(pending(server, j) == [(1, "mu_sigma")] for j in range(3))
    for step in ("mu_sigma", "gamma", "theta"):  # worker 0 alone drives iteration 1 (Agg_threshold = 1)
        assert run(server, models, 0).step == step
    assert pending(server, 1) == [(2, "mu_sigma"), (1, "gamma"), (1, "theta")]  # same step replaced in place
    run(server, models, 0)
    assert pending(server, 1) == [(2, "mu_sigma"), (2, "gamma"), (1, "theta")]
    assert pending(server, 0) == [(2, "gamma")]
    assert server.next_task(1).t == 2 and pending(server, 1) == [(2, "gamma"), (1, "theta")]


def test_counter_counts_arrivals_and_resets_after_aggregation(data):
    models = data[0]
    server = through_initial_pass(data, FitConfig.basic(agg_threshold=2))
    tasks = {j: server.next_task(j) for j in range(3)}
    rows = len(server.trace)
    server.receive(evaluate(models[0], tasks[0], 0), now=1.0)
    assert server.counters["mu_sigma"] == 1 and len(server.trace) == rows
    server.receive(evaluate(models[1], tasks[1], 1), now=2.0)
    assert server.counters["mu_sigma"] == 0 and server.trace[-1]["step"] == "mu_sigma"
    assert pending(server, 0) == [(1, "gamma")]
    server.receive(evaluate(models[2], tasks[2], 2), now=3.0)  # late mu_sigma: counted for the next mu_sigma step
    assert server.counters["mu_sigma"] == 1 and len(server.trace) == rows + 1


def test_runtime_protocol_errors(data):
    models, knots, kernel = data
    server = FederatedServer(3, knots, kernel, FitConfig(), start=START)
    with pytest.raises(RuntimeError, match="without a task"):
        server.receive(Quantity({}, 0, "moments", 0), now=0.0)
    p = server.next_task(0)
    with pytest.raises(RuntimeError, match="already has a task"):
        server.next_task(0)
    with pytest.raises(RuntimeError, match="answered"):
        server.receive(Quantity(models[0].moments(), 5, p.step, 0), now=0.0)
    with pytest.raises(ValueError, match="unknown starting value"):
        FederatedServer(3, knots, kernel, start={"range": 0.3})
    with pytest.raises(ValueError, match="agg_threshold must be an integer in 1..J"):
        FederatedServer(3, knots, kernel, FitConfig.of(mode="async", agg_threshold=4))


def test_agg_threshold_J_is_the_synchronous_algorithm(data):
    models, knots, kernel = data
    sync = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=6))
    as_async = run_virtual(models, knots, kernel, FitConfig.basic(agg_threshold=3, alpha=1.0, max_iter=6),
                           slowdowns=[1.0, 7.0, 2.5])
    drop_time = lambda trace: [{k: v for k, v in row.items() if k != "time_s"} for row in trace]  # noqa: E731
    assert drop_time(as_async.trace) == drop_time(sync.trace)
    assert as_async.loglik == sync.loglik
    assert all(row["max_staleness"] == 0 for row in sync.trace)


def test_sync_trajectory_equals_direct_block_iteration(data):
    """Section 3.1 written out centrally: per iteration μ,Σ → γ → Newton on u with the profile Hessian."""
    models, knots, kernel = data
    server = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", mean_step="block", max_iter=4, tol=1e-12),
                         start=START)
    phi = starting.initial_params(START["gamma"], START["delta"], START["sigma2"], START["beta"], knots, kernel)
    rows = [row for row in server.trace if row["step"] == "theta"]
    for row in rows:
        K = blocks.knot_covariance(knots, kernel, phi.sigma2, phi.beta)
        qs = [lm.quantity("mu_sigma", phi) for lm in models]
        mu, Sigma = blocks.update_mu_sigma(sum(q["A"] for q in qs), sum(q["b"] for q in qs), K)
        phi = phi.replace(mu=mu, Sigma=Sigma)
        qs = [lm.quantity("gamma", phi) for lm in models]
        phi = phi.replace(gamma=blocks.update_gamma(sum(q["XtRX"] for q in qs), sum(q["XtRr"] for q in qs)))
        qs = [lm.quantity("theta", phi) for lm in models] + [
            blocks.h_terms(phi.mu, phi.Sigma, knots, kernel, phi.sigma2, phi.beta)]
        tot = {k: sum(q[k] for q in qs) for k in ("grad", "hess", "d2_du_dmu", "d2_du_dSigma")}
        H = blocks.profile_hessian(tot["hess"], tot["d2_du_dmu"], tot["d2_du_dSigma"], phi.Sigma)
        phi = phi.with_u(blocks.newton_step(phi.u, tot["grad"], H, alpha=1.0, bound=1.0, floor=1e-6))
        np.testing.assert_allclose([row["delta"], row["sigma2"], row["beta"]], [phi.delta, phi.sigma2, phi.beta],
                                   rtol=1e-9)
        np.testing.assert_allclose(row["gamma"], phi.gamma, rtol=1e-9)
    assert len(rows) == 5  # Algorithm 1's pass (t = 0) and 4 iterations


def test_data_driven_start_and_final_loglik_belongs_to_params(data):
    models, knots, kernel = data
    server = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=3))
    first = server.trace[0]
    X = np.vstack([lm.X for lm in models])
    z = np.concatenate([lm.z for lm in models])
    assert first["step"] == "init"
    np.testing.assert_allclose(first["gamma"], np.linalg.lstsq(X, z, rcond=None)[0], rtol=1e-10)
    assert server.n_obs == len(z) and server.stop_reason == "max_iter" and not server.converged
    phi = server.params
    parts = [(lm.locs, lm.z, lm.X) for lm in models]
    expected = lowrank_loglik(parts, knots, kernel, "pp", phi.gamma, phi.delta, phi.sigma2, phi.beta)
    assert server.loglik == pytest.approx(expected, abs=1e-8)


def test_time_budget_stops_and_still_reports_loglik_at_params(data):
    models, knots, kernel = data
    server = run_virtual(models, knots, kernel, FitConfig.of(mode="async", agg_threshold=1, time_budget=1e-3),
                         slowdowns="straggler")
    assert server.done and server.stop_reason == "time_budget" and not server.converged
    assert server.trace[-1]["time_s"] >= 1e-3
    phi = server.params
    parts = [(lm.locs, lm.z, lm.X) for lm in models]
    expected = lowrank_loglik(parts, knots, kernel, "pp", phi.gamma, phi.delta, phi.sigma2, phi.beta)
    assert server.loglik == pytest.approx(expected, abs=1e-8)


def test_variogram_rule_recovers_an_exact_semivariogram():
    from spatialfed.model.matern import Matern

    kernel, knots = Matern(0.5), np.array([[0.0, 0.0], [1.0, 1.0]])
    edges = starting.variogram_edges(starting.domain_diameter(knots))
    h = 0.5 * (edges[:-1] + edges[1:])
    count = np.full(h.size, 100.0)
    tau2, sigma2, beta = 0.3, 0.7, 0.12
    sum_sq = count * (tau2 + sigma2 * (1 - kernel.correlation(h, beta)))
    fitted = starting.fit_variogram(sum_sq, count, edges, kernel, s2=tau2 + sigma2)
    np.testing.assert_allclose(fitted, (tau2, sigma2, beta), rtol=1e-3)


def test_trace_loglik_estimate_and_exact_final_row(data):
    """Synchronously every f_j is fresh, so a theta row's estimate is ℓ_LR at the (γ, θ) that step started from."""
    models, knots, kernel = data
    server = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=3))
    parts = [(lm.locs, lm.z, lm.X) for lm in models]
    rows = server.trace
    thetas = [i for i, row in enumerate(rows) if row["step"] == "theta"]
    assert len(thetas) == 4
    for i in thetas:
        start = rows[i - 1]  # the gamma row: (γ, θ) the Newton step started from
        expected = lowrank_loglik(parts, knots, kernel, "pp", start["gamma"], start["delta"], start["sigma2"],
                                  start["beta"])
        assert rows[i]["loglik"] == pytest.approx(expected, abs=1e-8)
    assert all(row["loglik"] is None for row in rows if row["step"] in ("init", "mu_sigma", "gamma"))
    assert rows[-1]["step"] == "final" and rows[-1]["loglik"] == server.loglik
