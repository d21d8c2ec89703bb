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

Float32 or bfloat16 (config.model.dtype): x and the weights of the matmuls in one dtype (under
bfloat16 the model's float32 parameters cast per use, as the unfused block's Dense layers cast
them), the norm's scale float32; the output, dx and the weight gradients in their inputs' dtypes.
Inside, float32 statistics and accumulation, the unfused bfloat16 block's arithmetic
(pallas_block_kernels.py, which holds the kernel bodies; docs/bfloat16.md); the weight-gradient
partials are float32 and summed in float32 before the cast.

On a CPU the kernels run in Pallas interpret mode (``interpret``, static, as in
pallas_attention.py); on a GPU float32 matmuls use the lowering's default precision (TF32).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from mhjax.models import pallas_block_kernels as kernels
from mhjax.models.dropout_hash import NO_DROPOUT  # noqa: F401 (pallas_block.NO_DROPOUT, callers' name)
from mhjax.models.pallas_attention import KernelCost
from mhjax.models.pallas_block_kernels import RMS_EPS, Dims  # noqa: F401 (RMS_EPS: the kernels' epsilon)
from mhjax.models.pallas_block_kernels import pad as _pad

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
# deviceless compile of each kernel's forward and backward (benchmarks/studies/block_fit.py): norm_dense
# compiles at D x F = 128 x 256 and fails at 256 x 256, 128 x 512, 64 x 1,024; mlp_block (two
# weights) compiles at D x M = 64 x 128, 32 x 256, 16 x 512, 128 x 64 and fails at 64 x 256 and
# 128 x 128 ("Shared memory size limit exceeded: requested 303,104, available: 232,448").
MAX_ELEMENTS = {"norm_dense": 128 * 256, "mlp_block": 64 * 128}
# With bfloat16 x and weights (a bfloat16 model's; the accumulators stay float32) twice as many, by
# the same compile (benchmarks/studies/block_fit.py --dtype bfloat16): norm_dense compiles at 256 x 256
# (every size within MAX_DIM) and fails at 128 x 512 and 64 x 1,024; mlp_block compiles at 128 x
# 128, 64 x 256, 256 x 64, 32 x 256, 16 x 512 and fails at 128 x 256, 256 x 128, 64 x 512 and 32 x
# 1,024 ("requested 270,336" at 128 x 256).
MAX_ELEMENTS_BFLOAT16 = {"norm_dense": 256 * 256, "mlp_block": 128 * 128}


def chunk_rows(rows: int) -> int:
    """Rows per program (a power of two) for ``rows`` rows."""
    return max(MIN_CHUNK, min(MAX_CHUNK, pl.next_power_of_2(pl.cdiv(rows, PROGRAMS))))


def _call(kernel, name, hidden: int, rowwise, weights, outs, partials, interpret, seed=None, **static):
    """pallas_call of ``kernel`` (mhjax_``name``) over the chunks of N rows, of x (``rowwise[0]``,
    (N, D)) and a hidden width ``hidden``. Refs in order: ``seed`` (2,) if any, ``rowwise`` (N, W)
    arrays, ``weights`` (whole blocks), then outputs: (N, W) for each W in ``outs`` and a
    (programs, *shape) partial for each shape in ``partials``. The (N, W) outputs are in x's
    dtype, the partials float32."""
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
    out_shape = [jax.ShapeDtypeStruct((dims.rows, width), rowwise[0].dtype) for width in outs]
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
    return _call(kernels.norm_dense_fwd, "norm_dense_fwd", kernel.shape[1], *args, interpret)[0]


def _norm_dense_fwd(x, scale, kernel, bias, interpret):
    return _norm_dense(x, scale, kernel, bias, interpret), (x, scale, kernel)


def _norm_dense_bwd(interpret, residuals, dy):
    x, scale, kernel = residuals
    width, features = kernel.shape
    partials = [(width,), (width, features), (features,)]
    dx, *parts = _call(
        kernels.norm_dense_bwd, "norm_dense_bwd", features, [x, _as(dy, x.dtype)], [scale, kernel], [width],
        partials, interpret,
    )  # fmt: skip
    return (dx, *_summed(parts, (scale, kernel, kernel)))  # the bias in its kernel's dtype (_check)


def _as(x, dtype):
    return x if x.dtype == dtype else x.astype(dtype)


def _summed(partials, like):
    """Each (programs, ...) float32 partial summed over the programs, in its argument's dtype."""
    return tuple(_as(p.sum(axis=0), a.dtype) for p, a in zip(partials, like))


