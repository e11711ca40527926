"""Opt-in Gaussian mechanism on the shared summaries, with μ-GDP accounting (docs/privacy.md).

Adjacency is worker-level: one worker's whole partition replaced by any other of the same (public) size n_j.
Each released array ξ_k is clipped to ‖ξ_k‖₂ ≤ c_k·n_j, so its L2 sensitivity is Δ_k = 2·c_k·n_j, and released as
ξ_k + N(0, (z·Δ_k)² I): one Gaussian mechanism, μ = Δ_k/σ_k = 1/z. Composition and conversion follow Dong, Roth &
Su (2022), "Gaussian differential privacy", JRSS-B 84(1): the Gaussian mechanism is Δ/σ-GDP (Thm. 2.7),
μ = √(Σ_i μ_i²) under composition (Cor. 3.3) and δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Cor. 2.13).
"""

from __future__ import annotations

import hashlib
import math
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

#: Keys released without noise: n_j is public (the server learns it anyway, and the adjacency keeps it fixed).
EXEMPT_KEYS = frozenset({"n"})
#: Keys whose arrays are symmetric (for "d2_du_dSigma": each m×m slice); symmetrised after the noise.
SYMMETRIC_KEYS = frozenset({"A", "XtRX", "hess", "d2_du_dSigma", "XtX"})
ADJACENCY = "worker-level: one worker's whole partition replaced by any other of the same public size n_j"


@dataclass(frozen=True)
class GaussianMechanism:
    """Clip each released array to ‖ξ_k‖₂ ≤ clip_k·n_j and add N(0, (z·2·clip_k·n_j)² I), z = noise_multiplier.

    `clip` is a public per-observation bound: one float for every key, or a mapping key → float. It must be fixed
    from public knowledge (a pilot on public or simulated data), never from the private data. `delta` is the δ at
    which the accountant reports ε. `seed=None` (the default) draws every release's noise from fresh OS entropy; an
    integer `seed` makes the noise a deterministic function of the task (see `privatize`) for reproducible studies —
    but whoever knows the seed (the server, which builds the mechanism) can recompute and remove the noise.
    """

    noise_multiplier: float
    clip: float | Mapping[str, float]
    delta: float = 1e-5
    seed: int | None = None

    def __post_init__(self):
        if not _positive(self.noise_multiplier):
            raise ValueError(f"noise_multiplier must be a finite number > 0, got {self.noise_multiplier!r}")
        if isinstance(self.clip, Mapping):
            bad = {k: v for k, v in self.clip.items() if not _positive(v)}
            if not self.clip or bad:
                raise ValueError(f"clip must map each key to a finite number > 0; got {dict(self.clip)!r}")
            object.__setattr__(self, "clip", {str(k): float(v) for k, v in self.clip.items()})
        elif not _positive(self.clip):
            raise ValueError(f"clip must be a finite number > 0 or a mapping key → number > 0, got {self.clip!r}")
        if not (isinstance(self.delta, float) and 0.0 < self.delta < 1.0):
            raise ValueError(f"delta must be a float in (0, 1), got {self.delta!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer))
                                      or self.seed < 0):
            raise ValueError(f"seed must be None (fresh OS entropy) or an integer ≥ 0, got {self.seed!r}")

    def released(self, xi: Mapping) -> int:
        """Number of Gaussian releases in ξ: one per key except the exempt public "n"."""
        return sum(1 for key in xi if key not in EXEMPT_KEYS)

    def clip_bounds(self, keys) -> dict[str, float]:
        """Per-observation bound c_k of each released key; ValueError listing the keys a mapping `clip` lacks."""
        keys = [key for key in keys if key not in EXEMPT_KEYS]
        if not isinstance(self.clip, Mapping):
            return {key: float(self.clip) for key in keys}
        missing = sorted(set(keys) - set(self.clip))
        if missing:
            raise ValueError(f"clip has no bound for released key(s) {missing}; add them to the clip mapping "
                             f"(or give one float for every key)")
        return {key: self.clip[key] for key in keys}

    def privatize(self, xi: Mapping, *, n: int, worker: int, t: int, step: str,
                  nonce: bytes = b"") -> tuple[dict, tuple[str, ...]]:
        """(ξ̃, clipped keys): ξ̃_k = sym(clip(ξ_k) + N(0, (z·2c_k·n)² I)), clip(ξ) = ξ·min(1, c_k·n/‖ξ‖₂).

        With seed=None every call draws fresh noise (each call is a release to count). With an integer seed the noise
        Generator is seeded from (seed, worker, t, step, nonce, key), so a re-sent identical task releases identical
        noise (no further privacy loss); `nonce` must identify the task's inputs (evaluate passes
        `task_nonce(p.params, p.extra)`), since two computations sharing noise would reveal their noise-free difference.
        The clipped keys depend on the private data and must not be sent.
        """
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n must be the partition size, an integer ≥ 1; got {n!r}")
        bounds = self.clip_bounds(xi)
        out, clipped = {}, []
        for key, value in xi.items():
            if key in EXEMPT_KEYS:
                out[key] = value
                continue
            arr = np.array(value, dtype=float)
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"worker {worker}'s {key!r} at (t={t}, step={step!r}) is not finite; it cannot be "
                                 f"clipped, so it is not released")
            top = float(np.abs(arr).max(initial=0.0))
            norm = top * float(np.linalg.norm(arr / top)) if top > 0 else 0.0  # scaled: no overflow for huge ξ
            bound = bounds[key] * int(n)
            if norm > bound:
                arr *= bound / norm
                clipped.append(key)
            sd = self.noise_multiplier * 2.0 * bound
            arr = arr + sd * self._rng(worker, t, step, nonce, key).standard_normal(arr.shape)
            if key in SYMMETRIC_KEYS:
                arr = 0.5 * (arr + np.swapaxes(arr, -1, -2))
            out[key] = float(arr) if arr.ndim == 0 else arr
        return out, tuple(clipped)

    def _rng(self, worker: int, t: int, step: str, nonce: bytes, key: str) -> np.random.Generator:
        """Generator from fresh OS entropy (seed None) or seeded from (seed, worker, t, step, nonce, key)."""
        if self.seed is None:
            return np.random.default_rng()
        words = [int(self.seed), int(worker), int(t), zlib.crc32(step.encode()), zlib.crc32(key.encode()),
                 int.from_bytes(hashlib.sha256(nonce).digest()[:16], "little")]
        return np.random.default_rng(np.random.SeedSequence(words))


