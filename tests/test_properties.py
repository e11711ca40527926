"""Property tests (hypothesis) where an invariant is the specification.

- site statistics are additive: the statistics of the union of two sites are the sum of theirs (same u, same knots)
  whenever the union's residual is the two blocks (mpp, pp: diagonal R; full: sites far apart in correlation lengths);
- a fit does not depend on how the sites are numbered (tolerance: the optimiser's tol);
- with no nugget (δ → ∞) prediction at a training location returns the observation (mean) with no latent spread;
- the trust-region step maximises its quadratic model over the ball and the box (against scipy's SLSQP).

Examples are few and derandomized (no database, no deadline): the suite stays deterministic and takes seconds.
"""

import numpy as np
import pytest
from conftest import grid_knots
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import optimize

from spatialfed.algorithm.likelihood import default_bounds, sum_statistics, trust_region_step
from spatialfed.model.blocks import modified_hessian
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params
from spatialfed.model.stats import SUMMED, site_statistics


def few(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def site(rng, n, p, offset, knots, kernel, residual):
    locs = rng.uniform(size=(n, 2)) + offset
    X = np.column_stack([np.ones(n), rng.standard_normal((n, p - 1))])
    return LocalModel(locs, rng.standard_normal(n) + locs[:, 0], X, knots, kernel, residual)


def union(a: LocalModel, b: LocalModel) -> LocalModel:
    return LocalModel(np.vstack([a.locs, b.locs]), np.concatenate([a.z, b.z]), np.vstack([a.X, b.X]), a.knots,
                      a.kernel, a.residual)


@few(12)
@given(seed=st.integers(0, 2**16), n_a=st.integers(3, 25), n_b=st.integers(3, 25), p=st.integers(1, 3),
       residual=st.sampled_from(["full", "mpp", "pp"]), nu=st.sampled_from([0.5, 1.5]),
       log_delta=st.floats(-1.0, 3.0), log_sigma2=st.floats(-1.0, 1.0), log_beta=st.floats(-3.0, -1.0))
def test_statistics_of_a_union_are_the_sum_of_its_sites(seed, n_a, n_b, p, residual, nu, log_delta, log_sigma2,
                                                        log_beta):
    rng = np.random.default_rng(seed)
    kernel = Matern(nu)
    # full: the residual correlates points within a site, so the two sites are put ~60 correlation lengths apart
    # (their cross-correlation is below 1e-20) and the knots between them; mpp/pp: side by side
    gap = 60.0 * np.exp(log_beta) * (1.0 if residual == "full" else 0.0)
    knots = grid_knots(3, 0.0, 1.0 + gap)
    a = site(rng, n_a, p, 0.0, knots, kernel, residual)
    b = site(rng, n_b, p, 1.0 + gap if residual == "full" else 0.5, knots, kernel, residual)
    u = np.array([log_delta, log_sigma2, log_beta])
    both = site_statistics(union(a, b), u)
    total = sum_statistics([site_statistics(a, u), site_statistics(b, u)])
    for key in SUMMED:
        scale = max(float(np.max(np.abs(both[key]))), 1.0)
        np.testing.assert_allclose(total[key], both[key], rtol=1e-8, atol=1e-9 * scale, err_msg=key)


@pytest.fixture(scope="module")
def sim_parts():
    from spatialfed.data.simulate import simulate

    sim = simulate(4, 40, seed=11, test_size=0, noise_sd=0.5)
    return sim.parts(), sim.covariate_names


@few(3)
@given(order=st.permutations(range(4)).filter(lambda o: list(o) != [0, 1, 2, 3]))
def test_a_fit_does_not_depend_on_the_numbering_of_the_sites(sim_parts, order, tmp_path_factory):
    from spatialfed.api import FederatedGP
    from spatialfed.data.store import write_store

    tol = 1e-7
    fits = []
    parts, names = sim_parts
    for name, ordered in (("given", parts), ("renumbered", [parts[j] for j in order])):
        path = tmp_path_factory.mktemp("renumber") / f"{name}.zarr"
        write_store(path, ordered, partition="random", crs=None, covariate_names=names)
        fits.append(FederatedGP(mode="sync", knots=9, max_iter=60, tol=tol, cluster="simulated",
                                progress=False).fit(path))
    a, b = fits
    assert a.converged_ and b.converged_
    for name in ("delta", "sigma2", "beta"):  # tol bounds the last step in log-parameters
        assert np.log(a.params_[name]) == pytest.approx(np.log(b.params_[name]), abs=100 * tol), name
    np.testing.assert_allclose(a.params_["gamma"], b.params_["gamma"], rtol=1e-4, atol=1e-5)
    assert a.loglik_ == pytest.approx(b.loglik_, abs=1e-6 * abs(a.loglik_))


@few(10)
@given(seed=st.integers(0, 2**16), residual=st.sampled_from(["full", "mpp"]), predictor=st.sampled_from(
    ["lowrank", "independent"]), site_index=st.integers(0, 2), row=st.integers(0, 14))
def test_prediction_at_a_training_location_without_nugget_returns_the_observation(seed, residual, predictor,
                                                                                  site_index, row):
    """δ = 1e10: the residual (full) or its diagonal (mpp) interpolates, whatever γ and μ are: at an observed
    location the mean is the observation and the latent sd vanishes (sd is then δ^{-1/2})."""
    from spatialfed.model.predict import federated_predict

    rng = np.random.default_rng(seed)
    kernel, knots = Matern(0.5), grid_knots(3)
    models = [site(rng, 15, 2, 0.0, knots, kernel, residual) for _ in range(3)]
    m = len(knots)
    A = rng.standard_normal((m, m))
    params = Params(rng.standard_normal(m), 0.1 * A @ A.T, rng.standard_normal(2), 1e10, 1.5, 0.3)
    lm = models[site_index]
    locs0, X0 = lm.locs[row:row + 1], lm.X[row:row + 1]
    if predictor == "lowrank":
        got = federated_predict(models, locs0, X0, params, knots, kernel, residual)
        mean, sd_latent = got["mean"][0], got["sd_latent"][0]
    else:
        got = lm.independent_kriging(locs0, X0, params)
        mean, sd_latent = got["mean"][0], np.sqrt(max(got["var"][0], 0.0))
    assert mean == pytest.approx(lm.z[row], abs=1e-5 * (1 + np.abs(lm.z).max()))
    assert sd_latent < 1e-3 * np.sqrt(params.sigma2)


@few(25)
@given(seed=st.integers(0, 2**16), radius=st.floats(0.05, 3.0), concave=st.booleans(),
       near=st.sampled_from([None, 0, 1, 2]))
def test_trust_region_step_maximises_the_quadratic_model(seed, radius, concave, near):
    """p = argmax gᵀp − ½pᵀBp over ‖p‖ ≤ radius, B = mod(−H) (SPEC §2), with the entries that reach the box held on
    it: no feasible point of SLSQP's does better, and it is an ascent step; `near` puts one entry on or next to the
    bound it is pushed to."""
    rng = np.random.default_rng(seed)
    lo, hi = default_bounds(1.0, 1.0)
    u = lo + (hi - lo) * rng.uniform(0.05, 0.95, size=3)
    g = rng.standard_normal(3) * 3
    if near is not None:  # one entry on (or just inside) a bound its gradient pushes against
        u[near] = (hi if g[near] > 0 else lo)[near] - np.sign(g[near]) * rng.choice([0.0, 0.01 * radius])
    A = rng.standard_normal((3, 3))
    H = -(A @ A.T + 0.1 * np.eye(3)) if concave else A + A.T
    B = modified_hessian(-H)
    step = trust_region_step(u, g, H, radius, lo, hi)
    p = step.p
    model = lambda q: float(g @ q - 0.5 * q @ B @ q)  # noqa: E731
    assert np.linalg.norm(p) <= radius * (1 + 1e-6) and np.all(u + p >= lo - 1e-12) and np.all(u + p <= hi + 1e-12)
    assert step.predicted == pytest.approx(model(p), rel=1e-9, abs=1e-12)
    assert model(p) > 0 and g @ p > 0  # an ascent step
    # the entries that end on a bound are held there; the others are the model's argmax over what is left of the
    # ball (the box is handled by fixing entries, SPEC §2, so optimality holds given the fixed ones)
    fixed = np.isclose(u + p, lo, rtol=0, atol=1e-12) | np.isclose(u + p, hi, rtol=0, atol=1e-12)
    free = ~fixed
    left = radius**2 - float(p[fixed] @ p[fixed])

    def full(q):
        out = p.copy()
        out[free] = q
        return out

    best = optimize.minimize(lambda q: -model(full(q)), np.zeros(free.sum()), method="SLSQP",
                             bounds=list(zip((lo - u)[free], (hi - u)[free])),
                             constraints=[{"type": "ineq", "fun": lambda q: left - q @ q, "jac": lambda q: -2 * q}],
                             options={"ftol": 1e-12, "maxiter": 200})
    assert model(p) >= -best.fun - 1e-6 * max(1.0, abs(best.fun))
