"""A fused causal attention core for TPUs in Pallas (Mosaic lowering), forward and backward,
with pallas_attention.py's contract: any T, causal, every head count of a program (each group
of a member layout at its own static head count), members batched (on the grid, or through
vmap: the pallas_call's batching rule adds the axis), dropout on the probabilities drawn as
the JAX path and the GPU kernel draw it (dropout_hash.hash_mix at (b * T + i, j) with the
coarse head's seed), per shard under the mesh, float32 and bfloat16. No (heads, T, T) array
leaves the chip: HBM holds the (B, T, 3D) projection, the (B, T, D) output, each row's
log-sum-exp per head (B, T, heads, float32: what the backward needs to recompute a tile's
probabilities) and, backward, dout and the one (B, T, 3D) gradient.

Why not JAX's shipped TPU kernels (jax.experimental.pallas.ops.tpu.flash_attention,
splash_attention): they lay every head out as (T, head size) with the head size on the 128
lanes and save the row statistics broadcast to 128 lanes, so at mhjax's head sizes (4 to 64)
q, k, v, out, the gradients and the statistics fill 128 lanes in HBM, and they need a
heads-first transposed copy of q, k and v. Compiled for a v5e-8, the paper sweep at
model.dropout = 0 moved 5.4 GB per member-step with flash_attention against the JAX path's
3.7 (temporaries 5.3 against 1.7 GiB per chip); and neither has dropout on the probabilities
(flash_attention's only extras are an additive bias and segment ids).

The layout here keeps the model's own: heads stay packed in lanes of the (T, 3D) projection
(q, k, v side by side). Head h's scores are (q masked to h's lanes) @ k^T, a contraction over
all D lanes in which the other heads' lanes are zero: the MXU pads a head's contraction to 128
anyway, so this costs what a per-head slice would, with no lane shuffles; its output (p @ v)
is kept on h's lanes.

Tiling (flash attention): sequences up to WHOLE rows are one tile (queries and keys whole);
longer ones are padded to a multiple of TILE rows (zeros; the causal mask alone keeps a real
row from the padded keys, which come after it, and the padded rows' outputs are cut off) and
run on a (members, batch, query tiles, key tiles) grid. The forward keeps each head's running
max and sum per row (online softmax) over the key tiles; key tiles above the diagonal are
skipped (no work, and their index map repeats the diagonal's block, so no copy either). The
backward recomputes a tile's probabilities from the saved log-sum-exp, accumulates dq over the
key tiles and dk, dv over the whole grid in float32 VMEM, the (T, 3D) gradient block resident:
its VMEM grows with T (tpu_vmem.need says by how much; tpu_vmem.limit sets the compiler's
scoped limit from the chip, since Mosaic's default of 16 MiB is an eighth of a v5e's VMEM).

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

from mhjax.models import tpu_vmem
from mhjax.models.dropout_hash import NO_DROPOUT, hash_mix
from mhjax.models.tpu_vmem import LANES, tiles

MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
Layout = tuple[tuple[int, int], ...]  # (members, heads) per group, in member-axis order (attention.Layout)


def check(width: int, heads: int, dtype) -> None:
    """What the kernel takes, checked where interpret mode would accept more."""
    if width % heads:
        raise ValueError(f"pallas tpu attention: {heads} heads do not divide width {width}")
    if heads > LANES:
        raise ValueError(f"pallas tpu attention: at most {LANES} heads (one lane each for the row statistics)")
    if jnp.dtype(dtype) not in DTYPES:
        raise ValueError(f"pallas tpu attention: float32 or bfloat16 inputs only, got {jnp.dtype(dtype)}")


def _as(x, dtype):
    return x if x.dtype == dtype else x.astype(dtype)


def _dot(a, b, contract):
    """a . b over axes ``contract`` ((a's, b's)), float32 accumulation."""
    return lax.dot_general(a, b, ((contract[0], contract[1]), ((), ())), preferred_element_type=jnp.float32)


def _lane(stats, head):
    """(rows, 1): column ``head`` of (rows, n) per-head statistics (a masked lane sum: the head is traced)."""
    lanes = lax.broadcasted_iota(jnp.int32, stats.shape, 1)
    return jnp.sum(jnp.where(lanes == head, stats, 0.0), axis=1, keepdims=True)


class _Tile:
    """One grid step's (rows, cols) frame of query tile i and key tile j: positions, the causal
    mask, the lanes' heads, dropout."""

    def __init__(self, ids, rows: int, cols: int, width: int, heads: int, threshold: int, length: int):
        batch, i, j = ids  # program ids, read at the kernel's top level (interpret mode maps them there)
        self.rows = i * rows + lax.broadcasted_iota(jnp.int32, (rows, cols), 0)
        self.cols = j * cols + lax.broadcasted_iota(jnp.int32, (rows, cols), 1)
        self.lanes = lax.div(lax.broadcasted_iota(jnp.int32, (1, width), 1), width // heads)
        self.first = (batch * length).astype(jnp.uint32)  # b * T, the UNPADDED T
        self.threshold, self.scale = threshold, 1.0 / math.sqrt(width // heads)

    def only(self, x, head):
        """x with every lane but head ``head``'s zeroed."""
        return jnp.where(self.lanes == head, x, jnp.zeros((), x.dtype))

    def scores(self, q, k, head):
        """(rows, cols) float32 causal scores of head ``head`` (masked: MASK_VALUE)."""
        s = _dot(self.only(q, head), k, ((1,), (1,))) * self.scale
        return jnp.where(self.rows >= self.cols, s, MASK_VALUE)

    def keep(self, seeds_ref, head):
        """(rows, cols) keep decisions of head ``head``: hash_keep's bits at (b * T + i, j)."""
        bits = hash_mix(seeds_ref[head, 0], seeds_ref[head, 1], self.first + self.rows.astype(jnp.uint32),
                        self.cols.astype(jnp.uint32))  # fmt: skip
        return (bits >> 8) < jnp.uint32(self.threshold)


def _forward_kernel(seeds_ref, q_ref, kv_ref, out_ref, lse_ref, acc_ref, max_ref, sum_ref, **static):
    """q_ref (rows, 3D): query tile i's rows; kv_ref (cols, 3D): key tile j's; out_ref (rows, D)
    and lse_ref (rows, heads) written at the diagonal, the last key tile query tile i sees;
    acc_ref (rows, D), max_ref and sum_ref (rows, LANES: lane h head h's) carried over j."""
    heads, threshold, inv_keep, length = static["heads"], static["threshold"], static["inv_keep"], static["length"]
    rows, width = out_ref.shape
    cols = kv_ref.shape[0]
    ids = pl.program_id(1), pl.program_id(2), pl.program_id(3)
    i, j = ids[1:]

    @pl.when(j == 0)
    def _():
        acc_ref[...] = jnp.zeros_like(acc_ref)
        max_ref[...] = jnp.full_like(max_ref, MASK_VALUE)
        sum_ref[...] = jnp.zeros_like(sum_ref)

    @pl.when(j <= i)  # tiles above the diagonal: every score masked, nothing to add
    def _():
        frame = _Tile(ids, rows, cols, width, heads, threshold, length)
        q, k, v = q_ref[:, :width], kv_ref[:, width : 2 * width], kv_ref[:, 2 * width :]
        stat_lanes = lax.broadcasted_iota(jnp.int32, max_ref.shape, 1)

        def head_step(head, carry):
            acc, top, total = carry
            s = frame.scores(q, k, head)
            before = _lane(top, head)
            now = jnp.maximum(before, jnp.max(s, axis=1, keepdims=True))
            e, rescale = jnp.exp(s - now), jnp.exp(before - now)
            total = jnp.where(
                stat_lanes == head, rescale * _lane(total, head) + jnp.sum(e, axis=1, keepdims=True), total
            )
            top = jnp.where(stat_lanes == head, now, top)
            if threshold < NO_DROPOUT:  # the normaliser counts every probability; dropout scales what meets v
                e = jnp.where(frame.keep(seeds_ref, head), e * inv_keep, 0.0)
            acc = jnp.where(frame.lanes == head, acc * rescale + _dot(_as(e, v.dtype), v, ((1,), (0,))), acc)
            return acc, top, total

        carry = (acc_ref[...], max_ref[...], sum_ref[...])
        acc_ref[...], max_ref[...], sum_ref[...] = lax.fori_loop(0, heads, head_step, carry)

    @pl.when(j == i)
    def _():
        total = sum_ref[...]
        lanes = lax.div(lax.broadcasted_iota(jnp.int32, (1, width), 1), width // heads)
        per_lane = lax.fori_loop(
            0, heads, lambda h, x: jnp.where(lanes == h, _lane(total, h), x), jnp.ones((rows, width), jnp.float32)
        )
        out_ref[...] = _as(acc_ref[...] / per_lane, out_ref.dtype)
        lse = max_ref[...] + jnp.log(jnp.maximum(total, 1e-30))  # lanes past the heads: never read
        lse_ref[...] = lse[:, :heads]


def _backward_kernel(seeds_ref, q_ref, kv_ref, dout_ref, out_ref, lse_ref, dqkv_ref, dq_ref, dk_ref, dv_ref, **static):
    """dq of query tile i (accumulated over key tiles j in dq_ref), and its share of key tile j's
    dk, dv (accumulated over the whole grid in dk_ref, dv_ref, (T, D) float32), into dqkv_ref
    (T, 3D), resident across the tiles."""
    heads, threshold, inv_keep, length = static["heads"], static["threshold"], static["inv_keep"], static["length"]
    rows, width = dout_ref.shape
    cols = kv_ref.shape[0]
    ids = pl.program_id(1), pl.program_id(2), pl.program_id(3)
    (i, j), last = ids[1:], pl.num_programs(3) - 1
    keys = slice(None) if cols == dk_ref.shape[0] else pl.ds(pl.multiple_of(j * cols, cols), cols)

    @pl.when((i == 0) & (j == 0))
    def _():
        dk_ref[...] = jnp.zeros_like(dk_ref)
        dv_ref[...] = jnp.zeros_like(dv_ref)

    @pl.when(j == 0)
    def _():
        dq_ref[...] = jnp.zeros_like(dq_ref)

    @pl.when(j <= i)
    def _():
        frame = _Tile(ids, rows, cols, width, heads, threshold, length)
        q, dout = q_ref[:, :width], dout_ref[...]
        k, v = kv_ref[:, width : 2 * width], kv_ref[:, 2 * width :]
        lse = lse_ref[...]
        # sum_j p_ij dp_ij per head = dout_i . out_i on the head's lanes (dropout included)
        delta = dout.astype(jnp.float32) * out_ref[...].astype(jnp.float32)

        def head_step(head, carry):
            dq, dk, dv = carry
            p = jnp.exp(frame.scores(q, k, head) - _lane(lse, head))
            dp = _dot(frame.only(dout, head), v, ((1,), (1,)))  # gradient of the applied probabilities
            applied = p
            if threshold < NO_DROPOUT:
                keep = frame.keep(seeds_ref, head)
                applied, dp = jnp.where(keep, p * inv_keep, 0.0), jnp.where(keep, dp * inv_keep, 0.0)
            rowsum = jnp.sum(frame.only(delta, head), axis=1, keepdims=True)
            ds = _as(p * (dp - rowsum) * frame.scale, q.dtype)
            dk = dk + frame.only(_dot(ds, q, ((0,), (0,))), head)
            dv = dv + frame.only(_dot(_as(applied, dout.dtype), dout, ((0,), (0,))), head)
            return dq + frame.only(_dot(ds, k, ((1,), (0,))), head), dk, dv

        carry = (dq_ref[...], dk_ref[keys, :], dv_ref[keys, :])
        dq_ref[...], dk_ref[keys, :], dv_ref[keys, :] = lax.fori_loop(0, heads, head_step, carry)

    @pl.when(j == i)
    def _():
        queries = slice(None) if rows == dqkv_ref.shape[0] else pl.ds(pl.multiple_of(i * rows, rows), rows)
        dqkv_ref[queries, :width] = _as(dq_ref[...], dqkv_ref.dtype)

    @pl.when((i == last) & (j == last))
    def _():
        dqkv_ref[:, width : 2 * width] = _as(dk_ref[...], dqkv_ref.dtype)
        dqkv_ref[:, 2 * width :] = _as(dv_ref[...], dqkv_ref.dtype)


def _work(batch: int, length: int, width: int, heads: int, itemsize: int, backward: bool) -> tuple[int, int, int]:
    """(matmul FLOPs, exps, HBM bytes) of one call over ``batch`` rows (members x batch) as the
    kernel runs it: the tiles on or below the diagonal (tpu_vmem.tile_pairs); per head and
    tile pair 2 matmuls forward, 5 backward, each contracting or producing all D lanes (the
    other heads' lanes zeroed, not skipped); the bytes: each query tile's rows once, each key
    tile once per query tile that sees it, the outputs once (the forward's log-sum-exp in
    float32)."""
    rows, padded = tiles(length)
    pairs = tpu_vmem.tile_pairs(length)
    flops = batch * pairs * rows * rows * width * 2 * heads * (5 if backward else 2)
    exps = batch * pairs * rows * rows * heads
    stats = batch * padded * heads * 4
    if backward:  # q, dout and out tiles; the key tiles; the gradient; the statistics read
        nbytes = itemsize * batch * (padded * 5 * width + pairs * rows * 3 * width + padded * 3 * width) + stats
    else:
        nbytes = itemsize * batch * (padded * 3 * width + pairs * rows * 3 * width + padded * width) + stats
    return flops, exps, nbytes


def _cost(members: int, batch: int, length: int, width: int, heads: int, itemsize: int, backward: bool):
    """The call's work for XLA's cost analysis (in its HLO: train/hlo.py reads the bytes)."""
    flops, exps, nbytes = _work(members * batch, length, width, heads, itemsize, backward)
    return pl.CostEstimate(flops=int(flops), transcendentals=int(exps), bytes_accessed=int(nbytes))


def kernel_cost(batch: int, length: int, width: int, heads: int, itemsize: int = 4):
    """FLOPs and HBM bytes of one forward and backward of one member's layer (models/cost.py),
    as pallas_attention.kernel_cost for the GPU's: the calls' stated work, plus ~20 elementwise
    operations (mask, exp, dropout hash) per (head, query, key) of the tiles run in each of
    three passes: the forward's probabilities, the backward's recomputed ones and their gradient."""
    from mhjax.models.pallas_attention import KernelCost

    parts = [_work(batch, length, width, heads, itemsize, backward) for backward in (False, True)]
    dots, nbytes = sum(p[0] for p in parts), sum(p[2] for p in parts)
    rows, _ = tiles(length)
    elementwise = 20 * 3 * batch * heads * tpu_vmem.tile_pairs(length) * rows * rows
    return KernelCost(float(dots + elementwise), float(nbytes), float(dots))


def _call(seeds, qkv, residual, group, static, interpret, into=None):
    """One pallas_call over a (members, batch, query tiles, key tiles) grid for the group (first
    member, members, heads): the forward (``residual`` None: returns (out, lse)), or with
    ``residual`` = (dout, out, lse) the backward (returns dqkv), of every member's (M, B, T',
    ...) arrays (T' the padded length) read at the group's offset on the member axis; its first
    output written into ``into`` (the other groups' members left as they are) where given."""
    first, count, heads = group
    backward = residual is not None
    members, batch, padded, width3 = qkv.shape
    width = width3 // 3
    check(width, heads, qkv.dtype)
    rows, _ = tiles(static["length"])
    steps = padded // rows
    at = lambda offset, block: lambda m, b, i, j: (m + offset, b, block(i, j), 0)  # noqa: E731
    query_tile = lambda cols, offset=first: pl.BlockSpec((None, None, rows, cols), at(offset, lambda i, j: i))  # noqa: E731
    # above the diagonal the key tile index stays at the diagonal's: no copy for a skipped step
    key_tile = pl.BlockSpec((None, None, rows, width3), at(first, jnp.minimum))
    whole = pl.BlockSpec((None, None, padded, width3), at(first, lambda i, j: 0))
    seeds_spec = pl.BlockSpec((None, seeds.shape[1], 2), lambda m, b, i, j: (m + first, 0, 0), memory_space=pltpu.SMEM)
    specs, operands = [seeds_spec, query_tile(width3), key_tile], [seeds, qkv, qkv]
    body = functools.partial(_backward_kernel if backward else _forward_kernel, heads=heads, **static)
    if backward:
        dout, out, lse = residual
        specs += [query_tile(width), query_tile(width), query_tile(heads, 0)]
        operands += [dout, out, lse]
        out_shape, out_specs = jax.ShapeDtypeStruct(qkv.shape, qkv.dtype), whole
        scratch = [pltpu.VMEM((rows, width), jnp.float32)] + [pltpu.VMEM((padded, width), jnp.float32)] * 2
    else:
        out_shape = (
            jax.ShapeDtypeStruct((members, batch, padded, width), qkv.dtype),
            jax.ShapeDtypeStruct((count, batch, padded, heads), jnp.float32),
        )
        out_specs = (query_tile(width), query_tile(heads, 0))
        scratch = [pltpu.VMEM((rows, width), jnp.float32)] + [pltpu.VMEM((rows, LANES), jnp.float32)] * 2
    if into is not None:  # left in HBM (ANY): the kernel writes its blocks through the output, never reads it
        specs.append(pl.BlockSpec(memory_space=pl.ANY))
        operands.append(into)

    def run(*refs):  # an aliased input is the output's own buffer: the kernel writes, never reads it
        inputs = len(specs) - (into is not None)
        body(*refs[:inputs], *refs[len(specs) :])

    semantics = ("parallel", "parallel", "arbitrary" if backward else "parallel", "arbitrary")
    itemsize = qkv.dtype.itemsize
    return pl.pallas_call(
        run,
        grid=(count, batch, steps, steps),
        in_specs=specs,
        out_specs=out_specs,
        out_shape=out_shape,
        scratch_shapes=scratch,
        input_output_aliases={} if into is None else {len(specs) - 1: 0},
        compiler_params=pltpu.CompilerParams(dimension_semantics=semantics, vmem_limit_bytes=tpu_vmem.limit()),
        cost_estimate=_cost(count, batch, static["length"], width, heads, itemsize, backward),
        interpret=interpret,
        name="mhjax_tpu_attention_bwd" if backward else "mhjax_tpu_attention_fwd",
    )(*operands)


def _groups(layout: Layout):
    """(first member, members, heads) of each group."""
    first = 0
    for count, heads in layout:
        yield first, count, heads
        first += count


def _pad(x, padded: int):
    """x (M, B, T, ...) with zero rows to ``padded`` on the sequence axis."""
    extra = padded - x.shape[2]
    return x if extra == 0 else jnp.pad(x, [(0, 0), (0, 0), (0, extra), (0, 0)])


def _forward(qkv, seeds, layout, static, interpret):
    """(out (M, B, T', D), [each group's lse (members, B, T', heads)]) of the padded qkv."""
    out, stats = None, []
    for group in _groups(layout):
        out, lse = _call(seeds, qkv, None, group, static, interpret, out)
        stats.append(lse)
    return out, stats


def _static(length: int, threshold: int, inv_keep: float) -> dict:
    """The kernels' static arguments besides the head count: dropout, and the UNPADDED T."""
    return {"threshold": threshold, "inv_keep": inv_keep, "length": length}


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def members_attention(qkv, seeds, layout: Layout, threshold: int, inv_keep: float, interpret: bool):
    """Causal attention of M members from their (M, B, T, 3D) fused projection (float32 or
    bfloat16), the members in ``layout`` groups ((members, heads), ... along the member axis;
    static), each at its own head count of dim D/heads; dropout seeds (M, S, 2) uint32 per
    member and coarse head (S >= every head count; threshold >= 2^24: no dropout). Returns
    jax_attention's (M, B, T, D) output of each member at its head count, in qkv's dtype.
    ``interpret`` (static): Pallas's TPU interpret mode, for a CPU."""
    return _members_fwd(qkv, seeds, layout, threshold, inv_keep, interpret)[0]


def _members_fwd(qkv, seeds, layout, threshold, inv_keep, interpret):
    static = _static(qkv.shape[2], threshold, inv_keep)
    padded = _pad(qkv, tiles(static["length"])[1])
    out, stats = _forward(padded, seeds, layout, static, interpret)
    return out[:, :, : static["length"]], (padded, seeds, out, stats)


def _members_bwd(layout, threshold, inv_keep, interpret, residuals, dout):
    padded, seeds, out, stats = residuals
    length = dout.shape[2]
    static = _static(length, threshold, inv_keep)
    dout = _pad(_as(dout, padded.dtype), padded.shape[2])
    dqkv = None
    for group, lse in zip(_groups(layout), stats):
        dqkv = _call(seeds, padded, (dout, out, lse), group, static, interpret, dqkv)
    return dqkv[:, :, :length], np.zeros(seeds.shape, jax.dtypes.float0)


members_attention.defvjp(_members_fwd, _members_bwd)


def attention(qkv, seeds, heads: int, threshold: int, inv_keep: float, interpret: bool):
    """Causal attention of one (B, T, 3D) fused projection at ``heads`` (static) heads of dim
    D/heads, dropout seeds (heads, 2) uint32 per head: (B, T, D), jax_attention's output
    (members_attention of one member; the member axis is a free reshape)."""
    return members_attention(qkv[None], seeds[None], ((1, heads),), threshold, inv_keep, interpret)[0]
