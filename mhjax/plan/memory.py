"""Each attention path's activation memory at the run's sequence length (``--dry-run``), and the
check that ``attention=auto`` on a GPU or a TPU never runs a path whose predicted memory does not fit.

What a member keeps for its backward pass, per path (models/cost.activation_bytes: rows in
config.model.dtype, the maps, row statistics and logits in float32):
- JAX path: per layer the residual, norms, q/k/v and MLP rows, and the (heads, T, T) scores,
  probabilities and dropout mask: quadratic in T;
- C++ CPU kernel: the same rows, and (heads, T) row statistics instead of the maps;
- Pallas kernel (flash attention, tiled: any T): the block kernels' rows where their weights fit
  (pallas_block.block_parts), else the C++ kernel's, and (heads, T) row statistics.
Parameters, gradients and Adam's two moments add 16 bytes per parameter.
Every figure is computed once per distinct model and head count (SweepShapes.alike).
"""

from __future__ import annotations

from mhjax.config import ConfigError
from mhjax.models import cost, pallas_block
from mhjax.models.attention_choice import AUTO
from mhjax.plan.shapes import SweepShapes

PATHS = {"jax": "JAX path", "cpu_kernel": "C++ CPU kernel", "pallas": "Pallas kernel"}
TPU_PATH = {"pallas_tpu": "Pallas TPU"}  # listed where it runs: a TPU's kernel (no block kernels, no maps)


def activations(shapes: SweepShapes, index: int, path: str) -> tuple[float, float]:
    """(bytes member ``index`` keeps for its backward on ``path``, of them the (heads, T, T) maps)."""
    model, heads = shapes.models[index], shapes.heads[index]
    b, t, dtype = shapes.batch, shapes.seq_len, shapes.dtype
    shape = cost.Shape(b, t, model.width, model.num_layers, model.mlp_dim, shapes.vocab, model.attention_width)
    full = cost.activation_bytes(shape, heads, False, dtype)
    maps = 4.0 * model.num_layers * 3 * b * heads * t * t
    stats = 4.0 * model.num_layers * b * heads * t
    if path == "jax":
        return full, maps
    if path == "pallas" and all(pallas_block.block_parts(model.width, model.mlp_dim, model.attention_width, dtype)):
        return cost.activation_bytes(shape, heads, True, dtype), 0.0
    return full - maps + stats, 0.0


def member_bytes(shapes: SweepShapes, index: int, path: str) -> float:
    """Parameters, gradients, Adam's moments (16 bytes per parameter) and ``path``'s activations."""
    return 16.0 * shapes.params(index) + activations(shapes, index, path)[0]


def lines(shapes: SweepShapes, names: list[str], running: str) -> list[str]:
    """The dry run's lines: each path's activations at T for the sweep's largest member, and for
    every member at once; ``running``: the path this run takes (AttentionChoice.core)."""
    alike = shapes.alike()
    largest = max((i for i, _ in alike), key=lambda i: activations(shapes, i, "jax")[0])
    out = [f"activation memory at T = {shapes.seq_len} ({names[largest]}, the largest; all {len(names)} members):"]
    for path, label in {**PATHS, **(TPU_PATH if running in TPU_PATH else {})}.items():
        one, maps = activations(shapes, largest, path)
        every = sum(n * activations(shapes, i, path)[0] for i, n in alike)
        square = f", of it (heads, T, T) maps {size(maps)}" if maps else ""
        mark = "  <- this run" if path == running else ""
        out.append(f"  {label:<15} {size(one)} per member{square}; {size(every)} in all{mark}")
    return out


def need(shapes: SweepShapes, devices: int, path: str = "jax") -> float:
    """Every member's bytes on ``path``, per device of ``devices``."""
    return sum(n * member_bytes(shapes, i, path) for i, n in shapes.alike()) / max(devices, 1)


def fits(shapes: SweepShapes, choice, core: str, devices: int = 1) -> bool:
    """False where ``attention=auto`` on a GPU or a TPU would run the JAX path (``core``) and every
    member's predicted memory, over ``devices``, exceeds the device's (models/cost.py's preset)."""
    if choice.requested != AUTO or choice.backend not in ("gpu", "tpu") or core != "jax":
        return True
    return need(shapes, devices) <= cost.DEVICES[cost.BACKEND_DEVICE[choice.backend]].memory_bytes


def check(shapes: SweepShapes, choice, core: str, devices: int = 1) -> None:
    """``fits``, or one line with the figures, before anything compiles: auto on a GPU never
    runs a path whose predicted memory does not fit (the kernel failed to compile, or ``fused``
    traces the head counts, which the kernel cannot take)."""
    if not fits(shapes, choice, core, devices):
        device = cost.DEVICES[cost.BACKEND_DEVICE[choice.backend]]
        why = f"{choice.reason}: {choice.fallback}" if choice.fallback else choice.reason
        advice = (  # the TPU kernel refused for its VMEM (models/tpu_vmem.py): why says what T fits
            "use what the kernel fits, or fewer members per run"
            if choice.backend == "tpu" and choice.fallback
            else "use fewer members per run or a strategy whose head counts are static (the Pallas kernel runs them)"
        )
        raise ConfigError(
            f"config.attention: auto on {choice.backend} runs the JAX path here ({why}), whose activations at "
            f"T = {shapes.seq_len} need ~{size(need(shapes, devices))} per device for {len(shapes.heads)} "
            f"members, more than the {device.name}'s {size(device.memory_bytes)}: {advice}"
        )


def size(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"
