"""Progress names every phase of a fit from its first second (issue 14, "progress visible throughout").

A terminal's phase bar shows the runtime's start, the default domain, the partitions loading, the initial values
(moments, variogram) and each round trip with the sites that answered; a log gets a status line for a phase that runs
long, with the answers so far and an ETA; quiet (``progress=False``, ``--quiet``) prints nothing and starts no thread;
the heartbeat thread ends with the fit, also when the fit fails.
"""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import pytest

from spatialfed import Cluster
from spatialfed import FederatedGP
from spatialfed.algorithm.protocol import Augmented
from spatialfed.api import progress
from spatialfed.api.progress import Progress
from spatialfed.cli import main
from spatialfed.errors import DataError
from spatialfed.runtime.cluster import SchedulerUnreachableError

FIT = {"mode": "sync", "knots": 9, "max_iter": 2, "cluster": "simulated"}


class Terminal(io.StringIO):
    def isatty(self):
        return True


def heartbeats() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "spatialfed-progress" and t.is_alive()]


def wait_for(condition, seconds: float = 3.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def in_order(text: str, parts: list[str]) -> list[int]:
    """Positions of `parts` in `text` (each searched after the previous one; -1 when missing)."""
    out, at = [], 0
    for part in parts:
        at = text.find(part, max(at, 0))
        out.append(at)
    return out


def test_a_terminal_names_every_phase_in_order(store, monkeypatch):
    screen = Terminal()
    monkeypatch.setattr(progress.sys, "stderr", screen)
    FederatedGP(**FIT).fit(store)
    shown = screen.getvalue()
    phases = ["spatialfed fit: starting the simulated runtime", "starting the simulated runtime …",
              "init:   0%", "loading the partitions of 3 sites: ", "initial values: moments: 0/3 sites",
              "initial values: variogram: 0/3 sites", "iter 0: round trip: 0/3 sites",
              "iter 1: round trip: 0/3 sites", "stopped (max_iter) after 2 iterations"]
    assert -1 not in in_order(shown, phases), shown
    assert wait_for(lambda: not heartbeats()), "the heartbeat thread outlived the fit"
    assert progress._ACTIVE.get() is None


def test_the_default_domain_is_a_phase_of_its_own(monkeypatch):
    """In-memory data have no simulation truth: the knots' domain comes from the sites' bounding boxes, which loads
    every partition once more, shown as its own phase before the fit's."""
    rng = np.random.default_rng(3)
    coords = rng.uniform(size=(90, 2))
    y = np.sin(6 * coords[:, 0]) + 0.3 * rng.standard_normal(90)
    screen = Terminal()
    monkeypatch.setattr(progress.sys, "stderr", screen)
    FederatedGP(**FIT).fit(None, y, coords=coords, groups=np.repeat([0, 1, 2], 30))
    shown = screen.getvalue()
    assert -1 not in in_order(shown, ["starting the simulated runtime …", "default domain: the bounding boxes of 3 "
                                      "sites …", "loading the partitions of 3 sites: "]), shown


def test_a_log_gets_a_status_line_with_the_answers_and_an_eta():
    out = io.StringIO()
    say = Progress(True, stream=out, every_s=30.0)
    say.TICK_S, say.ANNOUNCE_S = 0.02, 0.1
    say.starting("the simulated runtime (why it was chosen)")
    assert heartbeats()
    say.n_sites = 10
    say.phase("initial values: variogram", 10, announce=True, kind="variogram")
    for j in range(4):
        say.result(j, Augmented(None, 0, "variogram"))
    assert wait_for(lambda: "initial values: variogram (" in out.getvalue())
    status = [line for line in out.getvalue().splitlines() if line.startswith("initial values: variogram (")]
    assert len(status) == 1 and "4/10 sites answered" in status[0] and "eta ≈" in status[0], status
    say.phase("iter 0: round trip", 10, kind="round trip")  # not announced: silent for every_s
    time.sleep(0.3)
    assert "iter 0" not in out.getvalue()
    say.finish()
    assert wait_for(lambda: not heartbeats())
    printed = out.getvalue()
    time.sleep(0.1)
    assert out.getvalue() == printed and progress._ACTIVE.get() is None


def test_the_eta_comes_from_the_answers_or_from_the_last_phase_of_its_kind():
    say = Progress(True, stream=io.StringIO())
    say.phase("iter 1: round trip", 10, kind="round trip")
    say.phase_tic -= 8.0
    for j in range(4):
        say.result(j, Augmented(None, 1, "stats"))
    assert say.label == "iter 1: statistics"  # the first answer names what the sites compute
    assert say.status() == "iter 1: statistics (4/10 sites answered, 8 s, eta ≈ 12s)"
    say.phase_tic -= 12.0  # the round trip took 20 s: the next one's ETA before any answer
    say.phase("iter 2: round trip", 10, kind="round trip")
    say.phase_tic -= 5.0
    assert say.status() == "iter 2: round trip (0/10 sites answered, 5 s, eta ≈ 15s)"
    say.phase("starting an embedded Dask LocalCluster")
    assert say.status().startswith("starting an embedded Dask LocalCluster (0 s") and "eta" not in say.status()


def test_quiet_prints_nothing_and_starts_no_thread(store, capsys, monkeypatch):
    ran = []
    monkeypatch.setattr(Progress, "_beat", lambda self, stop: ran.append(stop))
    FederatedGP(progress=False, **FIT).fit(store)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == "" and ran == []
    progress.phase("a phase outside any fit")  # no fit in progress: nothing happens
    assert capsys.readouterr().err == ""


def test_the_cli_shows_the_phases_and_quiet_prints_nothing(store, tmp_path, monkeypatch):
    screen = Terminal()
    monkeypatch.setattr(progress.sys, "stderr", screen)
    flags = ["--mode", "sync", "--knots", "9", "--max-iter", "2", "--runtime", "simulated"]
    assert main(["fit", str(store), "--out", str(tmp_path / "quiet"), *flags, "--quiet"]) == 0
    assert screen.getvalue() == ""
    assert main(["fit", str(store), "--out", str(tmp_path / "shown"), *flags]) == 0
    assert -1 not in in_order(screen.getvalue(), ["loading the partitions of 3 sites: ",
                                                  "initial values: variogram: 0/3 sites", "iter 1: round trip"])


def test_a_failing_fit_stops_the_heartbeat(store, monkeypatch):
    """A fit that fails while its runtime starts (no scheduler at the address) or once it runs (one knot) leaves no
    heartbeat printing behind."""
    monkeypatch.setattr(progress.sys, "stderr", io.StringIO())
    with pytest.raises(SchedulerUnreachableError):
        FederatedGP(**{**FIT, "cluster": Cluster(address="tcp://127.0.0.1:9", timeout=0.3)}).fit(store)
    assert wait_for(lambda: not heartbeats()), "the heartbeat thread outlived a runtime that did not start"
    assert progress._ACTIVE.get() is None
    with pytest.raises(DataError, match="at least 2 knots"):
        FederatedGP(**{**FIT, "knots": 1}).fit(store)
    assert wait_for(lambda: not heartbeats()), "the heartbeat thread outlived the failed fit"
    assert progress._ACTIVE.get() is None


def test_an_asynchronous_loop_is_one_phase_counting_every_answer(store, monkeypatch):
    """Async aggregates after every answer: the loop is one phase, renamed at each iteration and counting on (a new
    bar per answer would flicker), never with a total of sites it does not wait for."""
    seen, begun = [], []
    result, phase = Progress.result, Progress.phase

    def spy_result(self, j, p):
        result(self, j, p)
        if p is not None and p.step == "stats":
            seen.append((self.label, self.count, self.phase_total))

    def spy_phase(self, label, *args, **kwargs):
        begun.append(label)
        phase(self, label, *args, **kwargs)

    monkeypatch.setattr(Progress, "result", spy_result)
    monkeypatch.setattr(Progress, "phase", spy_phase)
    monkeypatch.setattr(progress.sys, "stderr", Terminal())
    FederatedGP(**{**FIT, "mode": "async", "max_iter": 6}).fit(store)
    loop = [label for label in begun if label.startswith("iter")]
    assert len(loop) == 1, begun  # one phase for the whole loop (the final pass would be another)
    counts = [count for _, count, _ in seen]
    assert counts == list(range(1, len(seen) + 1)) and len(seen) >= 6, seen
    assert {total for *_, total in seen} == {None}
    labels = [label for label, *_ in seen]
    assert labels[0] == "iter 0" and len(set(labels)) >= 3, labels  # renamed as the iterations go
