"""Held-out losses with standard errors, and head counts compared on the same held-out windows.

A member's held-out set is N windows (sequences); window n contributes ``S_n``, the weighted sum
of its token losses, and ``W_n``, the sum of its weights (``window_sums``). The held-out loss is
the ratio L = sum S / sum W (the mean over every weighted token: ``eval_loss``), and its standard
error the ratio estimator's, sqrt(N / (N - 1) * sum (S_n - L W_n)^2) / sum W: for equal weights
the standard deviation of the per-window losses over sqrt(N).

Two members scored on the same windows (the same ``eval_set``) pair window by window: their
difference is the ratio of sum (S_n - S'_n) over sum W, with the same standard error on the
differences. Over seeds (``combine``): the mean of the per-seed values, with
SE^2 = SE_windows^2 + SE_seeds^2, where SE_windows is the windows' share (from the differences
averaged over seeds where every seed has the same windows, else from the per-seed errors as
independent) and SE_seeds the spread of the per-seed values, sd / sqrt(S) (0 for one seed). The
sum is conservative: the seeds' spread holds part of the windows' noise again.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

NOISE_SE = 2.0  # a difference below this many standard errors is "within noise"


def window_sums(loss, weights) -> np.ndarray:
    """(2, N) float64: per window, the weighted sum of its token losses and the sum of its weights
    (``loss`` and ``weights``: (N, T))."""
    loss, weights = np.asarray(loss, np.float64), np.asarray(weights, np.float64)
    return np.stack([(loss * weights).sum(axis=1), weights.sum(axis=1)])


def mean_se(sums) -> tuple[float, float]:
    """(held-out loss, its standard error) of a member's ``window_sums`` (module docstring)."""
    s, w = np.asarray(sums, np.float64)
    n, total = s.size, w.sum()
    mean = float(s.sum() / total)
    if n < 2:
        return mean, float("nan")
    return mean, float(math.sqrt(n / (n - 1) * float(((s - mean * w) ** 2).sum())) / total)


class Combined(NamedTuple):
    mean: float
    se: float
    se_windows: float
    se_seeds: float
    seeds: int


def combine(per_seed: list, shared: bool) -> Combined:
    """The mean over seeds of ``per_seed`` window sums ((2, N) each: a member's, or a pair's
    differences with the shared weights) and its standard error (module docstring); ``shared``:
    every seed scored the same windows."""
    per_seed = [np.asarray(p, np.float64) for p in per_seed]
    values = [mean_se(p) for p in per_seed]
    means = np.array([v[0] for v in values])
    if shared:
        se_windows = mean_se(np.mean(per_seed, axis=0))[1]
    else:
        se_windows = math.sqrt(sum(v[1] ** 2 for v in values)) / len(values)
    se_seeds = float(means.std(ddof=1) / math.sqrt(len(means))) if len(means) > 1 else 0.0
    return Combined(float(means.mean()), math.hypot(se_windows, se_seeds), se_windows, se_seeds, len(means))


def verdict(diff: float, se: float) -> str:
    """ "within noise" where |diff| < NOISE_SE standard errors, else "lower" or "higher"."""
    if not (math.isfinite(diff) and math.isfinite(se)):
        return "-"
    if abs(diff) < NOISE_SE * se:
        return "within noise"
    return "lower" if diff < 0 else "higher"
