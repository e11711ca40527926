"""Cluster factories for the Dask runtime: embedded LocalCluster, an existing scheduler, or a dask-jobqueue cluster.

Every factory returns a ``ClusterHandle``: a connected ``distributed.Client`` plus the cluster object it owns (if any),
closed together by ``handle.close()`` or a ``with`` block.

- ``local_cluster(n_workers)``: ``LocalCluster`` on 127.0.0.1 with worker *processes* (the partitions must live in
  separate processes from the client for the privacy claim), one thread per worker, BLAS held to one thread
  (``OMP_NUM_THREADS`` etc. in the worker environment), dashboard on a free port; TLS with a per-run in-memory
  certificate unless told otherwise (``security=False``), so no other process can run code on its workers.
- ``connect(address)``: any running scheduler (``tcp://host:port``); a short timeout and an error naming the address.
- ``jobqueue_cluster("slurm"|"pbs"|"sge", cores=, memory=, walltime=, queue=, account=, jobs=)``: a dask-jobqueue
  cluster that submits ``jobs`` batch jobs, each one Dask worker process with ``cores`` threads.

Every factory takes ``security=`` (a ``distributed.security.Security``, e.g. ``security.tls_security()``): the
cluster then listens on ``tls://`` and the client authenticates with the same certificates.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass

from spatialfed.errors import SpatialFedError, option
from spatialfed.runtime.walltime import QUEUE_WAIT_S, keep_jobs, with_lifetime

#: worker environment: one BLAS/OpenMP thread per task, so J concurrent tasks do not oversubscribe the cores
SINGLE_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "VECLIB_MAXIMUM_THREADS": "1",
    "NUMEXPR_NUM_THREADS": "1",
}

#: glibc malloc in the worker processes, set before they start (Dask's nanny applies distributed.nanny.pre-spawn-environ
#: before spawning; glibc reads these once). Dask's default MALLOC_TRIM_THRESHOLD_=65536 also turns off glibc's dynamic
#: mmap threshold, so every n_j × n_j temporary of the full residual (8.9 MB at n_j = 1,055) is a fresh mmap whose
#: pages fault in and are zeroed: a site's statistics took 0.32 s instead of 0.22 s (benchmarks/bench_large.py's
#: sites). Arrays up to 32 MB come from the heap instead, and up to 64 MB of freed heap is kept for the next task.
MALLOC_ENV = {"MALLOC_TRIM_THRESHOLD_": str(64 * 2**20), "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20)}
#: exported by a batch job's prologue before its Dask worker starts
JOB_ENV = {**SINGLE_THREAD_ENV, **MALLOC_ENV}

JOBQUEUE_KINDS = ("slurm", "pbs", "sge")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def worker_addresses(client, timeout: float | None = None) -> list[str]:
    """Addresses of the Dask workers connected now, sorted (a stable round-robin order), fetched fresh; TimeoutError
    when the scheduler does not answer within `timeout` seconds (None: distributed's connect timeout).

    Not ``client.scheduler_info()["workers"]``: that returns the client's cache, which its periodic refresh
    overwrites with a copy that lists no workers, so a read racing the refresh sees an empty cluster.
    """
    return sorted(worker_threads(client, timeout))


def worker_threads(client, timeout: float | None = None) -> dict[str, int]:
    """{address: threads} of the Dask workers connected now (worker_addresses)."""
    workers = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=timeout)["workers"]
    return {address: int(info.get("nthreads", 1) or 1) for address, info in workers.items()}


class SchedulerUnreachableError(SpatialFedError, ConnectionError):
    """No Dask scheduler answered at the given address."""


class _ReconnectFilter:
    """Drops distributed.client's log records of a reconnection to a scheduler that is gone (its traceback ends in
    a CommClosedError or the CancelledError of closing the client), and distributed.batched's "Batched Comm Closed"
    with its traceback: the fit reports that loss in one line."""

    def filter(self, record) -> bool:
        if record.name == "distributed.batched" and record.getMessage().startswith("Batched Comm Closed"):
            return False
        if record.exc_info and record.exc_info[2] is not None:
            tb = record.exc_info[2]
            while tb is not None:
                if tb.tb_frame.f_code.co_name in ("_reconnect", "_ensure_connected"):
                    return False
                tb = tb.tb_next
        return "reconnect to scheduler" not in record.getMessage()


_RECONNECT_FILTER = _ReconnectFilter()


def quiet_reconnect_logs() -> None:
    """Install `_ReconnectFilter` on distributed.client's and distributed.batched's loggers (once)."""
    import logging

    for name in ("distributed.client", "distributed.batched"):
        logger = logging.getLogger(name)
        if _RECONNECT_FILTER not in logger.filters:
            logger.addFilter(_RECONNECT_FILTER)


@dataclass
class ClusterHandle:
    """A Client and (optionally) the cluster it started; ``close()`` shuts down only what this handle started."""

    client: object
    cluster: object | None = None
    owns_cluster: bool = False
    worker_wait_s: float | None = None  # how long the fit waits for a replacement once every worker left

    def __post_init__(self):
        # before any loss: the batched stream logs its closed comm the moment the scheduler dies, before the fit
        # notices and reports that loss in its one line
        quiet_reconnect_logs()

    @property
    def dashboard_link(self) -> str | None:
        try:
            return self.client.dashboard_link
        except Exception:  # pragma: no cover - the scheduler may run without a dashboard
            return None

    def worker_addresses(self) -> list[str]:
        """Addresses of the Dask workers currently connected, sorted (a stable round-robin order)."""
        return worker_addresses(self.client)

    def close(self) -> None:
        """Close the client (and the cluster this handle started). With the scheduler gone (the client is
        reconnecting), within 2 s and without distributed's traceback of the reconnection it interrupts."""
        status = getattr(self.client, "status", "running")
        try:
            if status in ("running", "closed", "newly-created"):
                self.client.close()
            else:
                quiet_reconnect_logs()
                try:
                    self.client.close(timeout=2)
                except (Exception, asyncio.CancelledError):  # its reconnection, cancelled: nothing left to close
                    pass
        finally:
            if self.owns_cluster and self.cluster is not None:
                self.cluster.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def default_n_workers() -> int:
    """Number of worker processes for the embedded cluster: the usable cores (at least 1)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


WORKER_PRELOAD = "spatialfed.runtime.worker_logs"  # drops the heartbeat traceback a shutdown race logs


def local_cluster(n_workers: int | None = None, *, memory_limit="auto", silence_logs: int = 40,
                  security=None) -> ClusterHandle:
    """Start an embedded ``LocalCluster`` on 127.0.0.1 (processes, 1 thread each, BLAS single-threaded).

    Safe by default: with ``security=None`` every connection (client, scheduler, workers) uses TLS with a per-run
    certificate made in memory (``security.tls_security()``), so another process on this machine, even of the same
    user, can neither submit tasks nor ``client.run`` code on the workers (which hold the partitions) without the
    key; measured: ~0.2 s at start-up (the certificate) and no measurable cost per small task. ``security``: a
    ``distributed.security.Security`` of your own, or False for plain TCP (anyone on this machine who can reach the
    ports can run code on the workers: only for a cluster other tools must join without certificates)."""
    from distributed import Client, LocalCluster

    n = default_n_workers() if n_workers is None else int(n_workers)
    if n < 1:
        raise ValueError(f"n_workers must be >= 1, got {n_workers!r}")
    if security is None:
        from spatialfed.runtime.security import tls_security

        security = tls_security()
    elif security is False:
        security = None
    import dask

    pre_spawn = {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **MALLOC_ENV}
    with dask.config.set({"distributed.nanny.pre-spawn-environ": pre_spawn}), workers_ignore_sigint():
        cluster = LocalCluster(
            host="127.0.0.1",
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            dashboard_address="127.0.0.1:0",
            memory_limit=memory_limit,
            silence_logs=silence_logs,
            env=dict(SINGLE_THREAD_ENV),
            preload=[WORKER_PRELOAD],
            **({} if security is None else {"protocol": "tls", "security": security}),
        )
    try:
        client = Client(cluster, direct_to_workers=True, **({} if security is None else {"security": security}))
    except BaseException:
        cluster.close()
        raise
    return ClusterHandle(client=client, cluster=cluster, owns_cluster=True)


@contextmanager
def workers_ignore_sigint():
    """Start worker processes inside this block with SIGINT ignored, so Ctrl-C stops only this process.

    A terminal sends SIGINT to its whole foreground process group, which holds the LocalCluster's worker processes
    too: each printed a `Process Dask Worker process (from Nanny): ... KeyboardInterrupt` traceback (~50 lines) while
    this process reported the interrupt in one line. The nanny spawns its worker with multiprocessing's "spawn"
    (fork + exec); an ignored signal stays ignored across exec, and Python leaves SIGINT ignored when it starts so.
    The workers are closed by their nanny as before. This process ignores SIGINT while the block runs too (the
    cluster's start, ~2 s); outside the main thread (where signal handlers cannot change) this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler if before is None else before)  # None: set in C


TLS_DIR = "Cluster(tls='CERT_DIR')"  # how FederatedGP takes the certificates (spatialfed.errors.option)
TLS_FILES = "ca.pem, cert.pem, key.pem"


def configured_security():
    """A Security from Dask's configuration (distributed.comm.tls.*) when it holds client certificates, else None."""
    from distributed.security import Security

    security = Security()
    return security if security.get_connection_args("client").get("ssl_context") is not None else None


def speaks_tls(address: str, timeout: float = 2.0) -> bool:
    """Whether the server at host:port of `address` answers a TLS handshake (certificates not checked): a
    scheduler started with --tls-* that a tcp:// client reached."""
    import socket
    import ssl

    host, _, port = address.split("://", 1)[-1].rpartition(":")
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout) as sock, \
                context.wrap_socket(sock, server_hostname=host.strip("[]") or None):
            return True
    except ssl.SSLError as exc:  # an alert (e.g. "certificate required") is TLS too; a plain server is not
        return "alert" in str(exc).lower()
    except (OSError, ValueError):
        return False


