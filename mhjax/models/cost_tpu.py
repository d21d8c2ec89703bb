"""The TPU side of the cost model (models/cost.py's "tpu-v5e" Device): the rates a v5e runs
each kind of work at, the time of mhjax's attention kernel (pallas_tpu_attention.py) by unit,
and the byte ratios that map the model's XLA:CPU count to the TPU compiler's program.

Rates (per chip; no TPU has run a step here, so none is measured: docs/performance.md, "What
only a TPU can settle"):
- MXU: 197 TFLOP/s of bfloat16 (Cloud TPU v5e docs; jax's tpu_info.py gives the same). XLA
  runs float32 matmuls at JAX's default precision as one bfloat16 pass: that rate. The kernel's
  float32 dots in Mosaic: MOSAIC_FLOAT32_PASSES bfloat16 passes (3: the bf16x3 scheme XLA uses
  at HIGH; assumed, not measured). A matmul's contraction and output columns are padded to the
  MXU's 128 lanes, and the kernel runs each head over all D lanes (the other heads' zeroed):
  per head and tile pair, 2 x rows x pad128(cols) x pad128(D) MXU FLOPs a matmul, 2 matmuls
  forward and 5 backward.
- Vector unit: no datasheet figure. Derived: the clock is 197e12 / (4 MXUs x 128 x 128 x 2) =
  1.5 GHz, and a (8, 128) vreg op per VALU slot a cycle, VALU_SLOTS of them: 2 x 1,024 x 1.5 GHz
  = 3.1 TFLOP/s of float32 elementwise work (assumed). The kernel's per score element work,
  counted from its code on (8, 128)-padded tiles: VECTOR_OPS. XLA's elementwise rest of the step
  (norms, Adam, the JAX path's softmax) at the same rate.
- Grid steps: ~0.35 us each (the Pallas TPU pipelining docs' figure for the per-step cost of
  the software pipeline), every (member, batch row, query tile, key tile) step of both calls,
  the skipped ones above the diagonal too.
- HBM: 819 GB/s (Cloud TPU v5e docs), not calibrated.
The kernel's three terms add (a step's dots wait on its exponentials, and its DMA and grid
bookkeeping on both); the step takes max(their sum plus the rest's compute, bytes / bandwidth),
and sweep_cost says which term is largest.

Byte ratios (the calibration): the compiled program's bytes per member-step as train/hlo.py
counts them (HBM only: VMEM values and AllocateBuffer move nothing, a Pallas call's stated
bytes in the share of its operands in HBM) over the model's XLA:CPU count of the same step,
fitted on FITTED only (deviceless v5e-8 compiles, jax[tpu] 0.10.2, benchmarks/tpu_bytes.py,
the paper sweep at 8 seeds, 2026-12-06):
  attention=auto (mhjax's TPU kernel), T = 100, float32: 0.3375 GB besides the kernel calls;
  attention=jax, T = 100, float32: 1.264 GB (JAX_PATH_BYTES; 1.456 when AllocateBuffer counted).
The model's XLA:CPU count besides the kernel (WIDTH, ATTENTION_KERNEL_WIDTH, MLP, VOCAB, PARAM
at the paper's shape): 0.711 GB; on the JAX path 0.913 GB besides the core's 1.341 GB.
A dry run of a fitted sweep prints the model's figure without an error; other sweeps (T =
1,024, bfloat16: benchmarks/RESULTS.md "TPU cost line") print the error.
"""

from __future__ import annotations

from typing import NamedTuple

from mhjax.models import tpu_vmem

MXU_BF16 = 197e12  # FLOP/s, Cloud TPU v5e docs
MOSAIC_FLOAT32_PASSES = 3  # bfloat16 passes per float32 dot in the kernel (assumed: bf16x3)
VALU_SLOTS = 2  # (8, 128) vreg ops per cycle (assumed)
CLOCK = MXU_BF16 / (4 * 128 * 128 * 2)  # 1.5 GHz: 4 MXUs of 128 x 128 multiply-adds a cycle
VECTOR_RATE = VALU_SLOTS * 8 * 128 * CLOCK  # 3.1e12 elementwise FLOP/s
GRID_STEP_S = 0.35e-6  # per grid step (Pallas TPU pipelining docs)
HBM_BYTES_PER_S = 819e9  # Cloud TPU v5e docs
# vector ops per (head, query, key) element of a tile the kernel runs, from its code: forward
# scale, mask, max, subtract, exp, sum, rescale, cast; backward the recomputed probabilities,
# dp's mask, ds, two casts; each pass's dropout hash (two fmix32: 5 ops each, the mixing, the
# compare, the select)
VECTOR_OPS = {"forward": 10, "backward": 14, "dropout": 16}

KERNEL_REST = 0.3375 / 0.711  # 0.47: the step around the attention kernel
JAX_PATH_BYTES = 1.264e9  # the JAX path's compiled bytes per member-step (attention=jax, T = 100)
JAX_CORE = (JAX_PATH_BYTES - KERNEL_REST * 0.913e9) / 1.341e9  # 0.62: the JAX attention core
COMPILED_BYTES = (KERNEL_REST, JAX_CORE)
# (batch, T, width, layers, mlp, vocab, dtype): the sweeps the ratios were fitted on (the paper's)
FITTED = {(50, 100, 64, 4, 128, 256, "float32")}


class KernelTime(NamedTuple):
    """Seconds of one member's attention kernel calls (forward and backward) by unit."""

    mxu: float
    vector: float
    grid: float

    def __add__(self, other):
        return KernelTime(*(a + b for a, b in zip(self, other)))

    def scaled(self, factor: float) -> KernelTime:
        return KernelTime(*(a * factor for a in self))


def _lanes(n: int) -> int:
    return -(-n // 128) * 128


def kernel_time(batch: int, length: int, width: int, heads: int, dtype: str = "float32", dropout: bool = True):
    """KernelTime of one layer's forward and backward calls for one member of ``batch`` rows."""
    rows, padded = tpu_vmem.tiles(length)
    pairs, steps = tpu_vmem.tile_pairs(length), padded // rows
    matmul = 2 * rows * _lanes(rows) * _lanes(width)  # one head's dot on one tile pair, padded
    rate = MXU_BF16 / (1 if dtype == "bfloat16" else MOSAIC_FLOAT32_PASSES)
    mxu = batch * pairs * heads * (2 + 5) * matmul / rate
    elements = batch * pairs * heads * (-(-rows // 8) * 8) * _lanes(rows)
    ops = VECTOR_OPS["forward"] + VECTOR_OPS["backward"] + (2 * VECTOR_OPS["dropout"] if dropout else 0)
    return KernelTime(mxu, elements * ops / VECTOR_RATE, 2 * batch * steps * steps * GRID_STEP_S)


def fitted(shape, dtype: str) -> bool:
    """Whether the byte ratios were fitted on a sweep of this shape and dtype (cost.Shape)."""
    return (*shape[:6], dtype) in FITTED and not shape.attention_width


TERMS = ("matmuls", "vector work", "grid steps", "memory")


def bound(parts, by_unit: bool) -> str:
    """What bounds a step of (matmul, other arithmetic, grid step, memory) seconds (cost.terms):
    memory where its seconds reach the compute terms' sum, else the largest compute term where
    they are priced by unit (the TPU kernel), else "compute"."""
    if parts[3] >= sum(parts[:3]):
        return "memory"
    return TERMS[max(range(3), key=parts.__getitem__)] if by_unit else "compute"
