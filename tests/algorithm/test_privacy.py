"""Opt-in Gaussian mechanism on the shared summaries and its μ-GDP / (ε, δ) accounting (docs/privacy.md)."""

import pickle

import numpy as np
import pytest
from conftest import grid_knots, simulate_parts
from scipy import integrate
from scipy.stats import norm

from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.privacy import (
    SYMMETRIC_KEYS,
    GaussianMechanism,
    PrivacyAccountant,
    delta_of_epsilon,
    epsilon_for_delta,
    gdp_mu,
    project_spd,
    task_nonce,
)
from spatialfed.algorithm.protocol import Augmented, evaluate
from spatialfed.runtime.pilot import pilot_clip
from spatialfed.algorithm.server import FederatedServer
from spatialfed.model.blocks import knot_covariance
from spatialfed.model.local import LocalModel
from spatialfed.model.matern import Matern
from spatialfed.model.params import Params

KERNEL = Matern(1.5)
START = {"gamma": [1.0, 0.2], "delta": 2.0, "sigma2": 1.2, "beta": 0.2}


def models(seed, J=4, n=80):
    knots = grid_knots(3)
    return [LocalModel(s, z, X, knots, KERNEL, residual="pp") for s, z, X in simulate_parts(J=J, n=n, seed=seed)], knots


def start_params(knots):
    K = knot_covariance(knots, KERNEL, START["sigma2"], START["beta"])
    return Params(np.zeros(len(knots)), K, np.array(START["gamma"]), START["delta"], START["sigma2"], START["beta"])


def all_quantities(lm, params):
    """Every summary a worker can release: moments, variogram and the three sub-steps' quantities."""
    edges = np.linspace(0.0, 0.5, 6)
    return [("moments", lm.moments()), ("variogram", lm.variogram(params.gamma, edges))] + [
        (step, lm.quantity(step, params)) for step in ("mu_sigma", "gamma", "theta", "value")]


@pytest.fixture(scope="module")
def lm_and_params():
    lms, knots = models(seed=3)
    return lms[0], start_params(knots)


def test_mechanism_validates_its_parameters():
    for kwargs, word in [({"noise_multiplier": 0.0, "clip": 1.0}, "noise_multiplier"),
                         ({"noise_multiplier": 1.0, "clip": -1.0}, "clip"),
                         ({"noise_multiplier": 1.0, "clip": {"A": 0.0}}, "clip"),
                         ({"noise_multiplier": 1.0, "clip": 1.0, "delta": 1.0}, "delta"),
                         ({"noise_multiplier": 1.0, "clip": 1.0, "seed": -1}, "seed")]:
        with pytest.raises(ValueError, match=word):
            GaussianMechanism(**kwargs)


def test_clip_mapping_names_the_missing_keys():
    mech = GaussianMechanism(1.0, {"A": 1.0})
    with pytest.raises(ValueError, match=r"\['b'\]"):
        mech.privatize({"A": np.eye(2), "b": np.ones(2), "n": 5}, n=5, worker=0, t=0, step="mu_sigma")


def test_clipping_bounds_the_norm_and_reports_the_clipped_keys():
    xi = {"A": 50.0 * np.eye(3), "b": np.full(3, 0.01), "f": -40.0, "n": 10}
    c = 0.5
    mech = GaussianMechanism(1e-12, c, seed=0)  # noise negligible: the output is the clipped array
    out, clipped = mech.privatize(xi, n=10, worker=0, t=1, step="mu_sigma")
    assert set(clipped) == {"A", "f"}
    assert np.linalg.norm(out["A"]) == pytest.approx(c * 10, rel=1e-9)
    assert out["f"] == pytest.approx(-c * 10, rel=1e-9) and isinstance(out["f"], float)
    np.testing.assert_allclose(out["b"], xi["b"], atol=1e-9)  # within the bound: not scaled
    assert out["n"] == 10 and type(out["n"]) is int  # exempt public size, untouched
    huge, _ = mech.privatize({"b": np.full(4, 1e300)}, n=10, worker=0, t=1, step="mu_sigma")
    assert np.linalg.norm(huge["b"]) == pytest.approx(c * 10, rel=1e-9)  # the norm itself would overflow
    with pytest.raises(ValueError, match="'b'.*not finite"):
        mech.privatize({"b": np.array([1.0, np.nan])}, n=10, worker=0, t=1, step="mu_sigma")


