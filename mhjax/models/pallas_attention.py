"""A fused causal attention core for GPUs in Pallas (Triton lowering), forward and backward.

One program per (batch row, head): its (T, T) scores, probabilities and dropout mask live
in registers and shared memory only. HBM holds the (B, T, D) inputs and outputs and the
(B, H, T) log-sum-exp of each row, saved by the forward so that the backward recomputes the
probabilities instead of storing them (flash attention). Dropout is mhjax's counter-based
hash (dropout_hash.hash_mix) recomputed in both passes from the head's seed and the element's
(b * T + i, j) position, with the UNPADDED length T: the JAX path's keep decisions exactly.

q, k and v are read where the model's one projection matmul wrote them: its (B, T, 3D) output
viewed as (B, T, 3, H, D/H) (a free reshape, no split or transposed copy), and the backward
writes the one (B, T, 3D) gradient of it. Under one_program's member layout the arrays are
every member's (M, B, T, ...), and each group of members is read and written at its offset
on the member axis (members_attention). The Triton lowering wants every block
dimension a power of two and every matmul dimension >= 16, so a program's block is
(T padded to a power of two, D/H padded to >= 16 and a power of two): the padding exists
only on chip, as masked loads (zeros) and masked stores; the padded key columns and rows
are removed by the causal mask (a real query i < T sees only keys j <= i < T).

On a CPU the same kernel runs in Pallas interpret mode (how CI tests it): ``interpret`` is a
static argument, decided by models/attention_choice.py for the backend compiled for. On a GPU
matmuls use the lowering's default precision (TF32, like XLA's default for fp32 dots).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from mhjax.models.dropout_hash import hash_mix

MIN_DOT = 16  # every dimension of a Triton matmul
MAX_LENGTH = 256  # one block over the whole sequence: (T, T) fp32 tiles must fit a program
MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)  # finite: no inf - inf in padded rows


def block_sizes(length: int, head_dim: int) -> tuple[int, int]:
    """(rows, columns) of a program's block for sequences of ``length`` and heads of ``head_dim``."""
    return max(MIN_DOT, pl.next_power_of_2(length)), max(MIN_DOT, pl.next_power_of_2(head_dim))


