"""What a sweep's compiled programs cost, from XLA itself: HLO FLOPs, bytes accessed and
temporary memory of one training step, per member.

Each program is compiled as the engine builds it (``make_train_chunk``) with a chunk of
ONE step: XLA's cost analysis counts a while loop's body once whatever its trip count, so
a one-step chunk is the only length whose figures are exactly one step. Sum over the
sweep's programs, divided by its members: per member-step.

Variants of the attention core that the library does not use are measured by swapping
``attention.jax_attention`` for the duration of a compile (``variant``):
  btft  scores, mixing and softmax in (B, T, F, T) layout instead of (B, F, T, T);
  bf16  scores (and the F x F mixing) in bf16, softmax in fp32, probabilities handed to the
        value product in bf16 with fp32 accumulation.
The programs must run the JAX attention path (config.attention = "jax"): a kernel is an
opaque custom call whose cost XLA cannot see. The exception is the Pallas kernels (variant
``pallas``, programs built with config.attention = "pallas"): their interpret-mode programs
would be counted as loops, so for the compile each kernel (pallas_attention.members_attention,
which plain heads also run; pallas_block.norm_dense and mlp_block) is replaced by a stand-in
custom call with the same inputs and outputs (forward and backward; a layout's groups as one
call, since they write in place), which XLA counts as -1 FLOP and -1 byte each (added back);
the kernels' own HBM traffic and FLOPs are then added analytically (kernel_cost: per layer
and member, attention at its head count).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from hlo_parts import bytes_by_part

from mhjax.models import attention, cost, pallas_attention, pallas_block
from mhjax.plan import pricing
from mhjax.train import engine
from mhjax.train.loop import stack_constants


def _btft_attention(q, k, v, fine, heads, seeds, threshold, inv_keep):
    # The same dropout hash as the library's, its mask transposed to this layout.
    batch, length, width = q.shape
    split = lambda x: x.reshape(batch, length, fine, width // fine)  # noqa: E731
    scores = jnp.einsum("btfd,bsfd->btfs", split(q), split(k))
    if heads is None:
        scale = 1.0 / math.sqrt(width // fine)
    else:
        group = attention.head_groups(heads, fine)
        scores = jnp.einsum("fg,btgs->btfs", (group[:, None] == group[None, :]).astype(scores.dtype), scores)
        scale = jax.lax.rsqrt(width / jnp.asarray(heads, scores.dtype))
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))[:, None, :]
    probs = jax.nn.softmax(jnp.where(causal, scores * scale, jnp.finfo(scores.dtype).min), axis=-1)
    attended = probs
    if threshold < (1 << 24):
        group = jnp.arange(fine) if heads is None else attention.head_groups(heads, fine)
        keep = jax.vmap(lambda s: attention.dropout_keep(s, batch, length, threshold))(seeds)[group]  # (F, B, T, T)
        attended = probs * jnp.transpose(keep, (1, 2, 0, 3)).astype(probs.dtype) * inv_keep
    out = jnp.einsum("btfs,bsfd->btfd", attended, split(v)).reshape(batch, length, width)
    return out, jnp.moveaxis(probs, 2, 1)


def _bf16_attention(q, k, v, fine, heads, seeds, threshold, inv_keep):
    batch, length, width = q.shape
    split = lambda x: x.reshape(batch, length, fine, width // fine).astype(jnp.bfloat16)  # noqa: E731
    scores = jnp.einsum("btfd,bsfd->bfts", split(q), split(k))  # bf16 (B, F, T, T)
    if heads is None:
        scale = 1.0 / math.sqrt(width // fine)
    else:
        group = attention.head_groups(heads, fine)
        scores = jnp.einsum("fg,bgts->bfts", (group[:, None] == group[None, :]).astype(scores.dtype), scores)
        scale = jax.lax.rsqrt(width / jnp.asarray(heads, jnp.float32))
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))
    logits = jnp.where(causal, scores.astype(jnp.float32) * scale, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1)
    attended = probs
    if threshold < (1 << 24):
        group = jnp.arange(fine) if heads is None else attention.head_groups(heads, fine)
        keep = jax.vmap(lambda s: attention.dropout_keep(s, batch, length, threshold))(seeds)[group]
        attended = probs * jnp.moveaxis(keep, 0, 1).astype(probs.dtype) * inv_keep
    out = jnp.einsum("bfts,bsfd->btfd", attended.astype(jnp.bfloat16), split(v), preferred_element_type=jnp.float32)
    return out.reshape(batch, length, width), probs


VARIANTS = {"btft": _btft_attention, "bf16": _bf16_attention}
KERNEL_VARIANT = "pallas"


def _opaque(shapes, *args):
    """A custom call of ``args`` returning arrays of ``shapes`` (compiled, never run)."""
    return jax.pure_callback(lambda *a: None, shapes, *args, vmap_method="broadcast_all")


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _kernel_stand_in(qkv, seeds, layout):
    return _kernel_stand_in_fwd(qkv, seeds, layout)[0]


def _kernel_stand_in_fwd(qkv, seeds, layout):
    """members_attention's outputs: the (M, B, T, D) output, written in place group by group,
    and each group's (members, B, heads, T) row statistics."""
    batch, length, fused = qkv.shape[-3:]
    stats = [jax.ShapeDtypeStruct((*qkv.shape[:-4], n, batch, h, length), qkv.dtype) for n, h in layout]
    out_shape = jax.ShapeDtypeStruct((*qkv.shape[:-1], fused // 3), qkv.dtype)
    out, *lse = _opaque((out_shape, *stats), qkv, seeds)
    return out, (qkv, seeds, out, lse)


def _kernel_stand_in_bwd(layout, residuals, dout):
    qkv, seeds, out, lse = residuals
    (grad,) = _opaque((jax.ShapeDtypeStruct(qkv.shape, qkv.dtype),), qkv, seeds, out, *lse, dout)
    return grad, None


_kernel_stand_in.defvjp(_kernel_stand_in_fwd, _kernel_stand_in_bwd)


def _like(*arrays):
    return tuple(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays)


def _dense_out(x, scale, kernel, bias):
    """pallas_block.norm_dense's output, (..., F)."""
    return _opaque((jax.ShapeDtypeStruct((*x.shape[:-1], kernel.shape[1]), x.dtype),), x, scale, kernel, bias)[0]


_dense_stand_in = jax.custom_vjp(_dense_out)
_dense_stand_in.defvjp(lambda *args: (_dense_out(*args), args), lambda args, dout: _opaque(_like(*args), *args, dout))


def _mlp_out(x, seed, *weights):
    """pallas_block.mlp_block's output, x's shape."""
    return _opaque(_like(x), x, seed, *weights)[0]


def _mlp_stand_in_bwd(residuals, dout):
    x, seed, weights = residuals
    grads = _opaque(_like(x, *weights), x, seed, *weights, dout)
    return grads[0], np.zeros(seed.shape, jax.dtypes.float0), *grads[1:]


_mlp_stand_in = jax.custom_vjp(_mlp_out)
_mlp_stand_in.defvjp(lambda x, seed, *w: (_mlp_out(x, seed, *w), (x, seed, w)), _mlp_stand_in_bwd)

# The Pallas kernels (models/pallas_attention.py, models/pallas_block.py) and their stand-ins.
KERNEL_STAND_INS = (
    (pallas_attention, "members_attention", lambda qkv, seeds, layout, *_: _kernel_stand_in(qkv, seeds, layout)),
    (pallas_block, "norm_dense", lambda x, scale, kernel, bias, *_: _dense_stand_in(x, scale, kernel, bias)),
    (
        pallas_block,
        "mlp_block",
        lambda x, scale, w_in, b_in, w_out, b_out, seed, *_: _mlp_stand_in(x, seed, scale, w_in, b_in, w_out, b_out),
    ),
)


@contextlib.contextmanager
def variant(name: str | None):
    """Run the block with attention variant ``name`` (None: the library's own)."""
    if name is None:
        yield
        return
    swaps = KERNEL_STAND_INS if name == KERNEL_VARIANT else ((attention, "jax_attention", VARIANTS[name]),)
    originals = [(module, field, getattr(module, field)) for module, field, _ in swaps]
    for module, field, replacement in swaps:
        setattr(module, field, replacement)
    try:
        yield
    finally:
        for module, field, original in originals:
            setattr(module, field, original)


def kernel_cost(experiment, programs) -> tuple[float, float]:
    """(FLOPs, bytes) of the Pallas kernels' calls in one step of ``programs``, summed over
    members and layers: the attention kernel of each member at the static head count its group
    runs, and per layer the projection's norm_dense and the MLP block (pallas_block)."""
    shape = cost.Shape.of(experiment.config)
    flops = nbytes = 0.0
    for groups in pricing.program_groups(programs):
        for members, heads, mixed in groups:
            if mixed:
                raise ValueError("the Pallas kernel runs static head counts only (not fused over several)")
            layer = cost.kernels_cost(shape, heads)  # attention and the block's kernels where they run
            flops, nbytes = (
                flops + members * shape.num_layers * layer.flops,
                nbytes + members * shape.num_layers * layer.bytes,
            )
    return flops, nbytes


def measure(experiment, programs, kernel: bool = False) -> dict:
    """HLO cost of one training step of ``programs`` (experiment.programs(...)), per member;
    ``kernel``: the programs run the Pallas kernel, replaced by its stand-in (``variant``)."""
    used = {recipe.model.attention for p in programs for _, recipe in engine.recipe_groups(p)}
    if used != {"pallas" if kernel else "jax"}:
        raise RuntimeError(f"programs with attention {used} (config.attention): XLA cannot count a kernel")
    members = sum(len(p.members) for p in programs)
    flops = nbytes = compile_s = 0.0
    peak_temp, each, parts = 0, {}, {}
    for program in programs:
        consts = stack_constants(experiment, program.members)
        states = jax.eval_shape(engine.make_init(program.recipe), consts)
        start = time.perf_counter()
        compiled = engine.make_train_chunk(program.recipe, 1).lower(states, consts).compile()
        compile_s += time.perf_counter() - start
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # older jax: one dict per device
        text = compiled.as_text()
        unknown = text.count("custom-call(") if kernel else 0  # each counted as -1
        for part, part_bytes in bytes_by_part(text).items():
            parts[part] = parts.get(part, 0.0) + part_bytes
        flops += float(cost["flops"]) + unknown
        nbytes += float(cost["bytes accessed"]) + unknown
        each[program.name] = {
            "members": len(program.members),
            "flops": float(cost["flops"]) + unknown,
            "bytes": float(cost["bytes accessed"]) + unknown,
        }
        peak_temp = max(peak_temp, int(compiled.memory_analysis().temp_size_in_bytes))
    kernel_flops, kernel_bytes = kernel_cost(experiment, programs) if kernel else (0.0, 0.0)
    flops, nbytes = flops + kernel_flops, nbytes + kernel_bytes
    return {
        "programs": len(programs),
        "members": members,
        "kernel_flops_per_member_step": kernel_flops / members,
        "kernel_bytes_per_member_step": kernel_bytes / members,
        "flops_per_member_step": flops / members,
        "bytes_per_member_step": nbytes / members,
        "peak_temp_bytes": peak_temp,
        "compile_s": compile_s,
        # hlo_parts.py's attribution of XLA's bytes to model parts (approximate; the kernel's own
        # traffic is in kernel_bytes_per_member_step)
        "bytes_by_part_per_member_step": {k: v / members for k, v in sorted(parts.items(), key=lambda kv: -kv[1])},
        "per_program": each,
    }


def accuracy(experiment, programs, name: str) -> dict:
    """How far variant ``name`` moves one training step's loss and gradient: the last member
    of the first program (the most fine heads) at initialisation, step 0, dropout on.
    Relative: |loss' - loss| / |loss| and ||grad' - grad|| / ||grad|| (all leaves)."""
    program = programs[0]
    recipe = engine.recipe_groups(program)[-1][1]
    if recipe.model.layout is not None:
        # A layout model differentiates only as a vmapped whole; its last member's attention
        # runs at the last group's static head count: that recipe, alone.
        recipe = copy.copy(recipe)
        recipe.model, recipe.static_heads = recipe.model.clone(num_heads=recipe.model.layout[-1][1], layout=None), True
    consts = jax.tree_util.tree_map(jnp.asarray, experiment.member_constants(experiment.members[program.members[-1]]))
    params = recipe.init_params(consts)

    def step():  # a new function each time: traced under whichever attention is in place
        return jax.jit(jax.value_and_grad(lambda p: recipe.loss(p, consts, jnp.int32(0))[0]))(params)

    loss, grads = step()
    with variant(name):
        loss_v, grads_v = step()
    diff = jax.tree_util.tree_map(lambda a, b: jnp.sum((a - b) ** 2), grads_v, grads)
    norm = jax.tree_util.tree_map(lambda a: jnp.sum(a**2), grads)
    total = lambda t: float(jnp.sqrt(sum(jax.tree_util.tree_leaves(t))))  # noqa: E731
    return {
        "loss_rel_diff": abs(float(loss_v) - float(loss)) / abs(float(loss)),
        "grad_rel_l2": total(diff) / total(norm),
    }
