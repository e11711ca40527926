"""site_statistics' u: a Params or three finite numbers in any shape that holds three (found by the mutation run)."""

import numpy as np
import pytest

from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.stats import site_statistics


@pytest.fixture(scope="module")
def lm():
    rng = np.random.default_rng(2)
    g = np.linspace(0.2, 0.8, 2)
    knots = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    return LocalModel(rng.uniform(size=(12, 2)), rng.standard_normal(12), np.ones((12, 1)), knots, Matern(0.5), "mpp")


def test_u_as_a_column_is_u(lm):
    u = np.log([3.0, 0.9, 0.2])
    a, b = site_statistics(lm, u), site_statistics(lm, u.reshape(3, 1))
    np.testing.assert_array_equal(b["u"], u)
    np.testing.assert_array_equal(a["S"], b["S"])


@pytest.mark.parametrize("u", [[0.0, np.nan, 0.0], [0.0, 0.0, np.inf], [0.0, 1.0], [[0.0, 1.0, 2.0, 3.0]]])
def test_u_that_is_not_three_finite_numbers_is_refused(lm, u):
    with pytest.raises(ValueError, match="u must be 3 finite numbers"):
        site_statistics(lm, u)
