"""``jax.random.fold_in`` of the default (threefry2x32) key, on the host in Python integers.

train/members.derive_key folds a member's seed and name into the root key. Done by JAX, each
fold is an eager dispatch (~0.3 ms); the dry run of a sweep of 512 members derives 1,536 keys,
about a second before any compile. The same bits come from Threefry-2x32 (20 rounds; Salmon et
al. 2011, as jax/_src/prng.py computes it) on the key and the count (0, data): a few
microseconds a fold. tests/test_member_keys.py checks them against jax.random bit for bit.
"""

from __future__ import annotations

import jax

MASK = 0xFFFFFFFF
ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))  # alternating groups of four rounds
PARITY = 0x1BD11BDA  # the key schedule's constant


def exact() -> bool:
    """Whether JAX's default keys are threefry2x32's (the only implementation computed here)."""
    return jax.config.jax_default_prng_impl == "threefry2x32"


def key(seed: int) -> tuple[int, int]:
    """``jax.random.PRNGKey(seed)``'s two words, for 0 <= seed < 2**31."""
    return 0, seed


def fold_in(key_words: tuple[int, int], data: int) -> tuple[int, int]:
    """``jax.random.fold_in(key, data)``'s two words, for 0 <= data < 2**32."""
    return threefry2x32(key_words, (0, data))


def threefry2x32(key_words: tuple[int, int], count: tuple[int, int]) -> tuple[int, int]:
    """One block of Threefry-2x32 with 20 rounds: ``count`` encrypted under ``key_words``."""
    k0, k1 = key_words
    schedule = (k0, k1, k0 ^ k1 ^ PARITY)
    x0, x1 = (count[0] + k0) & MASK, (count[1] + k1) & MASK
    for group in range(5):
        for r in ROTATIONS[group % 2]:
            x0 = (x0 + x1) & MASK
            x1 = ((x1 << r) | (x1 >> (32 - r))) & MASK
            x1 ^= x0
        x0 = (x0 + schedule[(group + 1) % 3]) & MASK
        x1 = (x1 + schedule[(group + 2) % 3] + group + 1) & MASK
    return x0, x1
