"""Safe by default (issue 15): the embedded cluster listens on 127.0.0.1 only and, through TLS with a per-run
certificate, refuses every other process — plain TCP, or TLS with another certificate — so nobody else can
`client.run` code on the workers that hold the partitions."""

import os
import subprocess
import sys
import textwrap
import warnings

import pytest

from spatialfed.runtime.cluster import local_cluster, worker_addresses

#: what another local process tries: connect to the scheduler, then run code on every worker
INTRUDER = textwrap.dedent("""
    import os, sys
    from distributed import Client
    from distributed.security import Security
    for address in sys.argv[1:]:
        for name, kw in (("plain", {}), ("own certificate", {"security": Security.temporary()})):
            addr = address if name != "plain" else address.replace("tls://", "tcp://")
            try:
                with Client(addr, timeout=3, **kw) as c:
                    print("RAN", name, c.run(os.getpid))
            except BaseException as exc:
                print("REFUSED", name, type(exc).__name__)
    """)


def test_embedded_cluster_binds_loopback_and_refuses_other_processes():
    with local_cluster(1) as handle:
        client = handle.client
        scheduler = client.scheduler.address
        workers = worker_addresses(client)
        assert scheduler.startswith("tls://127.0.0.1:")
        assert workers and all(a.startswith("tls://127.0.0.1:") for a in workers)
        assert client.run(os.getpid)  # the fit's own client holds the certificate
        # the scheduler, and a worker directly
        out = subprocess.run([sys.executable, "-c", INTRUDER, scheduler, workers[0]], capture_output=True, text=True,
                             timeout=120).stdout
        assert "RAN" not in out, out
        assert out.count("REFUSED") == 4, out


def test_plain_tcp_only_when_asked():
    with local_cluster(1, security=False) as handle:
        assert handle.client.scheduler.address.startswith("tcp://127.0.0.1:")


def test_worker_processes_start_with_the_malloc_settings(monkeypatch):
    """glibc reads MALLOC_* when a process starts: the embedded cluster's workers get MALLOC_ENV before they spawn
    (Dask's own MALLOC_TRIM_THRESHOLD_=65536 made every n_j × n_j temporary a fresh mmap: statistics 45 % slower)."""
    from spatialfed.runtime.cluster import MALLOC_ENV

    for name in MALLOC_ENV:  # a value set in the shell would win: test the default
        monkeypatch.delenv(name, raising=False)
    with local_cluster(1, security=False) as handle:
        env = handle.client.run(lambda: {k: os.environ.get(k) for k in MALLOC_ENV})
    assert list(env.values()) == [MALLOC_ENV], env


def test_a_batch_cluster_listening_beyond_this_machine_without_tls_warns(monkeypatch):
    """The warning comes before any job is submitted (the dask-jobqueue class is replaced by one that stops)."""
    from spatialfed.runtime import cluster

    dask_jobqueue = cluster.import_dask_jobqueue()  # a bare import would leave sys.exit as this process's Ctrl-C

    class Stop(Exception):
        pass

    def refuse(**kw):
        raise Stop

    monkeypatch.setattr(dask_jobqueue, "SLURMCluster", refuse)
    with pytest.warns(UserWarning, match="without TLS"), pytest.raises(Stop):
        cluster.jobqueue_cluster("slurm", host="10.0.0.5")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(Stop):
            cluster.jobqueue_cluster("slurm")  # 127.0.0.1: no warning


def test_workers_drop_only_the_heartbeat_traceback_of_a_shutdown():
    """A heartbeat cut by the cluster's shutdown logged a ~30-line traceback from a worker after Ctrl-C (a race
    seen in CI); each embedded worker drops that record (and only that one) through its preload."""
    import logging

    from distributed.comm.core import CommClosedError

    from spatialfed.runtime.worker_logs import HEARTBEAT_CUT, ShutdownHeartbeatFilter

    def record(msg, exc):
        return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, msg, None,
                                 (type(exc), exc, None) if exc else None)

    keep = ShutdownHeartbeatFilter().filter
    assert not keep(record(HEARTBEAT_CUT + ".", CommClosedError("in <TLS (closed)>: Stream is closed")))
    assert keep(record(HEARTBEAT_CUT + ".", ValueError("a bug")))  # not a closed connection: kept
    assert keep(record("Compute Failed", CommClosedError("x")))
    with local_cluster(1, security=False) as handle:
        installed = handle.client.run(
            lambda: [type(f).__name__ for f in logging.getLogger("distributed.worker").filters])
    assert list(installed.values()) == [["ShutdownHeartbeatFilter", "OwnErrorFilter"]], installed


def test_workers_drop_the_compute_failed_record_of_spatialfeds_own_errors_only():
    """A damaged partition on Dask printed the worker's ~20-line "Compute Failed" record (the task's arguments and
    a traceback) beside the fit's one line naming the same cause; a failure that is not a SpatialFedError (a bug)
    keeps it."""
    import logging

    from spatialfed.runtime.worker_logs import OwnErrorFilter

    def compute_failed(exception_text):  # distributed.worker's record: (key, state, task, exception, traceback)
        return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1,
                                 "Compute Failed\nKey:       %s\nState:     %s\nTask:  %s\nException: %r\n"
                                 "Traceback: %r\n", ("load-w1-5aa7e8", "executing", "<Task ...>", exception_text,
                                                      "  File ..."), None)

    keep = OwnErrorFilter().filter
    assert not keep(compute_failed("StoreError('/s.zarr: cannot read partition workers/1')"))
    assert not keep(compute_failed("WorkerTaskError('x')"))
    assert keep(compute_failed("ZeroDivisionError('division by zero')"))
    assert keep(logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, "StoreError(x)", None, None))


@pytest.mark.parametrize(("n", "sites", "cores", "message"), [
    (1000, 4, 2, r"1000 is more than the store's 4 sites: each Dask worker process serves at least one site; give at "
                 r"most 4"),
    (12, 40, 2, r"12 is more than 4 processes per core on this machine's 2 usable cores; give at most 8"),
])
def test_embedded_worker_processes_are_bounded_by_sites_and_cores(n, sites, cores, message):
    from spatialfed.runtime.factory import check_worker_count

    with pytest.raises(ValueError, match=message):
        check_worker_count(n, sites, cores)
    check_worker_count(min(sites, 4 * cores), sites, cores)  # the bounds themselves are allowed
