"""StatsServer (SPEC §2b, issue 13): one round trip per iteration, sync and async, against the centralized maximiser."""

import dataclasses

import numpy as np
import pytest
from support import LowRankReference, simulate

from spatialfed.algorithm.config import FitConfig, StatsPolicy
from spatialfed.algorithm.likelihood import distance
from spatialfed.algorithm.protocol import STATS_STEP, evaluate
from spatialfed.algorithm.stats_server import StatsServer
from spatialfed.model.reference import lowrank_loglik
from spatialfed.runtime.driver import drive
from spatialfed.runtime.virtual import VirtualRuntime, run_virtual

SLOW = [1.0, 1.0, 1.0, 15.0]  # one straggler


@pytest.fixture(scope="module", params=["pp", "full"])
def problem(request):
    models, knots, kernel = simulate(J=4, n=60, side=4, residual=request.param, seed=3)
    return models, knots, kernel, request.param


@pytest.fixture(scope="module")
def reference(problem):
    models, knots, kernel, residual = problem
    ref = LowRankReference(models, knots, kernel, residual)
    return ref.maximise(np.log([4.0, 1.0, 0.1]))


def fit(problem, mode, slowdowns="balanced", **config):
    models, knots, kernel, _ = problem
    server = StatsServer(len(models), knots, kernel, FitConfig.of(mode=mode, max_iter=300, **config))
    return run_virtual(models, knots, kernel, server=server, slowdowns=slowdowns)


@pytest.fixture(scope="module")
def sync(problem):
    return fit(problem, "sync", tol=1e-8)


def test_sync_reaches_the_reference_maximiser_in_few_round_trips(problem, reference, sync):
    models, knots, kernel, residual = problem
    gamma_hat, theta_hat, ll_hat = reference
    assert sync.converged and sync.stop_reason == "tol" and sync.phase == "done"
    # one round trip per iteration; pp starts far off (the variogram's nugget leaves out what pp drops into it), and
    # its first two steps in log δ look like a walk to a bound: the probe there is rejected, one more round trip
    assert sync.iterations <= {"full": 7, "pp": 10}[residual]
    assert sync.answers == [sync.iterations] * len(models)
    np.testing.assert_allclose([sync.params.delta, sync.params.sigma2, sync.params.beta], theta_hat, rtol=1e-4)
    np.testing.assert_allclose(sync.params.gamma, gamma_hat, rtol=1e-4, atol=1e-6)
    parts = [(lm.locs, lm.z, lm.X) for lm in models]
    exact = lowrank_loglik(parts, knots, kernel, residual, sync.params.gamma, sync.params.delta, sync.params.sigma2,
                           sync.params.beta)
    assert sync.loglik == pytest.approx(exact, rel=1e-10)  # the reported ℓ is exact at the reported estimate
    assert sync.loglik >= ll_hat - 1e-7
    assert sync.trace[-1]["step"] == "final" and sync.trace[-1]["loglik"] == sync.loglik


def test_sync_never_accepts_a_decrease(sync):
    lls = [ll for _, ll in sync.accepted]
    assert len(lls) >= 3 and all(b >= a - 1e-12 * abs(a) for a, b in zip(lls, lls[1:]))  # up to rounding


def test_async_with_a_straggler_reaches_the_same_optimum(problem, sync):
    fast = fit(problem, "async", SLOW, tol=1e-8)
    assert fast.converged and fast.stop_reason == "tol"
    assert fast.loglik == pytest.approx(sync.loglik, abs=1e-6)
    np.testing.assert_allclose(fast.params.u, sync.params.u, atol=1e-4)
    assert fast.answers[-1] < fast.answers[0]  # the straggler answered less often
    assert max(row["max_staleness"] for row in fast.trace) > 0  # stale sites entered through their Taylor models


def test_async_with_graded_sites_converges_to_the_same_optimum(problem, sync):
    graded = fit(problem, "async", [1.0, 2.0, 4.0, 8.0], tol=1e-8)
    assert graded.converged and graded.loglik == pytest.approx(sync.loglik, abs=1e-6)
    assert graded.answers[0] > graded.answers[-1]


