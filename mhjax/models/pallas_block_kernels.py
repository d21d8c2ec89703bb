"""The kernel bodies of pallas_block.py (norm_dense, mlp_block; forward and backward): one program
per chunk of rows, looping over sub-blocks of rows with lax.fori_loop (``rows_loop``), the weights
whole blocks loaded once per program.

Dtypes: x (the residual stream), the output, dx and the row-wise cotangents are read and written
in the activations' dtype, float32 or bfloat16 (config.model.dtype); the matmuls' weights (kernel,
bias, w_in, b_in, w_out, b_out) arrive in the dtype the JAX path's matmuls take them (bfloat16:
the float32 parameters cast per use, as Flax's Dense casts them); the norm's scale is float32.
Inside, as the unfused bfloat16 block (transformer.RMSNorm, attention.dense; docs/bfloat16.md):
the norm's statistics and the normalised rows in float32, each matmul on two operands of the
weights' dtype accumulating in float32 (pl.dot's float32 result), biases, relu, dropout, the
residual add, the norm's gradient and the weight-gradient accumulators in float32, each result
rounded once where it is stored. In float32 every such cast is no cast (``_as``): the float32
program is the one before bfloat16 existed.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from mhjax.models.dropout_hash import NO_DROPOUT, hash_mix
from mhjax.models.pallas_attention import MIN_DOT

RMS_EPS = float(np.finfo(np.float32).eps)  # transformer.RMSNorm's epsilon (float32 machine epsilon)


def pad(n: int) -> int:
    """A size padded on chip: a power of two >= MIN_DOT."""
    return max(MIN_DOT, pl.next_power_of_2(n))


class Dims(NamedTuple):
    rows: int  # N, the real rows
    chunk: int
    sub: int
    width: int  # D
    hidden: int  # M (mlp_block) or F (norm_dense)


def _as(x, dtype):
    """x in ``dtype``; x itself when it is already (no convert in the float32 program)."""
    return x if x.dtype == dtype else x.astype(dtype)


def _wide(x):
    return _as(x, jnp.float32)


def _cols(n: int):
    return jnp.arange(pad(n)) < n


def _load(ref, *valid):
    """A whole weight block (1-D or 2-D), zeros past the real sizes."""
    mask = valid[0] if len(valid) == 1 else valid[0][:, None] & valid[1][None, :]
    return plgpu.load(ref, mask=mask, other=0.0)


def _rows_loop(dims: Dims, body, init):
    """fori_loop over this program's sub-blocks: body(view of a (rows, W) ref at the sub-block,
    its rows' mask (sub,), their indices in the member (sub,) int32, carry)."""
    first = pl.program_id(0) * dims.chunk  # the chunk's first row in this member

    def step(s, carry):
        start = pl.multiple_of(s * dims.sub, dims.sub)
        row = first + start + jnp.arange(dims.sub)
        view = lambda ref: ref.at[pl.ds(start, dims.sub)]  # noqa: E731
        return body(view, row < dims.rows, row, carry)

    return jax.lax.fori_loop(0, dims.chunk // dims.sub, step, init)


def _norm(x, scale, width: int):
    """(1 / rms (R,), x / rms, x / rms * scale) of float32 x; padded columns of x are zeros, so sum /
    width is the mean."""
    inv = jax.lax.rsqrt(jnp.sum(x * x, axis=1) / width + RMS_EPS)
    xn = x * inv[:, None]
    return inv, xn, xn * scale[None, :]


def _norm_grad(dxn, xn, inv, width: int):
    """d loss / d x from d loss / d (x / rms)."""
    return inv[:, None] * (dxn - xn * (jnp.sum(dxn * xn, axis=1) / width)[:, None])


def _dropout(seed, value, row, threshold: int, inv_keep: float):
    """HashDropout of a (R, C) block whose rows are ``row`` (the member's flattened b * T + t)."""
    if threshold >= NO_DROPOUT:
        return value
    col = jnp.arange(value.shape[1]).astype(jnp.uint32)
    bits = hash_mix(seed[0], seed[1], row.astype(jnp.uint32)[:, None], col[None, :])
    return jnp.where((bits >> 8) < jnp.uint32(threshold), value * inv_keep, 0.0)


def norm_dense_fwd(x_ref, scale_ref, kernel_ref, bias_ref, out_ref, *, dims):
    cd, cf = _cols(dims.width), _cols(dims.hidden)
    scale, kernel, bias = _load(scale_ref, cd), _load(kernel_ref, cd, cf), _wide(_load(bias_ref, cf))

    def body(view, row, _, carry):
        x = _wide(plgpu.load(view(x_ref), mask=row[:, None] & cd[None, :], other=0.0))
        y = pl.dot(_as(_norm(x, scale, dims.width)[2], kernel.dtype), kernel) + bias[None, :]
        plgpu.store(view(out_ref), _as(y, out_ref.dtype), mask=row[:, None] & cf[None, :])
        return carry

    _rows_loop(dims, body, 0)


def norm_dense_bwd(x_ref, dy_ref, scale_ref, kernel_ref, dx_ref, dscale_ref, dkernel_ref, dbias_ref, *, dims):
    cd, cf = _cols(dims.width), _cols(dims.hidden)
    scale, kernel = _load(scale_ref, cd), _load(kernel_ref, cd, cf)

    def body(view, row, _, acc):
        dscale, dkernel, dbias = acc
        x = _wide(plgpu.load(view(x_ref), mask=row[:, None] & cd[None, :], other=0.0))
        dy = plgpu.load(view(dy_ref), mask=row[:, None] & cf[None, :], other=0.0)  # padded rows: zero gradient
        inv, xn, xs = _norm(x, scale, dims.width)
        dxs = pl.dot(dy, kernel, trans_b=True)
        dx = _norm_grad(dxs * scale[None, :], xn, inv, dims.width)
        plgpu.store(view(dx_ref), _as(dx, dx_ref.dtype), mask=row[:, None] & cd[None, :])
        return (
            dscale + jnp.sum(dxs * xn, axis=0),
            dkernel + pl.dot(_as(xs, kernel.dtype), dy, trans_a=True),
            dbias + jnp.sum(_wide(dy), axis=0),
        )

    init = (jnp.zeros(cd.shape), jnp.zeros((cd.shape[0], cf.shape[0])), jnp.zeros(cf.shape))
    dscale, dkernel, dbias = _rows_loop(dims, body, init)
    plgpu.store(dscale_ref, dscale, mask=cd)
    plgpu.store(dkernel_ref, dkernel, mask=cd[:, None] & cf[None, :])
    plgpu.store(dbias_ref, dbias, mask=cf)


def mlp_fwd(seed_ref, x_ref, scale_ref, w_in_ref, b_in_ref, w_out_ref, b_out_ref, out_ref, *, dims, drop):
    cd, cm = _cols(dims.width), _cols(dims.hidden)
    scale, w_in, b_in = _load(scale_ref, cd), _load(w_in_ref, cd, cm), _wide(_load(b_in_ref, cm))
    w_out, b_out, seed = _load(w_out_ref, cm, cd), _wide(_load(b_out_ref, cd)), (seed_ref[0], seed_ref[1])
    low = w_in.dtype  # the matmuls' operands

    def body(view, row, index, carry):
        tile = row[:, None] & cd[None, :]
        x = _wide(plgpu.load(view(x_ref), mask=tile, other=0.0))
        h = pl.dot(_as(_norm(x, scale, dims.width)[2], low), w_in) + b_in[None, :]
        z = pl.dot(_as(jnp.maximum(h, 0.0), low), w_out) + b_out[None, :]
        plgpu.store(view(out_ref), _as(x + _dropout(seed, z, index, *drop), out_ref.dtype), mask=tile)
        return carry

    _rows_loop(dims, body, 0)


def mlp_bwd(
    seed_ref, x_ref, dout_ref, scale_ref, w_in_ref, b_in_ref, w_out_ref,
    dx_ref, dscale_ref, dw_in_ref, db_in_ref, dw_out_ref, db_out_ref, *, dims, drop,
):  # fmt: skip
    cd, cm = _cols(dims.width), _cols(dims.hidden)
    scale, w_in, b_in = _load(scale_ref, cd), _load(w_in_ref, cd, cm), _wide(_load(b_in_ref, cm))
    w_out, seed = _load(w_out_ref, cm, cd), (seed_ref[0], seed_ref[1])
    low = w_in.dtype  # the matmuls' operands

    def body(view, row, index, acc):
        dscale, dw_in, db_in, dw_out, db_out = acc
        tile = row[:, None] & cd[None, :]
        x = _wide(plgpu.load(view(x_ref), mask=tile, other=0.0))
        dout = _wide(plgpu.load(view(dout_ref), mask=tile, other=0.0))  # padded rows: zero gradient everywhere below
        inv, xn, xs = _norm(x, scale, dims.width)
        xs = _as(xs, low)
        h = pl.dot(xs, w_in) + b_in[None, :]
        dz = _dropout(seed, dout, index, *drop)  # the forward's keep decisions, recomputed
        dz_low = _as(dz, low)
        dh = jnp.where(h > 0.0, pl.dot(dz_low, w_out, trans_b=True), 0.0)  # relu'(0) = 0, as jax.nn.relu
        dh_low = _as(dh, low)
        dxs = pl.dot(dh_low, w_in, trans_b=True)
        dx = dout + _norm_grad(dxs * scale[None, :], xn, inv, dims.width)  # the residual's gradient plus the norm's
        plgpu.store(view(dx_ref), _as(dx, dx_ref.dtype), mask=tile)
        return (
            dscale + jnp.sum(dxs * xn, axis=0),
            dw_in + pl.dot(xs, dh_low, trans_a=True),
            db_in + jnp.sum(dh, axis=0),
            dw_out + pl.dot(_as(jnp.maximum(h, 0.0), low), dz_low, trans_a=True),
            db_out + jnp.sum(dz, axis=0),
        )

    d, m = cd.shape[0], cm.shape[0]
    init = (jnp.zeros(d), jnp.zeros((d, m)), jnp.zeros(m), jnp.zeros((m, d)), jnp.zeros(d))
    partials = _rows_loop(dims, body, init)
    masks = (cd, cd[:, None] & cm[None, :], cm, cm[:, None] & cd[None, :], cd)
    for ref, value, mask in zip((dscale_ref, dw_in_ref, db_in_ref, dw_out_ref, db_out_ref), partials, masks):
        plgpu.store(ref, value, mask=mask)
