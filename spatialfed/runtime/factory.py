"""A runtime from a name or an object: the one place that turns "dask" / "simulated" into a started `Runtime`.

    with open_runtime("dask", scheduler="tcp://10.0.0.5:8786") as rt:   # or "simulated", or a Runtime object
        ...

"dask" connects to `client` (never closed here), or to the scheduler at `scheduler`, or starts a dask-jobqueue
cluster (`jobqueue`), or an embedded LocalCluster on 127.0.0.1 with min(sites, usable cores) processes; whatever it
started it closes on exit. "simulated" runs every site in this process on a virtual clock (for experiments and small
data, not for private data).

"auto" (the estimator's and the commands' default) picks one of the two for the job (`choose_runtime`):
the in-process runtime when the job is small — total observations × knots ≤ AUTO_THRESHOLD (knots count as 100 for
the no-knot methods) — and nothing asks for Dask (a client, scheduler, batch system, TLS, the live page,
dropping failed workers, a Dask worker count, emulated heterogeneity or delays); Dask otherwise. Checkpoints work on
both.
Below the threshold a LocalCluster costs more than the whole fit (10–20 s to start on 2 cores against under a second
for Meuse's 155 points, docs/user-guide.md), and in-process changes nothing a user keeps: the embedded cluster runs
on this machine too, with its processes reading the same store, and the balanced in-process fit computes the same
quantities, aggregated by the same server (a synchronous fit gives the Dask fit's estimate to rounding). Explicit
"dask" always uses Dask.
"""

from __future__ import annotations

from contextlib import contextmanager

from spatialfed.errors import option
from spatialfed.runtime.interface import Runtime

DASK = "cluster='dask'"  # how Python asks for Dask (spatialfed.errors.option)

RUNTIMES = ("auto", "dask", "simulated")
#: older names of the in-process runtime (prediction called it "simulated", the pipelines "virtual")
ALIASES = {"simulated": "simulated", "virtual": "simulated"}
#: "auto" runs in-process up to this many observation·knots (N·m): 155 Meuse points × 50 knots = 7,750; 10 sites of
#: 500 points × 100 knots = 500,000 (an in-process full-residual fit of about 10 s on 2 shared cores)
AUTO_THRESHOLD = 500_000
#: the knot count charged to the methods without knots (independent, fgpr: their cost is the local n_j³)
NO_KNOTS_CHARGE = 100


def runtime_name(runtime) -> str:
    """The canonical name of `runtime` (a name or a Runtime); ValueError listing the choices otherwise."""
    if isinstance(runtime, Runtime):
        return runtime.name
    name = ALIASES.get(runtime, runtime)
    if name not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES} or a spatialfed.runtime Runtime object, got {runtime!r}")
    return name


def choose_runtime(runtime="auto", *, n_obs: int | None = None, n_knots: int | None = None,
                   dask_options=()) -> tuple[str, str]:
    """(runtime name, why) for `runtime`: "dask" and "simulated" as given (why = ""); "auto" is "simulated" when
    n_obs · n_knots ≤ AUTO_THRESHOLD and `dask_options` (the names of given options that need Dask) is empty, else
    "dask". Unknown sizes choose Dask."""
    name = runtime_name(runtime)
    if name != "auto":
        return name, ""  # asked for: nothing to explain
    needs = [str(option) for option in dask_options if option]
    if needs:
        return "dask", f"runtime auto: {', '.join(needs)} need{'s' if len(needs) == 1 else ''} Dask"
    if n_obs is None:
        return "dask", "runtime auto: the job's size is unknown"
    size = int(n_obs) * int(n_knots if n_knots else NO_KNOTS_CHARGE)
    if size <= AUTO_THRESHOLD:
        return "simulated", (f"runtime auto: a small job runs in this process, {int(n_obs)} observations × "
                             f"{int(n_knots or NO_KNOTS_CHARGE)} knots = {size:,} ≤ {AUTO_THRESHOLD:,}; "
                             f"{option(DASK, '--runtime dask')} to use Dask")
    return "dask", (f"runtime auto: {int(n_obs)} observations × {int(n_knots or NO_KNOTS_CHARGE)} knots = {size:,} "
                    f"> {AUTO_THRESHOLD:,}")


