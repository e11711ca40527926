"""The estimator's settings turned into what a fit runs with: their validation, the resolved FitConfig (or
FgprConfig), the slowdowns, the delay models and the TLS security of a ``FederatedGP`` (api/estimator.py).

Everything here reads the estimator's constructor arguments only (scikit-learn style: ``__init__`` stores, ``fit``
validates); nothing is learned.
"""

from __future__ import annotations


import numpy as np

from spatialfed.algorithm.config import MODES, FitConfig
from spatialfed.api import covariance
from spatialfed.api.options import checkpoint_of, cluster_of, emulation_of, residual_k, scheme_of
from spatialfed.model import transform
from spatialfed.model.residuals import keeps_local_covariance, resolve_sites
from spatialfed.model.names import RESIDUAL_CHOICES
from spatialfed.model.vecchia_order import VECCHIA_K
from spatialfed.runtime.factory import runtime_name
from spatialfed.runtime.heterogeneity import PROFILES, profile_slowdowns, resolve_slowdowns

METHODS = ("lowrank", "independent", "fgpr")
#: ``privacy=`` asking for secure aggregation (algorithm/secagg.py) instead of a Gaussian mechanism
SECURE = "secure_aggregation"


def check_settings(gp) -> None:
    """Refuse settings that cannot work together (one line naming the parameter and the fix)."""
    for name, value, allowed in (("method", gp.method, METHODS), ("mode", gp.mode, MODES),
                                 ("residual", residual_k(gp.residual)[0], RESIDUAL_CHOICES)):
        if value not in allowed:
            extra = " (or 'vecchia:K', 'auto:K': K neighbours per point)" if name == "residual" else ""
            raise ValueError(f"{name} must be one of {allowed}{extra}, got {getattr(gp, name)!r}")
    c, e = cluster_of(gp.cluster), emulation_of(gp.emulation)
    runtime = runtime_name(c.runtime)
    if gp.progress not in (True, False, "live"):
        raise ValueError(f"progress must be True, False or 'live' (a live Bokeh page during a Dask fit), "
                         f"got {gp.progress!r}")
    if gp.privacy == SECURE and gp.method != "lowrank":
        raise ValueError(f"privacy={SECURE!r} sums the low-rank statistics scheme's messages; method={gp.method!r} "
                         "has none")
    transform.check_transform(gp.transform)
    if gp.method in ("independent", "fgpr") and not keeps_local_covariance(residual_name(gp)):
        raise ValueError(f"method={gp.method!r} (Eq. 3) uses each worker's full local covariance; "
                         f"residual={gp.residual!r} applies to method='lowrank' only")
    if gp.method == "fgpr":
        preset, extra = scheme_of(gp.strategies)
        for name, value in (("strategies={'agg_threshold': ...}", extra.get("agg_threshold")),
                            ("a preset", preset)):
            if not _same(value, None):
                raise ValueError(f"{name} does not apply to method='fgpr' (synchronous FedAvg rounds); give "
                                 "FGPR's settings as strategies={...}, e.g. strategies={'participation': 2} for "
                                 "K_c = 2 clients per round")
        if gp.privacy is not None:
            raise ValueError("privacy= applies to method='lowrank' and 'independent' (FGPR sends parameters, "
                             "not the summaries the mechanism is calibrated for); drop privacy= or change method")
    if e.slowdown is None:
        if e.profile not in PROFILES and not str(e.profile).startswith("graded:"):
            raise ValueError(f"profile must be one of {PROFILES} or graded:<min cores>, got {e.profile!r}")
        profile_slowdowns(e.profile, 1)  # graded:<min cores>: a bad number raises with the fix
    covariance.check(gp)
    covariance.check_distance(gp)
    if c.tls is not None and c.tls is not False:  # (Cluster refuses tls and an address in this process)
        if c.client is not None:
            raise ValueError("tls=... cannot be applied to an existing client; create it with "
                             "Client(cluster, security=spatialfed.runtime.security.tls_security(...)) instead")
    if runtime != "simulated" and c.client is None:  # before the progress display starts: one line, nothing else
        from spatialfed.runtime.cluster import check_transport

        check_transport(c.address, c.jobqueue, c.tls not in (None, False), bool(c.insecure))
    checkpoint_of(gp.checkpoint)  # a path, a Checkpoint or a dict of its settings


