"""The covariance the estimator fits, from its ``nu`` and ``anisotropy`` settings (docs/equations.md, "Covariance
options"): a Matérn with ν fixed and isotropic distances (model/matern.py, the default ν = 0.5), or a
``MaternFamily`` (model/family.py) with ν estimated (``nu="estimate"``, log ν in NU_RANGE) and/or geometric
anisotropy (``anisotropy=True``: a major range β along the angle φ from north and a minor range β/r), fitted by
the same statistics server with u = (log δ, log σ², log β [, log ν] [, log r, φ]).

What a fit reports about it (`fitted`): ν̂ with the standard error of log ν from the observed information −H of
the exact ℓ_LR at the estimate and its Wald interval exp(log ν̂ ± 1.96 se) (within NU_RANGE); the major and minor ranges, the ratio
r ≥ 1 and the major axis' angle in degrees clockwise from north in [0°, 180°).

Distances (``distance``, `geometry`): "planar" in the store's CRS, or "chordal" on the sphere — the sites map their
points to Earth-centred coordinates (data/space.py Chordal, Eq. 26) and every kernel, residual and predictor runs on
them; the range is then also reported in km and in degrees of arc. None (the default) is chordal for a store with a
CRS whose domain spans more than AUTO_CHORDAL_KM, else planar.
"""

from __future__ import annotations

import math

import numpy as np

from spatialfed.algorithm.likelihood import NotPositiveDefinite, profile_loglik
from spatialfed.api.options import scheme_of
from spatialfed.data import space as spaces
from spatialfed.errors import DataError
from spatialfed.model.family import NU_RANGE, MaternFamily
from spatialfed.model.matern import Matern

#: the value of ``nu`` that estimates it
ESTIMATE = "estimate"
#: what a fit with an estimated family adds to params_ (beside γ, δ, σ², β)
PARAM_KEYS = ("nu", "anisotropy_ratio", "angle_deg")
#: what it adds to variogram_params_ (and fit.json's "variogram_params")
FITTED_KEYS = ("nu_se_log", "nu_95", "nu_95_wald", "nu_interval_rounds", "nu_interval_s", "range_major", "range_minor",
               "anisotropy_ratio", "angle_deg", "metric")
#: what distance_params adds to variogram_params_
DISTANCE_KEYS = ("distance", "range_km", "range_arc_deg")
#: the normal quantile of the Wald interval
Z95 = 1.959963984540054
#: the domain's diagonal D above which distance=None is chordal. Below it the arc, the chord (shorter by θ²/24) and a
#: centred equal-area or UTM projection's distance (scale error ~(D/2R)²/2 at the edge, 0.04–0.1 % in a UTM zone)
#: agree to ~0.1 %, so regional fits keep their planar distances; beyond it the one projection's error grows as D²,
#: while the chordal Matérn stays a valid covariance on the sphere for every ν
AUTO_CHORDAL_KM = 1000.0


def check(gp) -> None:
    """One line naming the fix for a ``nu``/``anisotropy`` setting the fit cannot take."""
    nu = gp.nu
    if not (nu == ESTIMATE or (isinstance(nu, (int, float)) and not isinstance(nu, bool) and math.isfinite(nu)
                               and nu > 0)):
        raise ValueError(f"nu (Matérn smoothness) must be a number > 0 or {ESTIMATE!r} (fitted within "
                         f"{NU_RANGE[0]}–{NU_RANGE[1]}), got {nu!r}")
    if not isinstance(gp.anisotropy, bool):
        raise ValueError(f"anisotropy must be True or False, got {gp.anisotropy!r}")
    if not estimated(gp):
        return
    what = f"nu={ESTIMATE!r}" if nu == ESTIMATE else "anisotropy=True"
    if gp.method != "lowrank":
        raise ValueError(f"{what} is fitted by the statistics scheme of method='lowrank'; method={gp.method!r} has "
                         f"a fixed isotropic Matérn: give a number for nu (and anisotropy=False)")
    if scheme_of(gp.strategies)[0] not in (None, "stats") or gp.privacy is not None:
        raise ValueError(f"{what} is fitted by the statistics scheme (strategies None or 'stats', without privacy=); "
                         "the block presets and privacy noise or secure aggregation take a fixed isotropic Matérn")


def check_distance(gp) -> None:
    """One line naming the fix for a ``distance`` setting the fit cannot take."""
    distance = spaces.check_distance(gp.distance)
    if distance == "chordal" and gp.anisotropy is True:
        raise ValueError("anisotropy=True takes planar distances (its angle is from the map's north); give "
                         "distance='planar', or drop the anisotropy for chordal distances on the sphere")
    if distance == "chordal" and gp.method == "fgpr":
        raise ValueError("method='fgpr' takes planar distances; give distance='planar' or method='lowrank'")


def geometry(gp, info, domain, knots):
    """(space, knots, server_knots) of a fit: the data/space.py map its sites apply (None: planar), the knots in the
    store's coordinates (a resumed chordal fit's checkpoint holds them mapped) and as the server uses them."""
    knots = np.asarray(knots, dtype=float)
    space = spaces.chordal(info.crs) if resolve_distance(gp, info, domain) == "chordal" else None
    if knots.ndim == 2 and knots.shape[1] == 3:
        knots = space.back(knots) if space is not None else knots
    elif space is not None and len(knots) and not space.has_lonlat(knots).all() and np.ndim(gp.knots) == 0:
        knots = _knots_on_the_sphere(space, domain, int(gp.knots), gp.seed)
    return space, knots, (knots if space is None else space.forward(knots))


