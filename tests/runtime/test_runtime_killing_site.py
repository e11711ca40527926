"""A site whose task kills its Dask worker every time is named and given up after a bounded number of deaths
(Dask's ``distributed.scheduler.allowed-failures`` + 1), then ``on_worker_error`` stops the fit or drops the site.

A real LocalCluster of nanny-managed worker processes: a worker plugin makes the process die (``os._exit``, as the
nanny's memory monitor or the kernel's OOM killer ends it) as soon as a task of federated worker 2 starts there; the
nanny restarts it under a new address and the runtime moves the site on. The fast forms allow 1 failure (2 deaths);
the slow ones run Dask's default of 3 (4 deaths).
"""

import json
import os
import re
import time

import dask
import pytest

from spatialfed import Cluster
from spatialfed.api import FederatedGP
from spatialfed.cli import main
from spatialfed.errors import WorkerTaskError
from spatialfed.runtime.cluster import local_cluster

KILLER = 2
GIVEN_UP = re.compile(r"federated worker 2 \(group workers/2 of .*\) killed its Dask worker (\d+) times in "
                      r"sub-step 'load' \(Dask workers (.*) died running its task; "
                      r"distributed\.scheduler\.allowed-failures = (\d+)\).*--on-worker-error drop")


def kill_on_site(j: int, step: str = "", after_s: float = 0.1):
    """A worker plugin whose process exits `after_s` seconds after one of site j's tasks (key '<step>-w<j>-…', of
    any step unless given) starts there, as a task filling the memory is killed a while after it started: the exit
    takes the worker's one thread first, so the task never finishes, and the worker meanwhile reports what it
    finished before."""
    from distributed import WorkerPlugin

    def die():
        time.sleep(after_s)
        os._exit(1)

    class KillOnSite(WorkerPlugin):
        name = f"kill-on-site-{j}-{step}"

        def setup(self, worker):
            self.worker = worker

        def transition(self, key, start, finish, **kwargs):
            if finish == "executing" and f"-w{j}-" in str(key) and str(key).startswith(step):
                self.worker.executors["default"].submit(die)

    return KillOnSite()


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(2, security=False) as handle:
        handle.client.register_plugin(kill_on_site(KILLER))  # the scheduler hands it to every restarted worker too
        yield handle


def deaths_of(message: str, allowed: int) -> list[str]:
    match = GIVEN_UP.search(message)
    assert match, message
    assert int(match.group(3)) == allowed
    dead = match.group(2).split(", ")
    assert int(match.group(1)) == len(dead) == allowed + 1 == len(set(dead))
    return dead


def fit(cluster, store, allowed: int, on_worker_error: str):
    gp = FederatedGP(mode="sync", knots=9, max_iter=3, progress=False, cluster=Cluster(client=cluster.client, on_worker_error=on_worker_error))
    with dask.config.set({"distributed.scheduler.allowed-failures": allowed}):
        return gp.fit(store)


@pytest.mark.parametrize("allowed", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_stop_names_the_site_after_allowed_failures_plus_one_deaths(cluster, store, allowed):
    with pytest.raises(WorkerTaskError) as info:
        fit(cluster, store, allowed, "stop")
    message = str(info.value)
    assert "\n" not in message
    dead = deaths_of(message, allowed)
    assert not set(dead) & set(cluster.worker_addresses())  # each one really died (the nanny restarted it anew)


@pytest.mark.parametrize("allowed", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_drop_continues_without_the_site(cluster, store, allowed):
    gp = fit(cluster, store, allowed, "drop")
    assert [d["worker"] for d in gp.dropped_workers_] == [KILLER]
    deaths_of(gp.dropped_workers_[0]["cause"], allowed)
    assert gp.loglik_ is not None and gp.n_obs_ == 120  # the two other sites' rows


def test_cli_one_line_then_drop_continues_without_it(cluster, store, tmp_path, capsys):
    """`fit --scheduler`: one line naming the site and the fix (no resume hint: nothing was fitted yet); the same
    command with `--on-worker-error drop` then finishes without the site after the same bounded deaths."""
    out = tmp_path / "fit"
    args = ["fit", str(store), "--out", str(out), "--mode", "sync", "--knots", "9", "--max-iter", "3",
            "--scheduler", cluster.client.scheduler.address]
    with dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        assert main(args) == 1
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if "federated worker 2" in line]
        assert len(lines) == 1 and lines[0].startswith("spatialfed fit: error: federated worker 2")
        assert "--resume" not in lines[0] and not out.exists()
        deaths_of(lines[0], 1)
        assert main([*args, "--on-worker-error", "drop"]) == 0
    fit_json = json.loads((out / "fit.json").read_text())
    assert [d["worker"] for d in fit_json["dropped_workers"]] == [KILLER]
    deaths_of(fit_json["dropped_workers"][0]["cause"], 1)


def test_a_site_dropped_before_a_resume_is_not_loaded_again(cluster, store):
    """What a resume of a fit that dropped the site asks of the runtime: its partition is not loaded, so no worker
    dies (the plugin would end any worker that started the site's task)."""
    from spatialfed.data.geometry import jittered_unit_grid
    from spatialfed.model.matern import Matern
    from spatialfed.runtime import site
    from spatialfed.runtime.dask_runtime import DaskRuntime

    before = cluster.worker_addresses()
    runtime = DaskRuntime(cluster.client)
    specs = site.site_specs("skip-test", str(store), 3, jittered_unit_grid(9, seed=0), Matern(0.5), "full")
    try:
        events = runtime.start(specs, skip=[KILLER])
    finally:
        runtime.stop()
    assert [e.result is None for e in events] == [False, False, True] and all(e.error is None for e in events)
    assert cluster.worker_addresses() == before and runtime.lost_workers == []


@pytest.mark.slow  # the fast form: test_a_site_dropped_before_a_resume_is_not_loaded_again
def test_cli_resume_of_a_site_killing_workers_mid_fit_ends(store, tmp_path, capsys):
    """The site kills its worker at its request of iteration 2: `fit` stops after 2 deaths with one line naming the
    site and the resume; `--resume --on-worker-error drop` drops it after 2 more and finishes: bounded both times."""
    out = tmp_path / "fit"
    with local_cluster(2, security=False) as handle, dask.config.set({"distributed.scheduler.allowed-failures": 1}):
        handle.client.register_plugin(kill_on_site(KILLER, "stats-w2-t2-"))
        args = ["--scheduler", handle.client.scheduler.address]
        assert main(["fit", str(store), "--out", str(out), "--mode", "sync", "--knots", "9", "--max-iter", "5",
                     *args]) == 1
        lines = [line for line in capsys.readouterr().err.splitlines() if "federated worker 2" in line]
        assert len(lines) == 1 and "in sub-step 'stats'" in lines[0] and "--resume" in lines[0], lines
        assert main(["fit", "--resume", str(out), "--on-worker-error", "drop", *args]) == 0
    fit_json = json.loads((out / "fit.json").read_text())
    assert [(d["worker"], d["step"]) for d in fit_json["dropped_workers"]] == [(KILLER, "stats")]
