"""The dry run's account of a plan (``mhjax train --dry-run``, ``--target``'s first lines): the
strategy and its programs, per shape group its rate and memory, the cost model's estimate (in
both dtypes, over N devices beside one), the attention path, each path's activation memory and
per member its parameters, matmul FLOPs and memory. An experiment without shapes: each member's
facts and XLA's account of its compiled chunks (train/compiled_cost.py)."""

from __future__ import annotations

from mhjax.models import cost, cost_devices, flops
from mhjax.plan import memory

MATMUL_NOTE = (
    "matmul GFLOP/step: the model's matrix products, forward + 2x backward, causal attention at half "
    "(models/flops.py), the same in any dtype; the estimate's GFLOP count every FLOP the priced program runs"
)


def describe(plan) -> list[str]:
    if plan.shapes is None:
        from mhjax.train import compiled_cost  # the host loop (TensorBoard, plotting): only where it compiles

        experiment = plan.experiment
        members = [f"{m.name:<28} {experiment.member_info(m)}" for m in experiment.members]
        return members + compiled_cost.lines(compiled_cost.chunk_costs(experiment, plan.backend), plan.backend)
    choice, backend = plan.attention, plan.backend
    requested = plan.requested if plan.requested != "auto" else f"auto ({plan.strategy} on {backend})"
    return [
        f"strategy: {requested} -> {len(plan.programs)} program(s): "
        + ", ".join(f"{p.name} ({len(p.members)} members)" for p in plan.programs),
        *group_lines(plan),
        *estimate_lines(plan),
        f"attention: {plan.core} (config.attention={plan.shapes.attention} on {backend})"
        + (f"; {choice.fallback}" if choice.fallback else ""),
        *memory.lines(plan.shapes, plan.names, plan.core),
        *member_lines(plan),
    ]


def group_lines(plan) -> list[str]:
    """One line per shape group: its model, members, head counts and sizes, its programs and the
    roofline's rate and memory for the group alone (models/cost.py); none for a single group."""
    shapes = plan.shapes
    if len(shapes.groups) == 1:
        return []
    out = [f"{len(shapes.groups)} shape groups (members of one parameter shape and dropout share programs):"]
    for group in shapes.groups:
        inside = set(group.members)
        mine = [p for p in plan.programs if p.members[0] in inside]
        m = group.model
        heads = sorted({shapes.heads[i] for i in group.members})
        sizes = ", ".join(map(str, sorted({m.attention // h for h in heads})))
        p = plan.price(mine)
        out.append(
            f"  {group.name}: width {m.width}, {m.num_layers} layer(s), MLP {m.mlp_dim}, dropout {m.dropout:g}, "
            f"attention width {m.attention} (head size {sizes}); {len(group.members)} member(s) at heads "
            f"{', '.join(map(str, heads))}; programs {', '.join(p_.name for p_ in mine)}; "
            f"~{p['member_steps_per_s']:,.0f} member-steps/s and ~{p['memory_per_device_bytes'] / 2**30:.2f} GiB "
            f"on one {p['device'].name} (roofline)"
        )
    return out


def estimate_lines(plan) -> list[str]:
    """The cost lines: the estimate (in config.model.dtype), over N devices beside one device's
    (models/cost_devices.py), and the same sweep in the other dtype. A backend without a preset
    in models/cost.py (a CPU): a prediction for one H200, labelled as such."""
    work = plan.steps * len(plan.names)
    if plan.backend in cost.BACKEND_DEVICE:
        priced = plan
        p = plan.predict()
        machine = "the target" if plan.planned else "this machine"  # train/deviceless.py's
        where = f"{machine} ({plan.devices} x {plan.backend}, priced as {plan.devices} x {p['device'].name})"
        lines = [f"estimate for {where}, roofline of models/cost.py: " + cost.prediction_text(p, work)]
    else:
        priced = plan.accelerator()
        backends = {}
        for b, d in sorted(cost.BACKEND_DEVICE.items()):
            backends.setdefault(cost.DEVICES[d].name, []).append(b)
        presets = " and ".join(f"{'/'.join(b)} ({name})" for name, b in backends.items())
        p = priced.predict()
        lines = [
            f"estimate for this machine ({plan.backend}): none (models/cost.py has presets for {presets})",
            f"accelerator prediction, not this machine: on one {p['device'].name} this sweep would run "
            f"{priced.strategy} (roofline of models/cost.py): " + cost.prediction_text(p, work),
        ]
    if priced.devices > 1:
        p, one = priced.predict(), priced.predict(devices=1)
        lines += cost_devices.lines(p, one, p["device"].name)
    dtype = priced.shapes.dtype
    other = "float32" if dtype == "bfloat16" else "bfloat16"
    p = priced.predict(dtype=other)
    if dtype == "bfloat16":
        lines.append(
            "  model.dtype=bfloat16: priced in bfloat16 (models/cost_dtype.py: activations and the kernels' rows "
            "and weights at 2 bytes, dots at the bfloat16 rate)"
        )
    lines.append(
        f"  in {other}: ~{p['member_steps_per_s']:,.0f} member-steps/s, "
        f"{p['compiled_bytes_per_member_step'] / 1e9:.2f} GB compiled per member-step"
        + ("" if other == "float32" else " (--config.model.dtype=bfloat16)")
    )
    return lines


def member_lines(plan) -> list[str]:
    """Per member: parameters, analytic GFLOP per step and estimated memory on the attention path
    the run takes (plan.core: memory.PATHS); then the totals."""
    shapes = plan.shapes
    lines = [f"{'member':<24} {'params':>9} {'matmul GFLOP/step':>18} {'est. memory':>12}"]
    total_mem = total_flops = 0.0
    for i, name in enumerate(plan.names):
        model = shapes.models[i]
        sizes = (shapes.batch, shapes.seq_len, model.width, model.num_layers, model.mlp_dim)
        step_flops = flops.train_step_flops(*sizes, shapes.vocab, model.attention_width)
        mem = memory.member_bytes(shapes, i, plan.core)  # params, grads, Adam m and v; activations
        total_mem, total_flops = total_mem + mem, total_flops + step_flops
        lines.append(f"{name:<24} {shapes.params(i):>9,} {step_flops / 1e9:>18.3f} {mem / 2**20:>10.1f} MiB")
    total = total_flops * plan.steps
    lines.append(
        f"total: {total / 1e12:.2f} TFLOP of matmuls in training, "
        f"~{total_mem / 2**20:.0f} MiB if all members run at once"
    )
    lines.append(MATMUL_NOTE)
    return lines
