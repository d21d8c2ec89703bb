"""The text task's held-out region split into a validation part and a test part.

The region is cut into blocks of ``block_length`` tokens; even blocks (0, 2, 4, ...) are the
validation part, odd blocks the test part, and a window lies inside one block, so no token is
in both sets. Interleaved blocks rather than two halves: the held-out region runs through files
in order (builtin:stdlib: sorted by path), and two halves would put other files in each set,
so a choice made on the validation set would be scored on a different mix of sources; with
interleaved blocks both sets sample every part of the region alike. A block holds
``BLOCK_WINDOWS`` windows' lengths (fewer where the region is short: at least two blocks), so
a window has room to start at many offsets within it. A tail shorter than a block is unused.

Without a file list (a plain corpus file), the blocks are also the clusters of the windows'
standard errors (analysis/paired.py): windows of one block share a stretch of text.
"""

from __future__ import annotations

import jax
import numpy as np

VALIDATION, TEST = 0, 1  # a block's part: its index modulo 2
PARTS = {"validation": VALIDATION, "test": TEST}
BLOCK_WINDOWS = 16  # windows' lengths (T + 1 tokens) per block


def block_length(size: int, length: int) -> int:
    """Tokens per block of a held-out region of ``size`` tokens, for windows of ``length + 1``:
    BLOCK_WINDOWS windows' lengths, or size // 2 where that is shorter (two blocks at least),
    never below one window (data/text.check refuses a region shorter than two windows)."""
    return max(length + 1, min(BLOCK_WINDOWS * (length + 1), size // 2))


def part_blocks(size: int, length: int, part: int) -> int:
    """How many whole blocks of ``part`` the region holds."""
    full = size // block_length(size, length)
    return (full - part + 1) // 2


def part_starts(key, num: int, size: int, length: int, part: int):
    """``num`` window offsets (int32) in the region of ``size`` tokens, uniform over the whole
    blocks of ``part`` and, within a block, over every offset whose window stays inside it."""
    block = block_length(size, length)
    k_block, k_offset = jax.random.split(key)
    index = 2 * jax.random.randint(k_block, (num,), 0, part_blocks(size, length, part)) + part
    return index * block + jax.random.randint(k_offset, (num,), 0, block - length)


def block_of(starts, size: int, length: int):
    """The block each window starting at ``starts`` lies in (numpy or jax)."""
    return starts // block_length(size, length)


def window_clusters(starts, size: int, length: int, file_starts=None, offset: int = 0):
    """Per window (numpy int64), the cluster its standard error groups it in: the source file its
    first token is in where the corpus knows its files (``file_starts``: ascending offsets of the
    files in the whole corpus, whose held-out region begins at ``offset``), else its block."""
    starts = np.asarray(starts, np.int64)
    if file_starts is None:
        return block_of(starts, size, length)
    return np.searchsorted(np.asarray(file_starts, np.int64), starts + offset, side="right") - 1
