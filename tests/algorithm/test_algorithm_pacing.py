"""Pacing of the asynchronous statistics loop (algorithm/pacing.py): predictions from measured round trips only."""

import pytest

from spatialfed.algorithm.pacing import Pacing
from spatialfed.algorithm.protocol import STATS_STEP


def timed(rounds: dict, kind: str = STATS_STEP) -> Pacing:
    pacing = Pacing()
    for j, r in rounds.items():
        pacing.sent(j, 0.0)
        pacing.arrived(j, kind, r)
    return pacing


def test_a_round_trip_is_the_last_one_measured():
    pacing = timed({0: 1.0, 1: 3.0})
    pacing.sent(0, 10.0)
    pacing.arrived(0, STATS_STEP, 12.5)
    assert pacing.round_trip(0, [0, 1]) == pytest.approx(2.5) and pacing.round_trip(1, [0, 1]) == 3.0


def test_before_its_first_statistics_a_round_trip_follows_its_least_slowness_in_the_initialisation():
    pacing = timed({0: 0.1, 1: 0.1, 2: 2.0}, kind="variogram")  # site 2 is 20× the median in the variogram pass
    for j, r in {0: 0.05, 1: 0.05, 2: 1.5}.items():  # ... and 30× in the moments pass
        pacing.sent(j, 0.0)
        pacing.arrived(j, "moments", r)
    for j, r in {0: 1.0, 1: 1.2}.items():
        pacing.sent(j, 5.0)
        pacing.arrived(j, STATS_STEP, 5.0 + r)
    # 20× (the smaller) the median statistics round trip of the others, 1.1
    assert pacing.round_trip(2, [0, 1, 2]) == pytest.approx(20.0 * 1.1)
    pacing.sent(1, 6.0)
    pacing.arrived(1, "moments", 6.5)  # one delayed tiny task: site 1 is not slow in the variogram pass
    assert pacing.round_trip(1, [0, 1, 2]) == pytest.approx(1.2)  # it has a statistics round trip: that one
    assert Pacing().round_trip(0, [0]) is None


def test_the_epoch_is_due_when_its_slowest_owed_answer_is():
    pacing = timed({0: 1.0, 1: 4.0, 2: 2.0})
    pacing.sent(1, 10.0)  # asked at the epoch's point at 10
    pacing.sent(2, 11.0)  # busy with another task since 11: two round trips
    assert pacing.epoch_due([1, 2], [0, 1, 2], {1: False, 2: True}, 12.0) == pytest.approx(max(14.0, 15.0))
    assert pacing.epoch_due([1, 3], [0, 1, 2, 3], {}, 12.0) is None  # site 3 never timed


@pytest.mark.parametrize("now, allowed", [(10.0, True), (12.0, True), (12.01, False)])
def test_a_site_takes_extra_work_only_if_it_can_answer_the_next_epoch_in_time(now, allowed):
    """now + 2·r_j ≤ due + T: r_j = 1, the epoch due at 10, the slowest round trip T = 4."""
    pacing = timed({0: 1.0, 1: 4.0})
    assert pacing.may_work(0, now, 10.0, [0, 1]) is allowed
    assert pacing.may_work(0, now, None, [0, 1])  # nothing predicted: nothing held back


def test_the_asynchronous_server_reads_each_round_trip_a_bounded_number_of_times_per_answer(monkeypatch):
    """The driver asks every idle site for a task after each answer, and each ask reads pacing's predictions: they
    are kept until a task is sent or arrives (StatsServer._pace, Pacing.slowest), so a J-site fit reads O(J) round
    trips per answer, not O(J²) (at J = 200 the repeated reads were 0.4 of the server's CPU)."""
    from support import simulate

    from spatialfed.algorithm.config import FitConfig
    from spatialfed.algorithm.stats_server import StatsServer
    from spatialfed.runtime.virtual import run_virtual

    models, knots, kernel = simulate(J=24, n=30, side=3, residual="pp", seed=5)
    reads = []
    original = Pacing.round_trip
    monkeypatch.setattr(Pacing, "round_trip", lambda self, *a, **k: reads.append(1) or original(self, *a, **k))
    server = StatsServer(len(models), knots, kernel, FitConfig.of(mode="async", max_iter=100, tol=1e-8))
    done = run_virtual(models, knots, kernel, server=server, slowdowns=[1.0 + 0.5 * j for j in range(24)])
    assert done.converged
    per_answer = len(reads) / sum(done.answers) / len(models)  # 0.87 J per answer; 2.7 J when every ask recomputes
    assert per_answer <= 1.5, per_answer
