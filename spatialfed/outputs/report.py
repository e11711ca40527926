"""The written summary that opens report.html: data, settings, estimates with units, convergence, time per site.

Estimates in the units geostatisticians read (SPEC §1): nugget variance 1/δ and partial sill σ² in squared units of
the response; range β (the Matérn length scale of Eq. 23) and practical range β·f(ν) — where the correlation falls to
0.05, f = ``Matern(nu).effective_range_factor()`` — in the CRS's linear unit (planar units without a CRS).
Time per site comes from the monitor's arrivals: the tasks each site answered and the mean interval between its
answers (waiting for the server included), beside the fit's wall time.
"""

from __future__ import annotations

import html
import math

import numpy as np

from spatialfed.model.matern import Matern

UNIT_SHORT = {"metre": "m", "meter": "m", "kilometre": "km", "foot": "ft", "US survey foot": "US ft", "degree": "°"}
MAX_SITE_ROWS = 12   # more sites than this: the per-site time is summarised (fastest, median, slowest)


def _store_facts(store) -> dict:
    """CRS short name, distance unit and site sizes of the store fitted; {} when it cannot be opened."""
    if not store:
        return {}
    try:
        from spatialfed.data.crs import crs_name, parse_crs
        from spatialfed.data.store import open_store

        info = open_store(store)
        crs = parse_crs(info.crs)
    except Exception:   # the report never fails because the store moved: it says less
        return {}
    axes = (crs.axis_info or []) if crs is not None else []
    unit = axes[0].unit_name if axes else None
    return {"crs": crs_name(crs), "unit": unit, "sizes": [int(s) for s in info.sizes]}


def site_times(arrivals: list[dict], n_workers: int) -> list[dict]:
    """Per site j: tasks answered and the mean seconds between its answers (None with fewer than two)."""
    times: list[list[float]] = [[] for _ in range(n_workers)]
    for a in arrivals:
        if 0 <= int(a["worker"]) < n_workers and a.get("time_s") is not None:
            times[int(a["worker"])].append(float(a["time_s"]))
    rows = []
    for j, t in enumerate(times):
        t.sort()
        rows.append({"site": j, "tasks": len(t),
                     "s_per_task": (t[-1] - t[0]) / (len(t) - 1) if len(t) > 1 else None})
    return rows


def data_name(extra: dict) -> str:
    """What the report calls the data: the store's path, or, for a fit on in-memory data (whose temporary store
    is gone once the estimator is), the copy saved beside the report (``api.loading``: extra "data")."""
    if extra.get("data"):
        return f"in-memory data (a DataFrame or arrays), saved as {extra['data']} beside this report"
    return str(extra.get("store"))


def summary_facts(result, arrivals=None, preset: str | None = None) -> dict:
    """The facts of the summary from a ``FitResult`` (and the monitor's arrivals), as plain values."""
    extra = dict(result.extra or {})
    store = extra.get("store")
    facts = _store_facts(store)
    p = result.params
    gamma = np.atleast_1d(np.asarray(p.get("gamma", []), dtype=float))
    names = list(extra.get("covariate_names") or [])
    if len(names) != len(gamma):
        names = [f"x{k}" for k in range(len(gamma))]
    factor = Matern(float(result.nu)).effective_range_factor()
    stop = extra.get("stop_reason")
    return {
        "store": None if store is None else data_name(extra), "in_memory": bool(extra.get("data")),
        "n_sites": int(result.n_workers), "n_obs": int(result.n_obs),
        "crs": facts.get("crs"), "unit": facts.get("unit"), "sizes": facts.get("sizes"),
        "method": result.method, "mode": result.mode, "preset": preset or extra.get("preset"),
        "residual": result.residual, "m": 0 if result.knots is None else int(np.asarray(result.knots).shape[0]),
        "nu": float(result.nu), "runtime": extra.get("runtime"), "profile": _profile(extra),
        "gamma": dict(zip(names, gamma.tolist())),
        "nugget": 1.0 / float(p["delta"]), "partial_sill": float(p["sigma2"]), "range": float(p["beta"]),
        "practical_range": float(p["beta"]) * factor, "range_factor": factor,
        "converged": bool(result.converged), "stop_reason": None if stop is None else str(stop),
        "iterations": int(result.iterations), "loglik": None if result.loglik is None else float(result.loglik),
        "wall_time_s": float(result.wall_time_s), "dropped": list(result.dropped_workers or []),
        "sites": site_times(arrivals or [], int(result.n_workers)) if arrivals else [],
        "covariance": {k: v for k, v in (extra.get("variogram_params") or {}).items()
                       if k in ("nu_se_log", "nu_95", "nu_95_wald", "nu_interval_rounds", "range_major", "range_minor",
                                "anisotropy_ratio", "angle_deg", "distance", "range_km", "range_arc_deg")},
        "blocked_cv": extra.get("site_blocked_cv"),
    }


