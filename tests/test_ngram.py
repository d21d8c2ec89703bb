"""The text task's n-gram baselines (mhjax/data/ngram.py) against a direct computation: counts
in dictionaries and Witten-Bell written out as its recursion, on a tiny corpus."""

import math
from collections import Counter

import numpy as np
import pytest

from mhjax.data import ngram


def witten_bell(train, vocab, k, context, target):
    """P_k(target | context) from counts made here, the recursion written out."""
    if k == 0:
        return 1.0 / vocab
    h = tuple(context[len(context) - (k - 1) :]) if k > 1 else ()
    grams = Counter(tuple(train[i : i + k]) for i in range(len(train) - k + 1))
    after = {g[-1]: n for g, n in grams.items() if g[:-1] == h}
    lower = witten_bell(train, vocab, k - 1, context, target)
    total, types = sum(after.values()), len(after)
    if total == 0:
        return lower
    return (after.get(target, 0) + types * lower) / (total + types)


def test_unigram_bigram_trigram_bits_equal_a_direct_computation():
    rng = np.random.default_rng(0)
    vocab = 7
    train = list(rng.integers(0, 5, 80))  # ids 5 and 6 never seen: the uniform floor carries them
    windows = np.array([[0, 1, 2, 3, 6], [4, 4, 4, 0, 5], [2, 2, 1, 0, 3]])
    got = ngram.baselines(np.array(train, np.uint8), windows, vocab, block=9)  # blocks of 9: merged counts
    for k, name in ngram.ORDERS.items():
        want = []
        for w in windows.tolist():
            bits = []
            for t in range(len(w) - 1):
                order = min(k, t + 2)  # the window's own context only
                bits.append(-math.log2(witten_bell(train, vocab, order, w[: t + 1], w[t + 1])))
            want.append(np.mean(bits))
        assert got[f"{name}_bits"] == pytest.approx(np.mean(want), rel=1e-12)
        assert got[f"{name}_bits_se"] == pytest.approx(np.std(want, ddof=1) / math.sqrt(3), rel=1e-9)


def test_block_counts_equal_one_pass_and_probabilities_sum_to_one():
    ids = np.random.default_rng(1).integers(0, 300, 5000).astype("<u2")  # a .bin's large ids
    whole, blocked = ngram.NGram(ids, 300), ngram.NGram(ids, 300, block=277)  # 19 blocks: merged twice on the way
    for a, b in zip(whole.levels, blocked.levels):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    context = np.array([[ids[10], ids[11]]] * 300)
    for k in (1, 2, 3):
        assert whole.probabilities(context, np.arange(300), k).sum() == pytest.approx(1.0)