def _unreachable(addr: str, timeout: float, exc: BaseException) -> str:
    """The one line for a scheduler that could not be connected to: it wants TLS, it refused our certificate, or
    nothing answered."""
    tls_dir = option(TLS_DIR, "--tls-dir DIR")
    if addr.startswith("tls://") and "certificate" in str(exc).lower():
        return (f"the Dask scheduler at {addr} did not accept this client's certificate ({exc}); pass {tls_dir} "
                f"with the certificates the scheduler was started with ({TLS_FILES}; docs/hpc.md)")
    if not addr.startswith("tls://") and speaks_tls(addr):
        tls_addr = "tls://" + addr.split("://", 1)[1]
        scheduler = option(f"cluster={tls_addr!r}", f"--scheduler {tls_addr}")
        return (f"the Dask scheduler at {addr} wants TLS: give {scheduler} and {tls_dir} with the certificates it "
                f"was started with ({TLS_FILES}; docs/hpc.md)")
    return (f"could not reach a Dask scheduler at {addr} within {timeout:g} s ({type(exc).__name__}: {exc}); start "
            f"one with `dask scheduler` and `dask worker ADDRESS`, or omit {option('cluster=', '--scheduler')} to "
            "use an embedded cluster")


def connect(address: str, *, timeout: float = 5.0, wait_for_workers: float = 30.0, security=None) -> ClusterHandle:
    """Connect to a running scheduler at ``address``; SchedulerUnreachableError names it if it does not answer.

    With ``security`` (TLS) the address must be ``tls://host:port`` (a bare ``host:port`` becomes ``tls://``)."""
    from distributed import Client

    addr = str(address).strip()
    if not addr:
        raise SchedulerUnreachableError("empty scheduler address; give e.g. tcp://127.0.0.1:8786")
    if "://" not in addr:
        addr = ("tcp://" if security is None else "tls://") + addr
    if security is not None and not addr.startswith("tls://"):
        raise SchedulerUnreachableError(
            f"TLS was requested but the scheduler address {addr} is not tls://; start the scheduler with TLS "
            f"(`dask scheduler --tls-ca-file ca.pem --tls-cert cert.pem --tls-key key.pem`) and give "
            f"tls://{addr.split('://', 1)[1]}, or drop {option('tls', '--tls')}")
    if security is None and addr.startswith("tls://"):
        security = configured_security()
        if security is None:  # distributed would fail with "TLS expects a `ssl_context` argument"
            raise SchedulerUnreachableError(f"the Dask scheduler {addr} uses TLS: pass "
                                            f"{option(TLS_DIR, '--tls-dir DIR')} with the certificates it was "
                                            f"started with ({TLS_FILES}; docs/hpc.md)")
    try:
        client = Client(addr, timeout=timeout, **({} if security is None else {"security": security}))
    except (OSError, TimeoutError) as exc:
        raise SchedulerUnreachableError(_unreachable(addr, timeout, exc)) from exc
    if wait_for_workers:
        try:
            client.wait_for_workers(1, timeout=wait_for_workers)
        except (OSError, TimeoutError) as exc:
            client.close()
            raise SchedulerUnreachableError(
                f"the Dask scheduler at {addr} has no workers (waited {wait_for_workers:g} s); "
                f"start `dask worker {addr}`"
            ) from exc
    return ClusterHandle(client=client, cluster=None, owns_cluster=False)


