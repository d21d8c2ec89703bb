"""Causal attention on a TPU: JAX's shipped Pallas TPU (Mosaic) flash attention
(jax.experimental.pallas.ops.tpu.flash_attention), forward and backward, under
pallas_attention.py's contract where it can hold: any T, causal, every head count of a
program (each group of a member layout at its own static head count), members batched,
float32 and bfloat16. Memory linear in T: no (heads, T, T) map leaves the chip.

Adapted, not written anew: the shipped kernel takes (batch, heads, T', head size) with T' a
multiple of its blocks. Here the (B, T, 3D) projection is split, its heads moved ahead of the
sequence (one transposed copy per array: the kernel's layout) and the sequence zero-padded to
a multiple of BLOCK. The causal mask alone hides the padding: a padded key j >= T lies after
every real query i < T, and a padded query row's output is sliced away, so its gradient is
zero and adds nothing to dk, dv. Members fold into the kernel's batch axis (a free reshape);
under vmap (one member's model mapped over members) the pallas_call's batching rule adds the
member axis to its grid.

What it cannot take: dropout on the probabilities. The shipped kernel has no dropout (its
only extras are an additive bias, which cannot drop a probability after the softmax, and
segment ids), so attention_choice.resolve_attention runs the JAX path on a TPU when
model.dropout > 0, with that reason. Its blocks: BLOCK = 128 rows, the kernel's smallest
(its key blocks must be multiples of the 128 lanes), so T = 100 runs as one padded 128 x 128
tile pair (1.64x the causal work of T = 100, still linear memory); head size 16 occupies 16
of a vreg's 128 lanes in its (block, head size) tiles (the kernel pads on chip).

``interpret`` (static): Pallas's TPU interpret mode, on a CPU (how the tests check values);
the kernel's backward is traced in the same mode (the vjp is taken inside the mode).
"""

from __future__ import annotations

import contextlib
import functools
import math

import jax
import jax.numpy as jnp

BLOCK = 128  # the shipped kernel's default and smallest key block (a multiple of 128 lanes)
DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))
Layout = tuple[tuple[int, int], ...]  # (members, heads) per group, in member-axis order (attention.Layout)


def padded_length(length: int) -> int:
    """T rounded up to a multiple of BLOCK: the sequence the kernel runs."""
    return -(-length // BLOCK) * BLOCK


def _mode(interpret: bool):
    if not interpret:
        return contextlib.nullcontext()
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.force_tpu_interpret_mode()


def _kernel(q, k, v, scale: float):
    from jax.experimental.pallas.ops.tpu import flash_attention as shipped

    length = q.shape[2]
    blocks = shipped.BlockSizes.get_default(*q.shape[:3], length, q.shape[3])  # all BLOCK
    return shipped.flash_attention(q, k, v, causal=True, sm_scale=scale, block_sizes=blocks)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _flash(q, k, v, scale: float, interpret: bool):
    """The shipped kernel on (N, H, T', d) arrays, its forward and backward both traced in
    ``interpret`` mode (a context read when a pallas_call is traced)."""
    with _mode(interpret):
        return _kernel(q, k, v, scale)


def _flash_fwd(q, k, v, scale, interpret):
    with _mode(interpret):
        out, backward = jax.vjp(functools.partial(_kernel, scale=scale), q, k, v)
    return out, backward


def _flash_bwd(scale, interpret, backward, dout):
    with _mode(interpret):
        return backward(dout)


_flash.defvjp(_flash_fwd, _flash_bwd)


def check(width: int, heads: int, dtype) -> None:
    """What the kernel takes, checked where interpret mode would accept more."""
    if width % heads:
        raise ValueError(f"pallas tpu attention: {heads} heads do not divide width {width}")
    if jnp.dtype(dtype) not in DTYPES:
        raise ValueError(f"pallas tpu attention: float32 or bfloat16 inputs only, got {jnp.dtype(dtype)}")


def attention(qkv, heads: int, interpret: bool):
    """Causal attention of (N, T, 3D) fused projections (q, k, v side by side, float32 or
    bfloat16) at ``heads`` (static) heads of size D/heads: the (N, T, D) heads' outputs before
    the output projection, jax_attention's without dropout, in qkv's dtype."""
    count, length, width = qkv.shape
    width //= 3
    check(width, heads, qkv.dtype)
    size = width // heads
    pad = padded_length(length) - length

    def heads_first(x):  # (N, T, D) -> (N, H, T', d)
        x = x.reshape(count, length, heads, size).transpose(0, 2, 1, 3)
        return jnp.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) if pad else x

    q, k, v = (heads_first(x) for x in jnp.split(qkv, 3, axis=-1))
    out = _flash(q, k, v, 1.0 / math.sqrt(size), interpret)[:, :, :length]
    return out.transpose(0, 2, 1, 3).reshape(count, length, width)


def members_attention(qkv, layout: Layout, interpret: bool):
    """Causal attention of M members from their (M, B, T, 3D) projections, the members in
    ``layout`` groups ((members, heads), ... along the member axis; static), each group at
    its own head count: (M, B, T, D). One kernel call per group, its members folded into the
    kernel's batch axis."""
    members, batch, length, width = qkv.shape
    outs, first = [], 0
    for count, heads in layout:
        group = qkv[first : first + count].reshape(count * batch, length, width)
        outs.append(attention(group, heads, interpret).reshape(count, batch, length, width // 3))
        first += count
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs)