def test_noise_has_the_stated_sd():
    z, c, n = 0.7, 0.2, 30
    mech = GaussianMechanism(z, c, seed=5)
    out, clipped = mech.privatize({"b": np.zeros(20000)}, n=n, worker=2, t=3, step="mu_sigma")
    assert clipped == ()
    assert np.std(out["b"]) == pytest.approx(z * 2 * c * n, rel=0.03)
    assert abs(np.mean(out["b"])) < 4 * z * 2 * c * n / np.sqrt(20000)


def test_symmetric_keys_are_the_symmetric_quantities_and_stay_symmetric(lm_and_params):
    lm, params = lm_and_params
    mech = GaussianMechanism(1.0, 100.0, seed=0)
    for step, xi in all_quantities(lm, params):
        out, _ = mech.privatize(xi, n=lm.n, worker=0, t=1, step=step)
        for key, value in xi.items():
            value = np.asarray(value)
            square = value.ndim >= 2 and value.shape[-1] == value.shape[-2] > 1
            symmetric = square and np.allclose(value, np.swapaxes(value, -1, -2), rtol=1e-10, atol=1e-10)
            assert (key in SYMMETRIC_KEYS) == symmetric, (step, key)
            if key in SYMMETRIC_KEYS:
                np.testing.assert_array_equal(out[key], np.swapaxes(out[key], -1, -2))
                assert not np.allclose(out[key], value)  # noised


def test_noise_is_a_function_of_the_task(lm_and_params):
    lm, params = lm_and_params
    xi = lm.quantity("theta", params)
    mech = GaussianMechanism(1.0, 10.0, seed=1)

    def run(**changes):
        task = {"n": lm.n, "worker": 2, "t": 4, "step": "theta", "nonce": b"phi"} | changes
        return mech.privatize(xi, **task)[0]

    same, again = run(), run()
    for key in xi:
        np.testing.assert_array_equal(same[key], again[key])
    for changes in ({"t": 5}, {"worker": 1}, {"step": "gamma"}, {"nonce": b"other phi"}):
        assert not np.allclose(run(**changes)["grad"], same["grad"]), changes
    other_seed = GaussianMechanism(1.0, 10.0, seed=2).privatize(xi, n=lm.n, worker=2, t=4, step="theta",
                                                                 nonce=b"phi")[0]
    assert not np.allclose(other_seed["grad"], same["grad"])


def test_unseeded_noise_is_fresh_on_every_call(lm_and_params):
    lm, params = lm_and_params
    xi = lm.quantity("gamma", params)
    mech = GaussianMechanism(1.0, 10.0)  # seed=None: OS entropy, so not even the server can recompute the noise
    task = {"n": lm.n, "worker": 0, "t": 1, "step": "gamma", "nonce": b"phi"}
    assert not np.allclose(mech.privatize(xi, **task)[0]["XtRr"], mech.privatize(xi, **task)[0]["XtRr"])


def test_task_nonce_separates_different_parameters_and_ignores_the_mechanism(lm_and_params):
    _, params = lm_and_params
    mech = GaussianMechanism(1.0, 1.0)
    assert task_nonce(params, {}) == task_nonce(params.replace(), {"privacy": mech})
    assert task_nonce(params, {}) != task_nonce(params.replace(beta=params.beta * (1 + 1e-15)), {})
    assert task_nonce(params, {"with": ("gamma",)}) != task_nonce(params, {})
    assert task_nonce(None, {"gamma": np.ones(2), "edges": np.arange(3.0)}) != task_nonce(
        None, {"gamma": np.ones(2), "edges": np.arange(4.0)})


