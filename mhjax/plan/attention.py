"""The sweep's attention path on a backend: config.attention resolved (models/attention_choice.py),
whether the backend's kernel fits the sweep's shapes, and ``auto``'s fallback to JAX after its
kernel failed to compile there (train/ahead.py)."""

from __future__ import annotations

import dataclasses

from mhjax.models import tpu_vmem
from mhjax.models.attention_choice import AUTO, KERNELS, AttentionChoice, resolve_attention
from mhjax.plan.shapes import SweepShapes


def _gpu_kernel_fits(shapes: SweepShapes) -> str | None:
    """The GPU's Pallas attention kernel tiles its keys (flash attention): any T fits. The block
    kernels beside it (pallas_block.fits: their weights within one program's shared memory) are
    chosen per layer by the model itself, each falling back to JAX on its own."""
    return None


def kernel_shapes(shapes: SweepShapes) -> tuple[set, int]:
    """The (attention width, heads) the TPU kernel would run, and its q/k/v itemsize."""
    runs = {(model.attention_width or model.width, heads) for model, heads in zip(shapes.models, shapes.heads)}
    return runs, 2 if shapes.dtype == "bfloat16" else 4


def _tpu_kernel_fits(shapes: SweepShapes) -> str | None:
    """The TPU kernel keeps a query tile's keys and the backward's (T, 3D) block in VMEM: its need
    against the chip's scoped limit (models/tpu_vmem.py), with what would fit where it does not."""
    runs, itemsize = kernel_shapes(shapes)
    return tpu_vmem.refusal(shapes.seq_len, runs, itemsize)


# {backend: check(shapes) -> None where its kernel fits the sweep's shapes, else why not}: the one
# place auto's kernel choice asks whether a kernel fits; a backend without a check: its kernel
# always fits.
KERNEL_FITS = {"gpu": _gpu_kernel_fits, "tpu": _tpu_kernel_fits}


def choose(shapes: SweepShapes, backend: str, failed: str | None = None) -> AttentionChoice:
    """What config.attention runs on ``backend`` (this process's or a target's), and why: auto
    takes the backend's kernel where it fits (KERNEL_FITS), JAX where it does not or where it
    failed to compile (``failed``: why, Plan.without_kernel)."""
    choice = resolve_attention(shapes.attention, backend, shapes.seq_len, shapes.dropout, *kernel_shapes(shapes))
    if choice.requested != AUTO or choice.implementation not in KERNELS:
        return choice
    check = KERNEL_FITS.get(choice.backend)
    too_big = check(shapes) if check is not None else None
    if too_big:
        reason = f"auto on {choice.backend}: JAX (the Pallas kernel does not fit: {too_big})"
        return dataclasses.replace(choice, implementation="jax", interpret=False, fallback=too_big, reason=reason)
    if failed:
        reason = f"auto on {choice.backend}: JAX (the Pallas kernel failed to compile)"
        return dataclasses.replace(choice, implementation="jax", interpret=False, fallback=failed, reason=reason)
    return choice
