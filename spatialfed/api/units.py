"""The fitted parameters in the units geostatisticians read (SPEC §1): nugget, partial sill, sill, range.

The model of SPEC §1 is z(s) = x(s)ᵀγ + w(s) + ε(s), w ~ GP(0, c_θ) with the Matérn covariance of Eq. (23) and
ε ~ N(0, 1/δ). Its semivariogram is γ(h) = 1/δ + σ² (1 − ρ_ν(h/β)) for h > 0, so

- nugget = 1/δ (variance of ε, in squared units of the response),
- partial sill = σ² (variance of w),
- sill = 1/δ + σ² (the variogram's plateau),
- range = β (the Matérn length scale of Eq. 23, in the CRS's units: metres for a projected CRS),
- practical range = β · f(ν), where the correlation falls to 0.05 (f = 2.996 for ν = 0.5, 2.739 for ν = 1.5,
  2.647 for ν = 2.5: ``Matern.effective_range_factor``).
"""

from __future__ import annotations

import re

from spatialfed.data.geometry import parse_crs
from spatialfed.model.matern import Matern


def distance_unit(crs) -> str | None:
    """Name of the CRS's linear unit ("metre", "US survey foot", ...); None for planar units (no CRS)."""
    crs = parse_crs(crs)
    if crs is None:
        return None
    axes = crs.axis_info or []
    return axes[0].unit_name if axes else None


def variogram_params(params: dict, nu: float, crs=None) -> dict:
    """{"nugget", "partial_sill", "sill", "range", "practical_range", "nu", "distance_unit", "crs"} from
    params {"delta", "sigma2", "beta"} (SPEC §1; see the module docstring)."""
    nugget, sill = 1.0 / float(params["delta"]), float(params["sigma2"])
    beta = float(params["beta"])
    return {"nugget": nugget, "partial_sill": sill, "sill": nugget + sill, "range": beta,
            "practical_range": beta * Matern(nu).effective_range_factor(), "nu": float(nu),
            "distance_unit": distance_unit(crs), "crs": short_name(crs)}


def short_name(crs) -> str | None:
    """'EPSG:28992' when `crs` is given as an authority code, else the CRS's own name (e.g. 'WGS 84 / LAEA centred
    40.62N 88.27W'); None for planar units. Unlike geometry.crs_name it never searches the EPSG database (seconds
    for a custom projection)."""
    if isinstance(crs, str) and re.fullmatch(r"[A-Za-z]+:\d+", crs.strip()):
        return crs.strip().upper()
    parsed = parse_crs(crs)
    return None if parsed is None else parsed.name


def describe(vp: dict) -> str:
    """One line: nugget, partial sill, sill, range and practical range with the distance unit."""
    from spatialfed.outputs.report import chordal_words, distance, nu_interval_words

    unit = vp.get("distance_unit")
    line = (f"nugget 1/δ = {vp['nugget']:.4g}, partial sill σ² = {vp['partial_sill']:.4g}, sill = {vp['sill']:.4g}, "
            f"range β = {distance(vp['range'], unit)}, practical range (ρ = 0.05) = "
            f"{distance(vp['practical_range'], unit)}")
    if vp.get("distance") == "chordal":  # on the sphere (api/covariance.py distance_params)
        line += f" ({chordal_words(vp)})"
    if "nu_se_log" in vp:  # ν estimated (api/covariance.py)
        line += f"; ν̂ = {vp['nu']:.3g} ({nu_interval_words(vp)})"
    if "angle_deg" in vp:  # geometric anisotropy
        line += (f"; anisotropy: major range {distance(vp['range_major'], unit)} at {vp['angle_deg']:.1f}° from "
                 f"north, minor range {distance(vp['range_minor'], unit)} (ratio {vp['anisotropy_ratio']:.3g})")
    return line



def describe_cv(cv: dict | None) -> str | None:
    """One line of the site-blocked CV score (``site_blocked_cv_``, api/blocked_cv.py), None without one."""
    if not cv:
        return None
    return (f"site-blocked CV ({len(cv['per_site'])} sites, each predicted from the others at the fitted parameters):"
            f" RMSE {cv['rmse']:.4g}, CRPS {cv['crps']:.4g}, mean log predictive density {cv['mlpd']:.4g}")


#: what a parameter on a bound of the fit's box (algorithm.likelihood.default_bounds) means, by (name, side)
_ON_BOUND = {
    ("delta", "upper"): "nugget ≈ 0 (1/δ on its lower bound, 1e-6 of the residual variance: no measurement error "
                        "visible at the data's spacing)",
    ("delta", "lower"): "nugget on its upper bound (1e4 × the residual variance: the data look like pure noise)",
    ("sigma2", "lower"): "partial sill ≈ 0 (σ² on its lower bound: no spatial variation left after the covariates)",
    ("sigma2", "upper"): "partial sill on its upper bound (1e4 × the residual variance)",
    ("beta", "upper"): "range on its upper bound (100 × the study diameter: a trend more than a spatial correlation; "
                       "consider a covariate)",
    ("beta", "lower"): "range on its lower bound (1e-4 × the study diameter: no spatial correlation at the data's "
                       "spacing)",
    ("nu", "upper"): "smoothness ν on its upper bound 4 (the data cannot tell a smoother field; ν = 4 is the "
                     "constrained estimate)",
    ("nu", "lower"): "smoothness ν on its lower bound 0.2 (a very rough field)",
    ("log_ratio", "upper"): "anisotropy ratio on its bound 20 (ranges across the axis tiny: check the angle and "
                            "the sites' layout, or fit without anisotropy)",
    ("log_ratio", "lower"): "anisotropy ratio on its bound 1/20 (ranges across the axis tiny: check the angle and "
                            "the sites' layout, or fit without anisotropy)",
    ("angle", "upper"): "anisotropy angle on its bound (two turns; the angle wrapped)",
    ("angle", "lower"): "anisotropy angle on its bound (two turns; the angle wrapped)",
}


def on_bound(boundary: dict) -> list[str]:
    """One phrase per parameter the fit left on a bound of its box, from {name: "lower" | "upper"} (``boundary_``):
    e.g. {"delta": "upper"} → "nugget ≈ 0 (...)". The estimate there is the constrained maximum, reported
    converged."""
    return [_ON_BOUND.get((name, side), f"{name} on its {side} bound") for name, side in boundary.items()]
