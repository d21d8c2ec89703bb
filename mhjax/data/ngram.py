"""Unigram, bigram and trigram models of a token sequence (the text task's baselines): counted on
the training split, scored on the held-out windows the members are scored on.

Smoothing: interpolated Witten-Bell, which has no parameter to tune (nothing is fitted on the
held-out part). With n(h, c) the count of token c after context h, n(h) = sum_c n(h, c) and T(h)
the number of distinct tokens seen after h,

    P_k(c | h) = (n(h, c) + T(h) P_{k-1}(c | h')) / (n(h) + T(h))     (h' = h less its first token)

and P_k = P_{k-1} for a context never seen; P_0 = 1 / vocab_size, so every token of the
vocabulary has a probability. The unigram is P_1 (context empty), the bigram P_2, the trigram
P_3. A window's first target has one token of context inside the window: the trigram scores it
with the bigram (no model sees more of the past than the Transformer does).

Counting is sparse: k-grams are coded as int64 (id_1 V^(k-1) + ... + id_k), counted with np.unique
in blocks of BLOCK tokens (a memory-mapped .bin is read a block at a time), merged every few
blocks; sorted codes are looked up with np.searchsorted. Memory: ~16 bytes per distinct k-gram of
the training split (a few times that while merging), besides a few blocks.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

BLOCK = 2**24  # tokens counted at once
MERGE_EVERY = 8  # blocks' counts merged into the running counts
ORDERS = {1: "unigram", 2: "bigram", 3: "trigram"}


class Level(NamedTuple):
    """The counts of one order k: sorted k-gram codes and their counts; sorted context codes,
    their totals n(h) and distinct continuations T(h)."""

    codes: np.ndarray
    counts: np.ndarray
    contexts: np.ndarray
    totals: np.ndarray
    types: np.ndarray


def _codes(ids: np.ndarray, k: int, vocab: int) -> np.ndarray:
    ids = np.asarray(ids, np.int64)
    n = ids.size - k + 1
    code = np.zeros(max(n, 0), np.int64)
    for j in range(k):
        code = code * vocab + ids[j : j + n]
    return code


def count(ids, k: int, vocab: int, block: int = BLOCK) -> Level:
    """The order-``k`` counts of ``ids`` (any array, memory-mapped too), in blocks of ``block``."""
    parts = []
    for start in range(0, max(ids.size - k + 1, 0), block):
        chunk = np.asarray(ids[start : start + block + k - 1])  # k - 1 tokens shared with the next block
        parts.append(np.unique(_codes(chunk, k, vocab), return_counts=True))
        if len(parts) == MERGE_EVERY:  # memory: the merged counts and a few blocks', not every block's
            parts = [_merge(parts)]
    if not parts:
        empty = np.zeros(0, np.int64)
        return Level(empty, empty, empty, empty, empty)
    codes, counts = _merge(parts)
    contexts, first, types = np.unique(codes // vocab, return_index=True, return_counts=True)
    totals = np.add.reduceat(counts, first)
    return Level(codes, counts, contexts, totals, types)


def _merge(parts) -> tuple[np.ndarray, np.ndarray]:
    """Sorted unique codes and their summed counts of several (codes, counts)."""
    codes, inverse = np.unique(np.concatenate([c for c, _ in parts]), return_inverse=True)
    return codes, np.bincount(inverse, weights=np.concatenate([n for _, n in parts])).astype(np.int64)


def _lookup(sorted_codes: np.ndarray, values: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """values[i] where sorted_codes[i] == query, else 0."""
    if sorted_codes.size == 0:
        return np.zeros(queries.shape, values.dtype)
    at = np.minimum(np.searchsorted(sorted_codes, queries), sorted_codes.size - 1)
    return np.where(sorted_codes[at] == queries, values[at], 0)


class NGram:
    """Witten-Bell models up to ``order`` counted on ``ids`` over a vocabulary of ``vocab`` ids."""

    def __init__(self, ids, vocab: int, order: int = 3, block: int = BLOCK):
        self.vocab, self.order = int(vocab), order
        self.levels = [count(ids, k, self.vocab, block) for k in range(1, order + 1)]

    def probabilities(self, context: np.ndarray, targets: np.ndarray, k: int) -> np.ndarray:
        """P_k(target | the last k - 1 tokens of ``context``): ``context`` (M, k - 1) int, ``targets`` (M,)."""
        context, targets = np.asarray(context, np.int64), np.asarray(targets, np.int64)
        p = np.full(targets.shape, 1.0 / self.vocab)
        for j in range(1, k + 1):  # P_1, then P_2 on it, ...
            level = self.levels[j - 1]
            h = np.zeros(targets.shape, np.int64)
            for col in range(context.shape[1] - (j - 1), context.shape[1]):
                h = h * self.vocab + context[:, col]
            seen = _lookup(level.codes, level.counts, h * self.vocab + targets)
            total = _lookup(level.contexts, level.totals, h).astype(np.float64)
            types = _lookup(level.contexts, level.types, h).astype(np.float64)
            p = np.where(total > 0, (seen + types * p) / np.maximum(total + types, 1), p)
        return p

    def window_bits(self, windows: np.ndarray, k: int) -> np.ndarray:
        """-log2 P_k of each target of ``windows`` (N, T + 1): (N, T); target t (token t + 1) in the
        context of tokens t - k + 2 .. t inside the window (fewer at its start)."""
        windows = np.asarray(windows, np.int64)
        n, length = windows.shape[0], windows.shape[1] - 1
        bits = np.empty((n, length))
        for t in range(length):
            use = min(k, t + 2)  # the order the window's own tokens allow
            context = windows[:, t - use + 2 : t + 1] if use > 1 else np.zeros((n, 0), np.int64)
            bits[:, t] = -np.log2(self.probabilities(context, windows[:, t + 1], use))
        return bits


def baselines(train_ids, windows: np.ndarray, vocab: int, block: int = BLOCK) -> dict:
    """{"unigram_bits", "bigram_bits", "trigram_bits"} on ``windows`` (N, T + 1) of held-out ids,
    each with its standard error over the windows (``_se``), and the smoothing, in bits per token."""
    model = NGram(train_ids, vocab, 3, block)
    out = {"smoothing": "interpolated Witten-Bell (mhjax/data/ngram.py), counted on the training split"}
    for k, name in ORDERS.items():
        per_window = model.window_bits(windows, k).mean(axis=1)
        out[f"{name}_bits"] = float(per_window.mean())
        out[f"{name}_bits_se"] = (
            float(per_window.std(ddof=1) / math.sqrt(per_window.size)) if per_window.size > 1 else None
        )
    return out
