"""The checkpoint cadence of `runtime.driver.Checkpointer` (docs/recovery.md): every CLI fit keeps a checkpoint, so the
default must stay cheap — every 10 aggregations, but never more than 5 % of the wall time spent writing; an explicit
`every` is exact. Driven with a fake clock (each aggregation 10 ms, each write `cost` seconds): deterministic."""

import pytest

from spatialfed.runtime import driver


class Clock:
    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class Server:
    phase, t = "loop", 0


def _writes(monkeypatch, tmp_path, every, cost, n_iter=200):
    clock = Clock()
    monkeypatch.setattr(driver, "time", clock)
    written = []

    def write_checkpoint(path, server, meta=None):
        clock.now += cost
        written.append(server.t)

    monkeypatch.setattr("spatialfed.algorithm.checkpoint.write_checkpoint", write_checkpoint)
    ck, server = driver.Checkpointer(tmp_path / "c.ckpt", every, {}), Server()
    for t in range(1, n_iter + 1):
        clock.now += 0.01
        server.t = t
        ck.on_event(server)
    assert ck.writes == len(written)
    return written


def test_default_cadence_is_every_10_aggregations_when_writes_are_cheap(monkeypatch, tmp_path):
    assert _writes(monkeypatch, tmp_path, None, cost=0.001) == list(range(10, 201, 10))


@pytest.mark.parametrize("cost", [0.02, 0.2])
def test_default_cadence_spends_at_most_5_percent_of_the_time_writing(monkeypatch, tmp_path, cost):
    written = _writes(monkeypatch, tmp_path, None, cost=cost)
    # after a write of `cost` s the next waits until cost <= 5 % of the time since: 20·cost s = 2000·cost aggregations
    assert written[0] == 10 and all(b - a >= 2000 * cost for a, b in zip(written, written[1:]))
    assert len(written) == (5 if cost == 0.02 else 1)  # t = 10, 51, 92, 133, 174 (gaps of 40 + the write's 0.02 s)
    assert len(written) * cost <= 0.05 * (200 * 0.01 + len(written) * cost) + cost  # one write may overshoot


def test_an_explicit_every_is_exact_whatever_a_write_costs(monkeypatch, tmp_path):
    assert _writes(monkeypatch, tmp_path, 10, cost=1.0) == list(range(10, 201, 10))