def jobqueue_cluster(
    kind: str,
    *,
    cores: int = 1,
    memory: str = "4GB",
    walltime: str = "01:00:00",
    queue: str | None = None,
    account: str | None = None,
    jobs: int = 1,
    host: str = "127.0.0.1",
    interface: str | None = None,
    wait_for_workers: float | None = None,
    security=None,
    shared_temp_directory: str | None = None,
    queue_wait: float = QUEUE_WAIT_S,
    **job_kwargs,
) -> ClusterHandle:
    """A dask-jobqueue cluster (``slurm`` | ``pbs`` | ``sge``) with ``jobs`` batch jobs of one worker process each.

    The scheduler binds to ``host`` (default 127.0.0.1: only reachable from this machine; on a real batch system pass
    the login node's address or a network ``interface`` the compute nodes can reach). ``job_kwargs`` go to the
    dask-jobqueue cluster class unchanged (e.g. ``job_extra_directives``, ``job_script_prologue``).
    ``security`` (TLS) and ``shared_temp_directory`` (where dask-jobqueue writes a temporary certificate's files
    for the jobs: on the shared filesystem, private to you) are passed to the cluster class and the client.
    Workers retire before `walltime` and the cluster submits their replacements (runtime.walltime); a fit waits up to
    `queue_wait` seconds for one once every worker has left.
    """
    kind = str(kind).lower()
    if kind not in JOBQUEUE_KINDS:
        raise ValueError(f"jobqueue kind must be one of {JOBQUEUE_KINDS}, got {kind!r}")
    dask_jobqueue = import_dask_jobqueue()
    from distributed import Client

    cls = {"slurm": dask_jobqueue.SLURMCluster, "pbs": dask_jobqueue.PBSCluster, "sge": dask_jobqueue.SGECluster}[kind]
    kw = dict(
        cores=int(cores), processes=1, memory=memory, walltime=walltime, queue=queue,
        job_script_prologue=[f"export {k}={v}" for k, v in JOB_ENV.items()],
    )
    kw.update(job_kwargs)  # e.g. processes, job_extra_directives from a YAML job configuration
    kw = with_lifetime(kw, walltime)  # workers retire before the walltime ...
    if account is not None:
        kw["account" if kind in ("slurm", "pbs") else "project"] = account
    if security is None and (interface is not None or host not in LOOPBACK):
        warnings.warn(f"the Dask scheduler listens on {interface or host} without TLS: anyone who can reach it can "
                      "run code on your workers and read the partitions; pass "
                      f"{option('security=tls_security(...)', '--tls or --tls-dir DIR')}", UserWarning, stacklevel=2)
    if interface is not None:
        kw["interface"] = interface
    else:
        kw["scheduler_options"] = {"host": host, "dashboard_address": f"{host}:0"}
        kw = on_loopback(kw, host)
    if security is not None:
        kw["security"] = security
        kw.setdefault("protocol", "tls://")
    if shared_temp_directory is not None:
        kw["shared_temp_directory"] = str(shared_temp_directory)
    cluster = cls(**kw)
    try:
        if jobs:
            keep_jobs(cluster, jobs)  # ... and are replaced
        client = Client(cluster, direct_to_workers=True, **({} if security is None else {"security": security}))
        if wait_for_workers:
            try:
                client.wait_for_workers(1, timeout=wait_for_workers)
            except TimeoutError:
                raise TimeoutError(f"no batch job started a Dask worker within {wait_for_workers:g} s (`squeue` shows "
                                   f"why the jobs wait); give the queue longer with "
                                   f"{option('wait_for_workers=SECONDS', '--queue-wait SECONDS')} or ask for less "
                                   f"(cores, memory, walltime)") from None
    except BaseException:
        cluster.close()
        raise
    return ClusterHandle(client=client, cluster=cluster, owns_cluster=True, worker_wait_s=float(queue_wait))


