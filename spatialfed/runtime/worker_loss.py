"""Where sites live on Dask workers, and when a site whose request keeps killing its worker is given up.

Placement: round-robin at the start (`assign_partitions`); a site whose worker left moves to the live worker
holding the fewest partitions (`least_loaded`).

Deaths: a site is given up, not retried for ever, when its requests keep killing their Dask workers.

Dask's scheduler counts, per task, the workers that died while it ran, and fails it with KilledWorker once that
count exceeds ``distributed.scheduler.allowed-failures`` (default 3). The Dask runtime re-sends a lost request under
a new key on the site's new worker, which Dask counts as a new task; so the count is kept here, per site: the
distinct Dask workers that died while the site's request *ran* on them, since the site last answered. At
allowed-failures + 1 deaths (4 by default) the request ends as an error naming the site, and ``on_worker_error``
decides: stop the fit, or drop the site and continue (docs/recovery.md).

Which request ran: the scheduler's "remove-worker" event lists the tasks still processing on the worker (not
those it finished, whose result is merely lost), and is marked ``expected`` for a worker closed on purpose (not a
death). A Dask worker runs its tasks in the order they were submitted (same priority), `threads` at a time, so the
requests that ran are the first `threads` of those processing; those queued behind them do not count.
"""

from __future__ import annotations


def assign_partitions(n_workers: int, addresses: list[str]) -> list[str]:
    """Round-robin map site j -> Dask worker address (several partitions may share one process)."""
    if not addresses:
        raise RuntimeError("the Dask cluster has no workers; start at least one `dask worker`")
    addresses = sorted(addresses)
    return [addresses[j % len(addresses)] for j in range(int(n_workers))]


def least_loaded(assignment: list[str], alive: list[str]) -> str:
    """The live Dask worker holding the fewest partitions (the first in address order among equals)."""
    load = {a: sum(1 for b in assignment if b == a) for a in alive}
    return min(sorted(alive), key=lambda a: load[a])


def allowed_failures() -> int:
    """Dask's ``distributed.scheduler.allowed-failures`` (3 unless configured)."""
    import dask

    return int(dask.config.get("distributed.scheduler.allowed-failures", 3))


UNKNOWN = object()  # no remove-worker event (yet) for a worker found gone by the watchdog's poll


def step_name(request) -> str:
    """The sub-step a runtime request stands for: 'load' (None), a call's name (("call", name)) or p.step."""
    step = "load" if request is None else getattr(request, "step", request)
    return step[-1] if isinstance(step, tuple) else str(step)


class WorkerDeaths:
    """Per site, the Dask workers that died holding its in-flight request since its last answer."""

    def __init__(self, allowed: int | None = None):
        self.allowed = allowed_failures() if allowed is None else int(allowed)
        self._deaths: dict[int, list[str]] = {}
        self.ran: set[str] = set()  # keys of the tasks that were running on a worker when it died
        self._processing: dict[str, set | None] = {}  # dead worker -> its processing keys (None: closed on purpose)

    def removed(self, msg: dict) -> None:
        """The scheduler's remove-worker event `msg`: note what was processing on the worker."""
        self._processing[msg["worker"]] = None if msg.get("expected") else set(msg.get("processing-tasks", ()))

    def note_running(self, items, dead: set[str], threads: dict[str, int]) -> None:
        """From the in-flight `items` ((future, j, request, address), in submission order), note the keys of the
        tasks running on each `dead` address: its first `threads` processing ones (unfinished ones without the
        scheduler's event)."""
        seen: dict[str, int] = {}
        for future, _, _, address in items:
            processing = self._processing.get(address, UNKNOWN)
            candidate = not future.done() if processing is UNKNOWN else processing and future.key in processing
            if address in dead and candidate and seen.get(address, 0) < threads.get(address, 1):
                seen[address] = seen.get(address, 0) + 1
                self.ran.add(future.key)

    def died(self, j: int, address: str | None) -> bool:
        """Record that `address` died running site j's request; whether the site is now given up."""
        deaths = self._deaths.setdefault(j, [])
        if address is not None and address not in deaths:
            deaths.append(address)
        return len(deaths) > self.allowed

    def answered(self, j: int, result=None):
        """Site j answered (`result`, returned): the deaths before were not its request's doing."""
        self._deaths.pop(j, None)
        return result

    def count(self, j: int) -> int:
        return len(self._deaths.get(j, ()))

    def message(self, j: int, step: str, store: str) -> str:
        """The one line for a site given up: which site, how many deaths, the likely cause and the two ways on."""
        deaths = self._deaths.get(j, [])
        return (f"federated worker {j} (group workers/{j} of {store}) killed its Dask worker {len(deaths)} times in "
                f"sub-step '{step}' (Dask workers {', '.join(deaths)} died running its task; "
                f"distributed.scheduler.allowed-failures = {self.allowed}): its task likely needs more memory than a "
                f"Dask worker has; give the workers more memory (fewer --dask-workers, or --memory with --jobqueue) "
                f"or continue without this site (--on-worker-error drop)")
