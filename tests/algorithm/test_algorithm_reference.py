"""Test data and the centralized maximiser of ℓ_LR that the federated fits are checked against.

The data and the reference live in tests/support.py (shared by every layer's tests).
Data follow the paper's Section 6 design: covariates ~ N(0, 1) without an intercept (`intercept=True` for the joint
(μ, γ) step, docs/algorithm.md), an exactly simulated Matérn field plus noise, a regular knot grid.
"""

import numpy as np
import pytest

from spatialfed.model.reference import lowrank_loglik
from support import LowRankReference, simulate

@pytest.mark.parametrize("residual", ["full", "mpp", "pp"])
def test_reference_equals_project_lowrank_loglik(residual):
    models, knots, kernel = simulate(J=2, n=40, side=4, residual=residual)
    ref = LowRankReference(models, knots, kernel, residual)
    u = np.log([3.0, 0.8, 0.15])
    gamma, ll = ref.profile(u)
    assert ll == pytest.approx(lowrank_loglik(ref.parts, knots, kernel, residual, gamma, *np.exp(u)), abs=1e-8)
