"""benchmarks/bench_async_floor.py (issue 27): the surrogate with one answer of the slowest site, on a tiny store."""

import contextlib
import io
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_async_floor as floor  # noqa: E402


def test_one_answer_rows_and_the_maximiser_against_the_synchronous_optimum(tmp_path):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert floor.main(["--workers", "3", "--n-per-worker", "60", "--knots", "25", "--range", "0.2",
                           "--seeds", "0", "--partition", "random"]) == 0
    doc = json.loads(out.getvalue())
    from spatialfed.runtime import site

    assert not site.registry_keys()  # the script leaves no partition in this process
    (row,) = doc["rows"]
    assert doc["summary"]["stores"] == 1
    assert doc["summary"]["one_answer_at_us_settles"] == int(row["one_answer_at_us"] <= 1e-3)
    # u_s lacks the slowest site's data (a third of it here): neither it nor one answer there is the optimum
    assert row["us_from_optimum"] > 1e-3 and row["one_answer_at_us"] > 0
    # φ₀'s model (from one answer 1/3 of the data far away) is null where it is not positive definite at u*
    assert row["one_answer_at_phi0"] is None or row["one_answer_at_phi0"] >= 0


def test_the_maximiser_of_every_site_exact_is_the_synchronous_optimum(tmp_path):
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.data.simulate import simulate_store
    from spatialfed.data.store import open_store
    from spatialfed.model.matern import Matern
    from spatialfed.model.stats import site_statistics
    from spatialfed.runtime import site

    setting = floor.bench.Setting(workers=3, knots=25, beta=0.2)
    path = tmp_path / "s.zarr"
    simulate_store(path, 3, 60, beta=0.2, seed=0, test_size=0)
    ref = floor.bench.fit_stats(path, setting, "sync", "balanced", max_iter=100, tol=1e-10)
    knots, kernel = jittered_unit_grid(25, seed=0), Matern(0.5)
    info = open_store(path)
    models = [site.local_model(s) for s in site.site_specs("floor-test", info.path, 3, knots, kernel, "full")]
    site.release("floor-test")  # the process-wide registry must stay empty (test_dask_runtime checks the client's)
    server = ref.server

    def exact(u):
        return [site_statistics(lm, server.params.with_u(np.asarray(u))) for lm in models]

    found = floor.maximiser(exact, server.params.u + 0.2, server.bounds, knots, kernel)
    np.testing.assert_allclose(found, server.params.u, atol=1e-5)