def task_nonce(params, extra: Mapping) -> bytes:
    """SHA-256 of a task's inputs (the fields of φ, and `extra` without the mechanism): the noise key of `privatize`."""
    h = hashlib.sha256()
    if params is not None:
        for name in ("mu", "Sigma", "gamma", "delta", "sigma2", "beta"):
            h.update(name.encode() + np.asarray(getattr(params, name), dtype=float).tobytes())
    for key in sorted(k for k in extra if k != "privacy"):
        arr = np.asarray(extra[key])
        h.update(key.encode() + (repr(extra[key]).encode() if arr.dtype == object else
                                 arr.dtype.str.encode() + repr(arr.shape).encode() + arr.tobytes()))
    return h.digest()


def _positive(value) -> bool:
    """A finite real number > 0 (bool excluded)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


#: a released sum whose noise exceeds this multiple of the largest signal the sites can put in it carries nothing
MAX_NOISE_TO_SIGNAL = 100.0


def check_noise_for_fit(mechanism: GaussianMechanism, n_workers: int) -> None:
    """Refuse a noise multiplier z under which every released sum is noise. J sites' clipped arrays sum to at most
    J·clip·n in norm, their noise has standard deviation 2z·clip·n·√J per coordinate: the ratio is 2z/√J, and
    above MAX_NOISE_TO_SIGNAL no estimate means anything (the noisy moments give a negative residual variance,
    the Hessian overflows, or the fit ends on absurd values)."""
    z, J = float(mechanism.noise_multiplier), int(n_workers)
    ratio = 2.0 * z / math.sqrt(J)
    if ratio > MAX_NOISE_TO_SIGNAL:
        top = MAX_NOISE_TO_SIGNAL * math.sqrt(J) / 2.0
        raise ValueError(f"the privacy noise multiplier {z:g} is too large for a fit: with {J} sites the noise on "
                         f"every released sum is {ratio:.3g} times the largest signal they can put in it (2z/√J > "
                         f"{MAX_NOISE_TO_SIGNAL:g}), so every estimate would be noise; use a multiplier of at most "
                         f"{top:.3g} (1 to 2 is usual; docs/privacy.md)")


def gdp_mu(n_releases: int, noise_multiplier: float) -> float:
    """μ = √(n_releases)/z: n_releases Gaussian mechanisms of μ = 1/z each, composed (Dong, Roth & Su 2022, Cor. 3.3)."""
    if n_releases < 0 or noise_multiplier <= 0:
        raise ValueError(f"need n_releases ≥ 0 and noise_multiplier > 0, got {n_releases!r}, {noise_multiplier!r}")
    return math.sqrt(n_releases) / noise_multiplier


def delta_of_epsilon(mu: float, eps: float) -> float:
    """δ(ε) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) of μ-GDP (Dong, Roth & Su 2022, Cor. 2.13); 0 for μ = 0."""
    if mu < 0 or eps < 0:
        raise ValueError(f"need mu ≥ 0 and eps ≥ 0, got mu={mu!r}, eps={eps!r}")
    if mu == 0:
        return 0.0
    a = -eps / mu
    return max(0.0, float(special.ndtr(a + mu / 2) - math.exp(eps + special.log_ndtr(a - mu / 2))))


def epsilon_for_delta(mu: float, delta: float) -> float:
    """Smallest ε ≥ 0 with δ(ε) ≤ delta for μ-GDP (brentq on the decreasing δ(ε) of `delta_of_epsilon`)."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if delta_of_epsilon(mu, 0.0) <= delta:
        return 0.0
    hi = mu * mu / 2 + 1.0
    while delta_of_epsilon(mu, hi) > delta:
        hi *= 2.0
    return float(optimize.brentq(lambda e: delta_of_epsilon(mu, e) - delta, 0.0, hi, xtol=1e-12, rtol=1e-12))


