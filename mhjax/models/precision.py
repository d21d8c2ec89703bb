"""config.model.dtype: the dtype the Transformer's matmuls and activations run in.

- "float32" (the default): every array float32, the same program as before the field existed
  (compute_dtype is None, so no layer is given a dtype and no cast is added).
- "bfloat16": mixed precision, as Flax's ``dtype``/``param_dtype``. Parameters (and so the
  optimizer state and checkpoints) stay float32; the embeddings, projections, MLP and read-out
  run in bfloat16 on float32 parameters cast per use, so the residual stream is bfloat16.
  Accumulated in float32: the RMSNorm statistics (normalised in float32, then cast back), the
  attention scores (bfloat16 matmul with float32 results), the softmax, and the logits, so the
  loss. Gradients reach the float32 parameters through the casts (float32).

The fused kernels: the Pallas kernels (attention, the pre-norm projection, the MLP half) read
and write bfloat16 and accumulate in float32 inside, as the JAX path does (pallas_flash.py,
pallas_block_kernels.py); the C++ CPU kernel is float32 only, so it takes q, k, v cast to
float32 at its boundary and its output is cast back (same function, float32 inside).
docs/bfloat16.md has the measurements and advice.
"""

from __future__ import annotations

import jax.numpy as jnp

DTYPES = ("float32", "bfloat16")
DEFAULT = "float32"


def compute_dtype(name: str):
    """The dtype layers are given (Flax ``dtype``): None for float32 (the layers' default, so the
    float32 program is unchanged), jnp.bfloat16 for "bfloat16"."""
    if name not in DTYPES:
        raise ValueError(f"model dtype: one of {', '.join(DTYPES)}; got {name!r}")
    return None if name == DEFAULT else jnp.bfloat16


def to_float32(x):
    """x as float32; a float32 x itself (no cast in the program)."""
    return x if x.dtype == jnp.float32 else x.astype(jnp.float32)


def to_dtype(x, dtype):
    """x in ``dtype`` (None: as it is)."""
    return x if dtype is None or x.dtype == dtype else x.astype(dtype)
