"""Privacy audit from the scheduler's side: what it records of every worker result has a size independent of n_j."""

from spatialfed.algorithm.config import FitConfig
from spatialfed.data.geometry import jittered_unit_grid
from spatialfed.data.simulate import simulate_store
from spatialfed.runtime.cluster import local_cluster
from spatialfed.runtime.dask_runtime import run_dask


def scheduler_view(dask_scheduler):
    """(key, nbytes, holders) of every task the scheduler knows: metadata only, it never receives the data."""
    return [(str(ts.key), int(ts.nbytes or 0), sorted(ws.address for ws in ts.who_has or ()))
            for ts in dask_scheduler.tasks.values()]


def test_scheduler_sees_only_summaries_of_n_independent_size(tmp_path):
    knots = jittered_unit_grid(16, seed=0)
    peak = {}
    with local_cluster(2) as handle:
        client = handle.client
        workers = set(handle.worker_addresses())
        for n in (40, 160):
            store = tmp_path / f"n{n}.zarr"
            simulate_store(store, 2, n, test_size=0, seed=2)
            views = []
            run_dask(client, store, 2, knots, 0.5, "full", FitConfig.of(mode="sync", max_iter=2),
                     on_event=lambda server, now: views.append(client.run_on_scheduler(scheduler_view)))
            rows = [row for view in views for row in view]
            assert rows
            for key, nbytes, holders in rows:
                assert set(holders) <= workers  # results are held by worker processes, never the scheduler
            step_of = {key: key.split("-w")[0] for key, _, _ in rows}
            for key, nbytes, _ in rows:
                peak[(n, step_of[key])] = max(peak.get((n, step_of[key]), 0), nbytes)
    # tasks the scheduler has already forgotten when a snapshot is taken (e.g. the short load tasks under load)
    # are missing from one size or the other: compare the steps seen at both sizes, the three sub-steps always
    steps = {step for (n, step) in peak if n == 40} & {step for (n, step) in peak if n == 160}
    assert {"mu_sigma", "gamma", "theta"} <= steps
    for step in steps:
        assert peak[(160, step)] <= peak[(40, step)] + 64, (step, peak[(40, step)], peak[(160, step)])
