"""outputs/nearest.py: the sites' nearest-observation distances asked only where a site can matter (exactly those
of asking every site, within the slack of the nearest), and the spatial order of the prediction batches."""

import numpy as np
import pytest

from spatialfed.cli import main
from spatialfed.data.store import load_test, open_store
from spatialfed.outputs import nearest
from spatialfed.outputs import prediction as pr


class Sites:
    """Sites answering calls from their own points (as a runtime would), counting the locations they are asked."""

    def __init__(self, parts):
        from scipy.spatial import cKDTree

        self.parts = parts
        self.n_workers = len(parts)
        self.asked = 0

        class Points:
            def __init__(self, locs):
                self.locs, self.tree = locs, cKDTree(locs)

            def nearest_distance(self, locs0):
                return self.tree.query(locs0, k=1)[0]

        self.models = [Points(p) for p in parts]

    def call(self, name, calls):
        if name == "bounds":
            return {j: (*self.parts[j].min(axis=0), *self.parts[j].max(axis=0)) for j in calls}
        self.asked += sum(len(args[0]) for args in calls.values())
        return {j: self.models[j].nearest_distance(*args) for j, args in calls.items()}


def _sites(partition: str, J: int = 16, n: int = 200, seed: int = 0):
    pts = np.random.default_rng(seed).random((J * n, 2))
    if partition == "area":  # a 4 × 4 grid of blocks
        k = int(np.sqrt(J))
        owner = np.minimum((pts[:, 0] * k).astype(int), k - 1) * k + np.minimum((pts[:, 1] * k).astype(int), k - 1)
    else:
        owner = np.arange(len(pts)) % J
    return [pts[owner == j] for j in range(J)]


@pytest.mark.parametrize("partition", ["area", "interleaved"])
@pytest.mark.parametrize("slack", [0.0, 0.05])
def test_the_distances_within_the_slack_of_the_nearest_are_every_sites(partition, slack):
    sites = Sites(_sites(partition))
    locs0 = np.random.default_rng(1).uniform(-0.2, 1.2, (3000, 2))  # inside and outside every site's box
    full = np.array([m.nearest_distance(locs0) for m in sites.models])
    got = nearest.nearest_distances(sites, locs0, nearest.site_boxes(sites), slack)
    near = full <= full.min(axis=0) + slack
    np.testing.assert_array_equal(got[near], full[near])         # every distance the caller uses: exact
    assert np.all((got == full) | np.isinf(got))                 # the rest: exact or not asked
    np.testing.assert_array_equal(got.argmin(axis=0), full.argmin(axis=0))
    if partition == "area":   # compact areas: a few sites per location, not J
        assert sites.asked < 0.3 * full.size


def test_the_spatial_order_keeps_a_batch_together():
    g = np.stack(np.meshgrid(np.arange(128.0), np.arange(64.0)), axis=-1).reshape(-1, 2)
    shuffled = g[np.random.default_rng(2).permutation(len(g))]
    order = nearest.spatial_order(shuffled)
    assert np.array_equal(np.sort(order), np.arange(len(g)))
    spans = [np.ptp(shuffled[order[i:i + 256]], axis=0) for i in range(0, len(g), 256)]
    # a batch of 256 of 8,192 grid cells spans a patch, not the domain: row order would span 128 × 2
    assert np.mean([w * h for w, h in spans]) < 4 * 256 and max(max(s) for s in spans) < 64


def test_predictions_do_not_depend_on_the_order_of_the_locations(tmp_path):
    store, fit = tmp_path / "s.zarr", tmp_path / "fit"
    assert main(["simulate", str(store), "--workers", "4", "--n-per-worker", "100", "--partition", "area",
                 "--noise-sd", "0.5", "--test-size", "300", "--seed", "5", "--quiet"]) == 0
    assert main(["fit", str(store), "--out", str(fit), "--runtime", "simulated", "--knots", "16", "--mode", "sync",
                 "--max-iter", "6", "--quiet"]) == 0
    model = pr.load_model(fit)
    locs0, _, X0 = load_test(store)
    perm = np.random.default_rng(3).permutation(len(locs0))
    with pr.open_workers(open_store(store), model, "simulated") as workers:
        for predictor in ("seamless", "lowrank"):
            a = pr.predict_at(workers, model, locs0, X0, predictor, chunk=64)
            b = pr.predict_at(workers, model, locs0[perm], X0[perm], predictor, chunk=64)
            for key in ("mean", "sd", "owner"):
                np.testing.assert_allclose(b[key], a[key][perm], rtol=1e-10, atol=1e-12, err_msg=key)
