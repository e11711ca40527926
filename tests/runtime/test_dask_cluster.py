"""Cluster factories: embedded LocalCluster settings, scheduler address errors, dask-jobqueue job scripts."""

import pytest

from spatialfed.runtime.blas import _openblas_handles, limit_blas_threads
from spatialfed.runtime.cluster import (
    SINGLE_THREAD_ENV,
    SchedulerUnreachableError,
    connect,
    jobqueue_cluster,
    make_cluster,
)
from spatialfed.runtime.dask_runtime import assign_partitions


def test_unreachable_scheduler_names_the_address():
    with pytest.raises(SchedulerUnreachableError, match=r"tcp://127\.0\.0\.1:9 within 1 s"):
        connect("127.0.0.1:9", timeout=1)
    with pytest.raises(SchedulerUnreachableError, match="empty"):
        make_cluster(" ")  # blank address: refused, not an embedded cluster


def test_round_robin_assignment():
    assert assign_partitions(5, ["tcp://b:1", "tcp://a:1"]) == ["tcp://a:1", "tcp://b:1", "tcp://a:1", "tcp://b:1",
                                                                 "tcp://a:1"]
    with pytest.raises(RuntimeError, match="no workers"):
        assign_partitions(2, [])


@pytest.mark.parametrize("kind, directives", [
    ("slurm", ["#SBATCH -p short", "#SBATCH -A proj42", "#SBATCH -t 00:30:00", "#SBATCH --cpus-per-task=4"]),
    ("pbs", ["#PBS -q short", "#PBS -A proj42", "#PBS -l walltime=00:30:00"]),
    ("sge", ["#$ -q short", "#$ -P proj42", "#$ -l h_rt=00:30:00"]),
])
def test_jobqueue_job_scripts(kind, directives):
    handle = jobqueue_cluster(kind, cores=4, memory="8GB", walltime="00:30:00", queue="short", account="proj42",
                              jobs=0)
    try:
        script = handle.cluster.job_script()
        for line in directives:
            assert line in script, (line, script)
        assert "export OPENBLAS_NUM_THREADS=1" in script
        assert "127.0.0.1" in script  # the scheduler binds to loopback unless told otherwise
    finally:
        handle.close()


def test_jobqueue_kind_is_checked():
    with pytest.raises(ValueError, match="slurm"):
        jobqueue_cluster("lsf")


def test_single_thread_env_and_blas_limit():
    assert SINGLE_THREAD_ENV["OMP_NUM_THREADS"] == "1" and SINGLE_THREAD_ENV["OPENBLAS_NUM_THREADS"] == "1"
    handles = _openblas_handles()
    before = [get() for _, get in handles]
    with limit_blas_threads(1):
        assert all(get() == 1 for _, get in handles)
    assert [get() for _, get in handles] == before


def test_a_closed_batched_comm_is_not_logged_with_its_traceback():
    """distributed.batched logs "Batched Comm Closed" with a CommClosedError traceback when the scheduler dies under
    the client: the fit reports the loss in one line, so that record is dropped, and other records are kept."""
    import logging

    from spatialfed.runtime.cluster import quiet_reconnect_logs

    quiet_reconnect_logs()
    logger = logging.getLogger("distributed.batched")
    try:
        raise ConnectionError("closed")
    except ConnectionError:
        import sys

        info = sys.exc_info()
    closed = logger.makeRecord(logger.name, logging.INFO, __file__, 1, "Batched Comm Closed %r", ("<TCP>",), info)
    other = logger.makeRecord(logger.name, logging.INFO, __file__, 1, "something else", (), None)
    assert [f.filter(closed) for f in logger.filters] == [False]
    assert all(f.filter(other) for f in logger.filters)
    quiet_reconnect_logs()
    assert len(logging.getLogger("distributed.batched").filters) == 1


def test_every_cluster_handle_drops_those_records_from_the_start():
    """The scheduler can die before the fit notices (the batched stream logs at once): the filter is on from the
    moment a ClusterHandle exists, not only once the loss is reported."""
    import logging

    from spatialfed.runtime.cluster import _RECONNECT_FILTER, ClusterHandle

    loggers = [logging.getLogger(name) for name in ("distributed.client", "distributed.batched")]
    for logger in loggers:
        logger.removeFilter(_RECONNECT_FILTER)
    ClusterHandle(client=None)
    assert all(_RECONNECT_FILTER in logger.filters for logger in loggers)