def store_transform(gp, info) -> str:
    """The transform of a fit on the store `info`: the one its values were written with (model.transform.of_store);
    a ``transform=`` the store's values do not carry is refused in one line naming the fix."""
    have = transform.of_store(info)
    if gp.transform is not None and transform.check_transform(gp.transform) != have:
        holds = "log values (ingested with --transform log)" if have == "log" else "untransformed values"
        raise ValueError(f"transform={gp.transform!r}, but the store {info.path} holds {holds}; drop transform= "
                         "(a store carries its own), or ingest the table again with `spatialfed ingest --transform "
                         "log` (ingest_frame(..., transform='log'))")
    return have


def vecchia_k(gp) -> int:
    """k of the Vecchia residual: K of residual="vecchia:K" or "auto:K", else VECCHIA_K."""
    k = residual_k(gp.residual)[1]
    return VECCHIA_K if k is None else k


def residual_name(gp) -> str:
    """The structure asked for by ``residual`` without its K ("vecchia", "auto", "full", ...)."""
    return residual_k(gp.residual)[0]


def site_residual(gp, config, sizes) -> str:
    """The residual the sites use (fit.json "residual"): `full` for the independence model and FGPR, and for
    "auto" with the block scheme (its theta step has no Vecchia form); "auto" becomes the structure every site
    resolves to, or stays "auto" when the sizes straddle VECCHIA_AUTO_N (each site then resolves its own)."""
    if gp.method != "lowrank":
        return "full"
    return resolve_sites(residual_name(gp), sizes, getattr(config, "scheme_name", "stats") == "block")


def config(gp, n_workers: int):
    """The resolved FitConfig (or FgprConfig) for J workers: every option is validated by the config itself."""
    J = n_workers
    if gp.method == "fgpr":
        from spatialfed.algorithm.fgpr import FgprConfig

        extra = scheme_of(gp.strategies)[1]
        fixed = sorted(set(extra) & {"max_iter", "tol", "time_budget", "seed"})
        if fixed:
            raise ValueError(f"give {fixed} as FederatedGP(...) arguments, not inside strategies={{...}}")
        return FgprConfig(max_iter=gp.max_iter, tol=gp.tol, time_budget=gp.time_budget, seed=gp.seed,
                          **extra).resolved(J)
    preset, extra = scheme_of(gp.strategies)
    if noise(gp) is not None:
        extra["privacy"] = gp.privacy
    if gp.privacy == SECURE:
        extra["secure_aggregation"] = True
    return FitConfig.preset(preset, gp.mode, max_iter=gp.max_iter,
                            tol=gp.tol, time_budget=gp.time_budget, n_workers=J, **extra)


def slowdowns(gp, n_workers: int) -> np.ndarray:
    """The per-site slowdown factors s_1..s_J of `profile` or `slowdown`."""
    e = emulation_of(gp.emulation)
    return resolve_slowdowns(e.profile if e.slowdown is None else list(e.slowdown), n_workers)


def delay_models(gp, n_workers: int) -> dict:
    """The driver's delay keywords: delay models from objects or command-line strings (docs/delays.md)."""
    from spatialfed.runtime.delays import parse_activations, parse_delay

    e = emulation_of(gp.emulation)
    delays = parse_delay(e.delays, n_workers) if isinstance(e.delays, str) else e.delays
    activations = parse_activations(e.activations, n_workers) if isinstance(e.activations, str) else e.activations
    return {"delays": delays, "activations": activations, "seed": gp.seed}


def security(gp):
    """The Security object for `tls` (None: plain TCP)."""
    tls = cluster_of(gp.cluster).tls
    if tls is False:
        return False  # plain TCP, asked for explicitly (the embedded cluster's default is TLS)
    if tls is None:
        return None
    from spatialfed.runtime.security import tls_security

    return tls_security() if tls is True else tls_security(tls)


def noise(gp):
    """The Gaussian mechanism asked for by ``privacy`` (None without noise, or with secure aggregation)."""
    return None if gp.privacy is None or gp.privacy == SECURE else gp.privacy


def _same(a, b) -> bool:
    try:
        return bool(a is b or a == b)
    except Exception:
        return False
