"""Params (model/params.py): inputs are stored as float arrays of the documented shapes, and a non-finite one is named.

Found unguarded by the mutation run of model/params.py (27 Nov, docs/contributing.md).
"""

import numpy as np
import pytest

from spatialfed.model.params import Params


def test_params_store_lists_and_scalars_as_float_arrays():
    p = Params([1, 2], [[2, 0], [0, 1]], 3, 2, 1, 0.5)
    for name, shape in (("mu", (2,)), ("Sigma", (2, 2)), ("gamma", (1,))):
        value = getattr(p, name)
        assert isinstance(value, np.ndarray) and value.dtype == np.float64 and value.shape == shape, name
    np.testing.assert_array_equal(p.Sigma, [[2.0, 0.0], [0.0, 1.0]])
    assert p.with_u(np.log([4.0, 3.0, 0.25])).theta_key == pytest.approx((4.0, 3.0, 0.25))


@pytest.mark.parametrize("name", ["mu", "Sigma", "gamma"])
def test_a_non_finite_parameter_is_named(name):
    good = {"mu": np.zeros(2), "Sigma": np.eye(2), "gamma": np.ones(1)}
    good[name] = np.where(np.arange(good[name].size).reshape(good[name].shape) == 0, np.nan, good[name])
    with pytest.raises(ValueError, match=f"^{name} contains 1 non-finite"):
        Params(good["mu"], good["Sigma"], good["gamma"], 2.0, 1.0, 0.5)
