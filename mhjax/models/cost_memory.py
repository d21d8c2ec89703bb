"""What one member keeps in memory for its backward pass, by attention path (models/cost.py's
terms; plan/memory.py's lines)."""

from __future__ import annotations

from mhjax.models import cost_dtype


def activation_bytes(shape, fine: int, kernel: bool = False, dtype: str = "float32") -> float:
    """Activations one member of ``shape`` (cost.Shape) keeps for its backward pass: per layer the residual stream,
    norms, q/k/v and MLP rows (in ``dtype``) and the (F, T, T) scores, probabilities and dropout
    mask (float32; with the kernels, which recompute norms and the MLP: the block's input, q/k/v,
    the attention output and the MLP's input, and (F, T) float32 row statistics; with the TPU
    kernel, its (T, F) log-sum-exp, F padded to 128 lanes in HBM); plus the
    logits and their gradient (float32)."""
    b, t, d, layers, m, v = shape[:6]
    a, size = shape.attention, cost_dtype.element_bytes(dtype)
    if kernel == "tpu":  # the JAX path's rows, and the kernel's (B, T, heads) log-sum-exp, lanes padded to 128
        rows, maps = b * t * (5 * d + 3 * a + 2 * m), b * t * -(-fine // 128) * 128
    elif kernel:  # the block's input, q/k/v, the attention output and its row statistics, the MLP's input
        rows, maps = b * t * (2 * d + 4 * a), b * fine * t
    else:
        rows, maps = b * t * (5 * d + 3 * a + 2 * m), 3 * b * fine * t * t
    return layers * (size * rows + 4.0 * maps) + 4.0 * 2 * b * t * v
