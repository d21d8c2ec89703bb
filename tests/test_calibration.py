"""The verdicts' error rate and power (analysis/paired.compare), by simulation: per-window paired
differences of two head counts with seed effects, window clusters shared by every seed (text:
windows of one source file move together) and per-window noise, vectorised numpy, seeded.

A/A: no true difference. "lower"/"higher" must come in at most 5 % of the comparisons, at 2, 3
and 5 seeds: with R = 2,000 replicates a true 5 % rate gives an observed one above
0.05 + 3 sqrt(0.05 x 0.95 / 2000) = 0.0646 with probability 0.0013, the bound asserted. The same
data under the old rule (|difference| < 2 SE) and under an SE that ignores the clusters exceed it:
the test tells a calibrated rule from those.

Power: a true difference of 3 standard errors of the mean difference is found ("lower" or
"higher") at 5 seeds in >= 55 % of the comparisons (Student's t with 4 df and noncentrality 3:
0.62; the shared windows' share makes the interval slightly wider), at 3 seeds in >= 30 % (0.39)."""

import math

import numpy as np
import pytest

from mhjax.analysis import paired

R, N, G = 2000, 128, 16
BOUND = 0.05 + 3 * math.sqrt(0.05 * 0.95 / R)
SEED_NOISE = dict(seed_sd=0.02, cluster_sd=0.005, cluster_seed_sd=0.003, window_sd=0.05)  # the seeds dominate
CLUSTER_NOISE = dict(seed_sd=0.002, cluster_sd=0.03, cluster_seed_sd=0.003, window_sd=0.03)  # the files dominate


def draws(rng, S, seed_sd, cluster_sd, cluster_seed_sd, window_sd, shared=True, delta=0.0, clusters=None):
    """(R, S, N) per-window paired differences: delta + seed + cluster (shared by the seeds, or each
    seed's own where the windows are drawn per seed) + cluster x seed + window noise."""
    clusters = np.repeat(np.arange(G), N // G) if clusters is None else clusters
    d = delta + rng.normal(0, seed_sd, (R, S, 1))
    d = d + rng.normal(0, cluster_sd, (R, 1 if shared else S, G))[..., clusters]
    d = d + rng.normal(0, cluster_seed_sd, (R, S, G))[..., clusters]
    return d + rng.normal(0, window_sd, (R, S, N)), clusters


def rates(d, clusters, shared=True):
    """Share of the R comparisons with a verdict of lower/higher, with analysis/paired.compare."""
    ones = np.ones(d.shape[-1])
    found = 0
    for r in range(d.shape[0]):
        c = paired.compare([np.stack([row, ones]) for row in d[r]], shared, clusters)
        found += paired.verdict(c.interval) in ("lower", "higher")
    return found / d.shape[0]


@pytest.mark.parametrize("S", [2, 3, 5])
def test_a_a_comparisons_call_a_difference_in_at_most_5_percent(S):
    uneven = np.sort(np.random.default_rng(S).integers(0, G, N))  # clusters of uneven sizes, as files are
    for i, noise in enumerate((SEED_NOISE, CLUSTER_NOISE)):
        d, clusters = draws(np.random.default_rng((S, i)), S, **noise, clusters=uneven)
        assert rates(d, clusters) <= BOUND, (S, noise)
    rng = np.random.default_rng((S, 2))
    d, _ = draws(rng, S, seed_sd=0.02, cluster_sd=0.0, cluster_seed_sd=0.0, window_sd=0.1, shared=False)
    assert rates(d, None, shared=False) <= BOUND  # generated tasks: windows per seed, independent


def test_the_old_two_se_rule_and_unclustered_windows_call_false_differences():
    rng = np.random.default_rng(7)
    d, clusters = draws(rng, 2, **SEED_NOISE)
    # the old rule: |mean| >= 2 (SE_windows (+) sd / sqrt(S)), a normal cutoff on 1 df of seed spread
    mean = d.mean(axis=(1, 2))
    se = np.hypot(d.mean(axis=1).std(axis=1, ddof=1) / math.sqrt(N), d.mean(axis=2).std(axis=1, ddof=1) / math.sqrt(2))
    assert np.mean(np.abs(mean) >= 2 * se) > 0.15  # the simulation: 21 % at 2 seeds
    assert rates(d, clusters) <= BOUND
    d, clusters = draws(rng, 5, **CLUSTER_NOISE)
    assert rates(d, None) > 2 * BOUND  # every window its own cluster: the files' noise is missed
    assert rates(d, clusters) <= BOUND


@pytest.mark.parametrize("S,power", [(3, 0.30), (5, 0.55)])
def test_a_three_se_difference_is_found_at_the_stated_power(S, power):
    rng = np.random.default_rng(10 + S)
    n = SEED_NOISE  # equal clusters: the mean's variance is exactly the sum below
    var = n["seed_sd"] ** 2 / S + n["cluster_sd"] ** 2 / G + n["cluster_seed_sd"] ** 2 / (G * S)
    se = math.sqrt(var + n["window_sd"] ** 2 / (N * S))
    d, clusters = draws(rng, S, **n, delta=3 * se)
    assert rates(d, clusters) >= power
    own = math.sqrt(0.02**2 / S + 0.1**2 / (N * S))
    d, _ = draws(rng, S, seed_sd=0.02, cluster_sd=0.0, cluster_seed_sd=0.0, window_sd=0.1, shared=False, delta=-3 * own)
    assert rates(d, None, shared=False) >= power
