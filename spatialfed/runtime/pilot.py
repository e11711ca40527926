"""Clip bounds for the Gaussian mechanism from a noise-free pilot fit (docs/privacy.md)."""

from __future__ import annotations

import math

import numpy as np

from spatialfed.algorithm.config import FitConfig
from spatialfed.algorithm.privacy import EXEMPT_KEYS
from spatialfed.runtime.virtual import run_virtual


def pilot_clip(models, knots, kernel, *, margin: float = 4.0, max_iter: int = 10) -> dict[str, float]:
    """Per-observation clip bounds c_k = margin · max ‖ξ_k‖/n_j over a noise-free synchronous pilot fit on `models`
    (LocalModels of PUBLIC or simulated data resembling the private data: bounds from the private data break the
    guarantee, docs/privacy.md)."""
    if not (math.isfinite(margin) and margin >= 1):
        raise ValueError(f"margin must be a number ≥ 1 (the bound is margin × the largest pilot norm), got {margin!r}")
    norms: dict[str, float] = {}

    def record(j, p, q):
        if p is None:  # the partition-load summary
            return
        for key, value in q.xi.items():
            if key not in EXEMPT_KEYS:
                norms[key] = max(norms.get(key, 0.0), float(np.linalg.norm(value)) / models[j].n)

    run_virtual(models, knots, kernel, FitConfig.of(mode="sync", max_iter=max_iter), on_result=record)
    return {key: margin * max(value, np.finfo(float).tiny) for key, value in sorted(norms.items())}