def check_lowering(length: int, width: int, heads: int, dtype) -> tuple[int, int]:
    """The Triton lowering's constraints, checked here so that interpret mode (which accepts
    any shape) fails where the device would. Returns the block sizes."""
    if width % heads:
        raise ValueError(f"pallas attention: {heads} heads do not divide width {width}")
    if jnp.dtype(dtype) != jnp.float32:
        raise ValueError(f"pallas attention: float32 inputs only, got {jnp.dtype(dtype)}")
    rows, cols = block_sizes(length, width // heads)
    if length > MAX_LENGTH:
        raise ValueError(f"pallas attention: sequence length {length} > {MAX_LENGTH} (one block per sequence)")
    return rows, cols


def _masks(rows: int, cols: int, length: int, head_dim: int):
    """(rows inside the sequence (R,), the block's real elements (R, C))."""
    row = jnp.arange(rows) < length
    return row, row[:, None] & (jnp.arange(cols) < head_dim)[None, :]


def _scores(q, k, scale: float):
    """Causal, scaled scores (R, R); masked entries MASK_VALUE."""
    s = pl.dot(q, k, trans_b=True) * scale
    i = jnp.arange(q.shape[0])
    return jnp.where(i[:, None] >= i[None, :], s, MASK_VALUE)


def _keep(seeds_ref, rows: int, length: int, threshold: int):
    """This program's (R, R) dropout keep mask: hash_keep's bits at (b * T + i, j); b is the
    grid's second axis (members, batch, heads)."""
    first = (pl.program_id(1) * length).astype(jnp.uint32)
    i = first + jnp.arange(rows).astype(jnp.uint32)
    j = jnp.arange(rows).astype(jnp.uint32)
    bits = hash_mix(seeds_ref[0], seeds_ref[1], i[:, None], j[None, :])
    return (bits >> 8) < jnp.uint32(threshold)


def _forward_kernel(seeds_ref, q_ref, k_ref, v_ref, out_ref, lse_ref, *, length, head_dim, threshold, inv_keep):
    rows, cols = q_ref.shape
    row, tile = _masks(rows, cols, length, head_dim)
    q, k, v = (plgpu.load(ref, mask=tile, other=0.0) for ref in (q_ref, k_ref, v_ref))
    s = _scores(q, k, 1.0 / math.sqrt(head_dim))
    top = jnp.max(s, axis=1)
    e = jnp.exp(s - top[:, None])
    total = jnp.sum(e, axis=1)
    p = e / total[:, None]
    if threshold < (1 << 24):
        p = jnp.where(_keep(seeds_ref, rows, length, threshold), p * inv_keep, 0.0)
    plgpu.store(out_ref, pl.dot(p, v), mask=tile)
    plgpu.store(lse_ref, top + jnp.log(total), mask=row)


def _backward_kernel(
    seeds_ref, q_ref, k_ref, v_ref, out_ref, lse_ref, dout_ref, dqkv_ref, *, length, head_dim, threshold, inv_keep
):  # fmt: skip
    rows, cols = q_ref.shape
    row, tile = _masks(rows, cols, length, head_dim)
    q, k, v, out, dout = (plgpu.load(ref, mask=tile, other=0.0) for ref in (q_ref, k_ref, v_ref, out_ref, dout_ref))
    lse = plgpu.load(lse_ref, mask=row, other=0.0)
    scale = 1.0 / math.sqrt(head_dim)
    p = jnp.exp(_scores(q, k, scale) - lse[:, None])  # the forward's probabilities
    dp = pl.dot(dout, v, trans_b=True)  # gradient of the (dropped) probabilities
    attended = p
    if threshold < (1 << 24):
        keep = _keep(seeds_ref, rows, length, threshold)
        attended = jnp.where(keep, p * inv_keep, 0.0)
        dp = jnp.where(keep, dp * inv_keep, 0.0)
    # softmax backward: sum_j p_ij dp_ij = dout_i . out_i (out = attended @ v); padded rows: 0
    ds = p * (dp - jnp.sum(out * dout, axis=1)[:, None]) * scale
    # dq, dk, dv into this head's (R, 4, C) block of the (3, H, D/H)-viewed gradient (index 3 past its end);
    # an array index, not a Python int, which interpret mode's discharge of the store does not take
    grads = (pl.dot(ds, k), pl.dot(ds, q, trans_a=True), pl.dot(attended, dout, trans_a=True))
    for part, grad in enumerate(grads):
        plgpu.store(dqkv_ref.at[:, jnp.int32(part), :], grad, mask=tile)


Layout = tuple[tuple[int, int], ...]  # (members, heads) per group, in member-axis order (attention.Layout)


def _call(kernel, name, seeds, args, outs, group, threshold, inv_keep, interpret, into=()):
    """pallas_call of ``kernel`` for one group of members over a (members, batch, heads) grid.
    group = (first member, members, heads). seeds (M, S >= heads, 2) uint32; args are
    (array, kind), read at the group's offset on the member axis; kinds: 'q', 'k', 'v' the
    (M, B, T, 3D) projection of every member (viewed as (M, B, T, 3, H, D/H)), read at this
    head's query, key or value columns; 'tile' an (M, B, T, D) array (viewed as (M, B, T, H,
    D/H)); 'qkv' a (M, B, T, 3D) output, written at all three of this head's column blocks;
    'rows' the group's own (members, B, H, T) row statistics. ``into``: arrays the first
    outputs are written into in place (input_output_aliases), another group's members left
    as they are; without them the other members' blocks of an output are not written."""
    first, count, heads = group
    members, batch, length, width = args[0][0].shape  # args[0]: the projection's query columns
    width //= 3
    rows, cols = check_lowering(length, width, heads, args[0][0].dtype)
    head_dim = width // heads
    fused = (members, batch, length, 3, heads, head_dim)
    shapes = {"tile": (members, batch, length, heads, head_dim), "rows": (count, batch, heads, length), "qkv": fused}
    shapes.update(q=fused, k=fused, v=fused)
    part = lambda c: pl.BlockSpec((None, None, rows, None, None, cols), lambda m, b, h: (m + first, b, 0, c, h, 0))  # noqa: E731
    specs = {
        "tile": pl.BlockSpec((None, None, rows, None, cols), lambda m, b, h: (m + first, b, 0, h, 0)),
        "qkv": pl.BlockSpec((None, None, rows, 4, None, cols), lambda m, b, h: (m + first, b, 0, 0, h, 0)),
        "rows": pl.BlockSpec((None, None, None, rows), lambda m, b, h: (m, b, h, 0)),
        "q": part(0),
        "k": part(1),
        "v": part(2),
    }
    body = functools.partial(kernel, length=length, head_dim=head_dim, threshold=threshold, inv_keep=inv_keep)
    inputs = [(x, kind) for x, kind in args] + [(x, kind) for x, kind in zip(into, outs)]

    def run(*refs):  # the aliased inputs are the outputs' own buffers: the kernel writes, never reads them
        body(*refs[: 1 + len(args)], *refs[1 + len(inputs) :])

    results = pl.pallas_call(
        run,
        grid=(count, batch, heads),
        in_specs=[pl.BlockSpec((None, None, 2), lambda m, b, h: (m + first, h, 0))] + [specs[k] for _, k in inputs],
        out_specs=[specs[kind] for kind in outs],
        out_shape=[jax.ShapeDtypeStruct(shapes[kind], jnp.float32) for kind in outs],
        input_output_aliases={1 + len(args) + i: i for i in range(len(into))},
        compiler_params=plgpu.CompilerParams(num_warps=8 if rows >= 128 else 4, num_stages=1),
        interpret=interpret,
        name=name,
    )(seeds, *(x.reshape(shapes[kind]) for x, kind in inputs))
    flat = {"tile": width, "qkv": 3 * width}
    return [r.reshape(members, batch, length, flat[kind]) if kind in flat else r for r, kind in zip(results, outs)]


def _groups(layout: Layout):
    """(first member, members, heads) of each group."""
    first = 0
    for count, heads in layout:
        yield first, count, heads
        first += count


def _forward(qkv, seeds, layout, threshold, inv_keep, interpret):
    args, out, stats = [(qkv, "q"), (qkv, "k"), (qkv, "v")], (), []
    for group in _groups(layout):
        into = out
        out, lse = _call(
            _forward_kernel, "mhjax_attention_fwd", seeds, args, ("tile", "rows"), group, threshold, inv_keep,
            interpret, into,
        )  # fmt: skip
        out, stats = (out,), stats + [lse]
    return out[0], stats


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def members_attention(qkv, seeds, layout: Layout, threshold: int, inv_keep: float, interpret: bool):
    """Causal attention of M members from their (M, B, T, 3D) float32 fused projection (q, k
    and v side by side on the last axis, as the model's one matmul writes them), the members
    in ``layout`` groups ((members, heads), ... along the member axis; static), each at its
    own head count of dim D/heads; dropout seeds (M, S, 2) uint32 per member and coarse head
    (S >= every head count; threshold >= 2^24: no dropout). Each group's programs read their
    members' blocks where they lie and write the (M, B, T, D) output (and, backward, the one
    (M, B, T, 3D) gradient) in place: no per-group copy, no q/k/v split or concatenation.
    Returns jax_attention's output of each member at its head count. ``interpret`` (static):
    Pallas's interpret mode, for a CPU; the caller decides it for the backend it compiles for
    (attention_choice.resolve_attention), not this process's."""
    return _forward(qkv, seeds, layout, threshold, inv_keep, interpret)[0]


def _members_fwd(qkv, seeds, layout, threshold, inv_keep, interpret):
    out, stats = _forward(qkv, seeds, layout, threshold, inv_keep, interpret)
    return out, (qkv, seeds, out, stats)


def _members_bwd(layout, threshold, inv_keep, interpret, residuals, dout):
    qkv, seeds, out, stats = residuals
    grads = ()
    for group, lse in zip(_groups(layout), stats):
        args = [(qkv, "q"), (qkv, "k"), (qkv, "v"), (out, "tile"), (lse, "rows"), (dout, "tile")]
        grads = _call(
            _backward_kernel, "mhjax_attention_bwd", seeds, args, ("qkv",), group, threshold, inv_keep,
            interpret, grads,
        )  # fmt: skip
    return grads[0], np.zeros(seeds.shape, jax.dtypes.float0)


members_attention.defvjp(_members_fwd, _members_bwd)


def attention(qkv, seeds, heads: int, threshold: int, inv_keep: float, interpret: bool):
    """Causal attention of one (B, T, 3D) float32 fused projection at ``heads`` (static) heads
    of dim D/heads, dropout seeds (heads, 2) uint32 per head (threshold >= 2^24: no dropout).
    Returns the (B, T, D) heads' outputs before the output projection: jax_attention's,
    computed on chip (members_attention of one member; the member axis is a free reshape);
    ``interpret`` as there."""
    return members_attention(qkv[None], seeds[None], ((1, heads),), threshold, inv_keep, interpret)[0]


class KernelCost(NamedTuple):
    flops: float
    bytes: float
    dot_flops: float  # of ``flops``, the matmuls' (TF32 on a GPU's tensor cores)


def kernel_cost(batch: int, length: int, width: int, heads: int) -> KernelCost:
    """FLOPs and HBM bytes of one forward and backward of the kernel, counted analytically.
    Bytes: forward reads q, k, v and writes out and the row statistics; backward reads q, k,
    v, out, dout and the statistics and writes dq, dk, dv (fp32). FLOPs: the seven matmuls
    at the padded block sizes the programs compute (2 forward, 5 backward), plus ~60
    elementwise operations per block element (scale, mask, softmax, dropout hash twice)."""
    rows, cols = block_sizes(length, width // heads)
    tokens = batch * length * width
    nbytes = 4.0 * (12 * tokens + 2 * batch * heads * length)
    dots = batch * heads * 7 * 2 * rows * rows * cols
    return KernelCost(float(dots + batch * heads * 60 * rows * rows), nbytes, float(dots))
