"""The runtime interface: how the sans-IO server's decisions reach the sites and their answers come back.

A `Runtime` does four things and knows nothing of the algorithm:

- `start(specs)`: every site loads its partition where it lives (`runtime.site`), once;
- `submit(j, p, delay_s)` / `wake(j, at)`: ask site j for L_j(p), or wake it at its next activation;
- `alarm(at)`: call the server back at `at` if no answer comes first (the server's `alarm`/`tick`);
- `completed()`: yield the answers in batches as they complete (Dask's ``as_completed(...).batches()`` idiom),
  each an `Event` — a result, a failure of the site's computation, or the loss of the machine it ran on;
- `now()`: the fit's clock (wall seconds on Dask, virtual seconds on the virtual clock);
- `charge(seconds)`: the server computed for that long (`runtime.driver` measures every server call): a wall
  clock has already moved on; the virtual clock runs the server as one processor and moves on by it.

`runtime.driver.drive` runs the one loop over this interface for every server; `DaskRuntime` (runtime/dask_runtime.py)
and `VirtualRuntime` (runtime/virtual.py) implement it. A new runtime (Ray, MPI) implements these methods and
runs `runtime.site.answer` where the partitions live: docs/interfaces.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from spatialfed.algorithm.protocol import Augmented, Quantity
from spatialfed.runtime.site import SiteSpec

#: the request of a wake-up event (a Poisson activation, docs/delays.md)
ACTIVATION = "activation"
#: the request of the server's timer event (`Runtime.alarm`; its site is ALARM_SITE)
ALARM, ALARM_SITE = "alarm", -1


@dataclass
class Event:
    """One completed request of site `site`: `result` (a Quantity, or the load summary), or `error` (one line: the
    site's computation failed), or `lost` (the machine running it left; the runtime has moved the site and the
    request must be sent again)."""

    site: int
    request: Augmented | str | None  # None: the partition load; ACTIVATION: a wake-up
    result: Quantity | dict | None = None
    error: str | None = None
    lost: bool = False


class Runtime(ABC):
    """Where the sites' work runs (module docstring)."""

    #: the name recorded in results ("dask", "simulated")
    name: str = ""
    #: CPU seconds the server's own calls took so far (`charge`)
    server_s: float = 0.0

    @abstractmethod
    def start(self, specs: Sequence[SiteSpec], clock_start: float = 0.0, on_loaded=None, skip=()) -> list[Event]:
        """Load every site's partition; one Event per site (result: {"n", "p", ...}, or error), each also passed to
        `on_loaded(event)` as it lands (progress). The clock starts at `clock_start` (a resumed fit carries on
        its clock). Sites in `skip` (dropped before a resume) need not be loaded: their Event has no result."""

    @abstractmethod
    def submit(self, j: int, p: Augmented, delay_s: float = 0.0) -> None:
        """Ask site j for L_j(p); `delay_s`, a drawn extra delay, is added to its completion."""

    @abstractmethod
    def wake(self, j: int, at: float) -> None:
        """Complete an ACTIVATION event of site j at clock time `at`."""

    @abstractmethod
    def alarm(self, at: float | None) -> None:
        """Set the server's timer: an ALARM event completes at clock time `at` unless an answer comes first, or the
        timer is set again (None: no timer). It never keeps `completed` going when nothing else is outstanding."""

    @abstractmethod
    def completed(self) -> Iterator[list[Event]]:
        """Batches of events as they complete; ends when nothing is outstanding."""

    @abstractmethod
    def now(self) -> float:
        """The fit's clock in seconds."""

    @abstractmethod
    def call(self, name: str, calls: Mapping[int, tuple]) -> dict[int, object]:
        """{j: runtime.site.call(spec_j, name, args)} for each j in `calls`, where each partition lives."""

    @abstractmethod
    def stop(self) -> None:
        """Cancel outstanding work and release the partitions (always called, also after a failure)."""

    def charge(self, seconds: float) -> float:
        """The server computed for `seconds` of CPU (one receive, tick or next_task call): returns the seconds of
        the fit's clock it took (a wall clock has moved on by itself: all of them). The total is kept in
        `server_s`."""
        self.server_s += float(seconds)
        return float(seconds)

    def free(self, j: int) -> bool:
        """Whether a task of site j would start at once: the processor it runs on has an idle thread. True here:
        each site has its own (the virtual clock); a runtime whose sites share processors answers for itself."""
        return True

    def describe(self) -> dict:
        """What the runtime reports besides the server (assignment of sites, task counts...)."""
        return {}
