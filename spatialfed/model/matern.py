"""Matérn covariance with fixed smoothness ν (paper Eq. 23, SPEC §1) and its log-scale derivatives.

c(d) = σ² · 2^{1−ν}/Γ(ν) · x^ν K_ν(x),  x = √(2ν) d / β,  c(0) = σ².

Derivatives are taken in u_σ = log σ² and u_β = log β. Because c is linear in σ²,
∂c/∂u_σ = ∂²c/∂u_σ² = c and ∂²c/∂u_σ∂u_β = ∂c/∂u_β, so only the β-derivatives are
computed here: with ρ(x) the correlation and ∂x/∂u_β = −x,
∂ρ/∂u_β = −x ρ'(x) and ∂²ρ/∂u_β² = x ρ'(x) + x² ρ''(x).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize, special

from spatialfed.errors import check_finite, check_positive

CLOSED_FORM_NU = (0.5, 1.5, 2.5)


def pairwise_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Euclidean distance matrix between point sets a (n×d) and b (k×d)."""
    a = check_points(a, "a")
    b = check_points(b, "b", a.shape[1])
    diff = a[:, None, :] - b[None, :, :]
    return np.sqrt(np.einsum("ijk,ijk->ij", diff, diff))


#: coordinates the kernels take: x/y in the plane, or Earth-centred x/y/z on the sphere, whose Euclidean distance is
#: the chordal one (data/space.py Chordal)
DIMS = (2, 3)


def as_points(pts) -> np.ndarray:
    """`pts` as a float array of rows of coordinates: (n, d) kept, anything else read as x/y pairs."""
    pts = np.asarray(pts, dtype=float)
    return pts if pts.ndim == 2 and pts.shape[1] in DIMS else pts.reshape(-1, 2)


def norm(v) -> np.ndarray:
    """The Euclidean norm over the last axis: hypot for x/y (as the planar code always took it, to the last bit),
    else √Σv² (Earth-centred x/y/z)."""
    v = np.asarray(v, dtype=float)
    return np.hypot(v[..., 0], v[..., 1]) if v.shape[-1] == 2 else np.sqrt(np.einsum("...a,...a->...", v, v))


def check_points(pts, name: str, dims: int | None = None) -> np.ndarray:
    """Validate a set of locations: a finite float array of shape (n, 2) (x/y), or (n, 3) (Earth-centred); with
    `dims`, of that many columns (the points they meet: a site's, the knots)."""
    pts = np.asarray(pts, dtype=float)
    if pts.ndim != 2 or pts.shape[1] not in ((dims,) if dims else DIMS):
        what = "Earth-centred x/y/z" if dims == 3 else "x/y"
        raise ValueError(f"{name} must be an array of shape (n, {dims or 2}) of {what} coordinates, got shape "
                         f"{pts.shape}")
    check_finite(pts, name)
    return pts


#: largest smoothness evaluated (Bessel and effective range checked finite up to ν = 45)
MAX_NU = 40.0