def _covariance_text(facts: dict) -> str:
    """The estimated family's ν̂ (with its interval) and anisotropy, as the fit's summary line says them."""
    cov, unit, e = facts.get("covariance") or {}, facts.get("unit"), html.escape
    text = ""
    if cov.get("distance") == "chordal":
        text += f"<br>{e(chordal_words(cov))}"
    if "nu_se_log" in cov:
        text += f"<br>smoothness ν̂ = {facts['nu']:.3g} ({e(nu_interval_words(cov))})"
    if "angle_deg" in cov:
        text += (f"<br>anisotropy: major range {e(distance(cov['range_major'], unit))} at {cov['angle_deg']:.1f}° "
                 f"from north, minor range {e(distance(cov['range_minor'], unit))} (ratio "
                 f"{cov['anisotropy_ratio']:.3g})")
    return text


def _blocked_text(facts: dict) -> str:
    """The site-blocked CV score (fit.json "site_blocked_cv", api/blocked_cv.py) beside ℓ; '' without one."""
    cv = facts.get("blocked_cv")
    if not cv:
        return ""
    return (f"<br>site-blocked CV (each of {len(cv['per_site'])} sites predicted from the others at these estimates): "
            f"RMSE {_g(cv['rmse'])}, CRPS {_g(cv['crps'])}, mean log predictive density {_g(cv['mlpd'])}")


def trace_facts(trace_rows: list[dict], arrivals: list[dict], n_workers: int) -> dict:
    """The summary's facts from what a monitor saw alone (no FitResult): sites, the last trace row, time per site;
    settings and the data's size are then unknown (None)."""
    last = next((r for r in reversed(trace_rows) if r.get("delta") is not None), {})
    gamma = np.atleast_1d(np.asarray(last.get("gamma") or [], dtype=float))
    final = bool(trace_rows) and trace_rows[-1].get("step") == "final"
    times = [float(r["time_s"]) for r in trace_rows if r.get("time_s") is not None]
    return {
        "store": None, "n_sites": int(n_workers), "n_obs": None, "crs": None, "unit": None, "sizes": None,
        "method": None, "mode": None, "preset": None, "residual": None, "m": None, "nu": None,
        "runtime": None, "profile": None, "gamma": {f"x{k}": v for k, v in enumerate(gamma.tolist())},
        "nugget": 1.0 / float(last["delta"]) if last else None,
        "partial_sill": float(last["sigma2"]) if last else None, "range": float(last["beta"]) if last else None,
        "practical_range": None, "range_factor": None, "converged": None, "stop_reason": None,
        "iterations": max((int(r.get("iter") or 0) for r in trace_rows), default=0),
        "loglik": trace_rows[-1].get("loglik") if final else None,
        "wall_time_s": max(times, default=0.0), "dropped": [],
        "sites": site_times(arrivals, int(n_workers)) if arrivals else [],
    }


def _g(x, digits: int = 4) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:.{digits}g}"


