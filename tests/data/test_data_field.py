"""Sampled Matérn fields reproduce the target covariance: exact Cholesky and circulant embedding (large N)."""

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from spatialfed.data import field
from spatialfed.errors import DataError
from spatialfed.model.matern import Matern

RNG_LOCS = np.random.default_rng(11)
LOCS = RNG_LOCS.random((40, 2))


def max_z_score(samples, target):
    """Largest |empirical − target| covariance in units of its sampling standard error (820 entries: expect < 5.5)."""
    reps = samples.shape[1]
    emp = samples @ samples.T / reps
    var = np.diag(target)
    se = np.sqrt((var[:, None] * var[None, :] + target**2) / reps)
    return np.max(np.abs(emp - target) / se)


@pytest.mark.parametrize("nu, beta", [(0.5, 0.1), (1.5, 0.11), (2.5, 0.2)])
def test_exact_sampler_reproduces_covariance(nu, beta):
    model = Matern(nu)
    target = model.covariance(cdist(LOCS, LOCS), 1.3, beta)
    samples = field.sample_exact(model, LOCS, 1.3, beta, np.random.default_rng(0), n_samples=6000)
    assert max_z_score(samples, target) < 5.5


def test_exact_sampler_refuses_too_many_points():
    with pytest.raises(DataError, match="circulant"):
        field.sample_exact(Matern(0.5), np.zeros((field.EXACT_MAX_POINTS + 1, 2)), 1.0, 0.1, np.random.default_rng(0))


@pytest.mark.parametrize("nu, beta", [(0.5, 0.1), (0.5, 0.234), (1.0, 0.2), (1.5, 0.11), (2.5, 0.265)])
def test_circulant_implied_covariance_matches_matern(nu, beta):
    """With the default grid step (β/100) the covariance the large-N sampler produces is within 3e-3 of the target."""
    model, locs, beta = Matern(nu), LOCS / 2, beta / 2  # half-size square keeps the torus small
    emb = field.CirculantEmbedding(model, 1.0, beta, (0, 0, 0.5, 0.5))
    assert emb.clipped_fraction == 0.0
    target = model.covariance(cdist(locs, locs), 1.0, beta)
    implied = emb.implied_covariance(locs)
    assert np.allclose(np.diag(implied), 1.0, atol=1e-10)  # variance correction restores σ² exactly
    assert np.max(np.abs(implied - target)) < 3e-3


def test_circulant_sampler_matches_its_implied_covariance_and_target():
    model = Matern(0.5)
    emb = field.CirculantEmbedding(model, 2.0, 0.2, (0, 0, 1, 1), step=0.02)
    samples = emb.sample(LOCS, np.random.default_rng(1), n_samples=3000)
    assert max_z_score(samples, emb.implied_covariance(LOCS)) < 5.5
    assert max_z_score(samples, model.covariance(cdist(LOCS, LOCS), 2.0, 0.2)) < 5.5


def test_circulant_real_and_imaginary_fields_are_independent():
    emb = field.CirculantEmbedding(Matern(1.5), 1.0, 0.1, (0, 0, 1, 1), step=0.02)
    rng = np.random.default_rng(2)
    pairs = [emb.sample_grid(rng) for _ in range(1500)]
    a = np.array([p[0][10, 10] for p in pairs])
    b = np.array([p[1][10, 10] for p in pairs])
    assert abs(np.corrcoef(a, b)[0, 1]) < 4 / np.sqrt(1500)
    assert abs(a.var() - 1.0) < 0.12 and abs(b.var() - 1.0) < 0.12


def test_smooth_kernel_embedding_grows_the_torus_until_nonnegative():
    emb = field.CirculantEmbedding(Matern(2.5), 1.0, 0.265, (0, 0, 1, 1), step=0.02)
    minimal = 2 * (emb.shape[0] - 1)
    assert emb.torus_shape[0] > minimal and emb.clipped_fraction == 0.0
    assert emb.eigenvalues.min() >= 0.0