@dataclass(frozen=True)
class Matern:
    """Matérn correlation family with smoothness ν fixed (closed forms for ν = 0.5, 1.5, 2.5)."""

    nu: float = 0.5

    def __post_init__(self):
        if not np.isfinite(self.nu) or self.nu <= 0:
            raise ValueError(f"Matérn smoothness nu must be a finite number > 0, got {self.nu!r}")
        if self.nu > MAX_NU:  # x^ν K_ν(x) overflows in double precision beyond about 45
            raise ValueError(f"Matérn smoothness nu must be at most {MAX_NU:g}, got {self.nu!r}: beyond it the "
                             "Bessel function overflows, and the field is already that of the Gaussian limit; "
                             f"use nu ≤ {MAX_NU:g} (0.5, 1.5 and 2.5 have closed forms)")

    @property
    def scale(self) -> float:
        """√(2ν): distance d maps to x = √(2ν) d / β."""
        return float(np.sqrt(2.0 * self.nu))

    def _x(self, d, beta):
        check_positive(beta, "beta")
        return np.multiply(np.asarray(d, dtype=float), self.scale / beta)

    def correlation_derivatives(self, d, beta):
        """(ρ, ∂ρ/∂log β, ∂²ρ/∂log β²) at distances d (Eq. 23 and its log-β derivatives)."""
        x = self._x(d, beta)
        if self.nu in CLOSED_FORM_NU:
            return self._closed_form_derivatives(x)
        return self._bessel_derivatives(x)

    def _closed_form_derivatives(self, x):
        """ν ∈ {0.5, 1.5, 2.5}: exp, (1+x)e^{−x}, (1+x+x²/3)e^{−x}, evaluated in place (x is consumed)."""
        rho = np.negative(x)
        np.exp(rho, out=rho)  # e^{−x}
        if self.nu == 0.5:  # ρ̇ = x e^{−x}, ρ̈ = (x − 1) x e^{−x}
            d1 = x * rho
            x -= 1.0
            return rho, d1, np.multiply(x, d1, out=x)
        if self.nu == 1.5:  # ρ = (1+x)e^{−x}, ρ̇ = x² e^{−x}, ρ̈ = (x − 2) x² e^{−x}
            d1 = x * rho
            rho += d1
            d1 *= x
            x -= 2.0
            return rho, d1, np.multiply(x, d1, out=x)
        # ν = 2.5: ρ = (1+x+x²/3)e^{−x}, ρ̇ = (1+x) x² e^{−x}/3, ρ̈ = ((x−1)² − 3) x² e^{−x}/3
        d1 = x * rho
        q = d1 * x
        q /= 3.0
        rho += d1
        rho += q
        np.multiply(x, q, out=d1)
        d1 += q
        x -= 1.0
        x *= x
        x -= 3.0
        return rho, d1, np.multiply(x, q, out=x)

    def _bessel_derivatives(self, x):
        """General ν via K_ν and d/dx[x^ν K_ν(x)] = −x^ν K_{ν−1}(x)."""
        nu = self.nu
        const = 2.0 ** (1.0 - nu) / special.gamma(nu)
        rho = np.ones_like(x)
        d1 = np.zeros_like(x)
        d2 = np.zeros_like(x)
        pos = x > 0
        xp = x[pos]
        xnu = xp**nu
        k_nu = special.kv(nu, xp)
        k_m1 = special.kv(nu - 1.0, xp)
        k_m2 = special.kv(nu - 2.0, xp)
        rho[pos] = const * xnu * k_nu
        # ∂ρ/∂u_β = −x ρ'(x) = const x^{ν+1} K_{ν−1}(x)
        d1[pos] = const * xnu * xp * k_m1
        # ∂²ρ/∂u_β² = −x d/dx[const x^{ν+1} K_{ν−1}] = const (x^{ν+2} K_{ν−2} − 2 x^{ν+1} K_{ν−1})
        d2[pos] = const * xnu * xp * (xp * k_m2 - 2.0 * k_m1)
        # 0·∞ where x^ν underflows and K_ν overflows (x → 0: the limits are ρ = 1, ρ̇ = ρ̈ = 0; from about x < 7e-7
        # at ν = 40) or x^ν overflows and K_ν underflows (x → ∞: all three are 0)
        for arr, near in ((rho, 1.0), (d1, 0.0), (d2, 0.0)):
            bad = ~np.isfinite(arr)
            arr[bad] = np.where(x[bad] < 1.0, near, 0.0)
        return rho, d1, d2

    def correlation(self, d, beta):
        """ρ(d; β): the correlation of Eq. (23), equal to 1 at d = 0 (no derivatives computed)."""
        if self.nu not in CLOSED_FORM_NU:
            return self._bessel_derivatives(self._x(d, beta))[0]
        x = self._x(d, beta)
        rho = np.exp(-x)
        if self.nu == 1.5:
            rho *= 1.0 + x
        elif self.nu == 2.5:
            x += x * x / 3.0
            x += 1.0
            rho *= x
        return rho

    def covariance(self, d, sigma2, beta):
        """c(d) = σ² ρ(d; β) (Eq. 23)."""
        check_positive(sigma2, "sigma2")
        return sigma2 * self.correlation(d, beta)

    def cross(self, a, b, sigma2, beta):
        """Cross-covariance matrix C(a, b) between point sets a (n×d) and b (k×d)."""
        return self.covariance(pairwise_distances(a, b), sigma2, beta)

    def effective_range_factor(self) -> float:
        """range/β where the correlation falls to 0.05 (2.996 for ν = 0.5, SPEC §1)."""
        f = lambda x: self.correlation(np.array([x]), 1.0)[0] - 0.05  # noqa: E731
        return float(optimize.brentq(f, 1e-6, 100.0, xtol=1e-12))

    def beta_from_range(self, effective_range: float) -> float:
        """β whose correlation falls to 0.05 at the given effective range."""
        check_positive(effective_range, "effective_range")
        return float(effective_range) / self.effective_range_factor()

    def range_from_beta(self, beta: float) -> float:
        """Effective range (correlation 0.05) of the length scale β."""
        check_positive(beta, "beta")
        return float(beta) * self.effective_range_factor()