def _knots_on_the_sphere(space, domain, m: int, seed: int) -> np.ndarray:
    """m jittered grid knots over the part of the domain that maps to the sphere (data lon/lat over most of the
    globe: its equal-area plane is a disk, the sites' bounding boxes reach beyond it)."""
    from spatialfed.data import geometry

    region = space.region()
    if region is None:  # another CRS: the knots as laid out, and forward names those without longitude/latitude
        return geometry.jittered_knots(domain, m, seed=seed)
    return geometry.jittered_knots(geometry.Domain(domain.geometry.intersection(region), domain.crs), m, seed=seed)


def resolve_distance(gp, info, domain) -> str:
    """"planar" or "chordal": the setting, or for None chordal where the store has a CRS and its domain's
    diagonal exceeds AUTO_CHORDAL_KM (isotropic fits with knots: a fit without them has no domain to measure)."""
    if gp.distance is not None:
        return spaces.check_distance(gp.distance)
    if info.crs is None or gp.anisotropy is True or gp.method == "fgpr" or domain is None:
        return "planar"
    try:
        km = spaces.chordal(info.crs).km
    except DataError:
        return "planar"
    x0, y0, x1, y1 = domain.geometry.bounds
    return "chordal" if math.hypot(x1 - x0, y1 - y0) * km > AUTO_CHORDAL_KM else "planar"


def distance_params(space, beta: float) -> dict:
    """{"distance"} and, for chordal distances, the range β in km and in degrees of arc (variogram_params_)."""
    if not isinstance(space, spaces.Chordal):
        return {"distance": "planar"}
    return {"distance": "chordal", "range_km": beta * space.km, "range_arc_deg": space.arc_degrees(beta)}


def estimated(gp) -> bool:
    """Whether the fit estimates covariance parameters beyond (σ², β): ν, or the anisotropy."""
    return gp.nu == ESTIMATE or gp.anisotropy is True


def kernel(gp):
    """The kernel the server and the sites use: Matern(ν) or the MaternFamily of the settings."""
    if not estimated(gp):
        return Matern(float(gp.nu))
    return MaternFamily(None if gp.nu == ESTIMATE else float(gp.nu), bool(gp.anisotropy))


def fitted(server) -> dict:
    """{"nu", "nu_se_log", "nu_95_wald", "range_major", "range_minor", "anisotropy_ratio", "angle_deg", "metric"}
    of a finished statistics fit with a MaternFamily (the entries its family has; "metric" the A of
    MaternFamily.metric, in which prediction is isotropic); {} for a fixed-ν isotropic one. "nu_95", the
    profile-likelihood interval, is api/nu_profile.py's (it refits on the sites)."""
    family = server.kernel
    if not isinstance(family, MaternFamily):
        return {}
    u = np.asarray(server.params.u, dtype=float)
    beta, nu, r, phi = family.split(u[2:])
    out: dict = {"nu": nu}
    se = standard_errors(server)
    if family.nu is None:
        i = 3
        s = float(se[i]) if se is not None else float("nan")
        out["nu_se_log"] = s
        lo, hi = (float(np.clip(np.exp(u[i] + k * Z95 * s), *NU_RANGE)) for k in (-1.0, 1.0))
        # within the box ν is fitted in; on its bound none (the curvature there does not describe it)
        out["nu_95_wald"] = [lo, hi] if math.isfinite(s) and "nu" not in getattr(server, "boundary", ()) else None
    if family.anisotropy:
        major, ratio, angle = major_axis(beta, r, phi)
        out.update(range_major=major, range_minor=major / ratio, anisotropy_ratio=ratio, angle_deg=angle,
                   metric=family.metric(u[2:]).tolist())
    return out


def major_axis(beta: float, r: float, phi: float) -> tuple[float, float, float]:
    """(major range, ratio ≥ 1, angle of the major axis in degrees from north in [0, 180)): (β, r, φ) and
    (β/r, 1/r, φ + 90°) are one model."""
    if r < 1.0:
        beta, r, phi = beta / r, 1.0 / r, phi + 0.5 * math.pi
    return float(beta), float(r), float(math.degrees(phi) % 180.0)


def standard_errors(server) -> np.ndarray | None:
    """√diag((−H)⁻¹) of ℓ_LR in u at the exact round nearest the estimate (its sites' summed statistics), or None
    when there is none or −H is not positive definite (ν weakly identified: reported as nan, not as a number)."""
    rounds = getattr(getattr(server, "records", None), "rounds", {})
    active = sorted(server.active)
    u = np.asarray(server.params.u, dtype=float)
    exact = [e for e in rounds.values() if sorted(e["sites"]) == active]
    if not exact:
        return None
    entry = min(exact, key=lambda e: float(np.linalg.norm(np.asarray(e["sum"]["u"], dtype=float) - u)))
    try:
        hess = profile_loglik(entry["sum"], server.knots, server.kernel).hess
        cov = np.linalg.inv(-hess)
    except (NotPositiveDefinite, np.linalg.LinAlgError):
        return None
    diag = np.diag(cov)
    return np.where(diag > 0, np.sqrt(np.abs(diag)), np.nan)