def on_loopback(job_kwargs: dict, host: str | None) -> dict:
    """`job_kwargs` with ``--host HOST`` for the workers when the scheduler's `host` is a loopback address: such
    jobs run on this machine, and their workers then listen on loopback too, not on every interface."""
    if host not in LOOPBACK:
        return job_kwargs
    return {**job_kwargs, "worker_extra_args": [*(job_kwargs.get("worker_extra_args") or []), "--host", host]}


def import_dask_jobqueue():
    """``dask_jobqueue``, without the side effect of importing it: its ``runner`` module (imported by the SLURM one)
    replaces this process's SIGINT handler with ``sys.exit``, so Ctrl-C raised SystemExit instead of
    KeyboardInterrupt and a fit skipped its Ctrl-C checkpoint message and exit status 130. That handler is replaced
    by the one before (Python's default when that was dask_jobqueue's too); only the main thread can do this."""
    def ours(handler) -> bool:
        return getattr(handler, "__module__", None) != "dask_jobqueue.runner"

    before = signal.getsignal(signal.SIGINT)
    import dask_jobqueue

    if not ours(signal.getsignal(signal.SIGINT)):
        try:
            signal.signal(signal.SIGINT, before if ours(before) and callable(before) else signal.default_int_handler)
        except ValueError:  # pragma: no cover - not the main thread
            pass
    return dask_jobqueue


