"""Held-out losses with standard errors, and head counts compared on the same held-out windows.

A member's held-out set is N windows (sequences); window n contributes ``S_n``, the weighted sum
of its token losses, and ``W_n``, the sum of its weights (``window_sums``). The held-out loss is
the ratio L = sum S / sum W (the mean over every weighted token: ``eval_loss``), and its standard
error the ratio estimator's over G clusters of windows, sqrt(G / (G - 1) * sum_g (S_g - L W_g)^2)
/ sum W, with S_g, W_g the sums of cluster g's windows (Cameron & Miller 2015, "A Practitioner's
Guide to Cluster-Robust Inference", eq. 11 with the G / (G - 1) factor). Text windows cluster by
source file or block (data/heldout_split.py): windows of one file share its style and overlap;
generated windows are independent draws, each its own cluster (for equal weights: the standard
deviation of the per-window losses over sqrt(N)).

Two members scored on the same windows (the same ``eval_set``) pair window by window: their
difference is the ratio of sum (S_n - S'_n) over sum W, with the same standard error on the
differences. Over S seeds (``compare``), the per-seed paired differences d_s give the estimate
mean(d_s) and an interval from Student's t with S - 1 degrees of freedom:

- windows drawn per seed (generated tasks): d_s are independent, each holding its seed's and its
  windows' noise, so the t interval on them, mean +- t(S-1) sd(d_s) / sqrt(S), is the exact
  interval for normal d_s (the paired t test: Dietterich 1998, "Approximate Statistical Tests for
  Comparing Supervised Classification Learning Algorithms"; Dror et al. 2018, "The Hitchhiker's
  Guide to Testing Statistical Significance in NLP").
- windows shared by every seed (text): the windows' draw is common to all d_s, so their spread
  misses it; its variance is added, the clustered SE of the seed-averaged per-window differences,
  se^2 = sd(d_s)^2 / S + se_windows^2, and the t quantile keeps S - 1 degrees of freedom (below
  Satterthwaite's 1946 df for that sum, so at least as wide: the windows' share is known to G - 1
  df, many more). The interval is never narrower than the t interval on the d_s alone.

A verdict is "lower" / "higher" where the 95 % interval excludes 0, else "within noise"; one seed
gives no interval (the seeds' noise is unknown) and the verdict "one seed". tests/test_paired.py's
A/A and power checks measure the error rate and power by simulation.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import numpy as np

LEVEL = 0.95  # two-sided coverage of every interval
RECOMMENDED_SEEDS = 5  # t(4) = 2.78: at 2 seeds t(1) = 12.7 and 3 seeds t(2) = 4.30 make most verdicts "within noise"


def window_sums(loss, weights) -> np.ndarray:
    """(2, N) float64: per window, the weighted sum of its token losses and the sum of its weights
    (``loss`` and ``weights``: (N, T))."""
    loss, weights = np.asarray(loss, np.float64), np.asarray(weights, np.float64)
    return np.stack([(loss * weights).sum(axis=1), weights.sum(axis=1)])


def cluster_sums(sums, clusters=None) -> np.ndarray:
    """(2, G): ``sums`` (2, N) added within each cluster (``clusters``: (N,) ids; None: each window its own)."""
    sums = np.asarray(sums, np.float64)
    if clusters is None:
        return sums
    _, index = np.unique(np.asarray(clusters), return_inverse=True)
    return np.stack([np.bincount(index, weights=row) for row in sums])


def mean_se(sums, clusters=None) -> tuple[float, float]:
    """(held-out loss, its standard error) of a member's ``window_sums``, clustered by ``clusters``
    (module docstring); the SE is nan with fewer than two clusters."""
    s, w = cluster_sums(sums, clusters)
    n, total = s.size, w.sum()
    mean = float(s.sum() / total)
    if n < 2:
        return mean, float("nan")
    return mean, float(math.sqrt(n / (n - 1) * float(((s - mean * w) ** 2).sum())) / total)


def t_cdf_two_sided(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3-4: a finite sum)."""
    theta = math.atan(abs(t) / math.sqrt(df))
    c, total, term = math.cos(theta), 0.0, 1.0
    if df % 2:  # odd: (2 / pi) (theta + sin cos (1 + 2/3 cos^2 + ...))
        for k in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c * c * (2 * k) / (2 * k + 1)
        return 2 / math.pi * (theta + math.sin(theta) * c * total) if df > 1 else 2 * theta / math.pi
    for k in range(1, df // 2 + 1):  # even: sin (1 + 1/2 cos^2 + 1.3/2.4 cos^4 + ...)
        total += term
        term *= c * c * (2 * k - 1) / (2 * k)
    return math.sin(theta) * total


@functools.lru_cache(maxsize=None)
def t_quantile(df: int, level: float = LEVEL) -> float:
    """The t with P(|T| < t) = ``level`` at ``df`` degrees of freedom (bisection; ~1e-12)."""
    low, high = 0.0, 1.0
    while t_cdf_two_sided(high, df) < level:
        high *= 2
    for _ in range(100):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf_two_sided(mid, df) < level else (low, mid)
    return (low + high) / 2


class Comparison(NamedTuple):
    mean: float  # mean over seeds of the per-seed paired differences
    interval: tuple[float, float]  # 95 %: (nan, nan) for one seed
    se: float  # the standard error the interval is built on
    per_seed: tuple[float, ...]  # d_s, in the order given
    se_windows: float  # the windows' share (shared windows), else 0
    clusters: int  # clusters of windows the windows' share is over (0: not used)


def compare(per_seed: list, shared: bool, clusters=None) -> Comparison:
    """The paired difference over seeds of ``per_seed`` window sums ((2, N) each: a pair's
    differences with the shared weights) and its 95 % interval (module docstring); ``shared``:
    every seed scored the same windows, ``clusters`` their cluster ids."""
    per_seed = [np.asarray(p, np.float64) for p in per_seed]
    d = np.array([p[0].sum() / p[1].sum() for p in per_seed])
    se_windows, groups = 0.0, 0
    if shared:
        pooled = cluster_sums(np.mean(per_seed, axis=0), clusters)
        se_windows, groups = mean_se(pooled)[1], pooled.shape[1]
    if d.size < 2:
        return Comparison(float(d.mean()), (math.nan, math.nan), math.nan, tuple(d.tolist()), se_windows, groups)
    se = math.sqrt(d.var(ddof=1) / d.size + se_windows**2)
    half = t_quantile(d.size - 1) * se
    mean = float(d.mean())
    return Comparison(mean, (mean - half, mean + half), se, tuple(d.tolist()), se_windows, groups)


def verdict(interval) -> str:
    """ "lower" / "higher" where the interval excludes 0, else "within noise"; "one seed" without one."""
    low, high = interval
    if not (math.isfinite(low) and math.isfinite(high)):
        return "one seed"
    if high < 0:
        return "lower"
    return "higher" if low > 0 else "within noise"


class Combined(NamedTuple):
    mean: float
    se: float
    sd_seeds: float  # the spread of the per-seed values (nan for one seed)
    seeds: int


def combine(per_seed: list, shared: bool, clusters=None) -> Combined:
    """The mean over seeds of members' ``per_seed`` window sums ((2, N) each) and its standard error:
    from the seeds' spread, plus the windows' share (clustered) where every seed scored the same windows."""
    per_seed = [np.asarray(p, np.float64) for p in per_seed]
    means = np.array([p[0].sum() / p[1].sum() for p in per_seed])
    if means.size < 2:
        return Combined(float(means[0]), mean_se(per_seed[0], clusters)[1], math.nan, 1)
    sd = float(means.std(ddof=1))
    windows = mean_se(np.mean(per_seed, axis=0), clusters)[1] if shared else 0.0
    return Combined(float(means.mean()), math.sqrt(sd**2 / means.size + windows**2), sd, int(means.size))
