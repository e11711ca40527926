"""The fit's progress display: initialisation announced, an ETA per iteration in logs, a tqdm bar on a terminal."""

import io

from spatialfed import FederatedGP
from spatialfed.api import progress
from spatialfed.api.progress import eta


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_eta_is_the_mean_time_per_iteration_times_the_rest():
    assert eta(10.0, 2, 10) == "eta ≤ 40s"
    assert eta(10.0, 0, 10) == eta(1.0, 10, 10) == eta(1.0, 3, None) == ""


def test_log_lines_carry_the_eta(store, capsys):
    FederatedGP(mode="sync", knots=9, max_iter=4, cluster="simulated", strategies="tuned").fit(store)  # 4 iterations
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "spatialfed fit: starting the simulated runtime ..."  # before anything is started
    iters = [line for line in err if line.startswith("iter")]
    done = [int(line.split()[1]) for line in iters]
    assert done == sorted(done) and done[0] == 0 and done[-1] == 4
    assert all("eta ≤" in line for line, k in zip(iters, done) if 0 < k < 4) and "eta" not in iters[-1]
    assert any(line.startswith("nugget 1/δ = ") and "practical range" in line for line in err)


def test_a_terminal_gets_a_bar(store, monkeypatch):
    screen = Terminal()
    monkeypatch.setattr(progress.sys, "stderr", screen)
    FederatedGP(mode="sync", knots=9, max_iter=4, cluster="simulated", strategies="tuned").fit(store)  # 4 iterations
    shown = screen.getvalue()
    assert "init:   0%" in shown and "fit: 100%" in shown and "4/4" in shown and "δ=" in shown
    assert "\niter " not in shown  # the bar replaces the per-iteration lines