def test_async_with_equal_sites_is_the_synchronous_run(problem, sync):
    same = fit(problem, "async", tol=1e-8)
    assert same.iterations == sync.iterations and same.loglik == sync.loglik
    assert [row["time_s"] for row in same.trace] == [row["time_s"] for row in sync.trace]


def test_requests_carry_u_and_answers_are_statistics(problem):
    models, knots, kernel, _ = problem
    server = StatsServer(len(models), knots, kernel, FitConfig.of(mode="sync"),
                         start={"delta": 4.0, "sigma2": 1.0, "beta": 0.1})
    for j, p in server.dispatch():  # moments first (φ₀ summaries), then statistics at u
        server.receive(evaluate(models[j], p, j), 0.0)
    tasks = server.dispatch()
    assert [p.step for _, p in tasks] == [STATS_STEP] * len(models)
    np.testing.assert_allclose(tasks[0][1].params.u, np.log([4.0, 1.0, 0.1]))
    q = evaluate(models[0], tasks[0][1], 0)
    assert set(q.xi) >= {"S", "dS", "d2S", "d", "dd", "d2d", "n"}


def test_snapshot_restore_ends_where_the_uninterrupted_fit_does(problem, tmp_path):
    """Through a checkpoint file (algorithm.checkpoint): the restored server ends where the whole run does."""
    from spatialfed.algorithm.checkpoint import read_checkpoint, write_checkpoint

    models, knots, kernel, _ = problem
    config = FitConfig.of(mode="async", tol=1e-8, max_iter=100)
    whole = run_virtual(models, knots, kernel, server=StatsServer(4, knots, kernel, config), slowdowns=SLOW)
    snaps = []

    def on_event(server, now):
        if server.phase == "loop" and server.t == 5 and not snaps:
            snaps.append(write_checkpoint(tmp_path / "fit.ckpt", server))

    run_virtual(models, knots, kernel, server=StatsServer(4, knots, kernel, config), slowdowns=SLOW, on_event=on_event)
    resumed = run_virtual(models, knots, kernel, server=StatsServer.restore(read_checkpoint(snaps[0])),
                          slowdowns=SLOW)
    assert resumed.loglik == pytest.approx(whole.loglik, abs=1e-8)
    np.testing.assert_allclose(resumed.params.u, whole.params.u, atol=1e-6)


def test_dropped_site_leaves_the_sums(problem):
    models, knots, kernel, _ = problem
    server = StatsServer(4, knots, kernel, FitConfig.of(mode="sync", tol=1e-8))
    dropped = []

    def on_event(server, now):
        if server.phase == "loop" and server.t == 2 and not dropped:
            server.drop_worker(3, STATS_STEP, "test", now)
            dropped.append(now)

    run_virtual(models, knots, kernel, server=server, on_event=on_event)
    assert server.converged and server.n_obs == sum(lm.n for lm in models[:3])
    alone = StatsServer(3, knots, kernel, FitConfig.of(mode="sync", tol=1e-8))
    three = run_virtual(models[:3], knots, kernel, server=alone)
    assert server.loglik == pytest.approx(three.loglik, abs=1e-6)


def test_a_range_running_to_its_bound_is_reported():
    """β boxed in below the maximiser: the fit stops on the bound, names it, and keeps ℓ increasing."""
    models, knots, kernel = simulate(J=3, n=60, side=4, residual="pp", seed=3)
    lo, hi = np.log([1e-3, 1e-3, 1e-3]), np.log([1e3, 1e3, 0.05])
    server = StatsServer(3, knots, kernel, FitConfig.of(mode="sync", tol=1e-8, max_iter=30), bounds=(lo, hi))
    run_virtual(models, knots, kernel, server=server)
    assert server.phase == "done" and server.boundary == ("beta",)
    assert server.params.beta == pytest.approx(0.05)
    lls = [ll for _, ll in server.accepted]
    assert all(b >= a - 1e-12 * abs(a) for a, b in zip(lls, lls[1:]))


def test_privacy_is_refused(problem):
    models, knots, kernel, _ = problem
    with pytest.raises(ValueError, match="privacy"):
        StatsServer(4, knots, kernel, FitConfig.of(mode="sync", privacy={"noise_multiplier": 1.0, "clip": 1.0}))