def chordal_words(vp: dict) -> str:
    """A chordal fit's range in km and as an arc (api/covariance.py distance_params)."""
    return f"chordal distances on the sphere: range {vp['range_km']:.4g} km, {vp['range_arc_deg']:.3g}° of arc"


def nu_interval_words(vp: dict) -> str:
    """ν's 95 % intervals as words: the profile-likelihood one ("nu_95", an open side said as the box's bound it
    reaches, api/nu_profile.py) with its round trips, then the Wald one ("nu_95_wald"); a fit saved before the
    profile interval has the Wald one only (its fit.json "nu_95", loaded as "nu_95_wald")."""
    from spatialfed.model.family import NU_RANGE

    ci, wald = vp.get("nu_95"), vp.get("nu_95_wald")
    if "nu_95_wald" not in vp or "nu_95" not in vp:  # saved before the profile interval (loaded: renamed)
        wald = vp.get("nu_95_wald", ci)
        return f"95 % Wald interval {wald[0]:.3g}–{wald[1]:.3g}" if wald else "weakly identified: no interval"
    ends = [f"{b:.3g} (open)" if c is None else f"{c:.3g}" for c, b in zip(ci or (None, None), NU_RANGE)]
    text = (f"95 % profile-likelihood interval {ends[0]}–{ends[1]}" if ci else
            "weakly identified: the profile likelihood bounds neither side") + \
        f", {vp.get('nu_interval_rounds', 0)} round trips"
    return text + (f"; Wald {wald[0]:.3g}–{wald[1]:.3g}" if wald else "")


def distance(value, unit: str | None) -> str:
    """A distance with its unit: kilometres for metres from 10 km up (8,063 km, not 8.063e+06 m); "(planar units)"
    without a CRS."""
    if value is None or not math.isfinite(float(value)):
        return "—"
    short = UNIT_SHORT.get(unit, unit) if unit else None
    if short == "m" and abs(value) >= 10_000:
        return f"{value / 1000:,.4g} km" if abs(value) < 1e7 else f"{value / 1000:,.0f} km"
    return f"{value:.4g} {short}" if short else f"{value:.4g} (planar units)"


