"""Fused Pallas kernels (Triton lowering) for the Transformer block's row-wise parts, forward and backward.

- ``norm_dense``: rmsnorm(x) * scale @ kernel + bias, the pre-norm fused into the matmul that
  consumes it (the attention half's ln1 and qkv projection);
- ``mlp_block``: x + dropout(relu(rmsnorm(x) * scale @ w_in + b_in) @ w_out + b_out), Block's
  whole MLP half with its residual add.

The leading axes are flattened to N rows (a free reshape). Each program owns a chunk of
``chunk_rows(N)`` rows (4 to 8 programs per member where N allows) and loops over sub-blocks
of ``STEP_ROWS`` rows; the weights are whole blocks read once per program. Neither kernel
stores the normalised x or the MLP's hidden activation: the backward recomputes rms, the
normalised x, h = xn @ w_in + b_in, relu and the dropout's keep decisions from x, and
accumulates the weight gradients over its chunk in the loop carry, writing ONE partial per
program ((programs, ...) arrays, summed by the wrapper in JAX), so HBM traffic is the
activations plus a few weight-sized partials. Dropout is mhjax's counter-based
hash (dropout_hash.hash_mix) of (row within the member, column): HashDropout's keep decisions
exactly, recomputed in the backward.

The Triton lowering wants every block dimension a power of two and every matmul dimension
>= 16: rows, the width, the hidden width and the output features are padded on chip only
(masked loads give zeros, masked stores drop the padding), e.g. F = 192 is computed as 256.
Under jax.vmap (the model's member axis) pallas_call adds a grid axis; program_id(0) stays
the chunk index, so row offsets (and dropout rows) are the member's own.

On a CPU the kernels run in Pallas interpret mode (``interpret``, static, as in
pallas_attention.py); on a GPU the matmuls use the lowering's default precision (TF32).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from mhjax.models.dropout_hash import NO_DROPOUT, hash_mix
from mhjax.models.pallas_attention import MIN_DOT, KernelCost

RMS_EPS = float(np.finfo(np.float32).eps)  # transformer.RMSNorm's epsilon (float32 machine epsilon)
MIN_CHUNK, MAX_CHUNK = 64, 1024  # rows per program: more programs write more weight-gradient partials
PROGRAMS = 8  # programs per member to aim for (at most; at least PROGRAMS / 2 where N allows)
# Rows per loop step of each kernel: at the paper's shape (D 64, M 128, F 192 as 256) the largest
# whose registers fit without spilling (ptxas -v on the deviceless sm_90a compile; the backward
# kernels hold the weights and their gradients' accumulators, norm_dense's 64 x 256 each).
STEP_ROWS = {"norm_dense_fwd": 32, "norm_dense_bwd": 16, "mlp_block_fwd": 32, "mlp_block_bwd": 32}
WARPS, STAGES = 8, 3  # pipelined: the loop's row loads are prefetched (cp.async); 3: no spill either
MAX_DIM = 256  # padded width, hidden width and features: whole weight blocks in one program
# Padded weight elements a program may hold: the backward keeps each weight block beside its
# gradient's accumulator in shared memory, 227 KiB per block on sm_90 (the H200). Found by the
# deviceless compile of each kernel's forward and backward (benchmarks/block_fit.py): norm_dense
# compiles at D x F = 128 x 256 and fails at 256 x 256, 128 x 512, 64 x 1,024; mlp_block (two
# weights) compiles at D x M = 64 x 128, 32 x 256, 16 x 512, 128 x 64 and fails at 64 x 256 and
# 128 x 128 ("Shared memory size limit exceeded: requested 303,104, available: 232,448").
MAX_ELEMENTS = {"norm_dense": 128 * 256, "mlp_block": 64 * 128}


def _pad(n: int) -> int:
    return max(MIN_DOT, pl.next_power_of_2(n))


def chunk_rows(rows: int) -> int:
    """Rows per program (a power of two) for ``rows`` rows."""
    return max(MIN_CHUNK, min(MAX_CHUNK, pl.next_power_of_2(pl.cdiv(rows, PROGRAMS))))


class Dims(NamedTuple):
    rows: int  # N, the real rows
    chunk: int
    sub: int
    width: int  # D
    hidden: int  # M (mlp_block) or F (norm_dense)


def _cols(n: int):
    return jnp.arange(_pad(n)) < n


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
    """(1 / rms (R,), x / rms, x / rms * scale); padded columns of x are zeros, so sum / width is the mean."""
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


def _norm_dense_fwd_kernel(x_ref, scale_ref, kernel_ref, bias_ref, out_ref, *, dims):
    cd, cf = _cols(dims.width), _cols(dims.hidden)
    scale, kernel, bias = _load(scale_ref, cd), _load(kernel_ref, cd, cf), _load(bias_ref, cf)

    def body(view, row, _, carry):
        x = plgpu.load(view(x_ref), mask=row[:, None] & cd[None, :], other=0.0)
        y = pl.dot(_norm(x, scale, dims.width)[2], kernel) + bias[None, :]
        plgpu.store(view(out_ref), y, mask=row[:, None] & cf[None, :])
        return carry

    _rows_loop(dims, body, 0)


def _norm_dense_bwd_kernel(x_ref, dy_ref, scale_ref, kernel_ref, dx_ref, dscale_ref, dkernel_ref, dbias_ref, *, dims):
    cd, cf = _cols(dims.width), _cols(dims.hidden)
    scale, kernel = _load(scale_ref, cd), _load(kernel_ref, cd, cf)

    def body(view, row, _, acc):
        dscale, dkernel, dbias = acc
        x = plgpu.load(view(x_ref), mask=row[:, None] & cd[None, :], other=0.0)
        dy = plgpu.load(view(dy_ref), mask=row[:, None] & cf[None, :], other=0.0)  # padded rows: zero gradient
        inv, xn, xs = _norm(x, scale, dims.width)
        dxs = pl.dot(dy, kernel, trans_b=True)
        dx = _norm_grad(dxs * scale[None, :], xn, inv, dims.width)
        plgpu.store(view(dx_ref), dx, mask=row[:, None] & cd[None, :])
        return dscale + jnp.sum(dxs * xn, axis=0), dkernel + pl.dot(xs, dy, trans_a=True), dbias + jnp.sum(dy, axis=0)

    init = (jnp.zeros(cd.shape), jnp.zeros((cd.shape[0], cf.shape[0])), jnp.zeros(cf.shape))
    dscale, dkernel, dbias = _rows_loop(dims, body, init)
    plgpu.store(dscale_ref, dscale, mask=cd)
    plgpu.store(dkernel_ref, dkernel, mask=cd[:, None] & cf[None, :])
    plgpu.store(dbias_ref, dbias, mask=cf)


def _mlp_fwd_kernel(seed_ref, x_ref, scale_ref, w_in_ref, b_in_ref, w_out_ref, b_out_ref, out_ref, *, dims, drop):
    cd, cm = _cols(dims.width), _cols(dims.hidden)
    scale, w_in, b_in = _load(scale_ref, cd), _load(w_in_ref, cd, cm), _load(b_in_ref, cm)
    w_out, b_out, seed = _load(w_out_ref, cm, cd), _load(b_out_ref, cd), (seed_ref[0], seed_ref[1])

    def body(view, row, index, carry):
        tile = row[:, None] & cd[None, :]
        x = plgpu.load(view(x_ref), mask=tile, other=0.0)
        h = pl.dot(_norm(x, scale, dims.width)[2], w_in) + b_in[None, :]
        z = pl.dot(jnp.maximum(h, 0.0), w_out) + b_out[None, :]
        plgpu.store(view(out_ref), x + _dropout(seed, z, index, *drop), mask=tile)
        return carry

    _rows_loop(dims, body, 0)


def _mlp_bwd_kernel(
    seed_ref, x_ref, dout_ref, scale_ref, w_in_ref, b_in_ref, w_out_ref,
    dx_ref, dscale_ref, dw_in_ref, db_in_ref, dw_out_ref, db_out_ref, *, dims, drop,
):  # fmt: skip
    cd, cm = _cols(dims.width), _cols(dims.hidden)
    scale, w_in, b_in = _load(scale_ref, cd), _load(w_in_ref, cd, cm), _load(b_in_ref, cm)
    w_out, seed = _load(w_out_ref, cm, cd), (seed_ref[0], seed_ref[1])

    def body(view, row, index, acc):
        dscale, dw_in, db_in, dw_out, db_out = acc
        tile = row[:, None] & cd[None, :]
        x = plgpu.load(view(x_ref), mask=tile, other=0.0)
        dout = plgpu.load(view(dout_ref), mask=tile, other=0.0)  # padded rows: zero gradient everywhere below
        inv, xn, xs = _norm(x, scale, dims.width)
        h = pl.dot(xs, w_in) + b_in[None, :]
        dz = _dropout(seed, dout, index, *drop)  # the forward's keep decisions, recomputed
        dh = jnp.where(h > 0.0, pl.dot(dz, w_out, trans_b=True), 0.0)  # relu'(0) = 0, as jax.nn.relu
        dxs = pl.dot(dh, w_in, trans_b=True)
        dx = dout + _norm_grad(dxs * scale[None, :], xn, inv, dims.width)  # the residual's gradient plus the norm's
        plgpu.store(view(dx_ref), dx, mask=tile)
        return (
            dscale + jnp.sum(dxs * xn, axis=0),
            dw_in + pl.dot(xs, dh, trans_a=True),
            db_in + jnp.sum(dh, axis=0),
            dw_out + pl.dot(jnp.maximum(h, 0.0), dz, trans_a=True),
            db_out + jnp.sum(dz, axis=0),
        )

    d, m = cd.shape[0], cm.shape[0]
    init = (jnp.zeros(d), jnp.zeros((d, m)), jnp.zeros(m), jnp.zeros((m, d)), jnp.zeros(d))
    partials = _rows_loop(dims, body, init)
    masks = (cd, cd[:, None] & cm[None, :], cm, cm[:, None] & cd[None, :], cd)
    for ref, value, mask in zip((dscale_ref, dw_in_ref, db_in_ref, dw_out_ref, db_out_ref), partials, masks):
        plgpu.store(ref, value, mask=mask)


def _call(kernel, name, hidden: int, rowwise, weights, outs, partials, interpret, seed=None, **static):
    """pallas_call of ``kernel`` (mhjax_``name``) over the chunks of N rows, of x (``rowwise[0]``,
    (N, D)) and a hidden width ``hidden``. Refs in order: ``seed`` (2,) if any, ``rowwise`` (N, W)
    arrays, ``weights`` (whole blocks), then outputs: (N, W) for each W in ``outs`` and a
    (programs, *shape) partial for each shape in ``partials``."""
    rows, width = rowwise[0].shape
    dims = Dims(rows, chunk_rows(rows), STEP_ROWS[name], width, hidden)
    programs = pl.cdiv(dims.rows, dims.chunk)
    padded = lambda shape: tuple(_pad(n) for n in shape)  # noqa: E731
    whole = lambda shape: pl.BlockSpec(padded(shape), lambda i: (0,) * len(shape))  # noqa: E731
    row_spec = lambda width: pl.BlockSpec((dims.chunk, _pad(width)), lambda i: (i, 0))  # noqa: E731
    in_specs = [row_spec(x.shape[1]) for x in rowwise] + [whole(w.shape) for w in weights]
    args = [*rowwise, *weights]
    if seed is not None:
        in_specs, args = [pl.BlockSpec((2,), lambda i: (0,))] + in_specs, [seed, *args]
    partial_spec = lambda shape: pl.BlockSpec((None, *padded(shape)), lambda i: (i,) + (0,) * len(shape))  # noqa: E731
    out_specs = [row_spec(width) for width in outs] + [partial_spec(shape) for shape in partials]
    out_shape = [jax.ShapeDtypeStruct((dims.rows, width), jnp.float32) for width in outs]
    out_shape += [jax.ShapeDtypeStruct((programs, *shape), jnp.float32) for shape in partials]
    return pl.pallas_call(
        functools.partial(kernel, dims=dims, **static),
        grid=(programs,),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=WARPS, num_stages=STAGES),
        interpret=interpret,
        name=f"mhjax_{name}",
    )(*args)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _norm_dense(x, scale, kernel, bias, interpret):
    args = ([x], [scale, kernel, bias], [kernel.shape[1]], [])
    return _call(_norm_dense_fwd_kernel, "norm_dense_fwd", kernel.shape[1], *args, interpret)[0]


def _norm_dense_fwd(x, scale, kernel, bias, interpret):
    return _norm_dense(x, scale, kernel, bias, interpret), (x, scale, kernel)


def _norm_dense_bwd(interpret, residuals, dy):
    x, scale, kernel = residuals
    width, features = kernel.shape
    partials = [(width,), (width, features), (features,)]
    dx, *parts = _call(
        _norm_dense_bwd_kernel, "norm_dense_bwd", features, [x, dy], [scale, kernel], [width], partials, interpret
    )
    return (dx, *(p.sum(axis=0) for p in parts))


_norm_dense.defvjp(_norm_dense_fwd, _norm_dense_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _mlp(x, scale, w_in, b_in, w_out, b_out, seed, threshold, inv_keep, interpret):
    args = ([x], [scale, w_in, b_in, w_out, b_out], [x.shape[1]], [])
    return _call(_mlp_fwd_kernel, "mlp_block_fwd", w_in.shape[1], *args, interpret, seed, drop=(threshold, inv_keep))[0]


def _mlp_fwd(x, scale, w_in, b_in, w_out, b_out, seed, threshold, inv_keep, interpret):
    out = _mlp(x, scale, w_in, b_in, w_out, b_out, seed, threshold, inv_keep, interpret)
    return out, (x, scale, w_in, b_in, w_out, seed)


def _mlp_bwd(threshold, inv_keep, interpret, residuals, dout):
    x, scale, w_in, b_in, w_out, seed = residuals
    width, hidden = w_in.shape
    partials = [(width,), (width, hidden), (hidden,), (hidden, width), (width,)]
    dx, *parts = _call(
        _mlp_bwd_kernel, "mlp_block_bwd", hidden, [x, dout], [scale, w_in, b_in, w_out], [width], partials,
        interpret, seed, drop=(threshold, inv_keep),
    )  # fmt: skip
    return (dx, *(p.sum(axis=0) for p in parts), np.zeros(seed.shape, jax.dtypes.float0))


_mlp.defvjp(_mlp_fwd, _mlp_bwd)


def fits(width: int, hidden: int, kernel: str = "norm_dense") -> bool:
    """Whether ``kernel``'s whole weight blocks of D = ``width`` and F or M = ``hidden`` fit one
    program: each padded size within MAX_DIM, their product within MAX_ELEMENTS[kernel]."""
    d, h = _pad(width), _pad(hidden)
    return d <= MAX_DIM and h <= MAX_DIM and d * h <= MAX_ELEMENTS[kernel]


def block_parts(width: int, mlp_dim: int, attention_width: int | None = None) -> tuple[bool, bool]:
    """Which of a Transformer block's parts run as kernels: (the pre-norm and q/k/v projection
    as norm_dense, the MLP half as mlp_block), where their weights fit one program (``fits``);
    the others are XLA's. ``attention_width``: q, k and v's width A (None: the width).

    Beyond the budget the norms and MLP are XLA's; tiled weights are not built. Decided from the
    deviceless H200 compile (benchmarks/block_rule.py; docs/performance.md, "The block kernels'
    rule"): GB per member-step, kernels 0.36 against XLA 0.77 at width 64; XLA 2.84 at 256 and 8.75
    at 1,024. The step stays memory-bound to width ~512 (28 FLOP per byte at 256), so tiling is
    worth building for widths 128-512; at 1,024 the dots bound it (~20 % to gain)."""
    return fits(width, 3 * (attention_width or width)), fits(width, mlp_dim, "mlp_block")


def _check(fn: str, x, **arrays):
    """ValueError naming the argument: float32 arrays of the given shapes (ints or names of free sizes)."""
    if x.dtype != jnp.float32:
        raise ValueError(f"pallas_block.{fn}: x must be float32, got {x.dtype}")
    if x.ndim < 1:
        raise ValueError(f"pallas_block.{fn}: x must have shape (..., D), got {x.shape}")
    for name, (array, want) in arrays.items():
        dtype = jnp.uint32 if name == "seed" else jnp.float32
        if array.dtype != dtype:
            raise ValueError(f"pallas_block.{fn}: {name} must be {jnp.dtype(dtype).name}, got {array.dtype}")
        if len(array.shape) != len(want) or any(isinstance(w, int) and w != n for w, n in zip(want, array.shape)):
            raise ValueError(
                f"pallas_block.{fn}: {name} must have shape ({', '.join(map(str, want))}), got {array.shape}"
            )
    for name, n in (("D", x.shape[-1]), *((f"{name}.shape[-1]", a.shape[-1]) for name, (a, _) in arrays.items())):
        if _pad(n) > MAX_DIM:
            raise ValueError(f"pallas_block.{fn}: {name} = {n} > {MAX_DIM} (whole weight blocks in one program)")
    hidden = arrays["kernel" if fn == "norm_dense" else "w_in"][0].shape[-1]
    if not fits(x.shape[-1], hidden, fn):  # what the device's shared memory refuses, refused here too
        raise ValueError(
            f"pallas_block.{fn}: D x {'F' if fn == 'norm_dense' else 'M'} = {x.shape[-1]} x {hidden} padded to "
            f"{_pad(x.shape[-1])} x {_pad(hidden)} > {MAX_ELEMENTS[fn]} weight elements (one program's shared memory)"
        )


def norm_dense(x, scale, kernel, bias, interpret: bool):
    """rmsnorm(x) * scale @ kernel + bias: x (..., D) float32, scale (D,), kernel (D, F), bias
    (F,) -> (..., F), RMSNorm as transformer.RMSNorm (eps RMS_EPS). The backward recomputes the
    norm from x (no normalised copy is stored). ``interpret`` (static): Pallas's interpret mode."""
    width = x.shape[-1]
    features = kernel.shape[-1] if kernel.ndim else 0
    _check("norm_dense", x, scale=(scale, (width,)), kernel=(kernel, (width, "F")), bias=(bias, (features,)))
    out = _norm_dense(x.reshape(-1, width), scale, kernel, bias, interpret)
    return out.reshape(*x.shape[:-1], features)


def mlp_block(x, scale, w_in, b_in, w_out, b_out, seed, threshold: int, inv_keep: float, interpret: bool):
    """x + dropout(relu(rmsnorm(x) * scale @ w_in + b_in) @ w_out + b_out): Block's MLP half with
    its residual add. x (..., D) float32, w_in (D, M), w_out (M, D); seed (2,) uint32 (HashDropout's
    draw); threshold, inv_keep from dropout_hash.dropout_threshold (threshold >= 2^24: no
    dropout). Element (r, c), r the flattened leading index, is kept iff hash_keep keeps it. The
    backward recomputes the norm, the hidden activation and the keep decisions from x."""
    width = x.shape[-1]
    hidden = w_in.shape[-1] if w_in.ndim else 0
    _check(
        "mlp_block", x, scale=(scale, (width,)), w_in=(w_in, (width, "M")), b_in=(b_in, (hidden,)),
        w_out=(w_out, (hidden, width)), b_out=(b_out, (width,)), seed=(seed, (2,)),
    )  # fmt: skip
    out = _mlp(x.reshape(-1, width), scale, w_in, b_in, w_out, b_out, seed, threshold, inv_keep, interpret)
    return out.reshape(x.shape)


def _programs(rows: int) -> tuple[int, int]:
    """(programs, rows computed: whole chunks)."""
    chunk = chunk_rows(rows)
    programs = pl.cdiv(rows, chunk)
    return programs, programs * chunk


def norm_dense_cost(rows: int, width: int, features: int) -> KernelCost:
    """FLOPs and HBM bytes of one forward and backward of norm_dense on ``rows`` rows (fp32).
    Bytes: forward reads x, writes the output; backward reads x and the output's gradient,
    writes dx and one (dscale, dkernel, dbias) partial per program; each program reads the
    weights (scale, kernel, and forward the bias). The wrapper's sum of the partials (an XLA
    reduce) is not counted. FLOPs at the padded sizes the programs compute (whole chunks): 3
    matmuls (1 forward, 2 backward) plus ~16 elementwise operations per element of x and 2 per
    output element (norm, its gradient, the bias and the column sums)."""
    programs, computed = _programs(rows)
    d, f = _pad(width), _pad(features)
    weights = width + width * features + features
    nbytes = 4.0 * (rows * (width + features) + rows * (2 * width + features))
    nbytes += 4.0 * programs * (weights + (weights - features) + weights)
    dots = 3 * 2 * computed * d * f
    return KernelCost(float(dots + computed * (16 * d + 2 * f)), nbytes, float(dots))


def mlp_block_cost(rows: int, width: int, mlp_dim: int) -> KernelCost:
    """FLOPs and HBM bytes of one forward and backward of mlp_block on ``rows`` rows (fp32).
    Bytes: forward reads x, writes the output; backward reads x and the output's gradient,
    writes dx and one partial per program of each weight gradient; each program reads the
    weights (forward all five, backward all but b_out). The dropout seed (8 bytes) and the
    wrapper's sum of the partials are not counted. FLOPs at the padded sizes the programs
    compute (whole chunks): 7 matmuls (2 forward; 5 backward, h recomputed) plus ~53
    elementwise operations per element of x (norm, dropout hash twice, residual, norm
    gradient) and ~6 per hidden element (bias, relu, its gradient, the column sums)."""
    programs, computed = _programs(rows)
    d, m = _pad(width), _pad(mlp_dim)
    weights = 2 * width + 2 * width * mlp_dim + mlp_dim
    nbytes = 4.0 * (2 * rows * width + 3 * rows * width)
    nbytes += 4.0 * programs * (weights + (weights - width) + weights)
    dots = 7 * 2 * computed * d * m
    return KernelCost(float(dots + computed * (53 * d + 6 * m)), nbytes, float(dots))
