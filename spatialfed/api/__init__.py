"""The estimator: ``FederatedGP`` (spatialfed.api.estimator), a scikit-learn regressor, with its input conversion
(inputs), prediction (predicting), parameters in variogram units (units), script safety (scripts) and progress.

The names below load on first use, so importing a light submodule (``spatialfed.api.scripts``) does not import
scikit-learn and Dask."""

import importlib

_EXPORTS = {"FederatedGP": "estimator", "METHODS": "estimator", "MODES": "estimator", "PRESETS": "estimator",
            "PROFILES": "estimator", "RESIDUALS": "estimator", "RESIDUAL_CHOICES": "estimator",
            "RUNTIMES": "estimator",
            "NotFittedError": "predicting", "Cluster": "options", "Emulation": "options",
            "Checkpoint": "options", "compare_models": "compare"}
__all__ = list(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"spatialfed.api.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'spatialfed.api' has no attribute {name!r}")
