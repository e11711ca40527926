"""The estimator: ``FederatedGP`` (spatialfed.api.estimator), with its progress display (spatialfed.api.progress)."""

from spatialfed.api.estimator import METHODS, MODES, PRESETS, PROFILES, RESIDUALS, RUNTIMES, FederatedGP

__all__ = ["FederatedGP", "METHODS", "MODES", "PRESETS", "PROFILES", "RESIDUALS", "RUNTIMES"]
