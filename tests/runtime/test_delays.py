"""Delay models for experiments (VAFL §2.3, Assumptions 3 and 5, Appendix G): distributions, validation, parsing,
and their effect on the virtual-clock and Dask runtimes."""

import time
from collections import Counter

import numpy as np
import pytest
from scipy import stats
from support import simulate

from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.protocol import Augmented
from spatialfed.model.matern import Matern
from spatialfed.runtime import site
from spatialfed.runtime.delays import (
    ExponentialDelay,
    PoissonActivations,
    PoissonDelay,
    parse_activations,
    parse_delay,
)
from spatialfed.runtime.virtual import run_virtual

N_SAMPLES = 4000


def draws(model, j, seed=0, n=N_SAMPLES):
    rng = np.random.default_rng(seed)
    return np.array([model.sample(j, rng) for _ in range(n)])


def activation_times(model, j, n, seed=0):
    """The first n activations of worker j after time 0, each drawn from the previous one."""
    rng, now, times = np.random.default_rng(seed), 0.0, []
    for _ in range(n):
        now = model.next_activation(j, now, rng)
        times.append(now)
    return np.array(times)


def poisson_fit_pvalue(counts, mean):
    """Chi-square goodness of fit of integer counts to Poisson(mean); the cells beyond the 99% quantile merged."""
    top = int(stats.poisson.ppf(0.99, mean))
    observed = np.bincount(np.minimum(counts, top + 1), minlength=top + 2)
    expected = len(counts) * np.r_[stats.poisson.pmf(np.arange(top + 1), mean), stats.poisson.sf(top, mean)]
    return stats.chisquare(observed, expected).pvalue


# ---------------------------------------------------------------------------------------------------- distributions


def test_exponential_delays_are_exponential_with_each_workers_mean():
    model = ExponentialDelay([0.5, 2.0]).resolve(2)
    for j, mean in enumerate((0.5, 2.0)):
        x = draws(model, j)
        assert stats.kstest(x, stats.expon(scale=mean).cdf).pvalue > 0.01
        assert model.mean(j) == mean
    # the test has power: worker 1's delays are not those of worker 0
    assert stats.kstest(draws(model, 1), stats.expon(scale=0.5).cdf).pvalue < 0.01


def test_poisson_delays_are_unit_times_poisson_counts():
    model = PoissonDelay([0.5, 3.0], unit_s=0.25).resolve(2)
    for j, rate in enumerate((0.5, 3.0)):
        x = draws(model, j)
        counts = x / 0.25
        np.testing.assert_array_equal(counts, np.round(counts))  # multiples of the unit
        counts = counts.astype(int)
        se = np.sqrt(rate / N_SAMPLES)
        assert abs(counts.mean() - rate) < 4 * se
        assert counts.var(ddof=1) == pytest.approx(rate, rel=0.1)  # Poisson: variance = mean
        assert poisson_fit_pvalue(counts, rate) > 0.01
        assert model.mean(j) == pytest.approx(0.25 * rate)
    assert poisson_fit_pvalue((draws(model, 1) / 0.25).astype(int), 2.0) < 0.01  # power


