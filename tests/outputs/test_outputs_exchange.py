"""The seamless predictor's boundary exchange (outputs/exchange.py): its closed form against the joint Gaussian it
stands for, its η-coefficients against a change of μ, the Vecchia site's neighbourhood, and where the points lie."""

from dataclasses import dataclass

import numpy as np
import pytest

from spatialfed.model.basis import residual_covariance
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params
from spatialfed.outputs import exchange


@dataclass
class Model:
    params: Params
    knots: np.ndarray
    kernel: Matern

    @property
    def space_knots(self) -> np.ndarray:  # FittedModel's knots in the kriging's coordinates (isotropic: as given)
        return self.knots


def _sites(residual="full", vecchia_k=4, seed=0):
    """Three area sites side by side on [0, 3] × [0, 1] (60 points each), 9 knots, a field with a residual part."""
    rng = np.random.default_rng(seed)
    knots = np.stack(np.meshgrid(np.linspace(0.2, 2.8, 3), np.linspace(0.2, 0.8, 3)), -1).reshape(-1, 2)
    models = []
    for j in range(3):
        locs = rng.random((60, 2)) + [j, 0.0]
        z = np.sin(3 * locs[:, 0]) + np.cos(5 * locs[:, 1]) + 0.3 * rng.standard_normal(60)
        models.append(LocalModel(locs, z, np.ones((60, 1)), knots, Matern(1.5), residual=residual,
                                 vecchia_k=vecchia_k))
    params = Params(0.3 * rng.standard_normal(9), np.eye(9) * 0.01, np.array([0.1]), 8.0, 1.2, 0.4)
    return models, Model(params, knots, Matern(1.5))


def _exchange(models, model, max_points=exchange.MAX_POINTS):
    bounds = np.array([[*lm.locs.min(0), *lm.locs.max(0)] for lm in models])
    U, pairs = exchange.boundary_points(bounds, lambda p: np.array([lm.nearest_distance(p) for lm in models]),
                                        0.08, 10.0, max_points)
    anchors = exchange.site_points(pairs, len(models))
    post = {j: models[j].anchor_posterior(U[ix], model.params) for j, ix in anchors.items()}
    return U, anchors, exchange.solve_exchange(U, anchors, post, model)


def _tied(models, model, ex, targets):
    return {j: exchange.correct(ex, j, models[j].residual_kriging(s, model.params, ex.anchors[j]))
            for j, s in targets.items()}


