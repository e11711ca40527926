"""Federated site-blocked cross-validation of a statistics fit (``FederatedGP.site_blocked_cv_``; docs/equations.md,
the map's "site-blocked CV" row): each site's points scored under the model conditioned on the other sites' data
only, at the fitted û (no refit), beside ℓ.

The server holds every site's statistics (``StatsServer.records.stats``), moved to û by their models
(``likelihood.taylor_statistics``: exact at the u they were taken, O(|û − u_j|³) otherwise; the models the final
estimate rests on). Without site j, by profile_loglik's algebra on the partial sum:

    F₋ⱼ = Σ_{i≠j} S_i(û) + blockdiag(K⁻¹, 0, 0),  (μ₋ⱼ, γ₋ⱼ) = F₋ⱼ[:−1, :−1]⁻¹F₋ⱼ[:−1, z],  Σ₋ⱼ = F₋ⱼ[:m, :m]⁻¹,

sent to site j alone, which returns four sums (model/blocked.py); over all N points

    RMSE = √(Σ_j SSE_j / N),  CRPS = Σ_j CRPS_j / N,  MLPD = Σ_j log p_j / N  (mean log predictive density).

Only fits whose server may see single sites' statistics have it: the statistics scheme of method "lowrank" without
privacy noise or secure aggregation (``for_fit`` records None for the others).
"""

from __future__ import annotations

import dataclasses
import logging
import uuid

import numpy as np

from spatialfed.algorithm.likelihood import NotPositiveDefinite, distance, knot_posterior, knot_terms, \
    taylor_statistics
from spatialfed.algorithm.secure_server import SecureStatsServer
from spatialfed.algorithm.stats_server import StatsServer
from spatialfed.api import progress
from spatialfed.errors import WorkerTaskError

log = logging.getLogger("spatialfed.api")


def applies(gp, server) -> bool:
    """Whether the fit's server may score sites one by one: a StatsServer of method "lowrank" (knots), not secure
    aggregation (it never sees one site's statistics) and no privacy noise (the sites' answers would leak beyond
    the accounted mechanism)."""
    return (isinstance(server, StatsServer) and not isinstance(server, SecureStatsServer)
            and gp.method == "lowrank" and gp.privacy is None and len(server.knots) > 0)


def for_fit(gp, server, runtime, specs) -> dict | None:
    """``site_blocked_cv_`` of a finished fit: site_blocked_scores on the fit's runtime, or None when it does not
    apply (``applies``) or cannot be computed (fewer than 2 sites, a site failing; logged)."""
    if not applies(gp, server):
        return None
    if sum(j in server.records.stats for j in server.active) < 2:
        log.warning("no site-blocked CV score for this fit: it needs at least 2 sites")
        return None
    try:
        return site_blocked_scores(server, runtime, specs)
    except (NotPositiveDefinite, np.linalg.LinAlgError, WorkerTaskError) as exc:
        log.warning("no site-blocked CV score for this fit: %s", exc)
        return None


def conditionals(server) -> tuple[np.ndarray, dict[int, tuple]]:
    """(û, {j: (μ₋ⱼ, Σ₋ⱼ, γ₋ⱼ, û)}) for each active site j (module docstring)."""
    u = np.asarray(server.params.u, dtype=float)
    sites = sorted(j for j in server.active if j in server.records.stats)
    S = {j: np.asarray(taylor_statistics(server.records.stats[j], u)["S"], dtype=float) for j in sites}
    m = len(server.knots)
    Kinv = knot_terms(server.knots, server.kernel, u).Kinv
    out = {}
    for j in sites:
        F = sum(S[i] for i in sites if i != j)
        F[:m, :m] += Kinv
        x, Sigma, _, _ = knot_posterior(F, m)
        out[j] = (x[:m], Sigma, x[m:], u)
    return u, out


def site_blocked_scores(server, runtime, specs=None) -> dict:
    """{"rmse", "crps", "mlpd", "n", "moved", "per_site": [{"site", "n", "rmse", "crps"}]} of a finished StatsServer
    fit, the sites scoring on `runtime` ("moved": the largest |û − u_j| the statistics were moved by). With
    `specs` (the fit's SiteSpecs: the runtime has stopped) the sites are loaded again and released after."""
    u, calls = conditionals(server)
    moved = max(distance(server.records.stats[j]["u"], u) for j in calls)
    if specs is None:
        sums = runtime.call("blocked_scores", calls)
    else:
        run_id = f"blocked-{uuid.uuid4().hex[:12]}"
        progress.phase(f"site-blocked CV: {len(calls)} sites")
        try:
            for event in runtime.start([dataclasses.replace(s, run_id=run_id) for s in specs],
                                       skip=[j for j in range(len(specs)) if j not in calls]):
                if event.error is not None:
                    raise WorkerTaskError(event.error)
            sums = runtime.call("blocked_scores", calls)
        finally:
            runtime.stop()
    return summarised({j: sums[j] for j in sorted(sums)}, moved)


def summarised(sums: dict[int, dict], moved: float = 0.0) -> dict:
    """The server's totals of the sites' sums (module docstring)."""
    n = sum(int(s["n"]) for s in sums.values())
    per_site = [{"site": int(j), "n": int(s["n"]), "rmse": float(np.sqrt(s["sse"] / s["n"])),
                 "crps": float(s["crps"] / s["n"])} for j, s in sums.items()]
    return {"rmse": float(np.sqrt(sum(s["sse"] for s in sums.values()) / n)),
            "crps": float(sum(s["crps"] for s in sums.values()) / n),
            "mlpd": float(sum(s["log_density"] for s in sums.values()) / n), "n": int(n), "moved": float(moved),
            "per_site": per_site}

