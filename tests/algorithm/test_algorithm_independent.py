"""The independence model (Eq. 3) fitted by the same server as the m = 0 case, from its data-driven start."""

import numpy as np
import pytest
from scipy import optimize

from conftest import simulate_parts
from spatialfed.algorithm.config import FitConfig
from spatialfed.model import reference as ref
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.runtime.virtual import run_virtual


def test_independence_fit_reaches_the_maximiser_of_eq3():
    parts = simulate_parts(J=3, n=60, nu=0.5, seed=5)
    kernel, no_knots = Matern(0.5), np.zeros((0, 2))
    models = [LocalModel(*p, no_knots, kernel, "full") for p in parts]
    server = run_virtual(models, no_knots, kernel, FitConfig.of(mode="sync", max_iter=30))
    assert server.converged
    p = server.params
    assert server.loglik == pytest.approx(ref.independent_loglik(parts, kernel, p.gamma, p.delta, p.sigma2, p.beta))

    def nll(v):
        return -ref.independent_loglik(parts, kernel, v[:2], *np.exp(v[2:]))

    v0 = np.concatenate([p.gamma, np.log([p.delta, p.sigma2, p.beta])])
    best = optimize.minimize(nll, v0 + 0.05, method="Nelder-Mead", options={"xatol": 1e-8, "fatol": 1e-10, "maxiter": 4000})
    assert server.loglik >= -best.fun - 1e-4
