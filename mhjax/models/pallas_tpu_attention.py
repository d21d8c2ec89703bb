"""A fused causal attention core for TPUs in Pallas (Mosaic lowering), forward and backward,
with pallas_attention.py's contract: any T, causal, every head count of a program (each group
of a member layout at its own static head count), members batched (on the grid, or through
vmap: the pallas_call's batching rule adds the axis), dropout on the probabilities drawn as
the JAX path and the GPU kernel draw it (dropout_hash.hash_mix at (b * T + i, j) with the
coarse head's seed), per shard under the mesh, float32 and bfloat16. No (heads, T, T) array
leaves the chip: HBM holds the (B, T, 3D) projection, the (B, T, D) output and, backward, dout
and the one (B, T, 3D) gradient. Nothing else is saved: the backward recomputes each row's
softmax from q and k, since a program holds whole rows.

Why not JAX's shipped TPU kernels (jax.experimental.pallas.ops.tpu.flash_attention,
splash_attention): they lay every head out as (T, head size) with the head size on the 128
lanes and save the row statistics broadcast to 128 lanes, so at mhjax's head sizes (4 to 64)
q, k, v, out, the gradients and the statistics fill 128 lanes in HBM, and they need a
heads-first transposed copy of q, k and v. Compiled for a v5e-8, the paper sweep at
model.dropout = 0 moved 5.4 GB per member-step with flash_attention against the JAX path's
3.7 (temporaries 5.3 against 1.7 GiB per chip); and neither has dropout on the probabilities
(flash_attention's only extras are an additive bias and segment ids).

The layout here keeps the model's own: one program per (member, batch row, tile of queries)
reads its query rows and the whole sequence of keys and values straight from the (T, 3D)
projection (q, k, v side by side on the lanes), so heads stay packed in lanes. Head h's scores
are (q masked to h's lanes) @ k^T, a contraction over all D lanes in which the other heads'
lanes are zero: the MXU pads a head's contraction to 128 anyway, so this costs what a per-head
slice would, with no lane shuffles; its output (p @ v) is kept on h's lanes. A whole row of
scores (tile, T) per head lives in VMEM (T = 1,024: 1 MiB at a 256-row tile), so the softmax
is exact, not online. Sequences longer than WHOLE rows run in tiles of TILE rows when TILE
divides T (the backward accumulates dk, dv over the tiles in VMEM); otherwise as one tile.

Dtypes: q, k, v, dout are read in their HBM dtype; matmuls accumulate in float32; the
probabilities and the scores' gradient meet v, dout, q and k in that dtype (as the JAX path's
bfloat16 probabilities meet v); output and gradients are written in it.

``interpret`` (static): Pallas's TPU interpret mode, on a CPU (how the tests check values).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from mhjax.models.dropout_hash import NO_DROPOUT, hash_mix

WHOLE = 512  # sequences up to this many rows: one tile of queries per program
TILE = 256  # longer ones: tiles of this many query rows, where it divides T
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
Layout = tuple[tuple[int, int], ...]  # (members, heads) per group, in member-axis order (attention.Layout)


def tile_rows(length: int) -> int:
    """Query rows per program: the whole sequence up to WHOLE rows or where TILE does not divide it."""
    return TILE if length > WHOLE and length % TILE == 0 else length


def check(width: int, heads: int, dtype) -> None:
    """What the kernel takes, checked where interpret mode would accept more."""
    if width % heads:
        raise ValueError(f"pallas tpu attention: {heads} heads do not divide width {width}")
    if jnp.dtype(dtype) not in DTYPES:
        raise ValueError(f"pallas tpu attention: float32 or bfloat16 inputs only, got {jnp.dtype(dtype)}")


def _as(x, dtype):
    return x if x.dtype == dtype else x.astype(dtype)


def _dot(a, b, contract):
    """a . b over axes ``contract`` ((a's, b's)), float32 accumulation."""
    return lax.dot_general(a, b, ((contract[0], contract[1]), ((), ())), preferred_element_type=jnp.float32)


class _Tile:
    """One program's (rows, T) frame: positions, the causal mask, lanes' heads, dropout."""

    def __init__(self, rows: int, length: int, width: int, heads: int, threshold: int):
        tile = pl.program_id(2)
        self.rows = tile * rows + lax.broadcasted_iota(jnp.int32, (rows, length), 0)
        self.cols = lax.broadcasted_iota(jnp.int32, (rows, length), 1)
        self.lanes = lax.div(lax.broadcasted_iota(jnp.int32, (1, width), 1), width // heads)
        self.first = (pl.program_id(1) * length).astype(jnp.uint32)  # b * T, the UNPADDED T
        self.threshold, self.scale = threshold, 1.0 / math.sqrt(width // heads)

    def only(self, x, head):
        """x with every lane but head ``head``'s zeroed."""
        return jnp.where(self.lanes == head, x, jnp.zeros((), x.dtype))

    def probs(self, q, k, head):
        """Softmax (rows, T) float32 of head ``head``'s causal scores."""
        s = _dot(self.only(q, head), k, ((1,), (1,))) * self.scale
        s = jnp.where(self.rows >= self.cols, s, MASK_VALUE)
        e = jnp.exp(s - jnp.max(s, axis=1, keepdims=True))
        return e / jnp.sum(e, axis=1, keepdims=True)

    def keep(self, seeds_ref, head):
        """(rows, T) keep decisions of head ``head``: hash_keep's bits at (b * T + i, j)."""
        bits = hash_mix(seeds_ref[head, 0], seeds_ref[head, 1], self.first + self.rows.astype(jnp.uint32),
                        self.cols.astype(jnp.uint32))  # fmt: skip
        return (bits >> 8) < jnp.uint32(self.threshold)


