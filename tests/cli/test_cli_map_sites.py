"""`spatialfed map` draws the sites' outlines, not their points, unless asked (`--sites points`): on Meuse, through
the real command line and a real Dask LocalCluster, the tasks the scheduler receives are recorded at the site
boundary (every task key starts with the site call it runs, runtime.dask_runtime.task_key), and a default map sends
no "sites" call, the call that returns raw coordinates."""

from __future__ import annotations

import pytest
from distributed.diagnostics.plugin import SchedulerPlugin

from spatialfed.cli import main
from spatialfed.data import datasets
from spatialfed.runtime.cluster import local_cluster


class TaskLog(SchedulerPlugin):
    """Every task key the scheduler is given, as it arrives."""

    def __init__(self):
        self.keys = []

    def transition(self, key, start, finish, *args, **kwargs):
        if start == "released":
            self.keys.append(str(key))


@pytest.fixture(scope="module")
def meuse_fit(tmp_path_factory):
    d = tmp_path_factory.mktemp("map_sites")
    store, fit = d / "meuse.zarr", d / "fit"
    assert main(["ingest", str(datasets.data_file("meuse", "meuse.csv")), str(store), "--x", "x", "--y", "y",
                 "--value", "zinc", "--crs", "EPSG:28992", "--transform", "log", "--workers", "4"]) == 0
    assert main(["fit", str(store), "--out", str(fit), "--knots", "16", "--max-iter", "5", "--runtime", "simulated",
                 "--quiet"]) == 0
    with local_cluster(2, security=False) as handle:  # plain TCP: the command line joins it with --scheduler
        log = TaskLog()
        handle.cluster.scheduler.add_plugin(log)
        yield store, fit, handle.client.scheduler.address, log


def _map(meuse_fit, out, *extra):
    store, fit, address, log = meuse_fit
    log.keys.clear()
    assert main(["map", str(fit), "--store", str(store), "--out", str(out), "--resolution", "200", "--runtime",
                 "dask", "--scheduler", address, "--quiet", *extra]) == 0
    return {key.split("-w")[0] for key in log.keys}


def test_a_default_map_asks_the_sites_for_outlines_never_for_coordinates(meuse_fit, tmp_path):
    calls = _map(meuse_fit, tmp_path / "m")
    assert "hull" in calls and "load" in calls      # the recording sees the site calls the map makes
    assert "sites" not in calls
    assert (tmp_path / "m" / "map.png").stat().st_size > 0


def test_points_are_fetched_only_when_asked_and_none_draws_neither(meuse_fit, tmp_path):
    assert "sites" in _map(meuse_fit, tmp_path / "p", "--sites", "points")
    assert "sites" not in _map(meuse_fit, tmp_path / "n", "--no-sites")
