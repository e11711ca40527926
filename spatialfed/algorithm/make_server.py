"""The server of a fit, chosen by its settings: FederatedServer (the block scheme of Algorithms 1–3) or StatsServer
(one round trip of sufficient statistics per iteration, SPEC §2b)."""

from __future__ import annotations

from collections.abc import Mapping

from spatialfed.algorithm.config import FitConfig, StatsPolicy
from spatialfed.algorithm.server import FederatedServer
from spatialfed.algorithm.stats_server import StatsServer


def server_for(n_workers: int, knots, kernel, config: FitConfig | None = None, start: Mapping | None = None):
    """A new server for `config` (FitConfig() when None: the block scheme, synchronous)."""
    config = config or FitConfig()
    cls = StatsServer if isinstance(config.scheme, StatsPolicy) else FederatedServer
    if config.secure_aggregation:  # FitConfig holds it for the statistics scheme only
        from spatialfed.algorithm.secure_server import SecureStatsServer as cls
    return cls(n_workers, knots, kernel, config, start)


def restore_server(snapshot: Mapping):
    """The server continuing `snapshot` (a FederatedServer or StatsServer snapshot; FgprServer's has kind "fgpr")."""
    if snapshot.get("kind") == "fgpr":
        from spatialfed.algorithm.fgpr import FgprServer

        return FgprServer.restore(snapshot)
    if "_fit_id" in snapshot.get("stats_server", {}):  # secure aggregation's state (algorithm/secure_server.py)
        from spatialfed.algorithm.secure_server import SecureStatsServer

        return SecureStatsServer.restore(snapshot)
    return (StatsServer if "stats_server" in snapshot else FederatedServer).restore(snapshot)
