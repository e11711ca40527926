"""Profile-likelihood intervals (algorithm/family_interval.py): exact on a quadratic profile, open where ℓ stays
within the drop up to the box, and for log ν of a real family fit, ends where a separate refit with ν fixed there
lies χ²₁(0.95)/2 below the maximum."""

import numpy as np
import pytest
from scipy.stats import chi2

from spatialfed.algorithm.family_fit import NU_INDEX, family_bounds, family_start, fit_serial, nu_interval
from spatialfed.algorithm.family_interval import XTOL, likelihood_ratio_interval
from spatialfed.model.family import MaternFamily
from tests.conftest import grid_knots, simulate_parts

DROP = 0.5 * chi2.ppf(0.95, 1)


def test_a_quadratic_profile_gives_the_wald_interval():
    s = 0.3
    calls = []

    def profile(v):
        calls.append(v)
        return -10.0 - (v - 1.0) ** 2 / (2 * s**2)

    lo, hi = likelihood_ratio_interval(profile, 1.0, -10.0, s, -5.0, 5.0)
    half = np.sqrt(2 * DROP) * s  # = 1.95996 s
    assert lo == pytest.approx(1.0 - half, abs=XTOL) and hi == pytest.approx(1.0 + half, abs=XTOL)
    assert len(calls) < 40


def test_a_side_that_stays_flat_to_the_bound_is_open_and_a_skewed_one_is_longer():
    # ℓ_p drops fast below v̂ and never by more than 1 above it (a smooth field's ν): the upper side is open
    def profile(v):
        return -((v - 0.0) ** 2) / 0.02 if v < 0 else -1.0 * (1 - np.exp(-v))

    lo, hi = likelihood_ratio_interval(profile, 0.0, 0.0, 0.1, -3.0, 3.0)
    assert hi is None and lo == pytest.approx(-np.sqrt(0.02 * DROP), abs=XTOL)
    # skewed but bounded: the upper end is farther from v̂ than the lower
    lo, hi = likelihood_ratio_interval(lambda v: -v**2 / 0.02 if v < 0 else -v / 0.5, 0.0, 0.0, 0.1, -3.0, 3.0)
    assert hi == pytest.approx(0.5 * DROP, abs=XTOL) and -lo < hi


@pytest.mark.slow
def test_the_nu_interval_ends_where_a_refit_with_nu_fixed_drops_by_the_chi2_quantile():
    family = MaternFamily(None)
    parts = simulate_parts(J=3, n=60, nu=1.5, beta=0.2, seed=5)  # ν̂ on its upper bound 4: ℓ flat above
    knots = grid_knots(3)
    lower, upper = family_bounds(family, 1.0, 1.4)
    best = fit_serial(parts, knots, family, "full", family_start(family, 1.0, 1.4), lower, upper).done
    se = float(np.sqrt(np.diag(np.linalg.inv(-best.hess)))[NU_INDEX])
    lo, hi = nu_interval(parts, knots, family, "full", best, lower, upper, se)
    assert lo is not None and lo < best.u[NU_INDEX] and hi is None  # the Wald interval would be two-sided
    keep = [i for i in range(len(best.u)) if i != NU_INDEX]
    for end in (e for e in (lo, hi) if e is not None):
        fixed = MaternFamily(float(np.exp(end)), False, "euclidean")
        refit = fit_serial(parts, knots, fixed, "full", best.u[keep], lower[keep], upper[keep]).done
        # the drop's slope in log ν times XTOL bounds the root's error in ℓ
        assert best.loglik - refit.loglik == pytest.approx(DROP, abs=0.05)