def test_released_counts_every_key_but_n():
    mech = GaussianMechanism(1.0, 1.0)
    assert mech.released({"XtX": 1, "Xtz": 1, "ztz": 1, "n": 3, "extent": 1}) == 4
    assert mech.released({"f": 1.0}) == 1


def test_gdp_composition():
    assert gdp_mu(1, 2.0) == 0.5
    assert gdp_mu(0, 2.0) == 0.0
    mus = [1 / 2.0] * 9  # nine releases of μ = 1/z compose to √(Σ μ_i²)
    assert gdp_mu(9, 2.0) == pytest.approx(np.sqrt(np.sum(np.square(mus))))


def hockey_stick(mu, eps):
    """δ(ε) from the definition of μ-GDP: ∫ max(0, φ(x − μ) − e^ε φ(x)) dx, the two densities crossing at ε/μ + μ/2."""
    x0 = eps / mu + mu / 2
    value, _ = integrate.quad(lambda x: norm.pdf(x - mu) - np.exp(eps) * norm.pdf(x), x0, x0 + 40, epsabs=1e-14,
                              epsrel=1e-10)
    return value


def test_delta_of_epsilon_matches_the_formula_and_epsilon_inverts_it():
    for mu, eps in [(0.5, 0.3), (1.0, 1.0), (3.0, 5.0)]:
        expected = norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * norm.cdf(-eps / mu - mu / 2)
        assert delta_of_epsilon(mu, eps) == pytest.approx(expected, rel=1e-10)
    for mu, delta in [(0.5, 1e-5), (1.0, 1e-5), (4.0, 1e-6)]:
        eps = epsilon_for_delta(mu, delta)
        assert hockey_stick(mu, eps) == pytest.approx(delta, rel=1e-6)
    assert epsilon_for_delta(1e-6, 1e-5) == 0.0  # δ(0) = 2Φ(μ/2) − 1 ≈ 4e-7 ≤ δ: nothing to pay
    assert epsilon_for_delta(0.5, 1e-5) < epsilon_for_delta(1.0, 1e-5) < epsilon_for_delta(2.0, 1e-5)


def test_project_spd():
    rng = np.random.default_rng(0)
    Q = rng.standard_normal((5, 5))
    S = Q @ Q.T + np.eye(5)
    np.testing.assert_array_equal(project_spd(S), S)  # already SPD: unchanged, bit for bit
    V, _ = np.linalg.qr(Q)
    M = (V * np.array([-1.0, 0.0, 0.5, 2.0, 3.0])) @ V.T
    M[0, 1] += 0.3  # not symmetric either
    P = project_spd(M, floor=1e-6)
    np.testing.assert_array_equal(P, P.T)
    assert np.linalg.eigvalsh(P).min() >= 1e-6 * np.abs(np.linalg.eigvalsh(0.5 * (M + M.T))).max() * (1 - 1e-8)
    np.linalg.cholesky(P)
    with pytest.raises(ValueError, match="square"):
        project_spd(np.ones((2, 3)))


def test_accountant_reports_composition_and_pickles():
    mech = GaussianMechanism(2.0, {"A": 1.0}, delta=1e-6)
    acc = PrivacyAccountant(mech)
    assert acc.report()["mu_gdp"] == 0.0 and acc.report()["epsilon"] == 0.0
    acc.record(0, 10)
    acc.record(1, 4)
    acc.record(0, 6)
    report = pickle.loads(pickle.dumps(acc)).report()
    assert [(w["worker"], w["releases"]) for w in report["workers"]] == [(0, 16), (1, 4)]
    assert report["workers"][1]["mu_gdp"] == pytest.approx(1.0)
    assert report["mu_gdp"] == pytest.approx(2.0)  # √16 / 2, the worst worker
    assert report["epsilon"] == pytest.approx(epsilon_for_delta(2.0, 1e-6))
    assert report["delta"] == 1e-6
    assert report["mechanism"] | {"adjacency": None} == {"noise_multiplier": 2.0, "clip": {"A": 1.0}, "delta": 1e-6,
                                                        "adjacency": None, "seeded": False}
    assert "worker-level" in report["mechanism"]["adjacency"]


