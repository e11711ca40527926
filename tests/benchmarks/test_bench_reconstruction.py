"""benchmarks/bench_reconstruction.py: the curious server's attack on one site's messages over a real sync fit
(simulated runtime, 3 sites of 20 points, 25 knots) recovers the site's values from its plain statistics given its
locations, and not from the sum over the 3 sites that secure aggregation releases."""

import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_reconstruction as br  # noqa: E402


@pytest.fixture(scope="module")
def recorded():
    return br.record_fit(20, 25, seed=0)


def test_the_plain_statistics_give_a_planted_sites_values(recorded):
    locs, z, X = recorded["parts"][0]
    own = recorded["messages"][0]
    assert len(br.theta_messages(own)) >= 1 and any("Xtz" in q for q in own)  # what the server really received
    z_hat = br.recover_values(locs, X, recorded["knots"], recorded["kernel"], own)
    assert br.value_scores(z_hat, z)["rel_error"] <= 1e-3


def test_the_sum_over_three_sites_does_not_give_them(recorded):
    locs, z, X = recorded["parts"][0]
    z_hat = br.recover_values(locs, X, recorded["knots"], recorded["kernel"], br.summed(recorded["messages"]))
    scores = br.value_scores(z_hat, z)
    assert scores["rel_error"] > 0.5 and scores["within_1pct"] < 0.2
    sums = br.summed(recorded["messages"])
    want = sum(np.asarray(recorded["messages"][j][-1]["S"]) for j in range(3))
    np.testing.assert_allclose(sums[-1]["S"], want, rtol=1e-12)  # the release the attack had: the true sum


def _numeric(value) -> bool:
    try:
        return np.asarray(value).dtype.kind in "fiub"
    except (TypeError, ValueError):
        return False


def test_one_sites_masked_messages_do_not_give_them(recorded):
    """Site 0's real messages masked as a secure-aggregation fit masks them (algorithm/secagg.py, keys of 3 sites):
    decoded alone, what the server holds of site 0 gives nothing; decoded with the other two, only the sum."""
    from spatialfed.algorithm import secagg

    keys = [secagg.private_key(bytes([j + 1]) * 32) for j in range(3)]
    peers = {j: secagg.public_bytes(k) for j, k in enumerate(keys)}
    locs, z, X = recorded["parts"][0]
    alone, together = [], []
    for i, qs in enumerate(zip(*(recorded["messages"][j] for j in range(3)))):
        round_id = i.to_bytes(8, "big")
        numbers = [{k: v for k, v in q.items() if _numeric(v) or k in secagg.PUBLIC} for q in qs]
        masked = [secagg.masked_message(q, keys[j], j, peers, round_id) for j, q in enumerate(numbers)]
        public = {k: v for k, v in qs[0].items() if k in secagg.PUBLIC or not _numeric(v)}
        alone.append({**public, **secagg.unmasked_sum(masked[:1])})
        together.append({**public, **secagg.unmasked_sum(masked)})
    scores = br.value_scores(br.recover_values(locs, X, recorded["knots"], recorded["kernel"], alone), z)
    assert scores["rel_error"] > 0.5 and scores["within_1pct"] < 0.2
    want = br.summed(recorded["messages"])
    np.testing.assert_allclose(together[-1]["S"], want[-1]["S"], rtol=1e-12, atol=1e-12 * np.abs(want[-1]["S"]).max())
