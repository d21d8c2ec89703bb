"""The tiled (flash attention) kernel bodies of pallas_attention.py: one program per (member,
batch row, head, tile of ``block`` rows), looping over the other axis's tiles with lax.fori_loop.

Forward (one query tile): an online softmax over the key tiles up to the diagonal (the causal
mask leaves every later tile empty, so the loop stops there): a running row maximum ``top``,
the running sum of exp(s - top) ``total`` and the unnormalised output ``acc``, rescaled when
the maximum grows. Dropout zeroes dropped terms of ``acc`` only: ``total`` is the softmax's
denominator, which dropout does not touch. It writes the tile's output and its rows'
log-sum-exps (top + log(total)).

Backward (one tile index t, the layout of jax's Pallas GPU attention): the dk/dv loop over the
query tiles from t on (the keys of tile t are seen by queries >= t*block only) and the dq loop
over the key tiles up to t, both recomputing probabilities from the saved log-sum-exp and the
keep decisions from the hash. The softmax backward's row term sum_j p_ij dp_ij = dout_i . out_i
is recomputed per query tile from out and dout (read beside q and dout) rather than by a
separate pass: no extra call, no (B, H, T) array written and read back.

Padding (block rows past T, head columns past D/H) exists only on chip: masked loads give
zeros and masked stores drop it. A padded key column j >= T is causally masked for every real
query i < T (j > i), and a padded query row contributes nothing to dk, dv (its dout is zero).

Dtypes: q, k, v, out and dout are read in the dtype they have in HBM (float32, or bfloat16
under config.model.dtype=bfloat16); every matmul takes two operands of that dtype and
accumulates in float32 (pl.dot's float32 result), and the scores, the softmax statistics, the
output and gradient accumulators and the row terms stay float32. Under bfloat16 a float32 tile
enters a matmul as bfloat16: the (unnormalised) probabilities against v, the dropped
probabilities against dout, and the scores' gradient against q and k, as the JAX path's
bfloat16 probabilities meet v (models/attention.jax_attention); the output and the gradients are
stored in their refs' dtype (bfloat16). In float32 every such cast is no cast (``_as``): the
float32 program is the one before bfloat16 existed.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from mhjax.models.dropout_hash import NO_DROPOUT, hash_mix

MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)  # finite: no inf - inf in padded rows
TILE_AXIS = 3  # the grid is (members, batch, heads, tiles)


def _as(x, dtype):
    """x in ``dtype``; x itself when it is already (no convert in the float32 program)."""
    return x if x.dtype == dtype else x.astype(dtype)


def _span(tile, block: int):
    """Sequence positions (block,) of tile ``tile`` (a traced int)."""
    return tile * block + jnp.arange(block)


def _load(ref, tile, block: int, length: int, head_dim: int):
    """Tile ``tile`` (block, C) of a (T padded, C) ref; rows past T and columns past D/H: 0."""
    cols = ref.shape[-1]
    mask = (_span(tile, block) < length)[:, None] & (jnp.arange(cols) < head_dim)[None, :]
    return plgpu.load(ref.at[pl.ds(tile * block, block), :], mask=mask, other=0.0)


def _load_rows(ref, tile, block: int, length: int):
    """Tile ``tile`` (block,) of a (T padded,) ref of row statistics; rows past T: 0."""
    return plgpu.load(ref.at[pl.ds(tile * block, block)], mask=_span(tile, block) < length, other=0.0)


def _scores(q, k, rows, keys, scale: float):
    """Causal, scaled scores (block, block) of query positions ``rows`` and key positions
    ``keys``; masked entries MASK_VALUE."""
    s = pl.dot(q, k, trans_b=True) * scale
    return jnp.where(rows[:, None] >= keys[None, :], s, MASK_VALUE)


def _first_row(length: int):
    """b * T of this program's batch row b (the grid's second axis), the UNPADDED T: read
    outside the tile loops (interpret mode does not substitute program_id inside a loop body)."""
    return (pl.program_id(1) * length).astype(jnp.uint32)


def _keep(seeds, first, rows, keys, threshold: int):
    """The (block, block) dropout keep mask at (b * T + i, j) (first = b * T): hash_keep's bits.
    ``seeds``: the head's two seed words."""
    i = first + rows.astype(jnp.uint32)
    bits = hash_mix(seeds[0], seeds[1], i[:, None], keys.astype(jnp.uint32)[None, :])
    return (bits >> 8) < jnp.uint32(threshold)