def knot_count(knots) -> int:
    """The number of knots of a `knots=` setting: an int m, an (m, 2) array, or None/0 (no knots)."""
    if knots is None:
        return 0
    if isinstance(knots, (int, float)) and not isinstance(knots, bool):
        return int(knots)
    import numpy as np

    return int(np.asarray(knots).reshape(-1, 2).shape[0])


@contextmanager
def open_runtime(runtime="dask", *, slowdowns="balanced", client=None, scheduler=None, jobqueue=None,
                 n_dask_workers=None, n_sites=None, security=None, timeout: float = 5.0, insecure: bool = False,
                 **options):
    """Yield a Runtime for `runtime` (a name or a Runtime object, yielded as is); `options` go to its constructor.
    `insecure` allows a plain-TCP scheduler off this machine (cluster.check_transport)."""
    if isinstance(runtime, Runtime):
        yield runtime
        return
    if runtime_name(runtime) == "auto":  # the size is unknown here: callers that know it resolve first
        runtime = choose_runtime(runtime)[0]  # (choose_runtime); unknown size → Dask
    if runtime_name(runtime) == "simulated":
        if scheduler or client is not None or jobqueue:
            raise ValueError("runtime='simulated' runs in this process; scheduler/client/jobqueue need runtime='dask'")
        from spatialfed.runtime.blas import limit_blas_threads
        from spatialfed.runtime.virtual import VirtualRuntime

        with limit_blas_threads(1):  # J small problems in turn: threads only add overhead
            yield VirtualRuntime(slowdowns=slowdowns, **options)
        return
    from spatialfed.runtime.cluster import default_n_workers, make_cluster
    from spatialfed.runtime.dask_runtime import DaskRuntime

    handle = None
    if n_dask_workers is not None and (isinstance(n_dask_workers, bool) or not float(n_dask_workers).is_integer()
                                       or n_dask_workers < 1):  # 0 would silently mean "the default"
        raise ValueError(f"{option('Cluster(n_workers=)', '--dask-workers')} must be a positive integer, "
                         f"got {n_dask_workers!r}")
    if client is None and not scheduler and not jobqueue and n_dask_workers is not None:
        check_worker_count(int(n_dask_workers), n_sites, default_n_workers())
    if client is None:
        n = n_dask_workers or min(n_sites or default_n_workers(), default_n_workers())  # no idle processes
        handle = make_cluster(scheduler, n_workers=n, jobqueue=jobqueue, timeout=timeout, security=security,
                              insecure=insecure)
        client = handle.client
        if handle.worker_wait_s is not None:  # a batch queue: replacements for retired workers take a while
            options.setdefault("worker_wait_s", handle.worker_wait_s)
    try:
        yield DaskRuntime(client, slowdowns, **options)
    finally:
        if handle is not None:
            handle.close()


#: at most this many embedded worker processes per usable core (each holds its partitions and a Python process)
PROCESSES_PER_CORE = 4


def check_worker_count(n: int, n_sites: int | None, cores: int) -> None:
    """Refuse more embedded Dask worker processes than sites (each serves at least one; the others would idle) or
    than PROCESSES_PER_CORE × the usable cores (starting them alone takes minutes), in one line."""
    flag = option("Cluster(n_workers=)", "--dask-workers")
    if n_sites is not None and n > n_sites:
        raise ValueError(f"{flag} {n} is more than the store's {n_sites} sites: each Dask worker process serves at "
                         f"least one site; give at most {n_sites}")
    if n > PROCESSES_PER_CORE * cores:
        raise ValueError(f"{flag} {n} is more than {PROCESSES_PER_CORE} processes per core on this machine's "
                         f"{cores} usable cores; give at most {PROCESSES_PER_CORE * cores}, or run the sites on a "
                         f"cluster ({option('cluster=', '--scheduler, --jobqueue')})")
