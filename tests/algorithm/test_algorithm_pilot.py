"""The pilot start (algorithm/pilot.py, issue 29): statistics of each site's seeded subsample move φ₀ near the
optimum before the loop, so the loop needs few round trips; the rules that decide when it runs and stops."""

import numpy as np
import pytest
from support import TRUTH, simulate

from spatialfed.algorithm.config import FitConfig, StatsPolicy
from spatialfed.algorithm.pilot import Pilot, pilot_size
from spatialfed.algorithm.likelihood import Profile
from spatialfed.algorithm.protocol import PILOT_STEP, STATS_STEP, Augmented, evaluate
from spatialfed.algorithm.stats_server import StatsServer
from spatialfed.model.stats import site_statistics, stats_flops
from spatialfed.runtime.virtual import FlopCost, run_virtual

POINTS = 160  # of 800 per site: the subsamples hold a fifth of the data, under pilot_share
FAR = {"delta": TRUTH["delta"] / 5, "sigma2": TRUTH["sigma2"] * 2, "beta": TRUTH["beta"] * 3}  # φ₀ far off


@pytest.fixture(scope="module")
def problem():
    return simulate(J=4, n=800, side=5, residual="full", seed=11)


def fit(problem, pilot=None, mode="sync", on_event=None, server=None, start=FAR, **config):
    """A statistics fit of `problem` from FAR; the pilot's subsamples hold a fifth of the data unless `pilot` says."""
    pilot = problem[0][0].n // 5 if pilot is None else pilot
    models, knots, kernel = problem
    config = FitConfig.of(mode=mode, scheme="stats", tol=1e-8, max_iter=60,
                       policy=StatsPolicy(pilot_points=pilot), **config)
    server = server or StatsServer(len(models), knots, kernel, config, start=start)
    return run_virtual(models, knots, kernel, server=server, on_event=on_event,
                       slowdowns=[1.0, 1.0, 1.0, 8.0] if mode == "async" else "balanced")


@pytest.fixture(scope="module")
def small():
    """Half the sites' size, for the bookkeeping tests (drop, checkpoint, async): the pilot still runs (80 of 400)."""
    return simulate(J=4, n=400, side=5, residual="full", seed=11)


@pytest.fixture(scope="module")
def piloted(problem):
    return fit(problem)


@pytest.fixture(scope="module")
def plain(problem):
    return fit(problem, pilot=0)


def u_of(row):
    return np.log([row["delta"], row["sigma2"], row["beta"]])


def test_the_pilot_starts_the_loop_within_its_standard_error_and_the_loop_needs_few_round_trips(problem, piloted,
                                                                                                 plain):
    assert plain._pilot is None and not any(row["step"] == "pilot" for row in plain.trace)
    assert piloted.converged and piloted._pilot.done and piloted._pilot.rounds >= 2
    # the same maximiser, the exact ℓ there
    assert piloted.loglik == pytest.approx(plain.loglik, abs=1e-8)
    np.testing.assert_allclose(piloted.params.u, plain.params.u, atol=1e-6)
    start = [row for row in piloted.trace if row["step"] == "pilot"][-1]
    gap = np.abs(u_of(start) - piloted.params.u)
    # within a few standard errors of the subsample against the full data ((−H_s)⁻¹(1 − N_s/N))
    info = -piloted._pilot.anchor.hess
    sd = np.sqrt(np.diag(np.linalg.inv(info)) * (1 - 4 * POINTS / sum(lm.n for lm in problem[0])))
    assert np.all(gap <= 3 * sd), (gap, sd)
    assert np.max(gap) < 0.25 * np.max(np.abs(u_of(plain.trace[0]) - plain.params.u))
    # from the pilot's point the loop settles in few round trips, fewer than from φ₀
    settled = [i for i, row in enumerate(r for r in piloted.trace if r["step"] == "stats")
               if np.max(np.abs(u_of(row) - piloted.params.u)) <= 1e-3]
    assert settled[0] <= 3 and piloted.epochs < plain.epochs


def test_pilot_requests_are_the_statistics_of_a_fixed_seeded_subsample(problem):
    models, knots, kernel = problem
    server = StatsServer(4, knots, kernel, FitConfig.of(mode="sync", scheme="stats", policy={"pilot_points": POINTS}),
                         start=FAR)
    tasks = []
    while server.phase in ("moments", "variogram", "pilot") and len(tasks) < 4:
        for j in range(4):
            p = server.next_task(j)
            if p is not None and p.step == PILOT_STEP:
                tasks.append(p)
            if p is not None:
                server.receive([evaluate(models[j], p, j)], 0.0)
    assert len(tasks) == 4 and all(p.extra == {"points": POINTS} for p in tasks)
    lm, p = models[0], tasks[0]
    xi = evaluate(lm, p, 0).xi
    idx = np.sort(np.random.default_rng(lm.VARIOGRAM_SEED).choice(lm.n, POINTS, replace=False))
    sub = type(lm)(lm.locs[idx], lm.z[idx], lm.X[idx], knots, kernel, "full")
    want = site_statistics(sub, p.params)
    assert xi["n"] == POINTS and xi["diagonal"] == 0.0 and lm.pilot(POINTS) is lm.pilot(POINTS)
    for key in ("S", "dS", "d2S", "d", "dd", "d2d"):
        np.testing.assert_allclose(xi[key], want[key], rtol=1e-12, atol=1e-12)
    assert lm.pilot(lm.n) is lm  # a site no larger than the subsample answers with all its data
    # the virtual clock charges the subsample's flops
    cost = FlopCost()
    assert cost.seconds(lm, p, 0.0) == pytest.approx(stats_flops(POINTS, lm.m, lm.p, "full", lm.vecchia_k) / cost.rate)
    full = Augmented(p.params, p.t, STATS_STEP)
    assert cost.seconds(lm, full, 0.0) > 10 * cost.seconds(lm, p, 0.0)


