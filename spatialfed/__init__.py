"""spatialfed: asynchronous federated fitting of low-rank spatial Gaussian-process models."""

__version__ = "0.1.0"