def forward_kernel(seeds_ref, q_ref, k_ref, v_ref, out_ref, lse_ref, *, length, head_dim, threshold, inv_keep):
    """One query tile: q_ref, out_ref (block, C), lse_ref (block,) float32; k_ref, v_ref the
    whole (padded) sequence."""
    block, cols = q_ref.shape
    tile = pl.program_id(TILE_AXIS)
    rows = _span(tile, block)
    real = (rows < length)[:, None] & (jnp.arange(cols) < head_dim)[None, :]
    q = plgpu.load(q_ref, mask=real, other=0.0)
    scale = 1.0 / math.sqrt(head_dim)
    seeds, first = (seeds_ref[0], seeds_ref[1]), _first_row(length)

    def step(key_tile, carry):
        acc, top, total = carry
        keys = _span(key_tile, block)
        s = _scores(q, _load(k_ref, key_tile, block, length, head_dim), rows, keys, scale)
        new_top = jnp.maximum(top, jnp.max(s, axis=1))
        e = jnp.exp(s - new_top[:, None])
        fix = jnp.exp(top - new_top)
        total = total * fix + jnp.sum(e, axis=1)
        if threshold < NO_DROPOUT:
            e = jnp.where(_keep(seeds, first, rows, keys, threshold), e, 0.0)
        acc = acc * fix[:, None] + pl.dot(_as(e, v_ref.dtype), _load(v_ref, key_tile, block, length, head_dim))
        return acc, new_top, total

    init = (jnp.zeros((block, cols), jnp.float32), jnp.full((block,), MASK_VALUE), jnp.zeros((block,), jnp.float32))
    acc, top, total = lax.fori_loop(0, tile + 1, step, init)  # key tiles past the diagonal: all masked
    plgpu.store(out_ref, _as(acc * (inv_keep / total)[:, None], out_ref.dtype), mask=real)
    plgpu.store(lse_ref, top + jnp.log(total), mask=rows < length)


def backward_kernel(
    seeds_ref, q_ref, k_ref, v_ref, out_ref, lse_ref, dout_ref, dqkv_ref, *, length, head_dim, threshold, inv_keep
):  # fmt: skip
    """Tile t: dk, dv of its keys and dq of its queries (accumulated in float32), into dqkv_ref
    (block, 4, C) in q's dtype (parts 0, 1, 2: dq, dk, dv; index 3 lies past the axis and is never
    written). The other refs hold the whole (padded) sequence; lse_ref float32."""
    block, _, cols = dqkv_ref.shape
    tile = pl.program_id(TILE_AXIS)
    own = _span(tile, block)
    scale = 1.0 / math.sqrt(head_dim)
    dropout = threshold < NO_DROPOUT
    seeds, first = (seeds_ref[0], seeds_ref[1]), _first_row(length)

    def load(ref, t):
        return _load(ref, t, block, length, head_dim)

    def grads(q, k, v, dout, lse, delta, rows, keys):
        """(ds, attended) of one (query tile, key tile) pair: the scores' gradient (scaled) and
        the probabilities as the forward applied them (dropped and rescaled)."""
        p = jnp.exp(_scores(q, k, rows, keys, scale) - lse[:, None])  # the forward's probabilities
        dp = pl.dot(dout, v, trans_b=True)  # gradient of the (dropped) probabilities
        attended = p
        if dropout:
            keep = _keep(seeds, first, rows, keys, threshold)
            attended = jnp.where(keep, p * inv_keep, 0.0)
            dp = jnp.where(keep, dp * inv_keep, 0.0)
        return p * (dp - delta[:, None]) * scale, attended

    def query_tile(t):
        """q, dout, log-sum-exps and the softmax backward's row term of query tile t."""
        q, dout = load(q_ref, t), load(dout_ref, t)
        wide = lambda x: _as(x, jnp.float32)  # noqa: E731
        return q, dout, _load_rows(lse_ref, t, block, length), jnp.sum(wide(load(out_ref, t)) * wide(dout), axis=1)

    k, v = load(k_ref, tile), load(v_ref, tile)

    def key_step(t, carry):  # this tile's keys against query tile t >= tile
        dk, dv = carry
        q, dout, lse, delta = query_tile(t)
        ds, attended = grads(q, k, v, dout, lse, delta, _span(t, block), own)
        dk = dk + pl.dot(_as(ds, q.dtype), q, trans_a=True)
        return dk, dv + pl.dot(_as(attended, dout.dtype), dout, trans_a=True)

    zeros = jnp.zeros((block, cols), jnp.float32)
    dk, dv = lax.fori_loop(tile, pl.cdiv(length, block), key_step, (zeros, zeros))

    q, dout, lse, delta = query_tile(tile)

    def query_step(t, dq):  # this tile's queries against key tile t <= tile
        k_t = load(k_ref, t)
        ds, _ = grads(q, k_t, load(v_ref, t), dout, lse, delta, own, _span(t, block))
        return dq + pl.dot(_as(ds, k_t.dtype), k_t)

    dq = lax.fori_loop(0, tile + 1, query_step, zeros)
    real = (own < length)[:, None] & (jnp.arange(cols) < head_dim)[None, :]
    # an array index, not a Python int, which interpret mode's discharge of the store does not take
    for part, grad in enumerate((dq, dk, dv)):
        plgpu.store(dqkv_ref.at[:, jnp.int32(part), :], _as(grad, dqkv_ref.dtype), mask=real)
