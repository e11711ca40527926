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