_norm_dense.defvjp(_norm_dense_fwd, _norm_dense_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _mlp(x, scale, w_in, b_in, w_out, b_out, seed, threshold, inv_keep, interpret):
    args = ([x], [scale, w_in, b_in, w_out, b_out], [x.shape[1]], [])
    return _call(kernels.mlp_fwd, "mlp_block_fwd", w_in.shape[1], *args, interpret, seed, drop=(threshold, inv_keep))[0]


def _mlp_fwd(x, scale, w_in, b_in, w_out, b_out, seed, threshold, inv_keep, interpret):
    out = _mlp(x, scale, w_in, b_in, w_out, b_out, seed, threshold, inv_keep, interpret)
    return out, (x, scale, w_in, b_in, w_out, seed)


def _mlp_bwd(threshold, inv_keep, interpret, residuals, dout):
    x, scale, w_in, b_in, w_out, seed = residuals
    width, hidden = w_in.shape
    partials = [(width,), (width, hidden), (hidden,), (hidden, width), (width,)]
    dx, *parts = _call(
        kernels.mlp_bwd, "mlp_block_bwd", hidden, [x, _as(dout, x.dtype)], [scale, w_in, b_in, w_out], [width],
        partials, interpret, seed, drop=(threshold, inv_keep),
    )  # fmt: skip
    grads = _summed(parts, (scale, w_in, w_in, w_in, w_in))  # every weight in w_in's dtype (_check)
    return (dx, *grads, np.zeros(seed.shape, jax.dtypes.float0))


_mlp.defvjp(_mlp_fwd, _mlp_bwd)


def max_elements(kernel: str, dtype: str = "float32") -> int:
    """The padded weight elements one program of ``kernel`` holds with x and weights in ``dtype``."""
    return (MAX_ELEMENTS_BFLOAT16 if dtype == "bfloat16" else MAX_ELEMENTS)[kernel]


def fits(width: int, hidden: int, kernel: str = "norm_dense", dtype: str = "float32") -> bool:
    """Whether ``kernel``'s whole weight blocks of D = ``width`` and F or M = ``hidden`` fit one
    program: each padded size within MAX_DIM, their product within ``max_elements(kernel,
    dtype)`` (``dtype``: x's and the weights', "float32" or "bfloat16")."""
    d, h = _pad(width), _pad(hidden)
    return d <= MAX_DIM and h <= MAX_DIM and d * h <= max_elements(kernel, dtype)


def block_parts(
    width: int, mlp_dim: int, attention_width: int | None = None, dtype: str = "float32"
) -> tuple[bool, bool]:
    """Which of a Transformer block's parts run as kernels: (the pre-norm and q/k/v projection
    as norm_dense, the MLP half as mlp_block), where their weights fit one program (``fits``);
    the others are XLA's. ``attention_width``: q, k and v's width A (None: the width);
    ``dtype``: the model's (config.model.dtype; bfloat16 weights fit twice the elements).

    Beyond the budget the norms and MLP are XLA's; tiled weights are not built. Decided from the
    deviceless H200 compile (benchmarks/studies/block_rule.py; docs/performance.md, "The block kernels'
    rule"): GB per member-step, kernels 0.36 against XLA 0.77 at width 64; XLA 2.84 at 256 and 8.75
    at 1,024. The step stays memory-bound to width ~512 (28 FLOP per byte at 256), so tiling is
    worth building for widths 128-512; at 1,024 the dots bound it (~20 % to gain)."""
    return fits(width, 3 * (attention_width or width), "norm_dense", dtype), fits(width, mlp_dim, "mlp_block", dtype)


DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16))  # of x and the matmuls' weights


