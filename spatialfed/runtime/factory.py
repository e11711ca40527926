"""A runtime from a name or an object: the one place that turns "dask" / "simulated" into a started `Runtime`.

    with open_runtime("dask", scheduler="tcp://10.0.0.5:8786") as rt:   # or "simulated", or a Runtime object
        ...

"dask" connects to `client` (never closed here), or to the scheduler at `scheduler`, or starts a dask-jobqueue
cluster (`jobqueue`), or an embedded LocalCluster on 127.0.0.1 with min(sites, usable cores) processes; whatever it
started it closes on exit. "simulated" runs every site in this process on a virtual clock (for experiments and small
data, not for private data).
"""

from __future__ import annotations

from contextlib import contextmanager

from spatialfed.runtime.interface import Runtime

RUNTIMES = ("dask", "simulated")
#: older names of the in-process runtime (prediction called it "simulated", the pipelines "virtual")
ALIASES = {"simulated": "simulated", "virtual": "simulated"}


def runtime_name(runtime) -> str:
    """The canonical name of `runtime` (a name or a Runtime); ValueError listing the choices otherwise."""
    if isinstance(runtime, Runtime):
        return runtime.name
    name = ALIASES.get(runtime, runtime)
    if name not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES} or a spatialfed.runtime Runtime object, got {runtime!r}")
    return name


@contextmanager
def open_runtime(runtime="dask", *, slowdowns="balanced", client=None, scheduler=None, jobqueue=None,
                 n_dask_workers=None, n_sites=None, security=None, timeout: float = 5.0, **options):
    """Yield a Runtime for `runtime` (a name or a Runtime object, yielded as is); `options` go to its constructor."""
    if isinstance(runtime, Runtime):
        yield runtime
        return
    if runtime_name(runtime) == "simulated":
        if scheduler or client is not None or jobqueue:
            raise ValueError("runtime='simulated' runs in this process; scheduler/client/jobqueue need runtime='dask'")
        from spatialfed.runtime.cluster import limit_blas_threads
        from spatialfed.runtime.virtual import VirtualRuntime

        with limit_blas_threads(1):  # J small problems in turn: threads only add overhead
            yield VirtualRuntime(slowdowns=slowdowns, **options)
        return
    from spatialfed.runtime.cluster import default_n_workers, make_cluster
    from spatialfed.runtime.dask_runtime import DaskRuntime

    handle = None
    if n_dask_workers is not None and (isinstance(n_dask_workers, bool) or not float(n_dask_workers).is_integer()
                                       or n_dask_workers < 1):  # 0 would silently mean "the default"
        raise ValueError(f"n_dask_workers (--dask-workers) must be a positive integer, got {n_dask_workers!r}")
    if client is None:
        n = n_dask_workers or min(n_sites or default_n_workers(), default_n_workers())  # no idle processes
        handle = make_cluster(scheduler, n_workers=n, jobqueue=jobqueue, timeout=timeout, security=security)
        client = handle.client
    try:
        yield DaskRuntime(client, slowdowns, **options)
    finally:
        if handle is not None:
            handle.close()
