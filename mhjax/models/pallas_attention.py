"""A fused causal attention core for GPUs in Pallas (Triton lowering), forward and backward.

One program per (batch row, head): its (T, T) scores, probabilities and dropout mask live
in registers and shared memory only. HBM holds the (B, T, D) inputs and outputs and the
(B, H, T) log-sum-exp of each row, saved by the forward so that the backward recomputes the
probabilities instead of storing them (flash attention). Dropout is mhjax's counter-based
hash (dropout_hash.hash_mix) recomputed in both passes from the head's seed and the element's
(b * T + i, j) position, with the UNPADDED length T: the JAX path's keep decisions exactly.

q, k and v are read where the model's projection wrote them: a (B, T, D) array viewed as
(B, T, H, D/H) (a free reshape, no transposed copy). The Triton lowering wants every block
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
    """This program's (R, R) dropout keep mask: hash_keep's bits at (b * T + i, j)."""
    first = (pl.program_id(0) * length).astype(jnp.uint32)
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
    seeds_ref, q_ref, k_ref, v_ref, out_ref, lse_ref, dout_ref, dq_ref, dk_ref, dv_ref, *, length, head_dim, threshold,
    inv_keep,
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
    plgpu.store(dv_ref, pl.dot(attended, dout, trans_a=True), mask=tile)
    plgpu.store(dq_ref, pl.dot(ds, k), mask=tile)
    plgpu.store(dk_ref, pl.dot(ds, q, trans_a=True), mask=tile)


def _call(kernel, name, seeds, args, outs, heads, threshold, inv_keep, interpret):
    """pallas_call of ``kernel`` over a (batch, heads) grid. seeds (H, 2) uint32; args and outs
    are (array, kind) and kinds: 'tile' a (B, T, D) array (viewed as (B, T, H, D/H)), 'rows'
    (B, H, T) row statistics."""
    batch, length, width = args[0][0].shape
    rows, cols = check_lowering(length, width, heads, args[0][0].dtype)
    head_dim = width // heads
    shapes = {"tile": (batch, length, heads, head_dim), "rows": (batch, heads, length)}
    specs = {
        "tile": pl.BlockSpec((None, rows, None, cols), lambda b, h: (b, 0, h, 0)),
        "rows": pl.BlockSpec((None, None, rows), lambda b, h: (b, h, 0)),
    }
    body = functools.partial(kernel, length=length, head_dim=head_dim, threshold=threshold, inv_keep=inv_keep)
    results = pl.pallas_call(
        body,
        grid=(batch, heads),
        in_specs=[pl.BlockSpec((None, 2), lambda b, h: (h, 0))] + [specs[kind] for _, kind in args],
        out_specs=[specs[kind] for kind in outs],
        out_shape=[jax.ShapeDtypeStruct(shapes[kind], jnp.float32) for kind in outs],
        compiler_params=plgpu.CompilerParams(num_warps=8 if rows >= 128 else 4, num_stages=1),
        interpret=interpret,
        name=name,
    )(seeds, *(x.reshape(shapes[kind]) for x, kind in args))
    return [r.reshape(batch, length, width) if kind == "tile" else r for r, kind in zip(results, outs)]


def _forward(q, k, v, seeds, heads, threshold, inv_keep, interpret):
    args = [(q, "tile"), (k, "tile"), (v, "tile")]
    outs = ("tile", "rows")
    return _call(_forward_kernel, "mhjax_attention_fwd", seeds, args, outs, heads, threshold, inv_keep, interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def attention(q, k, v, seeds, heads: int, threshold: int, inv_keep: float, interpret: bool):
    """Causal attention of (B, T, D) float32 q, k, v at ``heads`` (static) heads of dim D/heads,
    dropout seeds (heads, 2) uint32 per head (threshold >= 2^24: no dropout). Returns the
    (B, T, D) heads' outputs before the output projection: jax_attention's, computed on chip.
    ``interpret`` (static): Pallas's interpret mode, for a CPU; the caller decides it for the
    backend it compiles for (attention_choice.resolve_attention), not this process's."""
    return _forward(q, k, v, seeds, heads, threshold, inv_keep, interpret)[0]


def _attention_fwd(q, k, v, seeds, heads, threshold, inv_keep, interpret):
    out, lse = _forward(q, k, v, seeds, heads, threshold, inv_keep, interpret)
    return out, (q, k, v, seeds, out, lse)


def _attention_bwd(heads, threshold, inv_keep, interpret, residuals, dout):
    q, k, v, seeds, out, lse = residuals
    args = [(q, "tile"), (k, "tile"), (v, "tile"), (out, "tile"), (lse, "rows"), (dout, "tile")]
    statics = (heads, threshold, inv_keep, interpret)
    dq, dk, dv = _call(_backward_kernel, "mhjax_attention_bwd", seeds, args, ("tile",) * 3, *statics)
    return dq, dk, dv, np.zeros(seeds.shape, jax.dtypes.float0)


attention.defvjp(_attention_fwd, _attention_bwd)


def kernel_cost(batch: int, length: int, width: int, heads: int) -> tuple[float, float]:
    """(FLOPs, HBM bytes) of one forward and backward of the kernel, counted analytically.
    Bytes: forward reads q, k, v and writes out and the row statistics; backward reads q, k,
    v, out, dout and the statistics and writes dq, dk, dv (fp32). FLOPs: the seven matmuls
    at the padded block sizes the programs compute (2 forward, 5 backward), plus ~60
    elementwise operations per block element (scale, mask, softmax, dropout hash twice)."""
    rows, cols = block_sizes(length, width // heads)
    tokens = batch * length * width
    nbytes = 4.0 * (12 * tokens + 2 * batch * heads * length)
    flops = batch * heads * (7 * 2 * rows * rows * cols + 60 * rows * rows)
    return float(flops), nbytes