def test_the_pilot_runs_only_when_the_subsamples_are_a_small_share_of_the_data():
    assert pilot_size({0: 800, 1: 800, 2: 800, 3: 800}, 160, 0.25) == 640
    assert pilot_size({0: 800, 1: 800, 2: 800, 3: 800}, 201, 0.25) is None  # 804 > 0.25 · 3,200
    assert pilot_size({0: 4000, 1: 50}, 200, 0.25) == 250  # a small site gives all its points
    assert pilot_size({0: 4000, 1: 4000}, 0, 0.25) is None  # pilot_points = 0: no pilot


def test_the_pilot_stops_when_its_step_is_below_half_its_standard_error():
    policy = StatsPolicy()
    box = (np.full(3, -10.0), np.full(3, 10.0))
    pilot = Pilot(np.zeros(3), box, policy, 1.0, 1e-8, 50, n_s=1000, n=2000)
    at = Profile(u=np.zeros(3), loglik=0.0, grad=np.zeros(3), hess=-100.0 * np.eye(3), mu=np.zeros(0),
                 Sigma=np.zeros((0, 0)), gamma=np.zeros(0), n_obs=1000)
    sd = np.sqrt(0.01 * 0.5)  # (−H)⁻¹ (1 − N_s/N)
    assert pilot.settled(at, np.array([0.49 * sd, -0.49 * sd, 0.0]))
    assert not pilot.settled(at, np.array([0.51 * sd, 0.0, 0.0]))
    saddle = Profile(**{**vars(at), "hess": np.diag([-100.0, -100.0, 1.0])})
    assert not pilot.settled(saddle, np.array([1e-4, 0.0, 0.0]))  # no standard error away from a maximum
    assert pilot.settled(saddle, np.array([1e-9, 0.0, 0.0]))  # below tol


def test_a_site_dropped_in_the_pilot_leaves_its_subsample_and_the_fit_ends_at_the_others_optimum(small):
    models, knots, kernel = small
    dropped = []

    def on_event(server, now):
        if server.phase == "pilot" and server._pilot.rounds == 1 and not dropped:
            server.drop_worker(3, PILOT_STEP, "test", now)
            dropped.append(now)

    server = fit(small, on_event=on_event)
    three = fit((models[:3], knots, kernel))
    assert dropped and server.converged and server.n_obs == 1200
    assert server.loglik == pytest.approx(three.loglik, abs=1e-6)


def test_a_checkpoint_in_the_pilot_resumes_to_the_same_estimate(small, tmp_path):
    from spatialfed.algorithm.checkpoint import read_checkpoint, write_checkpoint

    models, knots, kernel = small
    snaps = []

    def on_event(server, now):
        if server.phase == "pilot" and server._pilot.rounds == 2 and not snaps:
            snaps.append(write_checkpoint(tmp_path / "fit.ckpt", server))

    whole = fit(small, on_event=on_event)
    resumed = run_virtual(models, knots, kernel, server=StatsServer.restore(read_checkpoint(snaps[0])))
    assert snaps and resumed._pilot.rounds == whole._pilot.rounds >= 3
    assert resumed.loglik == pytest.approx(whole.loglik, abs=1e-8)


def test_a_time_budget_spent_in_the_pilot_stops_the_fit_with_an_exact_loglik(problem, piloted):
    first = next(row["time_s"] for row in piloted.trace if row["step"] == "pilot")
    server = fit(problem, time_budget=first)
    assert server.stop_reason == "time_budget" and not server.converged and server.phase == "done"
    assert server.epochs == 0 and np.isfinite(server.loglik)


def test_a_start_nearer_the_optimum_than_the_pilot_can_tell_is_kept(problem, plain):
    """At the optimum itself ‖φ₀ − u_s‖² ≤ 2 tr C_s: the pilot ends after its first round and the loop starts at φ₀."""
    optimum = {"delta": plain.params.delta, "sigma2": plain.params.sigma2, "beta": plain.params.beta}
    server = fit(problem, start=optimum)
    assert server._pilot.rounds == 1 and server.epochs <= 2
    row = [r for r in server.trace if r["step"] == "pilot"][-1]
    np.testing.assert_allclose(u_of(row), plain.params.u, atol=1e-12)


def test_sites_with_a_diagonal_residual_end_the_pilot_at_phi0():
    models, knots, kernel = simulate(J=4, n=300, side=4, residual="mpp", seed=5)
    server = fit((models, knots, kernel), pilot=60)
    assert server._pilot.rounds == 1 and server.converged
    pilot_row, init_row = [r for r in server.trace if r["step"] == "pilot"][-1], server.trace[0]
    np.testing.assert_allclose(u_of(pilot_row), u_of(init_row), atol=1e-12)


def test_async_with_a_straggler_runs_the_pilot_and_reaches_the_same_optimum(small):
    server, sync = fit(small, mode="async"), fit(small)
    assert server._pilot.done and server._pilot.rounds >= 2 and server.converged
    assert server.loglik == pytest.approx(sync.loglik, abs=1e-6)
