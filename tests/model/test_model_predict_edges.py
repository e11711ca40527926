"""model.predict at its edges: malformed inputs are named, variances at the knots are not negative (found by the
mutation run)."""

import numpy as np
import pytest

from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params
from spatialfed.model.predict import federated_predict, lowrank_prior

KNOTS = np.array([[0.2, 0.2], [0.8, 0.2], [0.5, 0.8]])
PARAMS = Params(np.zeros(3), np.eye(3), np.zeros(1), 2.0, 1.0, 0.3)


@pytest.mark.parametrize("locs0, what", [([[0.1, np.nan]], "finite|NaN|nan"), ([0.1, 0.2, 0.3], r"shape \(n, 2\)")])
def test_malformed_prediction_locations_are_named(locs0, what):
    rng = np.random.default_rng(0)
    lm = LocalModel(rng.uniform(size=(6, 2)), rng.standard_normal(6), np.ones((6, 1)), KNOTS, Matern(0.5), "full")
    with pytest.raises(ValueError, match=f"^prediction locations.*({what})"):
        federated_predict([lm], locs0, np.ones((1, 1)), PARAMS, KNOTS, Matern(0.5), "full")
    with pytest.raises(ValueError, match=f"^prediction locations.*({what})"):
        lowrank_prior(locs0, KNOTS, Matern(0.5), PARAMS)


def test_prior_residual_variance_is_zero_not_negative_at_the_knots():
    """At a knot the residual variance c(0) − b₀ᵀKb₀ is 0; in floating point 1 − b₀ᵀr₀ comes out −2e-16 there."""
    b0, prior = lowrank_prior(KNOTS, KNOTS, Matern(1.5), PARAMS)
    np.testing.assert_allclose(b0, np.eye(3), atol=1e-12)
    assert np.all(prior >= 0.0) and np.all(prior < 1e-12)


def test_malformed_prediction_covariates_are_named():
    from spatialfed.model.predict import combine_prediction

    with pytest.raises(ValueError, match="^prediction covariates contains 1 non-finite"):
        combine_prediction(KNOTS[:1], [[np.nan]], PARAMS, KNOTS, Matern(0.5), "pp", {})