def _site_table(f: dict) -> str:
    sizes = f.get("sizes") or []
    rows = f["sites"]
    head = "<tr><th>site</th><th>observations</th><th>tasks answered</th><th>s per task</th></tr>"

    def row(r, label=None):
        n = sizes[r["site"]] if r["site"] < len(sizes) else None
        return (f"<tr><td>{label or r['site']}</td><td>{'—' if n is None else n}</td><td>{r['tasks']}</td>"
                f"<td>{_g(r['s_per_task'], 3)}</td></tr>")

    if len(rows) > MAX_SITE_ROWS:
        timed = sorted((r for r in rows if r["s_per_task"] is not None), key=lambda r: r["s_per_task"])
        if timed:
            picks = [("fastest", timed[0]), ("median", timed[len(timed) // 2]), ("slowest", timed[-1])]
            body = "".join(row(r, f"{name}: {r['site']}") for name, r in picks)
        else:
            body = ""
    else:
        body = "".join(row(r) for r in rows)
    return f'<table class="sites">{head}{body}</table>'


def summary_html(facts: dict) -> str:
    """The summary section (HTML, every value escaped) that opens report.html; unknown values (None) are left out
    or shown as '—'."""
    e = html.escape
    if facts["converged"] is None:
        conv = "convergence unknown (the report was written without the fit's result)"
    elif facts["converged"]:
        conv = "converged"
    else:
        conv = f"not converged (stopped: {facts['stop_reason'] or 'unknown'})"
    named = [("method", facts["method"]), ("mode", facts["mode"]),
             ("preset", facts["preset"] if facts["mode"] == "async" else None), ("residual", facts["residual"])]
    settings = [f"{k} {v}" for k, v in named if v is not None]
    if facts["m"] is not None:
        settings.append(f"m = {facts['m']} knots" if facts["m"] else "no knots")
    if facts["nu"] is not None:
        settings.append(f"ν = {facts['nu']:g}")
    settings += [f"runtime {facts['runtime']}"] if facts.get("runtime") else []
    profile = facts.get("profile")
    settings += [profile if str(profile).startswith("slowdowns") else f"profile {profile}"] if profile else []
    gamma = ", ".join(f"{e(str(k))} {v:.4g}" for k, v in facts["gamma"].items()) or "—"
    data = f"J = {facts['n_sites']} sites"
    if facts["n_obs"] is not None:
        data += f", N = {facts['n_obs']:,} observations"
    if facts["store"] is not None:
        where = facts["store"] if facts.get("in_memory") else f"store {facts['store']}"
        data = f"{e(where)}: {data}; CRS {e(facts['crs'] or 'none (planar coordinates)')}"
    practical = ""
    if facts["practical_range"] is not None:
        practical = (f", practical range (correlation 0.05) β·{facts['range_factor']:.3f} = "
                     f"{e(distance(facts['practical_range'], facts.get('unit')))}")
    items = [
        ("Data", data),
        ("Settings", e(", ".join(settings)) or "—"),
        ("Estimates", f"γ: {gamma}<br>nugget variance 1/δ = {_g(facts['nugget'])}, partial sill σ² = "
                      f"{_g(facts['partial_sill'])} (squared units of the response); range β = "
                      f"{e(distance(facts['range'], facts.get('unit')))}{practical}{_covariance_text(facts)}"
                      f"{_blocked_text(facts)}"),
        ("Convergence", f"{e(conv)} after {facts['iterations']} iterations; final log-likelihood "
                        f"ℓ = {_g(facts['loglik'], 8)}"
                        + (f"; continued without sites {facts['dropped']}" if facts["dropped"] else "")),
        ("Time", f"wall time {facts['wall_time_s']:.2f} s"
                 + (f"; {sum(r['tasks'] for r in facts['sites'])} tasks answered by the sites, per site below"
                    if facts["sites"] else "")),
    ]
    lis = "".join(f"<li><b>{name}</b>: {text}</li>" for name, text in items)
    table = _site_table(facts) if facts["sites"] else ""
    return f'<section id="summary" class="spatialfed-summary"><h1>Summary</h1><ul>{lis}</ul>{table}</section>'


STYLE = """
body { font-family: system-ui, sans-serif; margin: 16px; color: #222; }
#summary { max-width: 1100px; margin-bottom: 16px; font-size: 14px; line-height: 1.45; }
#summary h1 { font-size: 20px; margin: 0 0 6px 0; }
#summary ul { margin: 0 0 8px 0; padding-left: 18px; }
#summary table.sites { border-collapse: collapse; font-size: 13px; }
#summary table.sites td, #summary table.sites th { border: 1px solid #ccc; padding: 2px 8px; text-align: right; }
"""


def report_page(title: str, summary: str, plots) -> str:
    """A standalone page (BokehJS inlined: opens offline): the title, the summary, then the Bokeh plots."""
    from bokeh.embed import components
    from bokeh.resources import INLINE

    script, div = components(plots)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{html.escape(title)}</title>\n'
            f"<style>{STYLE}</style>\n{INLINE.render()}\n</head>\n<body>\n<p class=\"title\">{html.escape(title)}</p>\n"
            f"{summary}\n<div id=\"plots\">{div}</div>\n{script}\n</body>\n</html>\n")


def _profile(extra) -> str | None:
    """The sites' emulated speeds as a reader should see them: the profile's name, or explicit slowdowns (given with
    `slowdown=`, the name left at "balanced") as factors, e.g. "slowdowns 1, 1, 1, 20.7, 1"."""
    name, s = extra.get("profile"), extra.get("slowdowns")
    if s is not None and name in (None, "balanced") and any(float(v) != 1.0 for v in s):
        return "slowdowns " + ", ".join(f"{float(v):.3g}" for v in s)
    return name
