"""A site process holding several partitions keeps their data and O(n_j (m + p)) numbers each between requests,
never an n_j × n_j matrix (issue 14), whatever the residual; prediction adds one factorisation per site."""

import numpy as np
import pytest
from conftest import grid_knots

from spatialfed.algorithm.protocol import Augmented
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params
from spatialfed.runtime import site


@pytest.mark.parametrize("residual", ["full", "mpp"])
def test_registry_keeps_no_n_by_n_array_between_requests(store, residual):
    knots = grid_knots(3)
    m = len(knots)
    specs = site.site_specs(f"memtest-{residual}", store, 3, knots, Matern(0.5), residual)
    try:
        p = site.load(specs[0])["p"]
        par = Params(np.zeros(m), 0.1 * np.eye(m), np.zeros(p), 0.25, 1.0, 0.1)
        for spec in specs:
            for step in ("mu_sigma", "gamma", "theta", "stats"):
                site.answer(spec, Augmented(par, 0, step))
        kept = site.kept_bytes(specs[0].run_id)
        assert sorted(kept) == [spec.key for spec in specs]
        for spec in specs:
            lm = site.local_model(spec)
            k = lm.m + lm.p + 1
            assert kept[spec.key] <= 8 * lm.n * (3 + lm.p + k)  # data + the whitened [B, X, z]
            assert all(a.size < lm.n * lm.n for a in lm.cached_arrays())
            assert (lm.cached_nbytes() > 0) == (residual == "full")  # mpp/pp: answer drops the whitened data
        site.call(specs[0], "residual_kriging", (np.array([[0.5, 0.5]]), par))
        lm = site.local_model(specs[0])
        assert sum(a.size >= lm.n * lm.n for a in lm.cached_arrays()) == (1 if residual == "full" else 0)
    finally:
        site.release(specs[0].run_id)
    assert site.kept_bytes(specs[0].run_id) == {}
