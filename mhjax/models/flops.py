"""The model's FLOPs: analytic matmul FLOPs of the sequence Transformer (one multiply-add = 2
FLOPs), and the model FLOPs utilisation (MFU) they give a measured rate.

``attention_width``: q, k and v's width A = heads x head size (None: the width, parameter
matching). At a fixed head size it grows with the head count; at fixed width it does not.

MFU: the analytic training FLOPs done per second, over the matmul peak of the devices the run is on
(models/cost.py's presets, dense, in the model's dtype: an H200's 494.7 TFLOP/s of TF32 for
float32, 989.5 of bfloat16). A device models/cost.py has no preset for (a CPU) has no peak: its
MFU is None."""

from __future__ import annotations

from mhjax.models import cost

# jax's device_kind -> models/cost.py's preset. The H100 SXM: the H200's TF32 and bfloat16 dense
# rates (its datasheet gives the same, models/cost.py's h200 entry).
KINDS = (("H200", "h200"), ("H100 80GB HBM3", "h200"), ("H100 SXM", "h200"), ("TPU v5 lite", "tpu-v5e"))


def forward_flops(
    batch: int, length: int, width: int, num_layers: int, mlp_dim: int, vocab: int, attention_width=None
) -> float:
    """Matmul FLOPs of one forward pass. Causal attention is counted as half of the full
    T x T score and value products; independent of the head count at a fixed attention width."""
    a = attention_width or width
    per_token_layer = 4 * width * a + 2 * width * mlp_dim + length * a  # QKVO, MLP, causal QK^T + AV
    return 2.0 * batch * length * (num_layers * per_token_layer + width * vocab)


def train_step_flops(batch, length, width, num_layers, mlp_dim, vocab, attention_width=None) -> float:
    """Forward + backward (backward = 2x forward)."""
    return 3.0 * forward_flops(batch, length, width, num_layers, mlp_dim, vocab, attention_width)


def peak_flops(device_kind: str, dtype: str = "float32") -> float | None:
    """The matmul peak (FLOP/s) of one device of ``device_kind``, or None where there is no preset."""
    for needle, preset in KINDS:
        if needle.lower() in str(device_kind).lower():
            return cost.DEVICES[preset].dot_rate(dtype)
    return None


def mfu(flops_per_s: float, device_kind: str, devices: int = 1, dtype: str = "float32") -> float | None:
    """``flops_per_s`` over ``devices`` devices' peak; None without a preset."""
    peak = peak_flops(device_kind, dtype)
    return None if peak is None else flops_per_s / (peak * max(devices, 1))
