"""The statistics server under secure aggregation (algorithm/secure_server.py), on the virtual runtime: the same fit
as the plain synchronous one, a dropped site's round redone, too few sites refused."""

import numpy as np
import pytest

from spatialfed.algorithm import secagg
from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.secure_server import SecureStatsServer
from spatialfed.algorithm.make_server import server_for
from spatialfed.algorithm.stats_server import StatsServer
from spatialfed.errors import SpatialFedError
from spatialfed.runtime.virtual import run_virtual
from tests.support import simulate

CONFIG = dict(mode="sync", scheme="stats", max_iter=100, tol=1e-8)


def _plain(models, knots, kernel):
    """The plain synchronous statistics fit of `models`."""
    return run_virtual(models, knots, kernel, server=StatsServer(len(models), knots, kernel, FitConfig.of(**CONFIG)))


@pytest.fixture(scope="module")
def problem():
    return simulate(J=4, n=50, side=4, residual="full", seed=5)


@pytest.fixture(scope="module")
def plain(problem):
    return _plain(*problem)


class Recording(SecureStatsServer):
    """Keeps what the server received from the sites (the masked answers), as a curious server would."""

    def receive(self, qs, now):
        self.seen = [*getattr(self, "seen", []), *qs]
        super().receive(qs, now)


def test_secure_fit_is_the_plain_fit(problem, plain):
    models, knots, kernel = problem
    server = server_for(len(models), knots, kernel, FitConfig.of(**CONFIG, secure_aggregation=True))
    assert isinstance(server, SecureStatsServer)
    secure = run_virtual(models, knots, kernel, server=server)
    assert secure.converged and plain.converged
    assert abs(secure.loglik - plain.loglik) <= 1e-9 * abs(plain.loglik)
    assert np.allclose(secure.params.u, plain.params.u, rtol=0, atol=1e-7)
    assert secure.iterations == plain.iterations
    assert secure.redone == 1  # the first round only collects the keys


def test_the_server_receives_only_masked_numbers(problem):
    models, knots, kernel = problem
    server = Recording(len(models), knots, kernel, FitConfig.of(**CONFIG, secure_aggregation=True))
    run_virtual(models, knots, kernel, server=server)
    stats = [q.xi for q in server.seen if secagg.MASKED in q.xi and q.step == "stats"]
    assert stats and all(set(xi) <= {*secagg.PUBLIC, secagg.MASKED} for xi in stats)
    keys = [q.xi for q in server.seen if secagg.KEY_ANSWER in q.xi]
    assert len(keys) == len(models) and all(set(xi) == {secagg.KEY_ANSWER} for xi in keys)


class DropsSite(SecureStatsServer):
    """Drops site `victim` in the loop once its masked answer and some others' are in, not yet all."""

    victim, dropped_at = 2, None

    def receive(self, qs, now):
        super().receive(qs, now)
        r = self._round
        if (self.dropped_at is None and self.phase == "loop" and r is not None and self.victim in r.answers
                and len(r.answers) < len(r.tasks)):
            self.dropped_at = r.id
            self.drop_worker(self.victim, "stats", "test", now)


def test_a_site_dropped_mid_round_redoes_the_round_over_the_others(problem):
    """The round is redone over the three others with fresh masks: the fit ends at the maximiser of their data."""
    models, knots, kernel = problem
    rest = [m for j, m in enumerate(models) if j != DropsSite.victim]
    ref = _plain(rest, knots, kernel)
    server = DropsSite(len(models), knots, kernel, FitConfig.of(**CONFIG, secure_aggregation=True))
    run_virtual(models, knots, kernel, server=server, slowdowns=[1.0, 1.0, 1.0, 4.0])
    assert server.dropped_at is not None and server.active == [0, 1, 3] and server.converged
    assert server.redone == 2  # the keys' round and the dropped one
    assert abs(server.loglik - ref.loglik) <= 1e-9 * abs(ref.loglik)
    assert np.allclose(server.params.u, ref.params.u, rtol=0, atol=1e-6)


def test_too_few_sites_are_refused(problem):
    models, knots, kernel = problem
    with pytest.raises(ValueError, match="at least 3 sites"):
        FitConfig.of(**CONFIG, secure_aggregation=True, n_workers=2)
    with pytest.raises(ValueError, match="mode='sync'"):
        FitConfig.of(mode="async", scheme="stats", secure_aggregation=True)
    three = models[:3]

    class Drop(SecureStatsServer):
        def receive(self, qs, now):
            super().receive(qs, now)
            if self.phase == "loop":
                self.drop_worker(0, "stats", "test", now)

    server = Drop(3, knots, kernel, FitConfig.of(**CONFIG, secure_aggregation=True))
    with pytest.raises(SpatialFedError, match="only 2 remain"):
        run_virtual(three, knots, kernel, server=server)


def test_a_checkpoint_mid_fit_resumes_to_the_same_estimate(problem, plain, tmp_path):
    """Written mid-loop (public keys as text, no masked answers), read back, continued on fresh sites: the round in
    progress is asked again under new keys and the fit ends where the plain one does."""
    from spatialfed.algorithm.checkpoint import read_checkpoint, write_checkpoint
    from spatialfed.algorithm.make_server import restore_server

    models, knots, kernel = problem
    path = tmp_path / "ck.pkl"

    def save(server, now):
        if server.phase == "loop" and server.epochs == 2 and not path.exists():
            write_checkpoint(path, server)

    run_virtual(models, knots, kernel, server=SecureStatsServer(len(models), knots, kernel,
                                                                 FitConfig.of(**CONFIG, secure_aggregation=True)),
                on_event=save)
    server = restore_server(read_checkpoint(path))
    assert isinstance(server, SecureStatsServer) and server.epochs == 2
    fresh = simulate(J=4, n=50, side=4, residual="full", seed=5)[0]  # new processes: no site holds its old key
    run_virtual(fresh, knots, kernel, server=server)
    assert abs(server.loglik - plain.loglik) <= 1e-9 * abs(plain.loglik)
