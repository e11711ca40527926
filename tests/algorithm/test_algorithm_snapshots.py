"""One snapshot mechanism for every server: a snapshot taken mid-fit restores a server that holds every attribute the
original held, with equal values (what is in flight is re-sent, so the in-flight bookkeeping starts empty)."""

import copy
from collections import deque

import numpy as np
import pytest
from support import simulate

from spatialfed.algorithm.config import FitConfig, StatsPolicy
from spatialfed.algorithm.fgpr import FgprConfig, FgprServer
from spatialfed.algorithm.server import FederatedServer
from spatialfed.algorithm.stats_server import StatsServer
from spatialfed.model.local import LocalModel
from spatialfed.runtime.virtual import run_virtual

#: rebuilt by restore: the tasks in flight go back to the front of their site's buffer or are asked again
REBUILT = {"_in_flight", "_obsolete", "_P", "_pending"}


def same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple, deque)) and isinstance(b, (list, tuple, deque)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if hasattr(a, "__dict__") and type(a) is type(b) and not isinstance(a, type):
        return same(vars(a), vars(b))
    return a == b


def servers(knots, kernel):
    yield FederatedServer(4, knots, kernel, FitConfig.of(mode="async", max_iter=40))
    yield StatsServer(4, knots, kernel, FitConfig.stats(mode="sync", max_iter=40))
    yield StatsServer(4, knots, kernel, FitConfig.stats(mode="async", max_iter=40, policy=StatsPolicy()))
    yield FgprServer(4, kernel, FgprConfig(max_iter=6, seed=0))


@pytest.mark.parametrize("index", range(4))
def test_a_restored_server_holds_every_attribute_of_the_original(index):
    models, knots, kernel = simulate(J=4, n=40, side=3, residual="full", seed=5)
    server = list(servers(knots, kernel))[index]
    if isinstance(server, FgprServer):  # the independence model: no knots
        knots = np.zeros((0, 2))
        models = [LocalModel(lm.locs, lm.z, lm.X, knots, kernel, "full") for lm in models]
    taken = []

    def snap(s, now):
        if s.phase == "loop" and s.t >= 2 and not taken:
            taken.append((s.snapshot(), copy.deepcopy(vars(s))))

    run_virtual(models, knots, kernel, server=server, slowdowns=[1.0, 1.0, 2.0, 5.0], on_event=snap)
    assert taken, "the fit ended before a snapshot was taken"
    snapshot, held = taken[0]
    restored = type(server).restore(snapshot)
    missing = sorted(set(held) - set(vars(restored)))
    assert not missing, f"attributes left out of the snapshot: {missing}"
    differ = sorted(k for k in held if k not in REBUILT and not same(held[k], vars(restored)[k]))
    assert not differ, f"attributes restored with other values: {differ}"


def test_a_checkpoint_with_a_retired_policy_setting_restores():
    """A checkpoint of an earlier version names StatsPolicy.hold_share (retired: config.RETIRED), in the config and
    in the server's policy object: it decodes and restores with today's policy instead of failing on the setting."""
    from spatialfed.algorithm.checkpoint import decode_snapshot, encode_snapshot

    models, knots, kernel = simulate(J=4, n=40, side=3, residual="full", seed=5)
    server = StatsServer(4, knots, kernel, FitConfig.stats(mode="async", max_iter=40))
    taken = []
    run_virtual(models, knots, kernel, server=server, slowdowns=[1.0, 1.0, 2.0, 5.0],
                on_event=lambda s, now: taken.append(s.snapshot()) if s.phase == "loop" and not taken else None)
    doc, arrays = encode_snapshot(taken[0])
    doc["config"]["policy"]["hold_share"] = 0.15

    def add_hold(node):
        if isinstance(node, dict):
            if "StatsPolicy" in str(node.get("$obj", "")):
                node["state"]["hold_share"] = 0.15
                added.append(node)
            for value in node.values():
                add_hold(value)
        elif isinstance(node, list):
            for value in node:
                add_hold(value)
    added = []
    add_hold(doc)
    assert added
    restored = StatsServer.restore(decode_snapshot(doc, arrays))
    assert restored.config.policy == StatsPolicy() and restored.policy == StatsPolicy()