def test_poisson_activations_have_exponential_gaps_and_poisson_counts():
    rate, n = 4.0, N_SAMPLES
    times = activation_times(PoissonActivations([1.0, rate]).resolve(2), 1, n)
    gaps = np.diff(np.r_[0.0, times])
    assert np.all(gaps > 0)
    assert stats.kstest(gaps, stats.expon(scale=1 / rate).cdf).pvalue > 0.01
    window = 0.5  # activations per window of 0.5 s ~ Poisson(rate · 0.5)
    counts = np.bincount((times[times < times[-1] // window * window] // window).astype(int))
    assert poisson_fit_pvalue(counts, rate * window) > 0.01
    assert poisson_fit_pvalue(counts, 1.5 * rate * window) < 0.01  # power


def test_vafl_presets_follow_the_papers_appendix_g():
    assert ExponentialDelay.vafl(3).mean_s == (1.0, 2.0, 3.0)  # G.3: "parameter m" read as the mean
    model = PoissonDelay.vafl(4)  # G.2: Poisson(2j) scaled by 1/(2J); the slowest worker's mean delay is 1 s
    assert model.rate == (2.0, 4.0, 6.0, 8.0) and model.unit_s == 1 / 8
    assert model.mean(3) == 1.0


def test_same_seed_same_draws_other_seed_other_draws():
    model = ExponentialDelay(1.0)
    np.testing.assert_array_equal(draws(model, 0, seed=3, n=50), draws(model, 0, seed=3, n=50))
    assert not np.array_equal(draws(model, 0, seed=3, n=50), draws(model, 0, seed=4, n=50))


# ------------------------------------------------------------------------------------------ validation and parsing


@pytest.mark.parametrize("build, message", [
    (lambda: ExponentialDelay(-0.1), "mean_s must be finite numbers ≥ 0"),
    (lambda: ExponentialDelay([0.1, float("nan")]), "finite"),
    (lambda: ExponentialDelay([]), "one number or a sequence"),
    (lambda: ExponentialDelay([[0.1]]), "one number or a sequence"),
    (lambda: PoissonDelay(-1, 0.1), "rate must be finite numbers ≥ 0"),
    (lambda: PoissonDelay(1, -0.1), "unit_s must be finite numbers ≥ 0"),
    (lambda: PoissonDelay(1, [0.1, 0.2]), "unit_s is one number"),
    (lambda: PoissonActivations(0.0), "activation rate must be finite numbers > 0"),
    (lambda: PoissonActivations(float("inf")), "> 0"),
    (lambda: ExponentialDelay([0.1, 0.2]).resolve(3), "got 2 values of mean_s for 3 workers"),
    (lambda: PoissonActivations(1.0).resolve(0), "at least one worker"),
])
def test_invalid_models_raise_naming_the_cause(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_resolve_gives_one_value_per_worker():
    assert ExponentialDelay(0.5).resolve(3).mean_s == (0.5, 0.5, 0.5)
    assert PoissonDelay((1, 2), 0.1).resolve(2) == PoissonDelay((1.0, 2.0), 0.1)
    assert PoissonActivations(np.array([1, 2])).resolve(2).rate == (1.0, 2.0)


@pytest.mark.parametrize("text, expected", [
    ("none", None),
    (" None ", None),
    ("exponential:0.5", ExponentialDelay((0.5, 0.5, 0.5))),
    ("exponential:0.1,0.2,0.3", ExponentialDelay((0.1, 0.2, 0.3))),
    ("Exponential:vafl", ExponentialDelay((1.0, 2.0, 3.0))),
    ("poisson:2:0.1", PoissonDelay((2.0, 2.0, 2.0), 0.1)),
    ("poisson:1,2,3:0.5", PoissonDelay((1.0, 2.0, 3.0), 0.5)),
    ("poisson:vafl", PoissonDelay((2.0, 4.0, 6.0), 1 / 6)),
])
def test_parse_delay(text, expected):
    assert parse_delay(text, 3) == expected


@pytest.mark.parametrize("text, message", [
    ("gamma:1", "cannot parse the delay model 'gamma:1'; expected none | exponential:MEAN"),
    ("exponential", "cannot parse the delay model"),
    ("poisson:2", "cannot parse the delay model 'poisson:2'.*poisson:RATE"),
    ("exponential:fast", "the exponential mean must be a number.*expected none"),
    ("exponential:0.1,0.2", "got 2 values of mean_s for 3 workers"),
    ("poisson:2:0.1,0.2", "unit_s is one number"),
    ("none:1", "cannot parse"),
])
def test_parse_delay_errors_quote_the_grammar(text, message):
    with pytest.raises(ValueError, match=message):
        parse_delay(text, 3)


def test_parse_activations():
    assert parse_activations("none", 2) is None
    assert parse_activations("poisson:2", 2) == PoissonActivations((2.0, 2.0))
    assert parse_activations("poisson:1,4", 2) == PoissonActivations((1.0, 4.0))
    for text, message in [("poisson:0", "> 0"), ("poisson:1:2", "expected none | poisson:RATE"),
                          ("exponential:1", "cannot parse the activation model"), ("poisson:1,2,3", "3 values")]:
        with pytest.raises(ValueError, match=message):
            parse_activations(text, 2)


# ---------------------------------------------------------------------------------------------- virtual runtime


@pytest.fixture(scope="module")
def data():
    return simulate(J=3, n=60, side=5, residual="pp")


def sync_rounds(models, knots, kernel, cfg):
    """The undelayed synchronous run and its number of rounds (equal workers finish each round together)."""
    batches = []
    base = run_virtual(models, knots, kernel, cfg, on_event=lambda server, now: batches.append(now))
    return base, len(batches)


def test_without_models_the_run_is_unchanged_and_draws_nothing(data):
    models, knots, kernel = data
    cfg = FitConfig.of(mode="async", agg_threshold=2, max_iter=8)
    base = run_virtual(models, knots, kernel, cfg, slowdowns="graded")
    assert run_virtual(models, knots, kernel, cfg, slowdowns="graded", delays=None, activations=None,
                       seed=5).trace == base.trace
    zero = run_virtual(models, knots, kernel, cfg, slowdowns="graded", delays=ExponentialDelay(0.0))
    assert zero.trace == base.trace  # a delay of exactly 0 leaves every time and decision as it was


@pytest.mark.parametrize("model", ["delays", "activations"])
def test_mean_extra_time_per_round_matches_the_expected_maximum(data, model):
    """Sync rounds with i.i.d. Exp(mean 1) delays — or rate-1 activations, memoryless, so the first activation after
    a round starts is Exp(1) away — on J = 3 workers last E max = 1 + 1/2 + 1/3 longer on average."""
    models, knots, kernel = data
    cfg = FitConfig.of(mode="sync", max_iter=30, tol=1e-300)  # never converged: all 30 iterations
    base, rounds = sync_rounds(models, knots, kernel, cfg)
    kw = {"delays": ExponentialDelay(1.0)} if model == "delays" else {"activations": PoissonActivations(1.0)}
    fit = run_virtual(models, knots, kernel, cfg, seed=2, **kw)
    per_round = (fit.trace[-1]["time_s"] - base.trace[-1]["time_s"]) / rounds
    sd_max = np.sqrt(1 + 1 / 4 + 1 / 9)  # sd of the maximum of 3 unit exponentials (Rényi representation)
    assert rounds > 90 and abs(per_round - 11 / 6) < 4 * sd_max / np.sqrt(rounds)
    strip = [{k: v for k, v in row.items() if k != "time_s"} for row in fit.trace]
    assert strip == [{k: v for k, v in row.items() if k != "time_s"} for row in base.trace]  # times only


def test_same_seed_reproduces_other_seed_differs(data):
    models, knots, kernel = data
    cfg = FitConfig.of(mode="async", agg_threshold=1, max_iter=10)
    kw = {"delays": PoissonDelay([1, 2, 3], 0.1), "activations": PoissonActivations(2.0)}
    one = run_virtual(models, knots, kernel, cfg, seed=1, **kw)
    assert run_virtual(models, knots, kernel, cfg, seed=1, **kw).trace == one.trace
    other = run_virtual(models, knots, kernel, cfg, seed=2, **kw)
    assert [r["time_s"] for r in other.trace] != [r["time_s"] for r in one.trace]


def test_an_activated_worker_takes_its_newest_task_so_staleness_is_lower_than_with_a_delay(data):
    """VAFL §2.3: a client pulls the server's state when it activates. Waiting for the activation *before* taking a
    task then computes at fresher parameters than computing a task fixed earlier and waiting after it."""
    models, knots, kernel = data
    cfg = FitConfig.tuned(agg_threshold=1, max_iter=60)
    rates = [1.0, 2.0, 4.0]
    activated = run_virtual(models, knots, kernel, cfg, activations=PoissonActivations(rates), seed=0)
    delayed = run_virtual(models, knots, kernel, cfg, delays=ExponentialDelay([1 / r for r in rates]), seed=0)
    staleness = [np.mean([r["max_staleness"] for r in fit.trace]) for fit in (activated, delayed)]
    assert staleness[0] < 0.85 * staleness[1]  # seeds 0–5: 4.3–4.8 against 5.2–7.4


def test_wrong_number_of_values_fails_before_any_task(data):
    models, knots, kernel = data
    with pytest.raises(ValueError, match="got 2 values of activation rate for 3 workers"):
        run_virtual(models, knots, kernel, FitConfig.of(mode="sync"), activations=PoissonActivations([1.0, 2.0]))


def test_poisson_activations_give_stale_but_geometric_tailed_async_runs_that_converge(data):
    """VAFL §2.3: with Poisson activations the delays (in server updates) are unbounded with a geometric tail.
    Balanced equal workers otherwise finish together (staleness 0); with activations staleness spreads out, its
    frequencies fall from the mode on, and the tuned async fit still reaches the synchronous maximum."""
    models, knots, kernel = data
    sync = run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=100, tol=1e-10))
    cfg = FitConfig.tuned(agg_threshold=1, max_iter=300)
    assert {row["max_staleness"] for row in run_virtual(models, knots, kernel, cfg).trace} == {0}
    fit = run_virtual(models, knots, kernel, cfg, activations=PoissonActivations(1.0), seed=0)
    counts = Counter(row["max_staleness"] for row in fit.trace)
    mode = max(counts, key=counts.get)
    tail = [counts[d] for d in range(mode, max(counts) + 1)]
    assert mode > 0 and max(counts) >= mode + 3
    assert tail == sorted(tail, reverse=True)
    assert fit.converged and fit.loglik == pytest.approx(sync.loglik, abs=1e-6)


# ------------------------------------------------------------------------------------------------- Dask runtime


def test_evaluate_task_sleeps_the_delay_and_activation_task_the_wait(store, knots):
    spec = site.SiteSpec("delay-test", str(store), 0, knots, Matern(0.5), "full")
    try:
        site.answer(spec, Augmented(None, 0, "moments"))  # load the partition once
        tic = time.perf_counter()
        q = site.answer(spec, Augmented(None, 0, "moments"), 1.0, 0.3)
        assert time.perf_counter() - tic >= 0.3 and q.step == "moments" and q.worker == 0
        tic = time.perf_counter()
        assert site.wake(0.2) == 0.2 and time.perf_counter() - tic >= 0.2
    finally:
        site.release("delay-test")


class RecordingClient:
    """A Dask client that records what run_dask submits (function, arguments, key) and forwards everything."""

    def __init__(self, client):
        self._client, self.submitted = client, {}

    def __getattr__(self, name):
        return getattr(self._client, name)

    def submit(self, fn, *args, **kwargs):
        self.submitted[kwargs["key"]] = (fn, args)
        return self._client.submit(fn, *args, **kwargs)


def test_dask_tasks_sleep_their_sampled_waits(tmp_path):
    """J = 2 on a 2-process LocalCluster: each evaluation task carries a sampled delay and its compute span in the task
    stream is at least that; with activations every evaluation follows an activation task that slept its wait."""
    from distributed import get_task_stream

    from spatialfed.data.simulate import simulate_store
    from spatialfed.runtime.cluster import local_cluster
    from spatialfed.runtime.dask_runtime import run_dask

    store = tmp_path / "s.zarr"
    simulate_store(store, 2, 40, seed=3, test_size=0)
    with local_cluster(2) as handle:
        client = RecordingClient(handle.client)
        with get_task_stream(handle.client) as ts:
            server, info = run_dask(client, store, 2, simulate(side=3)[1], 0.5, "full",
                                    FitConfig.of(mode="sync", max_iter=2), delays=ExponentialDelay([0.01, 0.03]),
                                    activations=PoissonActivations(40.0), seed=1)
    assert server.done
    tasks = {k: args for k, (fn, args) in client.submitted.items() if fn is site.answer}
    activations = {k: args for k, (fn, args) in client.submitted.items() if fn is site.wake}
    assert len(tasks) + len(activations) == info.n_tasks - 2  # all but the two load tasks
    assert len(activations) >= len(tasks) and all(args[0] > 0 for args in activations.values())
    delays = np.array([args[3] for args in tasks.values()])
    assert np.all(delays > 0)
    computed = {d["key"]: sum(s["stop"] - s["start"] for s in d["startstops"] if s["action"] == "compute")
                for d in ts.data}
    for key, args in tasks.items():
        assert computed[key] >= args[3] - 1e-3, key
    for key, args in activations.items():
        assert computed.get(key, args[0]) >= args[0] - 1e-3, key  # a cancelled leftover has no compute span
