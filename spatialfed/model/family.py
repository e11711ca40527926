"""The Matérn family with estimated parameters beyond (σ², β): smoothness ν, geometric anisotropy, chordal distance.

Kernel coordinates κ (the entries of u after log δ, log σ²; docs/equations.md, "Covariance options"):

    κ = (log β [, log ν] [, log r, φ]),

ρ(s, s') = M_ν(√(2ν) d/β), M_ν(x) = 2^{1−ν}/Γ(ν) x^ν K_ν(x), with the distance d

    planar:      d² = a² + r² b²,  a = Δ·(sin φ, cos φ), b = Δ·(cos φ, −sin φ)  (Δ = s − s'; r = 1, φ = 0 isotropic)
    chordal:     d = R ‖p(s) − p(s')‖,  p the unit vector of (lon, lat), R = 6371 km.

φ is the major axis' angle clockwise from north (the y axis), β the range along it, β/r across it. The chordal
Matérn is positive definite on the sphere for every ν > 0 and β > 0 (Gneiting 2013, Bernoulli 19(4), Thm 3 with
Yadrenko: a covariance positive definite in R³ restricted to S²). Derivatives:
    β and the geometry through L = log d − log β: ρ_a = −ρ̇ L_a, ρ_ab = ρ̈ L_a L_b − ρ̇ L_ab, ρ_βa = −ρ̈ L_a,
    with ρ̇ = ∂ρ/∂log β, ρ̈ = ∂²ρ/∂log β² analytic (model/matern.py);
    ν (no closed form through K_ν): sixth-order central differences in log ν of the analytic (ρ, ρ̇) with the step
    NU_STEP = 0.01, where truncation (h⁶) and rounding (ε/h²) errors balance near 1e-12 (tests check them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import special
from scipy.spatial.distance import cdist

from spatialfed.model.matern import Matern, check_points

#: range of ν when it is estimated (the box on log ν)
NU_RANGE = (0.2, 4.0)
#: box on log r (ratio of the major to the minor range up to 20)
LOG_RATIO_BOUND = float(np.log(20.0))
#: the Earth's mean radius (km): chordal distances are in km
EARTH_RADIUS_KM = 6371.0088
#: step in log ν of the sixth-order differences (see the module docstring)
NU_STEP = 0.01
_D1 = np.array([-1.0, 9.0, -45.0, 0.0, 45.0, -9.0, 1.0]) / 60.0
_D2 = np.array([2.0, -27.0, 270.0, -490.0, 270.0, -27.0, 2.0]) / 180.0
DISTANCES = ("euclidean", "chordal")


def unit_vectors(lonlat) -> np.ndarray:
    """p(s) ∈ S² of (lon, lat) in degrees."""
    lon, lat = np.radians(np.asarray(lonlat, dtype=float)).T
    return np.column_stack([np.cos(lat) * np.cos(lon), np.cos(lat) * np.sin(lon), np.sin(lat)])


@dataclass(frozen=True)
class MaternFamily:
    """Matérn correlation with ν fixed (a float) or estimated (nu=None), optionally anisotropic or chordal."""

    nu: float | None = 0.5
    anisotropy: bool = False
    distance: str = "euclidean"

    def __post_init__(self):
        if self.nu is not None:
            Matern(float(self.nu))  # validates
        if self.distance not in DISTANCES:
            raise ValueError(f"distance must be one of {DISTANCES}, got {self.distance!r}")
        if self.anisotropy and self.distance == "chordal":
            raise ValueError("anisotropy needs planar coordinates: use distance='euclidean' (a projected CRS) with "
                             "anisotropy=True, or drop anisotropy for chordal distances on the sphere")

    @property
    def names(self) -> tuple[str, ...]:
        """Names of κ."""
        return ("beta",) + (("nu",) if self.nu is None else ()) + (("log_ratio", "angle") if self.anisotropy else ())

    @property
    def q(self) -> int:
        """Entries of u = (log δ, log σ², κ)."""
        return 2 + len(self.names)

    def bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """Box on κ after log β (log ν in NU_RANGE, |log r| ≤ LOG_RATIO_BOUND, φ within two turns)."""
        lo, hi = [], []
        if self.nu is None:
            lo.append(np.log(NU_RANGE[0]))
            hi.append(np.log(NU_RANGE[1]))
        if self.anisotropy:
            lo += [-LOG_RATIO_BOUND, -2.0 * np.pi]
            hi += [LOG_RATIO_BOUND, 2.0 * np.pi]
        return np.array(lo), np.array(hi)

    @property
    def base(self) -> Matern:
        """The fixed-ν isotropic Matérn the start φ₀ is fitted with (ν = 1 when ν is estimated)."""
        return Matern(float(self.nu) if self.nu is not None else 1.0)

    def start_kappa(self) -> np.ndarray:
        """κ after log β at the start: ν = 1 when estimated, ratio 1.5 at angle 0 (a direction to move in: at
        ratio 1 the angle has no gradient)."""
        return np.array(([0.0] if self.nu is None else []) + ([np.log(1.5), 0.0] if self.anisotropy else []))

    def metric(self, kappa) -> np.ndarray:
        """A (2×2) with d(s, s') = ‖A(s − s')‖ (planar distance): rows along and across the major axis, the
        second scaled by r, so that the fitted model is the isotropic Matérn of range β in the coordinates As."""
        if self.distance == "chordal":
            raise ValueError("chordal distances have no planar metric")
        _, _, r, phi = self.split(kappa)
        return np.array([[np.sin(phi), np.cos(phi)], [r * np.cos(phi), -r * np.sin(phi)]])

    def split(self, kappa) -> tuple[float, float, float, float]:
        """(β, ν, r, φ) of κ."""
        kappa = np.atleast_1d(np.asarray(kappa, dtype=float))
        if kappa.size != len(self.names):
            raise ValueError(f"κ must hold {len(self.names)} numbers {self.names}, got {kappa.size}")
        i, beta = 1, float(np.exp(kappa[0]))
        nu = float(self.nu) if self.nu is not None else float(np.exp(kappa[i]))
        i += self.nu is None
        r, phi = (float(np.exp(kappa[i])), float(kappa[i + 1])) if self.anisotropy else (1.0, 0.0)
        return beta, nu, r, phi

    def _geometry(self, a, b, r: float, phi: float):
        """d with ∂L/∂(log r, φ) and their second derivatives (None when isotropic); a, b are point sets (n×2,
        k×2; n×3 Earth-centred, isotropic only) or batches of them (B×n×2, B×k×2: the Vecchia residual's local
        sets)."""
        batched = np.ndim(a) == 3
        if self.distance == "chordal":
            if batched:
                pa, pb = (unit_vectors(x.reshape(-1, 2)).reshape(x.shape[:-1] + (3,)) for x in (a, b))
                diff = pa[:, :, None] - pb[:, None]
                return np.sqrt(np.einsum("...i,...i->...", diff, diff)) * EARTH_RADIUS_KM, None
            return cdist(unit_vectors(a), unit_vectors(b)) * EARTH_RADIUS_KM, None
        if not batched:
            a, b = check_points(a, "a"), check_points(b, "b")
        if np.shape(a)[-1] == 3 and not self.anisotropy:  # Earth-centred points (data/space.py): the chordal distance
            diff = a[..., :, None, :] - b[..., None, :, :]
            return np.sqrt(np.einsum("...i,...i->...", diff, diff)), None
        dx = a[..., :, None, 0] - b[..., None, :, 0]
        dy = a[..., :, None, 1] - b[..., None, :, 1]
        if not self.anisotropy:
            return np.hypot(dx, dy), None
        s, c = np.sin(phi), np.cos(phi)
        along, across = dx * s + dy * c, dx * c - dy * s
        D = along**2 + r * r * across**2
        with np.errstate(invalid="ignore", divide="ignore"):
            Lr = np.where(D > 0, r * r * across**2 / D, 0.0)
            Lp = np.where(D > 0, along * across * (1.0 - r * r) / D, 0.0)
            Lrp = np.where(D > 0, -2.0 * r * r * along * across / D, 0.0) - 2.0 * Lr * Lp
            Lpp = np.where(D > 0, (1.0 - r * r) * (across**2 - along**2) / D, 0.0) - 2.0 * Lp * Lp
        return np.sqrt(D), ((Lr, Lp), {(0, 0): 2.0 * Lr * (1.0 - Lr), (0, 1): Lrp, (1, 1): Lpp})

    def correlation(self, a, b, kappa) -> np.ndarray:
        """ρ(a_i, b_k) for point sets a, b (n×2, k×2; lon/lat degrees when chordal)."""
        beta, nu, r, phi = self.split(kappa)
        d, _ = self._geometry(a, b, r, phi)
        return Matern(nu).correlation(d, beta)

    def cross(self, a, b, sigma2, kappa) -> np.ndarray:
        """σ²ρ(a, b) (the interface of Matern.cross, with κ in place of β)."""
        return sigma2 * self.correlation(a, b, kappa)

    def derivatives(self, a, b, kappa) -> tuple[np.ndarray, list, dict]:
        """(ρ, [∂ρ/∂κ_k], {(k, l): ∂²ρ/∂κ_k∂κ_l, k ≤ l}) at the pairs of a × b (or of each batch's a_i × b_i)."""
        beta, nu, r, phi = self.split(kappa)
        d, geo = self._geometry(a, b, r, phi)
        if self.nu is not None:
            rho, r1, r2 = Matern(nu).correlation_derivatives(d, beta)
        elif a is b:  # symmetric: the costly Bessel stencils on the upper triangle only (ρ = 1, the rest 0 at d = 0),
            iu = np.triu_indices(d.shape[-1], 1)  # at its distinct distances (a Vecchia batch's sets share most pairs)
            upper = d[..., iu[0], iu[1]]
            distinct, back = np.unique(upper.ravel(), return_inverse=True)
            nu_parts, r1, r2 = _nu_free(distinct, beta, nu)

            def fill(v, diagonal):
                return _filled(v[back].reshape(upper.shape), iu, d.shape, diagonal)

            rho = tuple(fill(v, 1.0 if i == 0 else 0.0) for i, v in enumerate(nu_parts))
            r1, r2 = fill(r1, 0.0), fill(r2, 0.0)
        else:
            rho, r1, r2 = _nu_free(d, beta, nu)
        d1, d2 = [r1], {(0, 0): r2}
        i = 1
        if self.nu is None:
            rho, r1_nu, rho_nu, rho_nunu = rho
            d1.append(rho_nu)
            d2[(0, 1)] = r1_nu
            d2[(1, 1)] = rho_nunu
            i = 2
        if geo is not None:  # ρ_a = −ρ̇ L_a, ρ_βa = −ρ̈ L_a, ρ_νa = −ρ̇_ν L_a, ρ_ab = ρ̈ L_a L_b − ρ̇ L_ab
            (Lr, Lp), L2 = geo
            for k, La in ((i, Lr), (i + 1, Lp)):
                d1.append(-r1 * La)
                d2[(0, k)] = -r2 * La
                if self.nu is None:
                    d2[(1, k)] = -d2[(0, 1)] * La
            for (x, y), Lab in L2.items():
                d2[(i + x, i + y)] = r2 * (Lr, Lp)[x] * (Lr, Lp)[y] - r1 * Lab
        return rho, d1, d2


def _filled(values, iu, shape, diagonal: float) -> np.ndarray:
    """The symmetric (…, n, n) array with `values` on the upper triangles `iu` (and below) and `diagonal` on the
    diagonals."""
    out = np.full(shape, diagonal)
    out[..., iu[0], iu[1]] = values
    out[..., iu[1], iu[0]] = values
    return out


def _nu_free(d, beta, nu):
    """((ρ, ∂ρ̇/∂log ν, ∂ρ/∂log ν, ∂²ρ/∂log ν²), ρ̇, ρ̈) with ν free: ρ̇, ρ̈ analytic (Matern._bessel_derivatives) and
    the ν-derivatives by the stencils _D1, _D2 of ρ and ρ̇ at ν e^{jh}, j = −3..3 (x = √(2ν) d/β moves with ν)."""
    d = np.asarray(d, dtype=float)
    rho, r1, r2 = Matern(nu)._bessel_derivatives(d * (np.sqrt(2.0 * nu) / beta))
    rho_nu, rho_nunu, r1_nu = np.zeros_like(rho), _D2[3] * rho, np.zeros_like(rho)
    for j in (-3, -2, -1, 1, 2, 3):
        nu_j = nu * float(np.exp(j * NU_STEP))
        rho_j, r1_j = _correlation_and_rate(Matern(nu_j), d * (np.sqrt(2.0 * nu_j) / beta))
        rho_nu += _D1[j + 3] * rho_j
        rho_nunu += _D2[j + 3] * rho_j
        r1_nu += _D1[j + 3] * r1_j
    h = NU_STEP
    return (rho, r1_nu / h, rho_nu / h, rho_nunu / h**2), r1, r2


def _correlation_and_rate(kernel: Matern, x):
    """(ρ, ρ̇) = (c x^ν K_ν(x), c x^{ν+1} K_{ν−1}(x)), c = 2^{1−ν}/Γ(ν), with the limits 1, 0 at x = 0 and 0, 0 where
    x^ν K_ν underflows."""
    nu = kernel.nu
    const = 2.0 ** (1.0 - nu) / special.gamma(nu)
    rho, rate = np.ones_like(x), np.zeros_like(x)
    pos = x > 0
    xp = x[pos]
    xnu = const * xp**nu
    rho[pos] = xnu * special.kv(nu, xp)
    rate[pos] = xnu * xp * special.kv(nu - 1.0, xp)
    for arr, near in ((rho, 1.0), (rate, 0.0)):
        bad = ~np.isfinite(arr)
        arr[bad] = np.where(x[bad] < 1.0, near, 0.0)
    return rho, rate
