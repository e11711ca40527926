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
