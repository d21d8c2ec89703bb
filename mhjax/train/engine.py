"""The pure training step, vmapped over members and scanned over a chunk of steps.

A *kernel* describes one program's members (see experiments/): it supplies
``init_params(consts)``, ``optimizer(consts)``, ``loss(params, consts, step)`` and
``evaluate(params, consts)``, all for ONE member; ``consts`` holds that member's numeric
settings (keys, head count, learning rate, ...). The engine vmaps them over the member
axis and jits once per program and chunk length, donating the state buffers.

A program may instead be ``Unrolled(kernels, sizes)``: groups of members written out one
after another in the same program, each group with its own kernel (vmapped inside the
group). XLA's CPU runtime runs independent operations concurrently but each operation on
one core, so on a CPU independent groups keep every core busy, and each group can have
its own static head count, where one vmapped batch runs as a single chain of larger
operations (benchmarks/RESULTS.md). States stay stacked on the member axis either way, so
everything outside the engine is the same.
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class MemberState:
    params: Any
    opt_state: Any
    step: jax.Array  # int32, steps taken (frozen members keep counting)
    diverged: jax.Array  # bool: loss or parameters became non-finite
    diverged_at: jax.Array  # int32 step of divergence, -1 if none
    last_loss: jax.Array  # float32 training loss of the latest live step (kept in checkpoints)


class Unrolled:
    """Members computed side by side in one program: group g is ``sizes[g]`` consecutive
    members sharing ``kernels[g]``, vmapped within the group; groups are independent
    computations, which XLA's CPU runtime runs concurrently."""

    def __init__(self, kernels, sizes=None):
        self.kernels = tuple(kernels)
        self.sizes = tuple(sizes) if sizes is not None else (1,) * len(self.kernels)
        if len(self.sizes) != len(self.kernels) or min(self.sizes, default=0) < 1:
            raise ValueError("Unrolled: one positive group size per kernel")

    def split(self, tree) -> list:
        """A stacked tree -> one tree per group (slices of the member axis)."""
        out, start = [], 0
        for size in self.sizes:
            out.append(jax.tree_util.tree_map(lambda x, a=start, b=start + size: x[a:b], tree))
            start += size
        return out


def _concat(trees):
    return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *trees)


def over_members(kernel, fn):
    """``fn(member_kernel, *member_args)`` lifted to stacked member axes: vmapped for one
    kernel, group by group for ``Unrolled``."""
    if isinstance(kernel, Unrolled):
        def unrolled(*args):
            groups = zip(kernel.kernels, *(kernel.split(a) for a in args))
            return _concat([jax.vmap(lambda *a, k=k: fn(k, *a))(*group_args) for k, *group_args in groups])

        return unrolled
    return jax.vmap(lambda *args: fn(kernel, *args))


def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def init_member(kernel, consts) -> MemberState:
    params = kernel.init_params(consts)
    opt_state = kernel.optimizer(consts).init(params)
    return MemberState(params, opt_state, jnp.int32(0), jnp.array(False), jnp.int32(-1), jnp.float32(jnp.nan))


def train_step(kernel, state: MemberState, consts):
    """One member's step. A non-finite loss or update freezes the member (state unchanged
    from then on) and records the step; other members are unaffected."""
    (loss, aux), grads = jax.value_and_grad(kernel.loss, has_aux=True)(state.params, consts, state.step)
    updates, opt_state = kernel.optimizer(consts).update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    live = ~state.diverged
    finite = jnp.isfinite(loss) & _all_finite(params)
    accept = live & finite
    params, opt_state = jax.tree_util.tree_map(
        lambda new, old: jnp.where(accept, new, old), (params, opt_state), (state.params, state.opt_state)
    )
    newly_diverged = live & ~finite
    new_state = MemberState(
        params,
        opt_state,
        state.step + 1,
        state.diverged | newly_diverged,
        jnp.where(newly_diverged, state.step, state.diverged_at),
        jnp.where(live, loss, state.last_loss).astype(jnp.float32),
    )
    metrics = {"loss": jnp.where(live, loss, jnp.nan), **aux}
    return new_state, metrics


def member_status(state: MemberState) -> dict:
    """The few per-member values the host loop reads every chunk (not the whole state)."""
    status = {"diverged": state.diverged, "diverged_at": state.diverged_at}
    hyper = getattr(state.opt_state, "hyperparams", None)
    if hyper is not None and "learning_rate" in hyper:
        status["learning_rate"] = hyper["learning_rate"]
    return status


def make_init(kernel, out_shardings=None):
    return jax.jit(over_members(kernel, init_member), out_shardings=out_shardings)


def make_train_chunk(kernel, length: int):
    """jit(states, consts) -> (states, metrics with leaves (length, members))."""

    def chunk(states, consts):
        if isinstance(kernel, Unrolled):
            # The scan carries one state per group, so a step neither slices nor concatenates.
            group_consts = kernel.split(consts)

            def body(carry, _):
                out = [jax.vmap(lambda s, c, k=k: train_step(k, s, c))(s, c) for k, s, c in zip(kernel.kernels, carry, group_consts)]
                return tuple(o[0] for o in out), _concat([o[1] for o in out])

            final, metrics = jax.lax.scan(body, tuple(kernel.split(states)), None, length=length)
            return _concat(final), metrics

        def body(carry, _):
            return jax.vmap(lambda s, c: train_step(kernel, s, c))(carry, consts)

        return jax.lax.scan(body, states, None, length=length)

    return jax.jit(chunk, donate_argnums=0)


def make_evaluate(kernel):
    return jax.jit(over_members(kernel, lambda k, s, c: k.evaluate(s.params, c)))
