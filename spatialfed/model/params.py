"""The parameter tuple φ = (μ, Σ, γ, δ, θ) of the federated objective (Eq. 5, Eq. 11)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from spatialfed.errors import check_finite, check_positive


@dataclass(frozen=True)
class Params:
    """φ = (μ, Σ, γ, δ, σ², β); u = (log δ, log σ², log β) is the Newton coordinate of SPEC §2. `kappa`: the
    kernel coordinates after log β of an estimated Matérn family (log ν, log r, φ; model/family.py), empty for a
    fixed-ν isotropic Matérn: u = (log δ, log σ², log β, *kappa)."""

    mu: np.ndarray
    Sigma: np.ndarray
    gamma: np.ndarray
    delta: float
    sigma2: float
    beta: float
    kappa: tuple = ()

    def __post_init__(self):
        mu = check_finite(np.atleast_1d(np.asarray(self.mu, dtype=float)), "mu")
        Sigma = check_finite(np.atleast_2d(np.asarray(self.Sigma, dtype=float)), "Sigma")
        gamma = check_finite(np.atleast_1d(np.asarray(self.gamma, dtype=float)), "gamma")
        if Sigma.shape != (mu.size, mu.size):
            raise ValueError(f"Sigma must be {mu.size}×{mu.size} to match mu, got {Sigma.shape}")
        object.__setattr__(self, "mu", mu)
        object.__setattr__(self, "Sigma", Sigma)
        object.__setattr__(self, "gamma", gamma)
        for name in ("delta", "sigma2", "beta"):
            object.__setattr__(self, name, check_positive(getattr(self, name), name))
        object.__setattr__(self, "kappa", tuple(float(v) for v in check_finite(
            np.asarray(self.kappa, dtype=float).reshape(-1), "kappa")))

    @property
    def u(self) -> np.ndarray:
        """u = (log δ, log σ², log β, *kappa)."""
        return np.concatenate([np.log([self.delta, self.sigma2, self.beta]), self.kappa])

    @property
    def theta_key(self) -> tuple[float, float, float]:
        """(δ, σ², β): the values that fix R_j and hence its cached factorisation (a fixed-ν Matérn's)."""
        return (self.delta, self.sigma2, self.beta)

    def with_u(self, u) -> "Params":
        """Copy with (δ, σ², β) = exp(u[:3]) and kappa = u[3:]."""
        u = np.asarray(u, dtype=float).reshape(-1)
        delta, sigma2, beta = np.exp(u[:3])
        return replace(self, delta=float(delta), sigma2=float(sigma2), beta=float(beta), kappa=tuple(u[3:]))

    def replace(self, **changes) -> "Params":
        """Copy with some fields changed."""
        return replace(self, **changes)
