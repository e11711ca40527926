"""What every server state machine shares (FederatedServer, StatsServer, FgprServer): its phases, the sites taking
part, the fit's results and trace, and `dispatch` over the server's own `busy`/`next_task`.

Sans-IO (the h11/h2 pattern): a server takes "quantities arrived" events (`receive(qs, now)`) and answers with
"send p to site j" decisions (`next_task(j)`); it never waits, sleeps or talks to a network. A server that wants to
act at a time without an answer names it in `alarm`, and the runtime calls `tick(now)` then. Runtimes drive it
(runtime/driver.py).
"""

from __future__ import annotations

from enum import StrEnum

from collections.abc import Sequence

from spatialfed.algorithm.protocol import Augmented, Quantity
from spatialfed.errors import SpatialFedError
from spatialfed.model.params import Params


class Phase(StrEnum):
    """Where a server is: the φ₀ summaries, the pilot start (statistics server), the iterations, the final synchronous passes, done — or stopped on an
    error (a receive that raised leaves the state unusable: the fit is resumed from a checkpoint instead)."""

    MOMENTS = "moments"
    VARIOGRAM = "variogram"
    PILOT = "pilot"
    LOOP = "loop"
    FINAL = "final"
    VALUE = "value"
    DONE = "done"
    ERROR = "error"


class ServerState:
    """What every server shows its runtime and the result files (FederatedServer, fgpr.FgprServer): the workers
    taking part, the fit's results, its trace, and `dispatch` over the server's own `busy`/`next_task`."""

    def _start_state(self, n_workers: int) -> None:
        """No worker dropped, no iteration done, no result yet."""
        self.active: list[int] = list(range(n_workers))  # workers still taking part (drop_worker removes one)
        self.dropped: list[dict] = []  # {"worker", "step", "cause", "iter", "time_s"} of each dropped worker
        self.t = 0
        self.iterations = 0
        self.params: Params | None = None
        self.loglik: float | None = None
        self.n_obs: int | None = None
        self.converged = False
        self.stop_reason: str | None = None
        self.trace: list[dict] = []
        self._last_now = 0.0  # the runtime's clock at the last receive (kept in snapshots)

    def _remove_worker(self, j: int, step: str, cause: str, now: float) -> None:
        """Take failed worker j out of `active` and record who, where and why in `dropped` (drop_worker's first half)."""
        if j not in self.active:
            raise ValueError(f"worker {j} is not taking part in the fit (active: {self.active})")
        if len(self.active) == 1:
            raise SpatialFedError(f"worker {j} failed in sub-step {step!r} ({cause}) and no other worker is left")
        self.active.remove(j)
        self.dropped.append({"worker": int(j), "step": str(step), "cause": str(cause), "iter": int(self.t),
                             "time_s": float(now)})

    @property
    def alarm(self) -> float | None:
        """The clock time at which the server wants `tick` called if no answer arrives before (None: no wish). A
        sans-IO timer, as aioquic's get_timer/handle_timer: the runtime keeps the clock, the server decides."""
        return None

    def tick(self, now: float) -> None:
        """The alarm went off at `now` with no answer since (runtime/driver.py)."""

    def spent(self, seconds: float) -> None:
        """The runtime's measure of the call just made (receive, tick or next_task): the seconds of the fit's clock
        it took (0 where the clock leaves the server out). A server that decides from its own costs keeps them."""

    def clock(self, now: float) -> None:
        """The runtime's clock when it hands out tasks outside a receive (the first ones after its start, at an
        activation, after a tick): the time `next_task` takes as their sending time."""
        self._last_now = float(now)

    @property
    def time_s(self) -> float:
        """The runtime's clock at the last receive (a resumed fit's clock carries on from it)."""
        return self._last_now

    def dispatch(self) -> list[tuple[int, Augmented]]:
        """next_task for every idle worker that has work, in worker order."""
        tasks = [(j, self.next_task(j)) for j in self.active if not self.busy(j)]
        return [(j, p) for j, p in tasks if p is not None]

    def receive(self, qs: Quantity | Sequence[Quantity], now: float) -> None:
        """Quantities that arrived at `now` seconds since the fit started: one, or a batch that enters together.
        The template every server keeps: input after an error is refused; the whole batch is checked before any of
        it is applied (`_validate`); a failure while applying it (`_receive`) enters the error phase and is raised."""
        self._check_usable()
        qs = [qs] if isinstance(qs, Quantity) else list(qs)
        self._validate(qs)
        try:
            self._receive(qs, now)
        except Exception as exc:
            self._fail(exc)
            raise

    def _validate(self, qs: list[Quantity]) -> None:
        """A runtime's mistake is refused before anything changes: every quantity answers its site's task."""
        for q in qs:
            p = self._in_flight.get(q.worker)
            if p is None:
                raise RuntimeError(f"worker {q.worker} sent a quantity without a task in flight")
            if (q.t, q.step) != (p.t, p.step):
                raise RuntimeError(f"worker {q.worker} answered ({q.t}, {q.step}) to task ({p.t}, {p.step})")

    def _receive(self, qs: list[Quantity], now: float) -> None:
        raise NotImplementedError

    def _fail(self, exc: BaseException) -> None:
        """Enter the error phase: record why; further receive calls are refused (`_check_usable`)."""
        self.phase = Phase.ERROR
        self.stop_reason = f"error: {type(exc).__name__}: {exc}"

    def _check_usable(self) -> None:
        if self.phase == Phase.ERROR:
            raise SpatialFedError(f"the server stopped on an error ({self.stop_reason}); resume from the last "
                                  "checkpoint or start the fit again")
