"""spatialfed: asynchronous federated fitting of low-rank spatial Gaussian-process models.

    from spatialfed import FederatedGP     # the scikit-learn estimator (spatialfed.api), imported on first use
    from spatialfed import Cluster, Emulation, Checkpoint  # where a Dask fit runs, what it emulates, its checkpoint
    from spatialfed import compare_models  # candidate covariance models side by side (ℓ, AIC, site-blocked CV)
"""

import importlib

from spatialfed.version import __version__

__all__ = ["Checkpoint", "Cluster", "Emulation", "FederatedGP", "NotFittedError", "compare_models", "__version__"]


def __getattr__(name):
    """``spatialfed.FederatedGP`` and ``spatialfed.NotFittedError`` from spatialfed.api, loaded lazily: importing
    spatialfed (or its lower layers) does not import the estimator, scikit-learn or Dask. The package root is the
    facade, the top layer of tests/test_layers.py: no module of the package imports it."""
    if name in ("FederatedGP", "NotFittedError", "Cluster", "Emulation", "Checkpoint", "compare_models"):
        return getattr(importlib.import_module("spatialfed.api"), name)
    raise AttributeError(f"module 'spatialfed' has no attribute {name!r}")
