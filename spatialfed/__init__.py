"""spatialfed: asynchronous federated fitting of low-rank spatial Gaussian-process models.

    from spatialfed import FederatedGP     # the scikit-learn estimator (spatialfed.api), imported on first use
"""

import importlib

__version__ = "0.1.0"
__all__ = ["FederatedGP", "NotFittedError", "__version__"]


def __getattr__(name):
    """``spatialfed.FederatedGP`` and ``spatialfed.NotFittedError`` from spatialfed.api, loaded lazily: importing
    spatialfed (or its lower layers) does not import the estimator, scikit-learn or Dask."""
    if name in ("FederatedGP", "NotFittedError"):
        return getattr(importlib.import_module("spatialfed.api"), name)
    raise AttributeError(f"module 'spatialfed' has no attribute {name!r}")
