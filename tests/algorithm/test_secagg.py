"""Secure aggregation's maths (algorithm/secagg.py): the masked sum decodes to the float sum, one site's masked
integers are uniform, and no proper subset's sum decodes."""

import numpy as np
import pytest
from scipy import stats

from spatialfed.algorithm import secagg


def _sites(J: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    keys = [secagg.private_key(rng.bytes(32)) for _ in range(J)]
    return keys, {j: secagg.public_bytes(k) for j, k in enumerate(keys)}


def _statistics(J: int, seed: int = 1):
    """Statistics-like answers: a k×k block over magnitudes 1e-8..1e8 of both signs, a log det, n."""
    rng = np.random.default_rng(seed)
    return [{"S": rng.standard_normal((7, 7)) * 10.0 ** rng.uniform(-8, 8, (7, 7)), "d": float(rng.normal(-300, 50)),
             "n": int(rng.integers(20, 200)), "u": np.array([0.1, 0.2, 0.3])} for _ in range(J)]


def test_encoding_round_trips_and_adds_as_integers():
    rng = np.random.default_rng(2)
    x = rng.standard_normal(1000) * 10.0 ** rng.uniform(-20, 25, 1000)
    assert np.allclose(secagg.decode(secagg.encode(x)), x, rtol=1e-15, atol=1e-31)
    y = -x[::-1]
    assert np.allclose(secagg.decode(secagg.add(secagg.encode(x), secagg.encode(y))), x + y, rtol=1e-15,
                       atol=1e-30)


def test_masked_sum_decodes_to_the_float_sum():
    J = 5
    keys, peers = _sites(J)
    xis = _statistics(J)
    round_id = b"round-0"
    messages = [secagg.masked_message(xi, keys[j], j, peers, round_id) for j, xi in enumerate(xis)]
    got = secagg.unmasked_sum(messages)
    assert set(got) == {"S", "d"}  # n and u travel in clear
    S = sum(xi["S"] for xi in xis)
    assert np.max(np.abs(got["S"] - S) / np.abs(S)) <= 1e-12
    assert abs(got["d"] - sum(xi["d"] for xi in xis)) <= 1e-12 * abs(got["d"])
    assert messages[0]["n"] == xis[0]["n"]


def test_one_sites_masked_integers_are_uniform():
    """Chi-square of the top byte of every limb of one site's masked answer against the uniform distribution."""
    J = 4
    keys, peers = _sites(J, seed=3)
    xi = {"S": np.full((60, 60), 1.0), "dS": np.zeros((3, 60, 60))}  # plain values far from uniform
    data = secagg.masked_message(xi, keys[1], 1, peers, b"round-7")[secagg.MASKED]["data"]
    top = (data >> np.uint64(56)).astype(np.int64).ravel()
    counts = np.bincount(top, minlength=256)
    assert stats.chisquare(counts).pvalue > 1e-3
    plain = (secagg.encode(np.concatenate([xi["S"].ravel(), xi["dS"].ravel()])) >> np.uint64(56)).ravel()
    assert stats.chisquare(np.bincount(plain.astype(np.int64), minlength=256)).pvalue < 1e-10


def test_a_subset_sum_does_not_decode():
    J = 4
    keys, peers = _sites(J, seed=4)
    xis = [{"S": np.eye(3) * (j + 1.0)} for j in range(J)]
    messages = [secagg.masked_message(xi, keys[j], j, peers, b"r") for j, xi in enumerate(xis)]
    part = secagg.unmasked_sum(messages[:3])["S"]
    assert np.min(np.abs(part - sum(xi["S"] for xi in xis[:3]))) > 1e3  # noise over the whole 2^255 range
    full = secagg.unmasked_sum(messages)["S"]
    assert np.allclose(full, np.eye(3) * 10.0, rtol=1e-14)


def test_masks_are_fresh_per_round():
    keys, peers = _sites(3, seed=5)
    a = secagg.masked_message({"S": np.ones(4)}, keys[0], 0, peers, b"a")[secagg.MASKED]["data"]
    b = secagg.masked_message({"S": np.ones(4)}, keys[0], 0, peers, b"b")[secagg.MASKED]["data"]
    assert not np.any(a == b)


def test_a_site_answers_its_key_first_and_refuses_reused_or_small_rounds():
    class Site:  # stands for the LocalModel the site's key is kept with
        pass

    lm, calls = Site(), []
    compute = lambda: calls.append(1) or {"S": np.ones(2)}  # noqa: E731
    first = secagg.site_answer(lm, {"round": b"r0", "peers": {0: None, 1: None, 2: None}}, 0, compute)
    own = first[secagg.KEY_ANSWER]
    assert calls == [] and len(own) == 32
    _, others = _sites(3, seed=6)
    peers = {**others, 0: own}
    assert secagg.MASKED in secagg.site_answer(lm, {"round": b"r1", "peers": peers}, 0, compute) and calls == [1]
    with pytest.raises(ValueError, match="twice"):
        secagg.site_answer(lm, {"round": b"r1", "peers": peers}, 0, compute)
    with pytest.raises(ValueError, match="fewer than 3"):
        secagg.site_answer(lm, {"round": b"r2", "peers": {0: own, 1: others[1]}}, 0, compute)


def test_out_of_range_values_are_refused():
    with pytest.raises(ValueError, match="range"):
        secagg.encode([2.0 ** 101])
    with pytest.raises(ValueError, match="finite"):
        secagg.encode([np.nan])
