"""The counter-based dropout hash shared by the JAX path, the Pallas kernel and the C++ kernel:
keep decisions are a pure function of (seed, row, column), so a kernel recomputes them in its
backward pass instead of storing a mask. Its own module so that attention.py and the kernels
import it without importing each other."""

from __future__ import annotations

import math

import jax.numpy as jnp

NO_DROPOUT = 1 << 24  # a threshold at or above it keeps everything (24-bit uniform integers)


def dropout_threshold(rate: float) -> tuple[int, float]:
    """(threshold, 1 / keep_prob): keep iff a 24-bit uniform integer < threshold."""
    keep = 1.0 - rate
    return int(math.ceil(keep * (1 << 24))), 1.0 / keep


def _fmix32(h):
    h = h ^ (h >> 16)
    h = h * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * jnp.uint32(0xC2B2AE35)
    return h ^ (h >> 16)


def hash_mix(seed0, seed1, rows, cols):
    """mix(seed, r, c): 32 hash bits per (row, column), uint32 (broadcasting rows and cols);
    the same in the JAX path, the Pallas kernel and the C++ kernel."""
    a = _fmix32(rows * jnp.uint32(0x9E3779B9) + seed0)
    return _fmix32((a ^ (cols * jnp.uint32(0x85EBCA77))) + seed1)


def hash_keep(seed, shape, threshold: int):
    """Bool keep mask of ``shape`` from a seed (2,) uint32: element (r, c), with c the last
    index and r the flattened leading ones, is kept iff mix(seed, r, c) >> 8 < threshold."""
    rows = jnp.arange(math.prod(shape[:-1]), dtype=jnp.uint32).reshape(*shape[:-1], 1)
    cols = jnp.arange(shape[-1], dtype=jnp.uint32)
    return (hash_mix(seed[0], seed[1], rows, cols) >> 8) < jnp.uint32(threshold)
