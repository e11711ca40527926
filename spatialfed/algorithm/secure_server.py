"""The synchronous statistics server under secure aggregation (docs/secure-aggregation.md): StatsServer, whose every
pass (moments, variogram, pilot, loop, final) is asked of the sites as one masked round (algorithm/secagg.py).

A round is the set of tasks StatsServer gives every active site at once. Each site's request carries the round's id
(fresh for every attempt: the fit's random id and a counter) and the public keys of its members; a site answers
masked statistics, or only its public key while it holds none matching the request's (the first round of a fit, a
site that moved to a new process). Once every member answered the attempt, the server sums the masked answers and
decodes only the sum; StatsServer then receives, for each member, the public values of its answer (n_j, u) and the
members' mean of everything else — its sums, which are all the synchronous step reads, are Σ_j of the sites'
statistics (the variogram cutoff's median of the sites' extents becomes their mean). An attempt is redone with fresh
masks when a key changed or a member dropped out (never a partial sum); fewer than MIN_SITES members stop the fit.
"""

from __future__ import annotations

import dataclasses
import os

from spatialfed.algorithm.protocol import Augmented, Quantity
from spatialfed.algorithm.secagg import KEY_ANSWER, MIN_SITES, PUBLIC, unmasked_sum
from spatialfed.algorithm.stats_server import StatsServer
from spatialfed.errors import SpatialFedError


@dataclasses.dataclass
class Round:
    """One attempt at a masked round: its id, the StatsServer tasks of its members, the public keys sent (None:
    not known yet), the answers so far."""

    id: bytes
    tasks: dict
    peers: dict
    answers: dict = dataclasses.field(default_factory=dict)


class SecureStatsServer(StatsServer):
    """StatsServer (sync mode) that sees only the sum of the sites' statistics. Extra results: `secure_rounds`
    (attempts opened), `redone` (attempts redone after a key change or a drop)."""

    def __init__(self, n_workers: int, knots, kernel, config=None, start=None, *, bounds: tuple | None = None):
        if int(n_workers) < MIN_SITES:
            raise ValueError(f"secure aggregation needs at least {MIN_SITES} sites (with {int(n_workers)} the sum "
                             "reveals the others' statistics): add sites or fit without secure aggregation")
        self._keys: dict[int, bytes] = {}  # the sites' public keys, as relayed
        self._round: Round | None = None
        self._sent: dict[int, bytes] = {}  # site -> id of the attempt it is computing
        self._fit_id = os.urandom(16)
        self.secure_rounds = self.redone = 0
        self.pooled_variogram = None  # (edges, Σ_j binned sums) once the variogram round is decoded
        super().__init__(n_workers, knots, kernel, config, start, bounds=bounds)  # FitConfig refuses mode='async'

    def busy(self, j: int) -> bool:
        return j in self._sent

    def next_task(self, j: int, free: bool = True) -> Augmented | None:
        """Site j's request in the current attempt (a new round opened from StatsServer's tasks when none is)."""
        if self.done or j not in self.active or j in self._sent:
            return None
        if self._round is None:
            self._open()
        r = self._round
        if r is None or j not in r.tasks or j in r.answers:
            return None
        self._sent[j] = r.id
        p = r.tasks[j]
        return dataclasses.replace(p, extra={**p.extra, "secagg": {"round": r.id, "peers": dict(r.peers)}})

    def _open(self) -> None:
        tasks = {}
        for k in self.active:
            p = super().next_task(k, True)
            if p is not None:
                tasks[k] = p
        if tasks and len(tasks) < MIN_SITES:
            raise SpatialFedError(f"a secure-aggregation round would sum over only {len(tasks)} sites (fewer than "
                                  f"{MIN_SITES} reveal each other's statistics): the fit stops")
        if tasks:
            self._attempt(tasks)

    def _attempt(self, tasks: dict) -> None:
        self.secure_rounds += 1
        self._round = Round(self._fit_id + self.secure_rounds.to_bytes(8, "big"), tasks,
                            {k: self._keys.get(k) for k in tasks})

    def receive(self, qs, now: float) -> None:
        """Answers of the current attempt are kept (a site's public key, from any attempt, is relayed); once every
        member answered, the attempt is redone if a key changed, else only its sum is decoded and received."""
        self._check_usable()
        qs = [qs] if isinstance(qs, Quantity) else list(qs)
        for q in qs:
            if q.worker not in self._sent:
                raise RuntimeError(f"worker {q.worker} sent a quantity without a task in flight")
        r = self._round
        for q in qs:
            rid = self._sent.pop(q.worker)
            if KEY_ANSWER in q.xi:
                self._keys[q.worker] = bytes(q.xi[KEY_ANSWER])
            if r is not None and rid == r.id and q.worker in r.tasks:
                r.answers[q.worker] = q
        if r is None or any(k not in r.answers for k in r.tasks):
            return
        if any(KEY_ANSWER in q.xi for q in r.answers.values()) or any(self._keys.get(k) != r.peers[k]
                                                                       for k in r.tasks):
            self._redo()
            return
        self._round = None
        try:
            sums = unmasked_sum([r.answers[k].xi for k in sorted(r.tasks)])
        except Exception as exc:
            self._fail(exc)
            raise
        share = len(r.tasks)
        first = r.tasks[min(r.tasks)]
        if first.step == "variogram":  # the pooled bins, for the report's panel (outputs/monitor.py)
            self.pooled_variogram = (first.extra["edges"], sums)
        mean = {name: value / share for name, value in sums.items()}
        super().receive([Quantity({**{name: q.xi[name] for name in PUBLIC if name in q.xi}, **mean}, q.t, q.step, k)
                         for k, q in sorted(r.answers.items())], now)

    def _redo(self) -> None:
        self.redone += 1
        self._attempt(self._round.tasks)

    def drop_worker(self, j: int, step: str, cause: str, now: float) -> None:
        """Continue without site j when at least MIN_SITES remain (else stop with one line): the attempt in progress
        is redone over the others with fresh masks."""
        if len(self.active) - 1 < MIN_SITES:
            raise SpatialFedError(f"site {j} dropped out ({cause}) and secure aggregation needs at least {MIN_SITES} "
                                  f"sites: only {len(self.active) - 1} remain, the fit stops")
        super().drop_worker(j, step, cause, now)
        self._sent.pop(j, None)
        self._keys.pop(j, None)
        r = self._round
        if r is not None and j in r.tasks:
            del r.tasks[j]
            self._redo()

    def snapshot(self) -> dict:
        """StatsServer.snapshot without the round in progress (masked answers: a resumed fit asks again) and with
        the public keys as hex text (checkpoints hold data)."""
        snap = super().snapshot()
        state = snap["stats_server"]
        state.update(_round=None, _sent={}, _keys={j: key.hex() for j, key in self._keys.items()},
                     _fit_id=self._fit_id.hex())
        return snap

    @classmethod
    def restore(cls, snapshot) -> SecureStatsServer:
        """StatsServer.restore; the round in progress is opened again under a new fit id (fresh masks)."""
        server = super().restore(snapshot)
        server._round, server._sent, server._fit_id = None, {}, os.urandom(16)
        server._keys = {int(j): bytes.fromhex(key) for j, key in server._keys.items()}
        return server
