"""A fused causal attention core for GPUs in Pallas (Triton lowering), forward and backward,
tiled over queries and keys (flash attention): any sequence length, memory linear in T.

One program per (member, batch row, head, tile of queries or keys); the kernel bodies are
pallas_flash.py's. A (block, block) tile of scores, probabilities and dropout mask lives in
registers and shared memory only. HBM holds the (B, T, D) inputs and outputs and the (B, H, T)
log-sum-exp of each row, saved by the forward so that the backward recomputes the
probabilities instead of storing them. Dropout is mhjax's counter-based hash
(dropout_hash.hash_mix) recomputed in both passes from the head's seed and the element's
(b * T + i, j) position, with the UNPADDED length T: the JAX path's keep decisions exactly,
whatever the tiling. The causal mask ends each loop at the diagonal tile: fully masked tiles
are never computed.

Float32 or bfloat16 (config.model.dtype, models/precision.py): the kernel reads q, k, v (and
backward out and dout) in the projection's own dtype, accumulates scores, softmax statistics,
output and gradients in float32 (pallas_flash.py), and writes the output and the gradient in
that dtype, as the JAX path returns them; the row log-sum-exps are float32. Under bfloat16 the
kernel's (B, T, ...) traffic is half float32's.

q, k and v are read where the model's one projection matmul wrote them: its (B, T, 3D) output
viewed as (B, T, 3, H, D/H) (a free reshape, no split or transposed copy), and the backward
writes the one (B, T, 3D) gradient of it. Under one_program's member layout the arrays are
every member's (M, B, T, ...), and each group of members is read and written at its offset
on the member axis (members_attention). The Triton lowering wants every loaded block a power
of two and every matmul dimension >= 16, so tiles have power-of-two rows >= 16 (block_sizes)
and D/H is padded to >= 16 and a power of two: the padding exists only on chip, as masked
loads (zeros) and masked stores.

On a CPU the same kernel runs in Pallas interpret mode (how CI tests it): ``interpret`` is a
static argument, decided by models/attention_choice.py for the backend compiled for. On a GPU
matmuls use the lowering's default precision (TF32, like XLA's default for fp32 dots).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from mhjax.models.pallas_flash import backward_kernel, forward_kernel

MIN_DOT = 16  # every dimension of a Triton matmul
# The tile rule, by padded head columns C: (largest C, forward tile rows, backward tile rows,
# warps). The forward holds a (tile, tile) score tile beside (tile, C) q and an output
# accumulator; the backward holds dk, dv accumulators, this tile's k and v, a query tile's q,
# dout and out (tile, C) each and three (tile, tile) tiles (p, dp, ds), so it takes smaller
# tiles and more warps (threads to share them) at wide heads. Chosen so that ptxas reports no
# spill for sm_90 at T = 100 and 1,024 and head dims up to 128 (benchmarks/studies/attention_ptxas.py,
# with dropout; benchmarks/RESULTS.md). Beyond 128 columns the backward spills ~1 KB per thread
# even at 16-row tiles (no wider head arises at mhjax's widths under parameter matching).
TILE_RULE = ((32, 64, 64, 4), (64, 64, 32, 8), (128, 32, 16, 8), (None, 16, 16, 8))
NUM_STAGES = 2  # software pipelining of the tile loops' loads
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))  # of q, k, v (the row statistics: float32)


class Blocks(NamedTuple):
    """A program's tile rows (forward: a query tile and each key tile it loops over; backward:
    the tile of keys for dk, dv and of queries for dq), the padded head columns and the warps
    of both kernels."""

    forward: int
    backward: int
    cols: int
    warps: int


def block_sizes(length: int, head_dim: int) -> Blocks:
    """Tiles for sequences of ``length`` and heads of ``head_dim``: the rule. Columns: D/H padded
    to a power of two >= 16. Rows: the sequence padded to a power of two >= 16, capped by
    TILE_RULE's row for those columns (forward 64 up to 64 columns, backward 64 up to 32 and 32
    at 64; wider heads smaller tiles). A short sequence is one tile (T = 32: 32 rows)."""
    cols = max(MIN_DOT, pl.next_power_of_2(head_dim))
    rows = max(MIN_DOT, pl.next_power_of_2(length))
    _, forward, backward, warps = next(rule for rule in TILE_RULE if rule[0] is None or cols <= rule[0])
    return Blocks(min(rows, forward), min(rows, backward), cols, warps)


def check_lowering(length: int, width: int, heads: int, dtype) -> Blocks:
    """The Triton lowering's constraints, checked here so that interpret mode (which accepts
    any shape) fails where the device would. Returns the block sizes."""
    if width % heads:
        raise ValueError(f"pallas attention: {heads} heads do not divide width {width}")
    if jnp.dtype(dtype) not in DTYPES:
        raise ValueError(f"pallas attention: float32 or bfloat16 inputs only, got {jnp.dtype(dtype)}")
    blocks = block_sizes(length, width // heads)
    for size in blocks[:3]:
        if size < MIN_DOT or size & (size - 1):
            raise ValueError(f"pallas attention: block {blocks} not powers of two >= {MIN_DOT}")
    return blocks


Layout = tuple[tuple[int, int], ...]  # (members, heads) per group, in member-axis order (attention.Layout)


def _call(kernel, name, seeds, args, outs, group, threshold, inv_keep, interpret, into=()):
    """pallas_call of ``kernel`` for one group of members over a (members, batch, heads, tiles)
    grid. group = (first member, members, heads). seeds (M, S >= heads, 2) uint32; args are
    (array, kind), read at the group's offset on the member axis; kinds: 'q', 'k', 'v' the
    (M, B, T, 3D) projection of every member (viewed as (M, B, T, 3, H, D/H)), read at this
    head's query, key or value columns, the whole sequence ('q_tile': the program's tile of
    queries); 'tile' an (M, B, T, D) array (viewed as (M, B, T, H, D/H)), the whole sequence
    ('out_tile': the program's tile); 'qkv' a (M, B, T, 3D) output, written at all three of
    this head's column blocks of the program's tile; 'rows' the group's own (members, B, H, T)
    row statistics, the whole sequence ('rows_tile': the program's tile). The whole sequence
    is a block of the tiles' rows times their count (past T: masked on chip). Outputs are in the
    projection's dtype, but 'rows_tile' (float32 statistics). ``into``:
    arrays the first outputs are written into in place (input_output_aliases), another
    group's members left as they are; without them the other members' blocks of an output
    are not written."""
    first, count, heads = group
    members, batch, length, width = args[0][0].shape  # args[0]: the projection's query columns
    width //= 3
    dtype = args[0][0].dtype
    blocks = check_lowering(length, width, heads, dtype)
    block = blocks.forward if kernel is forward_kernel else blocks.backward
    tiles, cols, head_dim = pl.cdiv(length, block), blocks.cols, width // heads
    whole = tiles * block
    fused = (members, batch, length, 3, heads, head_dim)
    shapes = {"tile": (members, batch, length, heads, head_dim), "rows": (count, batch, heads, length), "qkv": fused}
    shapes.update(q=fused, k=fused, v=fused, q_tile=fused, out_tile=shapes["tile"], rows_tile=shapes["rows"])

    def part(c, rows, tiled):
        return pl.BlockSpec(
            (None, None, rows, None, None, cols), lambda m, b, h, t: (m + first, b, t if tiled else 0, c, h, 0)
        )

    specs = {
        "tile": pl.BlockSpec((None, None, whole, None, cols), lambda m, b, h, t: (m + first, b, 0, h, 0)),
        "out_tile": pl.BlockSpec((None, None, block, None, cols), lambda m, b, h, t: (m + first, b, t, h, 0)),
        "qkv": pl.BlockSpec((None, None, block, 4, None, cols), lambda m, b, h, t: (m + first, b, t, 0, h, 0)),
        "rows": pl.BlockSpec((None, None, None, whole), lambda m, b, h, t: (m, b, h, 0)),
        "rows_tile": pl.BlockSpec((None, None, None, block), lambda m, b, h, t: (m, b, h, t)),
        "q": part(0, whole, False),
        "q_tile": part(0, block, True),
        "k": part(1, whole, False),
        "v": part(2, whole, False),
    }
    body = functools.partial(kernel, length=length, head_dim=head_dim, threshold=threshold, inv_keep=inv_keep)
    inputs = [(x, kind) for x, kind in args] + [(x, kind) for x, kind in zip(into, outs)]

    def run(*refs):  # the aliased inputs are the outputs' own buffers: the kernel writes, never reads them
        body(*refs[: 1 + len(args)], *refs[1 + len(inputs) :])

    results = pl.pallas_call(
        run,
        grid=(count, batch, heads, tiles),
        in_specs=[pl.BlockSpec((None, None, 2), lambda m, b, h, t: (m + first, h, 0))] + [specs[k] for _, k in inputs],
        out_specs=[specs[kind] for kind in outs],
        out_shape=[jax.ShapeDtypeStruct(shapes[kind], jnp.float32 if kind == "rows_tile" else dtype) for kind in outs],
        input_output_aliases={1 + len(args) + i: i for i in range(len(into))},
        compiler_params=plgpu.CompilerParams(num_warps=blocks.warps, num_stages=NUM_STAGES),
        interpret=interpret,
        name=name,
    )(seeds, *(x.reshape(shapes[kind]) for x, kind in inputs))
    flat = {"out_tile": width, "qkv": 3 * width}
    return [r.reshape(members, batch, length, flat[kind]) if kind in flat else r for r, kind in zip(results, outs)]


def _groups(layout: Layout):
    """(first member, members, heads) of each group."""
    first = 0
    for count, heads in layout:
        yield first, count, heads
        first += count


def _forward(qkv, seeds, layout, threshold, inv_keep, interpret):
    args, out, stats = [(qkv, "q_tile"), (qkv, "k"), (qkv, "v")], (), []
    for group in _groups(layout):
        into = out
        out, lse = _call(
            forward_kernel, "mhjax_attention_fwd", seeds, args, ("out_tile", "rows_tile"), group, threshold, inv_keep,
            interpret, into,
        )  # fmt: skip
        out, stats = (out,), stats + [lse]
    return out[0], stats


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5))
def members_attention(qkv, seeds, layout: Layout, threshold: int, inv_keep: float, interpret: bool):
    """Causal attention of M members from their (M, B, T, 3D) fused projection, float32 or
    bfloat16 (q, k and v side by side on the last axis, as the model's one matmul writes them;
    the output and the gradient in its dtype, float32 accumulation inside), the members
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
            backward_kernel, "mhjax_attention_bwd", seeds, args, ("qkv",), group, threshold, inv_keep,
            interpret, grads,
        )  # fmt: skip
    return grads[0], np.zeros(seeds.shape, jax.dtypes.float0)


members_attention.defvjp(_members_fwd, _members_bwd)


def attention(qkv, seeds, heads: int, threshold: int, inv_keep: float, interpret: bool):
    """Causal attention of one (B, T, 3D) fused projection (float32 or bfloat16) at ``heads`` (static) heads
    of dim D/heads, dropout seeds (heads, 2) uint32 per head (threshold >= 2^24: no dropout).
    Returns the (B, T, D) heads' outputs before the output projection: jax_attention's,
    computed on chip (members_attention of one member; the member axis is a free reshape);
    ``interpret`` as there."""
    return members_attention(qkv[None], seeds[None], ((1, heads),), threshold, inv_keep, interpret)[0]


class KernelCost(NamedTuple):
    flops: float
    bytes: float
    dot_flops: float  # of ``flops``, the matmuls' (TF32 on a GPU's tensor cores)


def kernel_cost(batch: int, length: int, width: int, heads: int, itemsize: int = 4) -> KernelCost:
    """FLOPs and HBM bytes of one forward and backward of the kernel, counted analytically.
    Bytes: forward reads q, k, v and writes out and the row statistics; backward reads q, k,
    v, out, dout and the statistics and writes dq, dk, dv (``itemsize`` bytes each: 4 float32, 2
    bfloat16; the statistics float32), each once: the tiles' re-reads
    of k, v (forward) and q, out, dout (backward) are counted as L2 hits. FLOPs: the matmuls of
    the (query tile, key tile) pairs the causal loops visit (n (n + 1) / 2 of n tiles) at the
    padded tile sizes: 2 forward, 7 backward (4 in the dk/dv loop, 3 in the dq loop), plus ~20
    elementwise operations per tile element and loop (scale, mask, exp, dropout hash)."""
    forward, backward, cols, _ = block_sizes(length, width // heads)

    def pairs(block):  # tile elements the causal loops compute
        tiles = -(-length // block)
        return tiles * (tiles + 1) // 2 * block * block

    tokens = batch * length * width
    nbytes = float(itemsize * 12 * tokens + 4 * 2 * batch * heads * length)
    dots = batch * heads * 2 * cols * (2 * pairs(forward) + 7 * pairs(backward))
    elementwise = batch * heads * 20 * (pairs(forward) + 2 * pairs(backward))
    return KernelCost(float(dots + elementwise), nbytes, float(dots))