class Recording(StatsServer):
    """A StatsServer that records every statistics request it hands out: (site, u, time) in `requests`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.requests = []

    def next_task(self, j, free=True):
        p = super().next_task(j, free)
        if p is not None and p.step == STATS_STEP:
            self.requests.append((j, p.params.u.copy(), self._last_now))
        return p


def fit_recorded(problem, slowdowns, **policy):
    models, knots, kernel, _ = problem
    config = FitConfig.of(mode="async", max_iter=300, tol=1e-8, policy=policy or None)
    server = Recording(len(models), knots, kernel, config)
    return run_virtual(models, knots, kernel, server=server, slowdowns=slowdowns)


def test_the_slowest_site_is_never_idle_and_answers_at_the_epochs(problem, sync):
    """The straggler is asked again the moment it answers (its requests follow one another without a gap), and
    always at an epoch's point, which every other site is asked at too."""
    fit_ = fit_recorded(problem, SLOW)
    straggler = len(SLOW) - 1
    mine = [(u, when) for j, u, when in fit_.requests if j == straggler]
    assert len(mine) >= 2 and fit_.converged and fit_.loglik == pytest.approx(sync.loglik, abs=1e-6)
    round_trip = fit_.pacing.durations[STATS_STEP][straggler]
    for (u, sent), (_, next_sent) in zip(mine, mine[1:]):
        assert next_sent == pytest.approx(sent + round_trip, rel=1e-9)  # asked again on arrival
        assert all(any(k == j and np.array_equal(v, u) for k, v, _ in fit_.requests) for j in range(straggler))
    eager = fit_recorded(problem, SLOW, explore=False)  # epochs only: the synchronous run's points and pace
    assert [u.tolist() for j, u, _ in eager.requests if j == straggler] == \
        [u.tolist() for j, u, _ in fit_recorded_sync(problem, SLOW).requests if j == straggler]


def fit_recorded_sync(problem, slowdowns):
    models, knots, kernel, _ = problem
    server = Recording(len(models), knots, kernel, FitConfig.of(mode="sync", max_iter=300, tol=1e-8))
    return run_virtual(models, knots, kernel, server=server, slowdowns=slowdowns)


@pytest.mark.parametrize("slowdowns", [SLOW, [1.0, 2.0, 4.0, 8.0], [1.0, 1.3, 1.7, 2.2], [1.0, 1.0, 1.0, 1.5]])
def test_async_ends_no_later_than_sync(problem, sync, slowdowns):
    """The guarantee of docs/algorithm.md: epochs last what a synchronous iteration lasts and their points are at
    least the synchronous step, so async ends no later than sync, up to a fast site's round trip."""
    models, knots, kernel, _ = problem
    runs = {mode: run_virtual(models, knots, kernel, slowdowns=slowdowns,
                              server=StatsServer(len(models), knots, kernel, FitConfig.of(mode=mode, max_iter=300,
                                                                                       tol=1e-8)))
            for mode in ("sync", "async")}
    durations = runs["async"].pacing.durations[STATS_STEP].values()
    fast, slowest = min(durations), max(durations)
    assert runs["async"].converged and runs["async"].loglik == pytest.approx(sync.loglik, abs=1e-6)
    assert runs["async"].trace[-1]["time_s"] <= runs["sync"].trace[-1]["time_s"] + fast


@pytest.fixture(scope="module")
def eight():
    """Eight sites, the last 15× slower: one site's data moves the optimum little, and φ₀ is far from it."""
    models, knots, kernel = simulate(J=8, n=60, side=4, residual="pp", seed=3)
    return models, knots, kernel, "pp"


def epoch_points(fit_, j):
    """The points site j was asked at in the loop (its φ₀ passes are not statistics requests), in order."""
    return [u for k, u, _ in fit_.requests if k == j]


