"""When the asynchronous statistics server lets its surrogate speak (docs/algorithm.md, "The asynchronous loop"):
every epoch point is sync's step, whatever the surrogate says, and a trace row (an estimate) is published only where
the surrogate agrees with sync's step and rests mostly on answers newer than the epoch point's. Each test gives the
server a surrogate with a known defect (or a perfect one) and checks what the fit lets it publish."""

import numpy as np
import pytest
from support import simulate

from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.likelihood import distance, sum_statistics
from spatialfed.algorithm.site_records import SiteRecords, Surrogate
from spatialfed.algorithm.stats_server import StatsServer
from spatialfed.model.stats import site_statistics
from spatialfed.runtime.virtual import run_virtual

SLOW = [1.0, 1.0, 1.0, 15.0]  # one straggler


@pytest.fixture(scope="module")
def problem():
    return simulate(J=4, n=60, side=4, residual="full", seed=3)


@pytest.fixture(scope="module")
def sync(problem):
    models, knots, kernel = problem
    server = StatsServer(len(models), knots, kernel, FitConfig.of(mode="sync", max_iter=300, tol=1e-8))
    return run_virtual(models, knots, kernel, server=server)


def exact_records(models, scale=1.0, shift=(0.0, 0.0, 0.0)):
    """SiteRecords whose surrogate is every site's exact statistics at u − shift, times `scale`."""
    shift = np.asarray(shift, dtype=float)

    class Exact(SiteRecords):
        def surrogate(self, u_at, active, n_obs, t, radius):
            def at(u):
                stats = [site_statistics(models[j], np.asarray(u) - shift) for j in sorted(active)]
                out = dict(sum_statistics(stats, scale))
                out["u"] = np.asarray(u, dtype=float)
                return out
            return Surrogate(at, radius, 0, sorted(active), None)
    return Exact


class Watched(StatsServer):
    """Records each epoch's point, and every estimate's distance to its epoch point against half the epoch's step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.points, self.rows = [], []

    def _start_epoch(self):
        super()._start_epoch()
        self.points.append(self._epoch.params.u.copy())

    def _surrogate_step(self, now):
        rows = len(self.trace)
        super()._surrogate_step(now)
        if len(self.trace) > rows:  # this step published an estimate
            self.rows.append((distance(self.params.u, self._epoch.params.u), 0.5 * self._epoch_step))
        self.probes = getattr(self, "probes", 0) + (len(self.trace) == rows)


#: the variogram start of this store before its bins followed the sites' extents: 2.2 from the maximiser in log δ
FAR_START = {"delta": 24.16750606990266, "sigma2": 0.8585626020801143, "beta": 0.06424655664429965}


def fit_with(problem, records, start=None):
    models, knots, kernel = problem
    server = Watched(len(models), knots, kernel, FitConfig.of(mode="async", max_iter=300, tol=1e-8), start)
    server.records = records(server.policy)
    return run_virtual(models, knots, kernel, server=server, slowdowns=SLOW)


@pytest.mark.parametrize("records", ["exact", "shifted"])
def test_every_epoch_point_is_sync_s_step_whatever_the_surrogate(problem, records):
    """From a far start, with the exact ℓ as surrogate (it would rank its maximiser above sync's step) or with one
    moved 0.4 in log β: the epoch points are the synchronous fit's points, one for one, and so are its accepted ℓ."""
    models, knots, kernel = problem
    shift = (0.0, 0.0, 0.0) if records == "exact" else (0.0, 0.0, 0.4)
    fit_ = fit_with(problem, exact_records(models, shift=shift), FAR_START)
    ref = Watched(len(models), knots, kernel, FitConfig.of(mode="sync", max_iter=300, tol=1e-8), FAR_START)
    ref = run_virtual(models, knots, kernel, server=ref, slowdowns=SLOW)
    assert len(fit_.points) == len(ref.points) >= 3
    np.testing.assert_allclose(np.array(fit_.points), np.array(ref.points), rtol=0, atol=1e-9)
    assert [ll for _, ll in fit_.accepted] == pytest.approx([ll for _, ll in ref.accepted], abs=1e-8)
    assert fit_.converged and fit_.loglik == pytest.approx(ref.loglik, abs=1e-9)


def test_a_surrogate_step_that_disagrees_with_the_epoch_step_is_not_an_estimate(problem, sync):
    """A surrogate moved 0.4 in log β leads the faster sites away from the epoch point; those steps are probes:
    every estimate after the first epoch lies within half the epoch's step of its epoch point."""
    fit_ = fit_with(problem, exact_records(problem[0], shift=(0.0, 0.0, 0.4)))
    assert fit_.probes and all(d <= half * (1 + 1e-9) + 1e-12 for d, half in fit_.rows)
    assert fit_.converged and fit_.loglik == pytest.approx(sync.loglik, abs=1e-6)


def test_an_estimate_rests_mostly_on_answers_newer_than_the_epoch_point(problem, sync):
    """Two slow sites of four: after an epoch ends, half the observations are modelled at the epoch's base u_a,
    where sync's point already rests on them; a surrogate step there is a probe, and an estimate is published only
    once the answers it rests on lie, in mean square, within half of |s|² of it."""
    class Spread(Watched):
        def _surrogate_step(self, now):
            u_at, rows = self._explore.params.u, len(self.trace)
            super()._surrogate_step(now)
            candidate = distance(self.params.u, self._epoch.params.u) <= 0.5 * self._epoch_step
            if candidate and all(j in self.records.stats for j in self.active):
                spread = self.records.spread(self.params.u, u_at, self.active) / self._epoch_step ** 2
                self.spreads.append((spread, len(self.trace) > rows))

    models, knots, kernel = problem
    server = Spread(len(models), knots, kernel, FitConfig.of(mode="async", max_iter=300, tol=1e-8), FAR_START)
    server.spreads = []
    fit_ = run_virtual(models, knots, kernel, server=server, slowdowns=[1.0, 1.0, 6.0, 6.0])
    assert any(s > 0.5 for s, _ in fit_.spreads)  # the rule was tested: such steps happened
    assert all(s <= 0.5 * (1 + 1e-9) for s, published in fit_.spreads if published)
    assert any(published for _, published in fit_.spreads)
    assert fit_.converged and fit_.loglik == pytest.approx(sync.loglik, abs=1e-6)