def make_cluster(scheduler: str | None = None, *, n_workers: int | None = None, jobqueue: dict | None = None,
                 timeout: float = 5.0, security=None, insecure: bool = False) -> ClusterHandle:
    """One entry point: ``scheduler`` address > ``jobqueue`` settings (dict with ``kind``) > embedded LocalCluster.

    ``security`` (e.g. ``security.tls_security()``) is passed to whichever factory runs; None gives the embedded
    cluster its per-run TLS certificate (`local_cluster`) and leaves the others plain TCP, False is plain TCP.
    A plain-TCP scheduler off this machine (to connect to, or for jobqueue to listen on) is refused before any
    connection unless `insecure` (`check_transport`)."""
    check_transport(scheduler, jobqueue, security, insecure)
    if scheduler:
        return connect(scheduler, timeout=timeout, security=security or None)
    if jobqueue:
        jq = dict(jobqueue)
        return jobqueue_cluster(jq.pop("kind"), security=security or None, **jq)
    return local_cluster(n_workers, security=security)  # None: TLS with a per-run certificate; False: plain TCP


def check_transport(scheduler, jobqueue, security, insecure: bool) -> None:
    """Refuse, before any connection, a scheduler that is plain TCP off this machine: one given by address (not
    tls://), or a jobqueue scheduler listening on another host or interface without TLS; `insecure` allows it."""
    from spatialfed.runtime.security import off_machine_plain, refuse_plain_remote

    if insecure:
        return
    flag = option("Cluster(insecure=True)", "--insecure")
    tls = option("cluster=Cluster(address='tls://HOST:PORT', tls='CERT_DIR')", "--scheduler tls://HOST:PORT --tls-dir DIR")
    host = off_machine_plain(scheduler) if scheduler and str(scheduler).strip() else None  # blank: connect's error
    if host is not None:
        refuse_plain_remote(f"the scheduler {scheduler}", host, f"start it with TLS and connect with {tls}", flag)
    if jobqueue and not security:
        where = jobqueue.get("interface") or off_machine_plain(str(jobqueue.get("host", LOOPBACK[0])))
        if where is not None:
            refuse_plain_remote(f"the batch jobs' scheduler on {where}", where,
                                f"give {option('Cluster(tls=True)', '--tls')} (dask-jobqueue hands the jobs the certificate)",
                                flag)