def test_a_straggler_is_asked_at_the_start_at_once_and_the_first_two_epochs_are_sync_s(eight):
    """No hold (docs/algorithm.md, "Tried and not kept"): the straggler's first request is φ₀, handed out as the
    loop begins; the surrogate, unmeasured until an epoch's increase shows how well it predicts, picks neither of the
    first two epoch points, so the straggler's first two requests are sync's; the fit ends on sync's optimum, no
    later than a fast round trip after sync's end."""
    slow = [1.0] * 7 + [15.0]
    fit_, sync_ = fit_recorded(eight, slow), fit_recorded_sync(eight, slow)
    init = fit_.trace[0]
    (u, when) = next((u, when) for k, u, when in fit_.requests if k == 7)
    np.testing.assert_allclose(u, np.log([init["delta"], init["sigma2"], init["beta"]]), atol=1e-12)
    assert when == pytest.approx(init["time_s"], abs=1e-12)
    mine, theirs = epoch_points(fit_, 7), epoch_points(sync_, 7)
    assert len(mine) >= 3 and len(theirs) >= 3
    np.testing.assert_array_equal(np.array(mine[:2]), np.array(theirs[:2]))
    fast = min(fit_.pacing.durations[STATS_STEP].values())
    assert fit_.converged and fit_.loglik == pytest.approx(sync_.loglik, abs=1e-6)
    assert fit_.trace[-1]["time_s"] <= sync_.trace[-1]["time_s"] + fast


def test_the_trace_holds_estimates_from_every_site_only(problem):
    """A surrogate step taken while a site is stood in for (the straggler has not answered yet) is a probe, not an
    estimate: no trace row before the straggler's first answer."""
    fit_ = fit_recorded(problem, SLOW)
    first_answer = min(when for j, _, when in fit_.requests if j == 3) + fit_.pacing.spread[3][0]
    rows = [row for row in fit_.trace if row["step"] == STATS_STEP]
    assert rows and min(row["time_s"] for row in rows) >= first_answer * (1 - 1e-12)


def test_equal_sites_are_asked_together(problem):
    same = fit_recorded(problem, "balanced")
    by_time = {}
    for j, u, when in same.requests:
        by_time.setdefault(when, []).append((j, u))
    assert all(sorted(j for j, _ in asked) == list(range(len(problem[0]))) and
               all(np.array_equal(u, asked[0][1]) for _, u in asked) for asked in by_time.values())


@pytest.mark.parametrize("control_variates", [True, False])
def test_control_variates_keep_the_optimum(problem, sync, control_variates):
    """The stale-site model (plain Taylor or control variate) changes the path, never the exact optimum."""
    fit_ = fit_recorded(problem, [1.0, 2.0, 4.0, 8.0], control_variates=control_variates)
    assert fit_.converged and fit_.loglik == pytest.approx(sync.loglik, abs=1e-6)
    np.testing.assert_allclose(fit_.params.u, sync.params.u, atol=1e-4)


def test_async_with_equal_sites_and_jittered_answers_keeps_the_synchronous_pace(problem, sync):
    """Equal sites whose answers come a little apart (network delays ~5 % of a round trip): a site done early
    takes no extra work it could not finish before the next epoch, so async keeps sync's pace."""
    from spatialfed.runtime.delays import ExponentialDelay

    models, knots, kernel, _ = problem
    round_trip = sync.trace[-1]["time_s"] / sync.answers[0]
    jitter = ExponentialDelay(0.05 * round_trip)
    runs = {mode: run_virtual(models, knots, kernel, server=StatsServer(len(models), knots, kernel,
                                                                        FitConfig.of(mode=mode, max_iter=300, tol=1e-8)),
                              delays=jitter, seed=1)
            for mode in ("sync", "async")}
    assert runs["async"].converged and runs["async"].loglik == pytest.approx(sync.loglik, abs=1e-6)
    assert runs["async"].trace[-1]["time_s"] <= 1.05 * runs["sync"].trace[-1]["time_s"]


def test_sites_answering_along_the_path_get_third_order_models(problem, sync):
    """A site whose two answers before its latest lie within secant_reach of it gets third derivatives from them
    (stale.secant) for its model in the surrogate; this changes the path, not the optimum."""
    from spatialfed.algorithm.likelihood import distance, taylor_statistics
    from spatialfed.algorithm.site_records import SiteRecords

    secants = []

    class Kept(SiteRecords):
        def secant_model(self, j):
            model = super().secant_model(j)
            if model is not None:
                secants.append((model, [x["u"] for x in self.earlier[j]]))
            return model

    models, knots, kernel, _ = problem
    server = StatsServer(len(models), knots, kernel, FitConfig.of(mode="async", max_iter=300, tol=1e-8))
    server.records = Kept(server.policy)
    run_virtual(models, knots, kernel, server=server, slowdowns=[1.0, 2.0, 4.0, 8.0])
    assert secants
    for model, earlier in secants:
        assert "d3S" in model and len(earlier) == 2
        assert all(1e-4 <= distance(v, model["u"]) <= server.policy.secant_reach for v in earlier)
    assert server.converged and server.loglik == pytest.approx(sync.loglik, abs=1e-6)