def _forward_kernel(seeds_ref, tile_ref, qkv_ref, out_ref, *, heads, threshold, inv_keep):
    """tile_ref (rows, 3D): this program's query rows; qkv_ref (T, 3D): the whole sequence;
    out_ref (rows, D)."""
    rows, width = out_ref.shape
    length = qkv_ref.shape[0]
    frame = _Tile(rows, length, width, heads, threshold)
    q = tile_ref[:, :width]
    k, v = qkv_ref[:, width : 2 * width], qkv_ref[:, 2 * width :]

    def head_step(head, out):
        p = frame.probs(q, k, head)
        if threshold < NO_DROPOUT:
            p = jnp.where(frame.keep(seeds_ref, head), p * inv_keep, 0.0)
        return out + frame.only(_dot(_as(p, v.dtype), v, ((1,), (0,))), head)

    out = lax.fori_loop(0, heads, head_step, jnp.zeros((rows, width), jnp.float32))
    out_ref[...] = _as(out, out_ref.dtype)


def _backward_kernel(seeds_ref, tile_ref, qkv_ref, dout_ref, dqkv_ref, dk_ref, dv_ref, *, heads, threshold, inv_keep):
    """dq of this tile's rows, and this tile's share of dk, dv (accumulated in float32 VMEM
    over the tiles, the grid's last axis), into dqkv_ref (T, 3D), resident across the tiles."""
    rows, width = dout_ref.shape
    length = qkv_ref.shape[0]
    tile, tiles = pl.program_id(2), pl.num_programs(2)
    frame = _Tile(rows, length, width, heads, threshold)
    q, dout = tile_ref[:, :width], dout_ref[...]
    k, v = qkv_ref[:, width : 2 * width], qkv_ref[:, 2 * width :]

    @pl.when(tile == 0)
    def _():
        dk_ref[...] = jnp.zeros_like(dk_ref)
        dv_ref[...] = jnp.zeros_like(dv_ref)

    def head_step(head, dq):
        p = frame.probs(q, k, head)
        dp = _dot(frame.only(dout, head), v, ((1,), (1,)))  # gradient of the applied probabilities
        applied = p
        if threshold < NO_DROPOUT:
            keep = frame.keep(seeds_ref, head)
            applied, dp = jnp.where(keep, p * inv_keep, 0.0), jnp.where(keep, dp * inv_keep, 0.0)
        ds = p * (dp - jnp.sum(p * dp, axis=1, keepdims=True)) * frame.scale
        ds = _as(ds, q.dtype)
        dk_ref[...] += frame.only(_dot(ds, q, ((0,), (0,))), head)
        dv_ref[...] += frame.only(_dot(_as(applied, dout.dtype), dout, ((0,), (0,))), head)
        return dq + frame.only(_dot(ds, k, ((1,), (0,))), head)

    dq = lax.fori_loop(0, heads, head_step, jnp.zeros((rows, width), jnp.float32))
    if rows == length:
        dqkv_ref[:, :width] = _as(dq, dqkv_ref.dtype)
    else:
        dqkv_ref[pl.ds(pl.multiple_of(tile * rows, rows), rows), :width] = _as(dq, dqkv_ref.dtype)

    @pl.when(tile == tiles - 1)
    def _():
        dqkv_ref[:, width : 2 * width] = _as(dk_ref[...], dqkv_ref.dtype)
        dqkv_ref[:, 2 * width :] = _as(dv_ref[...], dqkv_ref.dtype)


def _cost(members: int, batch: int, length: int, width: int, heads: int, itemsize: int, backward: bool):
    """The kernel's work for XLA's cost analysis: the matmuls at each head's own size (2 forward,
    5 backward, full (T, T) squares as XLA counts the JAX path's einsums) and its HBM bytes
    (the query tile's rows once, the whole sequence once per tile, outputs once)."""
    rows = batch * members * length
    squares = rows * length * width * 2 * (5 if backward else 2)
    tiles = length // tile_rows(length)
    reads = rows * 3 * width * (1 + tiles) + (rows * width if backward else 0)
    writes = rows * width * (3 if backward else 1)
    return pl.CostEstimate(
        flops=int(squares), transcendentals=int(rows * length * heads), bytes_accessed=int(itemsize * (reads + writes))
    )