def test_evaluate_without_mechanism_is_unchanged_and_with_it_is_privatized(lm_and_params):
    lm, params = lm_and_params
    mech = GaussianMechanism(0.5, 10.0, seed=3)
    p = Augmented(params, 2, "mu_sigma", {"with": ("gamma",)})
    plain = evaluate(lm, p, 1).xi
    direct = {**lm.quantity("mu_sigma", params), **lm.quantity("gamma", params)}
    assert plain.keys() == direct.keys()
    for key, value in direct.items():
        np.testing.assert_array_equal(plain[key], value)  # bit for bit: the hook does nothing when off
    private = evaluate(lm, Augmented(params, 2, "mu_sigma", {"with": ("gamma",), "privacy": mech}), 1)
    expected, _ = mech.privatize(direct, n=lm.n, worker=1, t=2, step="mu_sigma", nonce=task_nonce(params, p.extra))
    assert private.xi.keys() == direct.keys() and (private.t, private.step, private.worker) == (2, "mu_sigma", 1)
    for key in direct:
        np.testing.assert_array_equal(private.xi[key], expected[key])
    moments = evaluate(lm, Augmented(None, 0, "moments", {"privacy": mech}), 1).xi
    assert moments["n"] == lm.n and moments["ztz"] != lm.moments()["ztz"]
    with pytest.raises(TypeError, match="GaussianMechanism"):
        evaluate(lm, Augmented(params, 2, "gamma", {"privacy": {"noise_multiplier": 1.0}}), 1)


def public_clip():
    """Clip bounds from an independent simulation (a stand-in for public pilot data), by privacy.pilot_clip."""
    lms, knots = models(seed=11)
    return pilot_clip(lms, knots, KERNEL, margin=2.0)


def fit(lms, knots, mechanism):
    """A synchronous fit driven by hand, the mechanism put into every task, each arrival recorded by an accountant."""
    server = FederatedServer(len(lms), knots, KERNEL, FitConfig.of(mode="sync", max_iter=15), start=START)
    accountant = PrivacyAccountant(mechanism) if mechanism else None
    tasks = {j: [] for j in range(len(lms))}
    while not server.done:
        for j, p in server.dispatch():
            if mechanism:
                p = Augmented(p.params, p.t, p.step, {**p.extra, "privacy": mechanism})
            q = evaluate(lms[j], p, j)
            tasks[j].append((p.step, *p.extra.get("with", ())))
            if accountant:
                accountant.record(j, mechanism.released(q.xi))
            server.receive(q, now=0.0)
    return server, accountant, tasks


def test_fit_with_privacy_noise_converges_and_reports_the_budget():
    lms, knots = models(seed=3)
    clear, _, _ = fit(lms, knots, None)
    mech = GaussianMechanism(1e-5, public_clip(), delta=1e-5, seed=7)
    noisy, accountant, tasks = fit(lms, knots, mech)
    np.testing.assert_allclose(noisy.params.theta_key, clear.params.theta_key, rtol=0.03)
    assert noisy.loglik == pytest.approx(clear.loglik, abs=0.2)
    # releases per task: the keys of SPEC §3 (and of the moments) but n, for the step and any joint ("with") steps
    keys = {"moments": 4, "mu_sigma": 3, "gamma": 2, "theta": 5, "value": 1}
    report = accountant.report()
    for row in report["workers"]:
        n_releases = sum(keys[step] for task in tasks[row["worker"]] for step in task)
        assert row["releases"] == n_releases
        assert row["mu_gdp"] == pytest.approx(np.sqrt(n_releases) / 1e-5)
    mu = max(row["mu_gdp"] for row in report["workers"])
    assert report["mu_gdp"] == mu
    assert delta_of_epsilon(mu, report["epsilon"]) == pytest.approx(1e-5, rel=1e-6)