def test_a_step_cut_at_the_smallest_radius_is_judged_so_the_radius_can_grow(problem):
    """A surrogate step shorter than settle_tol is judged when it reached the radius, so a radius shrunk below
    settle_tol can grow again (unjudged, area partitions crawled 1e-2 per aggregation for 40 aggregations)."""
    from spatialfed.algorithm.likelihood import profile_loglik, sum_statistics
    from spatialfed.algorithm.protocol import Augmented
    from spatialfed.algorithm.stats_server import Promise
    from spatialfed.model.params import Params
    from spatialfed.model.stats import site_statistics

    models, knots, kernel, _ = problem
    old = np.log([4.0, 1.0, 0.1])
    server = StatsServer(len(models), knots, kernel, FitConfig.of(mode="async"))
    settle = server.policy.settle_tol
    r = 0.8 * settle  # a radius below settle_tol (after a rejected step) and a step that reached it
    new = old + np.array([r, 0.0, 0.0])
    at = lambda u: sum_statistics([site_statistics(lm, u) for lm in models])  # noqa: E731
    before = profile_loglik(at(old), knots, kernel, derivatives=False).loglik
    phi = Params(np.zeros(len(knots)), np.eye(len(knots)), np.zeros(1), *np.exp(new))
    for rise, radius in ((1.0, 2 * r), (-0.5, settle)):  # the newer model's ℓ rose as promised / fell
        server._explore, server._explore_radius = Augmented(phi, 0, STATS_STEP), r
        server._promise = Promise(tuple(phi.u.tolist()), tuple(old.tolist()), 1.0, before, None)
        server._check_promise(at, before + rise)
        assert server._explore_radius == pytest.approx(radius)


def test_an_error_inside_an_aggregation_enters_the_error_phase(problem):
    """A receive whose aggregation raises leaves the server in the error phase (docs/interfaces.md): the error is
    raised, stop_reason names it, and further input is refused."""
    from spatialfed.errors import SpatialFedError

    models, knots, kernel, _ = problem
    server = StatsServer(len(models), knots, kernel, FitConfig.of(mode="sync"),
                         start={"delta": 4.0, "sigma2": 1.0, "beta": 0.1})
    for j, p in server.dispatch():
        server.receive(evaluate(models[j], p, j), 0.0)
    answers = []
    for j, p in server.dispatch():
        q = evaluate(models[j], p, j)
        answers.append(dataclasses.replace(q, xi={**q.xi, "S": -q.xi["S"]}))  # not positive definite
    with pytest.raises(Exception):
        server.receive(answers, 1.0)
    assert server.phase == "error" and server.stop_reason.startswith("error")
    with pytest.raises(SpatialFedError, match="stopped on an error"):
        server.receive(answers[:1], 2.0)


def test_a_batch_with_one_bad_quantity_changes_nothing(problem):
    """Every quantity of a batch is checked before any is applied."""
    models, knots, kernel, _ = problem
    server = StatsServer(len(models), knots, kernel, FitConfig.of(mode="async"),
                         start={"delta": 4.0, "sigma2": 1.0, "beta": 0.1})
    for j, p in server.dispatch():
        server.receive(evaluate(models[j], p, j), 0.0)
    tasks = dict(server.dispatch())
    good = evaluate(models[0], tasks[0], 0)
    bad = dataclasses.replace(evaluate(models[1], tasks[1], 1), t=tasks[1].t + 5)  # not the task in flight
    with pytest.raises(RuntimeError, match="answered"):
        server.receive([good, bad], 1.0)
    assert server.answers == [0] * len(models) and server.busy(0) and server.busy(1)


