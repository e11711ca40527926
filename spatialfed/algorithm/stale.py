"""Stale sites in the asynchronous statistics server (SPEC §2b): their models at the current u (Taylor or control
variate; third order from earlier answers). Pure functions over the server's records; the server holds the state.

Records: `stats` {site: its latest statistics (model/stats.py site_statistics, with "u")}; `rounds`
{u key: {"sum": the exact statistics of the sites that answered at that u, summed; "sites": [j, ...]}}.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from spatialfed.algorithm.expansion import Expansion
from spatialfed.algorithm.likelihood import (
    _PAIR,
    _TRIPLE,
    THIRD,
    TRIPLES,
    exact_scaling,
    scaled_frame,
    sum_statistics,
)
from spatialfed.model.stats import PAIRS, SUMMED


def u_key(u) -> str:
    """The key of a point u in `rounds`: its exact bytes (answers at one u are summed exactly)."""
    return np.asarray(u, dtype=float).tobytes().hex()


def remember(rounds: dict, stats: Mapping[int, dict], j: int, live: Iterable, keys: Iterable[str] | None = None) -> None:
    """Add site j's latest statistics to the sum of the answers at its u; forget the sums at points that neither
    a site's latest statistics nor the points in `live` (the u of tasks in flight) refer to. `keys`: the u keys of
    the statistics records, when the caller keeps them (else computed here: O(J) key computations per answer)."""
    st = stats[j]
    key = u_key(st["u"])
    entry = rounds.get(key)
    if entry is None:
        rounds[key] = {"sum": sum_statistics([st]), "sites": [j]}
    elif j not in entry["sites"]:
        entry["sum"] = sum_statistics([entry["sum"], st])
        entry["sites"].append(j)
    keep = (set(keys) if keys is not None else {u_key(v["u"]) for v in stats.values()}) | {u_key(u) for u in live}
    for stale in [k for k in rounds if k not in keep]:
        del rounds[stale]


def site_models(stats: Mapping[int, dict], rounds: Mapping[str, dict], used: Sequence[int], scale: float,
                control_variates: bool = True, center=None) -> Expansion:
    """u ↦ scale · Σ_{j ∈ used} T_j(u), T_j the model of site j's statistics at u.

    T_j is the second-order Taylor model around its u_j (taylor_statistics; exact at u_j). With control_variates,
    a stale site j is modelled through the sites F that also answered at u_j and whose models are fresher (a later
    answer, or third order there; all of them used): T_j(u) = ρ Σ_{k∈F} T_k(u) + Taylor[S_j − ρ Σ_{k∈F} S_k](u; u_j),
    ρ = n_j / n_F. Only the difference between site j and the others is extrapolated from u_j; it varies with u far
    less than S_j itself. A site still at u_j with its Taylor model there is not in F: it would add no change to the
    correction while counting in ρ.

    Returned as an `expansion.Expansion` summed around `center` (default: the first model's u_j), which evaluates the
    sum at the cost of about one model."""
    # Σ_j T_j(u) = Σ_k coef_k T_k(u) + Σ_{j stale} Taylor[S_j − ρ_j Σ_{k∈F_j} S_k](u; u_j), and a second-order model
    # is linear in the statistics it expands: the terms around one u_j (one scaling c) are summed, then expanded once
    coef = {k: 1.0 for k in used}
    around = []  # (statistics at a stale u_j, coefficient, the stale site's statistics: its scaling c)
    usable = set(used)
    still: dict[str, tuple[set, dict]] = {}  # u key -> the sites still at that u (second order), their summed stats
    for j in used if control_variates else ():
        st = stats[j]
        key = u_key(st["u"])
        entry = rounds.get(key)
        if entry is None:
            continue
        if key not in still:  # once per u: the sum is shared by every stale site answered there (O(J), not O(J²))
            at_u = [k for k in entry["sites"] if np.array_equal(stats[k]["u"], st["u"])
                    and not any(x in stats[k] for x in THIRD)]
            still[key] = (set(at_u), sum_statistics([stats[k] for k in at_u]) if at_u else None)
        at_u, at_sum = still[key]
        same = at_u - {j}
        fresh = [k for k in entry["sites"] if k != j and k not in same]
        if not fresh or not set(fresh) <= usable:
            continue  # nothing fresher to lean on: the plain Taylor model
        inside = j in entry["sites"]  # S_j − ρ Σ_{k∈F} S_k = (1 + ρ[j∈E]) S_j − ρ E + ρ Σ_{same} S_k, E the sum at u_j
        n_out = (float(st["n"]) if inside else 0.0) + sum(float(stats[k]["n"]) for k in same)
        rho = float(st["n"]) / (float(entry["sum"]["n"]) - n_out)
        coef[j] -= 1.0
        for k in fresh:
            coef[k] += rho
        around += [(st, 1.0 + (rho if inside else 0.0), st), (entry["sum"], -rho, st)]
        if same:  # Σ_{same} S_k: the sum of the sites still at u_j, without j itself
            around.append((_without(at_sum, st) if j in at_u else at_sum, rho, st))
    groups: dict[tuple, list] = {}  # (u_j, c) -> the second-order terms there: [(statistics, coefficient, c, own)]
    terms = []  # what the Expansion sums: third-order models (secant; cubic within their radius), groups
    for st, c, frame in [(stats[k], c, None) for k, c in coef.items()] + around:
        if c == 0.0:
            continue
        if frame is None and any(key in st for key in THIRD):
            terms.append((st, c))
            continue
        scaling = (st if frame is None else frame).get("c")
        key = (u_key(st["u"]), None if scaling is None else np.asarray(scaling, dtype=float).tobytes())
        groups.setdefault(key, []).append((st, c, scaling, frame is None))
    for members in groups.values():
        st, c, scaling, own = members[0]
        if own and len(members) == 1:  # a site's own second-order model, alone at its u_j: expanded as it is
            terms.append((st, c))
            continue
        total = {**_zero(st), **({} if scaling is None else {"c": scaling})}
        for member, weight, _, _ in members:
            for name in SUMMED:
                total[name] += weight * np.asarray(member[name], dtype=float)
        terms.append((total, 1.0))
    return Expansion(terms, terms[0][0]["u"] if center is None else center, scale)


def _without(total: Mapping, st: Mapping) -> dict:
    """The summed entries of `total` less those of `st` (both at one u): a sum of statistics with one site taken out."""
    return {"u": st["u"], **{name: np.asarray(total[name], dtype=float) - np.asarray(st[name], dtype=float)
                             for name in SUMMED}}


def _zero(st: Mapping) -> dict:
    """Statistics like st (its u, m, p; no c, which the caller sets) with every summed entry 0: the start of a
    weighted sum."""
    return {key: (np.zeros_like(np.asarray(value, dtype=float)) if key in SUMMED else value)
            for key, value in st.items() if key not in THIRD and key != "c"}


def _hessian_differences(base: Mapping, nearby: Sequence[Mapping]):
    """(directions v, ∂_v ∂_abG, ∂_v ∂_ab d, steps h) from answers near base's u_j: forward differences of the second
    derivatives in base's frame (scaled_frame: at u_j + hv the frame is e^{−w·hv} times the one at its own u), with
    the scaling direction c first (∂_c ∂_abG = ∂_c ∂_ab d = 0 exactly) when c ≠ 0."""
    u0 = np.asarray(base["u"], dtype=float)
    w = exact_scaling(base)
    _, _, H0 = scaled_frame(base, w)
    h0 = np.asarray(base["d2d"])[_PAIR]
    vs, TS, Td, hs = [], [], [], []
    if np.any(w):
        vs.append(np.asarray(base["c"], dtype=float))
        TS.append(np.zeros_like(H0))
        Td.append(np.zeros((3, 3)))
    for st in nearby:
        delta = np.asarray(st["u"], dtype=float) - u0
        h = float(np.linalg.norm(delta))
        hs.append(h)
        _, _, H = scaled_frame(st, w)
        vs.append(delta / h)
        TS.append((float(np.exp(-w @ delta)) * H - H0) / h)
        Td.append((np.asarray(st["d2d"])[_PAIR] - h0) / h)
    return vs, TS, Td, hs


def _with_third(base: Mapping, d3S: np.ndarray, d3d: np.ndarray, radius: float) -> dict:
    out = dict(base)
    out["d3S"], out["d3d"], out["d3_radius"] = d3S, d3d, radius
    return out


def secant(base: Mapping, earlier: Sequence[Mapping], reach: float = 3.0) -> dict:
    """`base` with third derivatives from the site's own earlier answers, wherever the fit asked them: the symmetric
    tensor (10 distinct triples) that fits the
    differences of _hessian_differences best in least squares, Σ_c ∂_abc v_c = ∂_v ∂_ab for every direction v (c
    included); the minimum-norm one where they do not span u, so the model is third order along the fit's path.
    Used within `reach` × the largest step (on graded n_j = 200 a 3.7× site answering 0.05 and 0.004 from its latest
    u: the surrogate's optimum 3.2e-4 instead of 1.2e-3 in log β from the full one once the slowest site answered)."""
    vs, TS, Td, hs = _hessian_differences(base, earlier)
    A = np.zeros((len(vs) * len(PAIRS), len(TRIPLES)))  # row (v, ab): Σ_c v_c e_{abc}
    for r, (v, (a, b)) in enumerate((v, ab) for v in vs for ab in PAIRS):
        np.add.at(A[r], _TRIPLE[a, b], v)
    k = TS[0].shape[-1]
    dS = np.array([T[a, b].ravel() for T in TS for a, b in PAIRS])
    dd = np.array([D[a, b] for D in Td for a, b in PAIRS])
    U, sv, Vt = np.linalg.svd(A, full_matrices=False)  # the minimum-norm least squares solution, A⁺ applied once
    keep = sv > 1e-10 * sv[0]
    pinv = (Vt[keep].T / sv[keep]) @ U[:, keep].T
    d3S = (pinv @ dS).reshape(len(TRIPLES), k, k)
    d3d = pinv @ dd
    return _with_third(base, d3S, d3d, reach * max(hs))
