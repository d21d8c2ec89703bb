"""A plan's programs priced by the roofline of models/cost.py: each program at its own model's
shape, over the planned devices, in the config's dtype or another."""

from __future__ import annotations

from mhjax.models import cost
from mhjax.models.attention_choice import resolve_attention
from mhjax.plan.shapes import SweepShapes
from mhjax.train.engine import Program, recipe_groups


def program_groups(programs: list[Program]) -> list[list[tuple[int, int, bool]]]:
    """Per program, its groups as (members, fine heads, mixed): what models/cost.py prices."""
    out = []
    for program in programs:
        groups = []
        for size, recipe in recipe_groups(program):
            if recipe.model.layout is not None:  # attention at each group's own head count
                groups += [(n, h, False) for n, h in recipe.model.layout]
            else:
                groups.append((size, recipe.model.num_heads, not recipe.static_heads))
        out.append(groups)
    return out


def kernel_priced(shapes: SweepShapes, backend: str) -> bool | str:
    """Whether the cost model prices static head counts at a Pallas kernel's cost (True: the
    GPU's, "tpu": the TPU's): on a CPU it predicts for an H200, so for what a GPU would run."""
    if shapes.attention == "cpu_kernel":
        return False
    target = "gpu" if backend == "cpu" else backend
    implementation = resolve_attention(shapes.attention, target, shapes.seq_len).implementation
    return {"pallas": True, "pallas_tpu": "tpu"}.get(implementation, False)


def price(shapes: SweepShapes, programs: list[Program], backend: str, devices: int, dtype: str | None = None) -> dict:
    """models/cost.sweep_cost of ``programs`` on ``backend``'s device preset (an H200 for backends
    without one) over ``devices`` of them, in ``dtype`` (default: config.model.dtype)."""
    device = cost.DEVICES[cost.BACKEND_DEVICE.get(backend, "h200")]
    dtype = dtype or shapes.dtype
    scanned = any(recipe.model.scan_layers for p in programs for _, recipe in recipe_groups(p))
    kernel, groups = kernel_priced(shapes, backend), program_groups(programs)
    sizes = []
    for p in programs:
        t = recipe_groups(p)[0][1].model
        dims = (t.width, t.num_layers, t.mlp_dim, t.vocab_size, t.attention_width)
        sizes.append(cost.Shape(shapes.batch, shapes.seq_len, *dims))
    return {"device": device, **cost.sweep_cost(sizes, groups, device, devices, kernel, scanned, dtype)}