def test_a_time_budget_that_ends_during_the_initialisation_stops_with_an_exact_estimate(problem):
    """A budget shorter than the φ₀ passes: the fit stops at its first point with ℓ exact there (no TypeError)."""
    models, knots, kernel, _ = problem
    for mode in ("sync", "async"):
        server = StatsServer(len(models), knots, kernel, FitConfig.of(mode=mode, time_budget=1e-9))
        run_virtual(models, knots, kernel, server=server, slowdowns=SLOW)
        assert server.done and server.stop_reason == "time_budget" and not server.converged
        assert np.isfinite(server.loglik) and server.trace[-1]["step"] == "final"


class SharedCores(VirtualRuntime):
    """Sites whose processors are never free between their own tasks (many sites sharing few cores, all busy)."""

    def free(self, j):
        return False


@pytest.mark.parametrize("slowdowns", [[1.0, 1.3, 1.7, 2.2], [1.0, 1.0, 1.0, 1.5]])
def test_async_without_a_free_processor_asks_only_the_synchronous_points(problem, slowdowns):
    """Spare work (explorations) and the surrogate steps that place it wait for a free processor
    (runtime.free): with none, the asynchronous fit asks every site exactly the synchronous fit's points."""
    models, knots, kernel, _ = problem
    config = FitConfig.of(mode="async", max_iter=300, tol=1e-8)
    shared = drive(Recording(len(models), knots, kernel, config), SharedCores(models, slowdowns))
    sync = fit_recorded_sync(problem, slowdowns)
    asked = sorted((j, u.tolist()) for j, u, _ in shared.requests)
    assert asked == sorted((j, u.tolist()) for j, u, _ in sync.requests)
    assert shared.loglik == pytest.approx(sync.loglik, abs=1e-9)
    assert shared.t == sync.t  # and no surrogate step took the server's share of the cores (each adds to t)
    assert len(fit_recorded(problem, slowdowns).requests) > len(asked)  # with free processors it explores


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_round_that_quadratic_convergence_predicts_to_stop_is_skipped(problem, reference, monkeypatch, mode):
    """Two pure Newton steps in a row predict the next (newton_settled): when it meets the stop rule the fit ends at
    u + p without asking the sites there, one round trip earlier, at the same optimum with ℓ of the model there."""
    from spatialfed.algorithm import likelihood

    models, knots, kernel, residual = problem
    slow = SLOW if mode == "async" else "balanced"
    skipping = fit(problem, mode, slowdowns=slow)
    monkeypatch.setattr(likelihood, "newton_settled", lambda *args: False)
    confirming = fit(problem, mode, slowdowns=slow)
    assert skipping.converged and confirming.converged
    assert skipping.epochs <= confirming.epochs - (1 if mode == "sync" else 0)
    assert skipping.time_s < confirming.time_s or mode == "async"
    u = np.log([skipping.params.delta, skipping.params.sigma2, skipping.params.beta])
    assert np.max(np.abs(u - np.log(reference[1]))) <= FitConfig().stopping.tol  # within the fit's tolerance of the maximiser
    parts = [(lm.locs, lm.z, lm.X) for lm in models]
    exact = lowrank_loglik(parts, knots, kernel, residual, skipping.params.gamma, *np.exp(u))
    assert skipping.loglik == pytest.approx(exact, rel=1e-10)  # the second-order model's ℓ at u + p is exact there


def test_config_resolved_once_as_the_statistics_scheme():
    # an async config without agg_threshold aggregates every answer; one given is kept; sync aggregates all J
    _, knots, kernel = simulate(J=4, n=20, side=4, residual="full", seed=3)
    unset = StatsServer(4, knots, kernel, FitConfig.of(mode="async")).config
    assert (unset.scheme_name, unset.agg_threshold, unset.n_workers) == ("stats", 1, 4)
    assert unset == FitConfig.stats(mode="async").resolved(4)
    assert StatsServer(4, knots, kernel, FitConfig.of(mode="async", agg_threshold=3)).config.agg_threshold == 3
    assert StatsServer(4, knots, kernel, FitConfig.of(mode="sync")).config.agg_threshold == 4
    assert StatsServer(4, knots, kernel).config.scheme_name == "stats"
    with pytest.raises(ValueError, match="takes no block-scheme settings"):
        StatsServer(4, knots, kernel, FitConfig.of(mode="async", correction=True))
