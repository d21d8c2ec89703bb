"""Model FLOPs utilisation (MFU): the analytic training FLOPs of models/flops.py done per second,
over the matmul peak of the devices the run is on (models/cost.py's presets, dense, in the model's
dtype: an H200's 494.7 TFLOP/s of TF32 for float32, 989.5 of bfloat16). A device models/cost.py has
no preset for (a CPU) has no peak: its MFU is None."""

from __future__ import annotations

from mhjax.models import cost

# jax's device_kind -> models/cost.py's preset. The H100 SXM: the H200's TF32 and bfloat16 dense
# rates (its datasheet gives the same, models/cost.py's h200 entry).
KINDS = (("H200", "h200"), ("H100 80GB HBM3", "h200"), ("H100 SXM", "h200"), ("TPU v5 lite", "tpu-v5e"))


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