def _call(seeds, qkv, dout, group, threshold, inv_keep, interpret, into=None):
    """One pallas_call over a (members, batch, tiles) grid for the group (first member,
    members, heads): the forward, or with ``dout`` the backward, of every member's (M, B, T,
    ...) arrays read at the group's offset on the member axis; its output written into
    ``into`` (the other groups' members left as they are) where given."""
    first, count, heads = group
    backward = dout is not None
    members, batch, length, width3 = qkv.shape
    width = width3 // 3
    check(width, heads, qkv.dtype)
    rows = tile_rows(length)
    tiles = length // rows
    rows_of = lambda cols: pl.BlockSpec((None, None, rows, cols), lambda m, b, t: (m + first, b, t, 0))  # noqa: E731
    whole = pl.BlockSpec((None, None, length, width3), lambda m, b, t: (m + first, b, 0, 0))
    seeds_spec = pl.BlockSpec((None, seeds.shape[1], 2), lambda m, b, t: (m + first, 0, 0), memory_space=pltpu.SMEM)
    specs = [seeds_spec, rows_of(width3), whole]
    kernel = _backward_kernel if backward else _forward_kernel
    if backward:
        specs.append(rows_of(width))
        out_shape, out_spec = jax.ShapeDtypeStruct(qkv.shape, qkv.dtype), whole
        scratch = [pltpu.VMEM((length, width), jnp.float32)] * 2
    else:
        out_shape = jax.ShapeDtypeStruct((members, batch, length, width), qkv.dtype)
        out_spec, scratch = rows_of(width), []
    operands = [seeds, qkv, qkv] + ([dout] if backward else [])
    if into is not None:
        specs.append(out_spec)
        operands.append(into)

    def run(*refs):  # an aliased input is the output's own buffer: the kernel writes, never reads it
        inputs = len(specs) - (into is not None)
        body = functools.partial(kernel, heads=heads, threshold=threshold, inv_keep=inv_keep)
        body(*refs[: inputs], *refs[len(specs) :])

    semantics = ("parallel", "parallel", "arbitrary" if backward else "parallel")
    return pl.pallas_call(
        run,
        grid=(count, batch, tiles),
        in_specs=specs,
        out_specs=out_spec,
        out_shape=out_shape,
        scratch_shapes=scratch,
        input_output_aliases={} if into is None else {len(specs) - 1: 0},
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics),
        cost_estimate=_cost(count, batch, length, width, heads, qkv.dtype.itemsize, backward),
        interpret=interpret,
        name="mhjax_tpu_attention_bwd" if backward else "mhjax_tpu_attention_fwd",
    )(*operands)


def _groups(layout: Layout):
    """(first member, members, heads) of each group."""
    first = 0
    for count, heads in layout:
        yield first, count, heads
        first += count


def _run(qkv, seeds, dout, layout, threshold, inv_keep, interpret):
    out = None
    for group in _groups(layout):
        out = _call(seeds, qkv, dout, group, threshold, inv_keep, interpret, out)
    return out


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def members_attention(qkv, seeds, layout: Layout, threshold: int, inv_keep: float, interpret: bool):
    """Causal attention of M members from their (M, B, T, 3D) fused projection (float32 or
    bfloat16), the members in ``layout`` groups ((members, heads), ... along the member axis;
    static), each at its own head count of dim D/heads; dropout seeds (M, S, 2) uint32 per
    member and coarse head (S >= every head count; threshold >= 2^24: no dropout). Returns
    jax_attention's (M, B, T, D) output of each member at its head count, in qkv's dtype.
    ``interpret`` (static): Pallas's TPU interpret mode, for a CPU."""
    return _run(qkv, seeds, None, layout, threshold, inv_keep, interpret)


def _members_fwd(qkv, seeds, layout, threshold, inv_keep, interpret):
    return members_attention(qkv, seeds, layout, threshold, inv_keep, interpret), (qkv, seeds)


def _members_bwd(layout, threshold, inv_keep, interpret, residuals, dout):
    qkv, seeds = residuals
    dqkv = _run(qkv, seeds, _as(dout, qkv.dtype), layout, threshold, inv_keep, interpret)
    return dqkv, np.zeros(seeds.shape, jax.dtypes.float0)


members_attention.defvjp(_members_fwd, _members_bwd)


def attention(qkv, seeds, heads: int, threshold: int, inv_keep: float, interpret: bool):
    """Causal attention of one (B, T, 3D) fused projection at ``heads`` (static) heads of dim
    D/heads, dropout seeds (heads, 2) uint32 per head: (B, T, D), jax_attention's output
    (members_attention of one member; the member axis is a free reshape)."""
    return members_attention(qkv[None], seeds[None], ((1, heads),), threshold, inv_keep, interpret)[0]