def test_the_closed_form_is_the_joint_gaussian():
    """The exchange's mean and residual variance at each site's points equal dense conditioning of the joint
    Gaussian it assumes: v = w̃(U) + e ~ N(0, C), each site's (data residuals, targets) given v from its own joint
    with v_j, the sites independent given v."""
    models, model = _sites()
    U, anchors, ex = _exchange(models, model)
    assert len(U) >= 10 and set(anchors) == {0, 1, 2}
    par, noise = model.params, 1.0 / model.params.delta
    cov = lambda a, b: residual_covariance(model.kernel, model.knots, par.beta, par.sigma2, a, b)  # noqa: E731
    rng = np.random.default_rng(1)
    targets = {j: rng.random((7, 2)) + [j, 0.0] for j in range(3)}
    got = _tied(models, model, ex, targets)

    C = cov(U, U) + noise * np.eye(len(U))
    blocks = []   # per site: (A_j = Cov(w_j, v_j) C_jj⁻¹, V_j = Cov(w_j | v_j), indices, n data)
    for j, lm in enumerate(models):
        ix, pts = anchors[j], np.vstack([lm.locs, targets[j]])
        W = cov(pts, pts)
        W[: lm.n, : lm.n] += noise * np.eye(lm.n)
        A = np.linalg.solve(C[np.ix_(ix, ix)], cov(U[ix], pts)).T
        blocks.append((A, W - A @ C[np.ix_(ix, ix)] @ A.T, ix, lm.n))
    S = np.block([[A @ C[np.ix_(ix, kx)] @ B.T + (V if j == k else 0) for k, (B, _, kx, _) in enumerate(blocks)]
                  for j, (A, V, ix, _) in enumerate(blocks)])
    data = np.concatenate([np.r_[np.ones(n), np.zeros(7)] for *_, n in blocks]).astype(bool)
    resid = np.concatenate([lm.z - lm.X @ par.gamma - lm._basis(par.beta).B @ par.mu for lm in models])
    K = np.linalg.solve(S[np.ix_(data, data)], S[np.ix_(data, ~data)]).T
    mean, var = K @ resid, np.diag(S[np.ix_(~data, ~data)] - K @ S[np.ix_(data, ~data)])
    prior = np.concatenate([np.diag(cov(targets[j], targets[j])) for j in range(3)])
    np.testing.assert_allclose(np.concatenate([got[j]["mean"] for j in range(3)]), mean, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(prior - np.concatenate([got[j]["kRk"] for j in range(3)]), var, rtol=1e-7,
                               atol=1e-10)
    # the tie matters: a site's own kriging differs from the joint posterior
    own = np.concatenate([models[j].residual_kriging(targets[j], par)["mean"] for j in range(3)])
    assert np.abs(own - mean).max() > 1e-3


def test_eta_coefficients_follow_a_change_of_mu():
    """The tied residual mean is linear in η = μ with coefficients −BRk (what the predictor's knot variance uses)."""
    models, model = _sites(seed=2)
    targets = {j: np.random.default_rng(3).random((5, 2)) + [j, 0.0] for j in range(3)}
    _, _, ex = _exchange(models, model)
    base = _tied(models, model, ex, targets)
    step = 0.05 * np.random.default_rng(4).standard_normal(9)
    moved = Model(Params(model.params.mu + step, *[getattr(model.params, k) for k in
                                                    ("Sigma", "gamma", "delta", "sigma2", "beta")]),
                  model.knots, model.kernel)
    _, _, ex2 = _exchange(models, moved)
    again = _tied(models, moved, ex2, targets)
    for j in range(3):
        np.testing.assert_allclose(again[j]["mean"] - base[j]["mean"], -base[j]["BRk"] @ step, rtol=1e-8,
                                   atol=1e-11)
        np.testing.assert_allclose(again[j]["kRk"], base[j]["kRk"], rtol=1e-10)


def test_a_vecchia_site_whose_neighbourhood_is_every_point_answers_as_the_dense_one():
    """A Vecchia site conditions the exchange points on their neighbours' union: with every point a neighbour it is
    the dense residual's answer; with fewer it is a nearby one."""
    full, model = _sites()
    every, _ = _sites("vecchia", vecchia_k=15)    # PREDICT_FACTOR · 15 = 60 = n: every point
    few, _ = _sites("vecchia", vecchia_k=3)
    U = np.array([[1.0, 0.3], [1.0, 0.6], [0.95, 0.9]])
    s = np.array([[0.8, 0.5], [0.5, 0.2]])
    a, b, c = (lm[0].anchor_posterior(U, model.params) for lm in (full, every, few))
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-9, atol=1e-12, err_msg=key)
        assert np.abs(c[key] - a[key]).max() > 0
    np.testing.assert_allclose(every[0].residual_kriging(s, model.params, U)["cross"],
                               full[0].residual_kriging(s, model.params, U)["cross"], rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(c["cov"], a["cov"], atol=0.05 * model.params.sigma2)


def test_exchange_points_lie_between_their_two_nearest_sites():
    models, model = _sites()
    U, anchors, ex = _exchange(models, model)
    d = np.array([lm.nearest_distance(U) for lm in models])
    two = np.sort(d, axis=0)[:2]
    assert np.all(two[1] - two[0] <= exchange.SLACK * 0.08 + 1e-12)
    near = np.minimum(np.abs(U[:, 0] - 1.0), np.abs(U[:, 0] - 2.0))
    assert np.all(near < 0.2)                       # the two boundaries x = 1 and x = 2
    assert not np.any(np.isin(anchors[0], anchors[2]))   # sites 0 and 2 share no boundary
    small = _exchange(models, model, max_points=len(U) // 3)[0]
    assert 0 < len(small) <= len(U) // 3             # coarsened to the cap


def test_one_site_has_no_exchange():
    models, model = _sites()

    class One:
        n_workers = 1

    assert exchange.build(One(), model, 0.08, np.zeros((1, 4))) is None
    with pytest.raises(ValueError, match="correlated residual"):
        LocalModel(models[0].locs, models[0].z, models[0].X, model.knots, model.kernel,
                   residual="mpp").anchor_posterior(models[0].locs[:3], model.params)