def _check(fn: str, x, **arrays):
    """ValueError naming the argument: x float32 or bfloat16, the weights in x's dtype (the scale
    float32, the seed uint32), of the given shapes (ints or names of free sizes)."""
    if x.dtype not in DTYPES:
        raise ValueError(f"pallas_block.{fn}: x must be float32 or bfloat16, got {x.dtype}")
    if x.ndim < 1:
        raise ValueError(f"pallas_block.{fn}: x must have shape (..., D), got {x.shape}")
    for name, (array, want) in arrays.items():
        dtype = {"seed": jnp.dtype(jnp.uint32), "scale": jnp.dtype(jnp.float32)}.get(name, x.dtype)
        if array.dtype != dtype:
            whose = " (x's dtype)" if name not in ("seed", "scale") else ""
            raise ValueError(f"pallas_block.{fn}: {name} must be {dtype.name}{whose}, got {array.dtype}")
        if len(array.shape) != len(want) or any(isinstance(w, int) and w != n for w, n in zip(want, array.shape)):
            raise ValueError(
                f"pallas_block.{fn}: {name} must have shape ({', '.join(map(str, want))}), got {array.shape}"
            )
    for name, n in (("D", x.shape[-1]), *((f"{name}.shape[-1]", a.shape[-1]) for name, (a, _) in arrays.items())):
        if _pad(n) > MAX_DIM:
            raise ValueError(f"pallas_block.{fn}: {name} = {n} > {MAX_DIM} (whole weight blocks in one program)")
    hidden = arrays["kernel" if fn == "norm_dense" else "w_in"][0].shape[-1]
    dtype = x.dtype.name
    if not fits(x.shape[-1], hidden, fn, dtype):  # what the device's shared memory refuses, refused here too
        raise ValueError(
            f"pallas_block.{fn}: D x {'F' if fn == 'norm_dense' else 'M'} = {x.shape[-1]} x {hidden} padded to "
            f"{_pad(x.shape[-1])} x {_pad(hidden)} > {max_elements(fn, dtype)} weight elements in {dtype} "
            "(one program's shared memory)"
        )


def norm_dense(x, scale, kernel, bias, interpret: bool):
    """rmsnorm(x) * scale @ kernel + bias: x (..., D) float32 or bfloat16, scale (D,) float32, kernel
    (D, F) and bias (F,) in x's dtype -> (..., F) in x's dtype, RMSNorm as transformer.RMSNorm (eps
    RMS_EPS; in float32, the matmul accumulating in float32). The backward recomputes the
    norm from x (no normalised copy is stored). ``interpret`` (static): Pallas's interpret mode."""
    width = x.shape[-1]
    features = kernel.shape[-1] if kernel.ndim else 0
    _check("norm_dense", x, scale=(scale, (width,)), kernel=(kernel, (width, "F")), bias=(bias, (features,)))
    out = _norm_dense(x.reshape(-1, width), scale, kernel, bias, interpret)
    return out.reshape(*x.shape[:-1], features)


def mlp_block(x, scale, w_in, b_in, w_out, b_out, seed, threshold: int, inv_keep: float, interpret: bool):
    """x + dropout(relu(rmsnorm(x) * scale @ w_in + b_in) @ w_out + b_out): Block's MLP half with
    its residual add. x (..., D) float32 or bfloat16 (the result in its dtype), scale (D,) float32,
    w_in (D, M), b_in (M,), w_out (M, D), b_out (D,) in x's dtype; seed (2,) uint32 (HashDropout's
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


def norm_dense_cost(rows: int, width: int, features: int, itemsize: int = 4) -> KernelCost:
    """FLOPs and HBM bytes of one forward and backward of norm_dense on ``rows`` rows, x and the
    weights ``itemsize`` bytes an element (4 float32, 2 bfloat16; the scale and the partials float32).
    Bytes: forward reads x, writes the output; backward reads x and the output's gradient,
    writes dx and one (dscale, dkernel, dbias) partial per program; each program reads the
    weights (scale, kernel, and forward the bias). The wrapper's sum of the partials (an XLA
    reduce) is not counted. FLOPs at the padded sizes the programs compute (whole chunks): 3
    matmuls (1 forward, 2 backward) plus ~16 elementwise operations per element of x and 2 per
    output element (norm, its gradient, the bias and the column sums)."""
    programs, computed = _programs(rows)
    d, f = _pad(width), _pad(features)
    weights = width + width * features + features
    read = 4 * width + itemsize * width * features  # scale and kernel (the forward also the bias)
    nbytes = itemsize * (rows * (width + features) + rows * (2 * width + features))
    nbytes += programs * (read + itemsize * features + read + 4 * weights)
    dots = 3 * 2 * computed * d * f
    return KernelCost(float(dots + computed * (16 * d + 2 * f)), float(nbytes), float(dots))


def mlp_block_cost(rows: int, width: int, mlp_dim: int, itemsize: int = 4) -> KernelCost:
    """FLOPs and HBM bytes of one forward and backward of mlp_block on ``rows`` rows, x and the
    weights ``itemsize`` bytes an element (4 float32, 2 bfloat16; the scale and the partials float32).
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
    read = 4 * width + itemsize * (2 * width * mlp_dim + mlp_dim)  # scale, w_in, b_in, w_out (forward also b_out)
    nbytes = itemsize * (2 * rows * width + 3 * rows * width)
    nbytes += programs * (read + itemsize * width + read + 4 * weights)
    dots = 7 * 2 * computed * d * m
    return KernelCost(float(dots + computed * (53 * d + 6 * m)), float(nbytes), float(dots))
