"""Spearman rank correlation in numpy (scipy is only a test dependency)."""

from __future__ import annotations

import numpy as np


def spearman(x, y) -> float | None:
    """Spearman rank correlation of two 1-d samples (average ranks for ties, as
    scipy.stats.spearmanr); None when either is constant or has fewer than two values."""
    x, y = np.asarray(x, np.float64).ravel(), np.asarray(y, np.float64).ravel()
    if x.size < 2 or x.size != y.size or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    return float(np.corrcoef(ranks(x), ranks(y))[0, 1])


def ranks(x) -> np.ndarray:
    """Ranks 0..n-1 of a 1-d sample; tied values share their average rank."""
    x = np.asarray(x, np.float64)
    order = np.argsort(x, kind="stable")
    plain = np.empty(x.size)
    plain[order] = np.arange(x.size, dtype=np.float64)
    _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    return (np.bincount(inverse, weights=plain) / counts)[inverse]