def project_spd(M, floor: float = 1e-10) -> np.ndarray:
    """Nearest (Frobenius) symmetric matrix with eigenvalues ≥ floor·max|λ|: V max(λ, floor·max|λ|) Vᵀ of sym(M).

    Server post-processing of noisy aggregates (Σ A_j, Σ X_jᵀR_j⁻¹X_j) so that Cholesky-based updates stay valid;
    a matrix already above the floor is returned as sym(M) = (M + Mᵀ)/2, i.e. unchanged when symmetric.
    """
    M = np.asarray(M, dtype=float)
    if M.ndim != 2 or M.shape[0] != M.shape[1] or not np.all(np.isfinite(M)):
        raise ValueError(f"project_spd needs a finite square matrix, got shape {M.shape}")
    if not floor > 0:
        raise ValueError(f"floor must be > 0, got {floor!r}")
    S = 0.5 * (M + M.T)
    lam, V = np.linalg.eigh(S)
    low = floor * max(float(np.abs(lam).max()), np.finfo(float).tiny)
    if lam.min() >= low:
        return S
    P = (V * np.maximum(lam, low)) @ V.T
    return 0.5 * (P + P.T)


class PrivacyAccountant:
    """Releases per worker and the μ-GDP / (ε, δ) they compose to; plain picklable state (mechanism, releases)."""

    def __init__(self, mechanism: GaussianMechanism):
        self.mechanism = mechanism
        self.releases: dict[int, int] = {}

    def record(self, worker: int, n_releases: int) -> None:
        """Add n_releases Gaussian releases (`mechanism.released(q.xi)`) of worker `worker`."""
        if n_releases < 0:
            raise ValueError(f"n_releases must be ≥ 0, got {n_releases!r}")
        self.releases[int(worker)] = self.releases.get(int(worker), 0) + int(n_releases)

    def report(self) -> dict:
        """{"mechanism", "workers": [{"worker", "releases", "mu_gdp"}], "mu_gdp": max over workers, "epsilon", "delta"};
        μ per worker by `gdp_mu`, ε at the mechanism's δ by `epsilon_for_delta`."""
        mech = self.mechanism
        z = mech.noise_multiplier
        workers = [{"worker": j, "releases": r, "mu_gdp": gdp_mu(r, z)} for j, r in sorted(self.releases.items())]
        mu = max((row["mu_gdp"] for row in workers), default=0.0)
        clip = dict(mech.clip) if isinstance(mech.clip, Mapping) else mech.clip
        return {"mechanism": {"noise_multiplier": z, "clip": clip, "delta": mech.delta, "adjacency": ADJACENCY,
                              "seeded": mech.seed is not None},
                "workers": workers, "mu_gdp": mu, "epsilon": epsilon_for_delta(mu, mech.delta), "delta": mech.delta}
