"""The pure training step, vmapped over members and scanned over a chunk of steps.

A *recipe* (the ``Recipe`` protocol below) says how ONE member trains; ``consts`` holds that
member's numeric settings (keys, head count, learning rate, ...). The engine vmaps it over
the member axis and jits once per program and chunk length, donating the state buffers; a
recipe may draw a chunk's data before its scan (Recipe.prefetch: a host read once per chunk). A
recipe whose model batches over the member axis itself (``vmap_inside_grad``: the
one_program strategy's attention layout) has the vmap moved inside one gradient of the
summed member losses (members_step): the same gradients, members being independent.

A program may instead be ``Unrolled(recipes, sizes)``: groups of members written out one
after another in the same program, each group with its own recipe (vmapped inside the
group). XLA's CPU runtime runs independent operations concurrently but each operation on
one core, so on a CPU independent groups keep every core busy, and each group can have
its own static head count, where one vmapped batch runs as a single chain of larger
operations (benchmarks/RESULTS.md). States stay stacked on the member axis either way, so
everything outside the engine is the same.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Protocol

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax


class Recipe(Protocol):
    """How ONE member trains (optax ``GradientTransformation`` style: the engine calls nothing
    else). Every function takes one member's ``consts`` and is traced, vmapped by the engine."""

    # True when the model batches over the whole member axis itself (one gradient of the summed
    # member losses, vmap inside it: members_step); recipes subclass Recipe to inherit False.
    vmap_inside_grad: bool = False
    # A member whose training loss ever exceeds this times its first (step-0) loss is flagged
    # (MemberState.exceeded_at), not frozen; 0 = off.
    divergence_factor: float = 0.0

    def init_params(self, consts) -> Any:
        """theta_0 of the member."""
        ...

    def optimizer(self, consts) -> optax.GradientTransformation:
        """The member's optimizer (hyperparameters may come from ``consts``)."""
        ...

    def loss(self, params, consts, step, data=None) -> tuple[jax.Array, dict]:
        """(scalar training loss at ``step``, {metric: scalar} logged as train/<metric>). ``data``:
        the step's slice of ``prefetch``'s data; only passed when the recipe prefetches."""
        ...

    def prefetch(self, consts, first_step, length: int) -> Any:
        """None (this default): ``loss`` draws its step's data itself. Otherwise the data of the
        ``length`` steps from ``first_step``, a pytree whose leaves lead with ``length``, drawn
        once before a chunk's scan (make_train_chunk): step ``first_step + t`` gets slice t as
        ``loss``'s ``data``. Data read by the host (a jax.pure_callback, vmapped over the steps
        and the members) is then read once per chunk and program, not once per step."""
        return None

    def evaluate(self, params, consts, step) -> dict:
        """{metric: scalar} of the member's evaluation at theta_step (logged as eval/<metric>)."""
        ...

    def trace(self, params, consts, loss, grads) -> dict:
        """{name: scalar} of the member at theta_step, recorded per step in W/trace (io/trace.py)
        and not in TensorBoard: ``loss`` and ``grads`` are the step's own, handed over by the
        engine, so a trace needs no second gradient. {} (this default): nothing traced."""
        return {}


class Program(NamedTuple):
    """One compiled program of a sweep: its name, the indices of its members in
    ``experiment.members`` (in member-axis order), and its recipe (or ``Unrolled``)."""

    name: str
    members: list[int]
    recipe: Recipe | Unrolled


class TrainedProgram(NamedTuple):
    """One program at the end of training, as the trainer hands it to an experiment
    (``Experiment.extra_results``): its stacked member constants and states (on device)."""

    program: Program
    consts: Any
    states: MemberState


@flax.struct.dataclass
class MemberState:
    """One member's training state. The loss-path fields are kept in-graph at the cost of a few
    scalar reductions per step, so that a run that blew up and came back (a loss of 5e6 that then
    underflowed to 0) is never read from its final loss alone."""

    params: Any
    opt_state: Any
    step: jax.Array  # int32, steps taken (frozen members keep counting)
    diverged: jax.Array  # bool: a loss or a parameter was ever non-finite (the member is then frozen)
    diverged_at: jax.Array  # int32 step of that, -1 if none
    last_loss: jax.Array  # float32 training loss of the latest live step (kept in checkpoints)
    initial_loss: jax.Array  # float32 training loss of step 0 (the loss of theta_0); NaN before it
    max_loss: jax.Array  # float32 running maximum of the finite training losses; -inf before any
    exceeded_at: jax.Array  # int32 first step whose loss > divergence_factor x initial_loss, -1 if none


# The loss-path fields, with their values for a checkpoint written before they existed.
PATH_FIELDS = {"initial_loss": np.float32(np.nan), "max_loss": np.float32(-np.inf), "exceeded_at": np.int32(-1)}


def has_path_fields(stored) -> bool:
    """Whether a checkpoint's stored tree ({"members": {name: state fields}}) has the loss-path fields."""
    members = stored.get("members", {}) if isinstance(stored, dict) else {}
    return all(isinstance(m, dict) and set(PATH_FIELDS) <= set(m) for m in members.values())


def without_path(state: MemberState) -> dict:
    """A state's fields as a dict without the loss-path fields: a checkpoint of before them."""
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if f.name not in PATH_FIELDS}


def with_path(fields: dict) -> MemberState:
    """A MemberState from ``without_path``'s fields, the loss path unknown (PATH_FIELDS)."""
    return MemberState(**fields, **PATH_FIELDS)


class Unrolled:
    """Members computed side by side in one program: group g is ``sizes[g]`` consecutive
    members sharing ``recipes[g]``, vmapped within the group; groups are independent
    computations, which XLA's CPU runtime runs concurrently."""

    def __init__(self, recipes, sizes=None):
        self.recipes = tuple(recipes)
        self.sizes = tuple(sizes) if sizes is not None else (1,) * len(self.recipes)
        if len(self.sizes) != len(self.recipes) or min(self.sizes, default=0) < 1:
            raise ValueError("Unrolled: one positive group size per recipe")

    def split(self, tree) -> list:
        """A stacked tree -> one tree per group (slices of the member axis)."""
        out, start = [], 0
        for size in self.sizes:
            out.append(jax.tree_util.tree_map(lambda x, a=start, b=start + size: x[a:b], tree))
            start += size
        return out


def unstack(programs, trees: dict) -> dict[int, Any]:
    """{member index: its own (unstacked) numpy tree} from per-program host trees stacked on the
    member axis: position j of program p is member ``p.members[j]``."""
    out = {}
    for program in programs:
        for j, i in enumerate(program.members):
            out[i] = jax.tree_util.tree_map(lambda x, j=j: np.asarray(x[j]), trees[program.name])
    return out


def recipe_groups(program: Program) -> list[tuple[int, Recipe]]:
    """(members, recipe) of each group of a program, in member-axis order: one group unless the
    program is ``Unrolled``."""
    if isinstance(program.recipe, Unrolled):
        return list(zip(program.recipe.sizes, program.recipe.recipes))
    return [(len(program.members), program.recipe)]


def _concat(trees):
    return jax.tree_util.tree_map(lambda *xs: jnp.concatenate(xs), *trees)


def over_members(recipe, fn):
    """``fn(member_kernel, *member_args)`` lifted to stacked member axes: vmapped for one
    recipe, group by group for ``Unrolled``."""
    if isinstance(recipe, Unrolled):

        def unrolled(*args):
            groups = zip(recipe.recipes, *(recipe.split(a) for a in args))
            return _concat([jax.vmap(lambda *a, r=r: fn(r, *a))(*group_args) for r, *group_args in groups])

        return unrolled
    return jax.vmap(lambda *args: fn(recipe, *args))


def _all_finite(tree) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def init_member(recipe, consts) -> MemberState:
    params = recipe.init_params(consts)
    opt_state = recipe.optimizer(consts).init(params)
    return MemberState(
        params,
        opt_state,
        jnp.int32(0),
        jnp.array(False),
        jnp.int32(-1),
        jnp.float32(jnp.nan),
        **{k: jnp.asarray(v) for k, v in PATH_FIELDS.items()},
    )


def _data(data) -> dict:
    """``loss``'s keyword for a step's prefetched data: none when the recipe does not prefetch."""
    return {} if data is None else {"data": data}


def train_step(recipe, state: MemberState, consts, data=None):
    """One member's step (``data``: its slice of the recipe's prefetched data, if any). A
    non-finite loss or update freezes the member (state unchanged from then on) and records the
    step; other members are unaffected."""
    loss_fn = jax.value_and_grad(recipe.loss, has_aux=True)
    (loss, aux), grads = loss_fn(state.params, consts, state.step, **_data(data))
    return apply_gradients(recipe, state, consts, loss, aux, grads)


def apply_gradients(recipe, state: MemberState, consts, loss, aux, grads):
    """The rest of one member's step once its loss and gradient are known (``loss``: the loss of
    the step's input, theta_{state.step})."""
    updates, opt_state = recipe.optimizer(consts).update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    live = ~state.diverged
    finite = jnp.isfinite(loss) & _all_finite(params)
    accept = live & finite
    params, opt_state = jax.tree_util.tree_map(
        lambda new, old: jnp.where(accept, new, old), (params, opt_state), (state.params, state.opt_state)
    )
    newly_diverged = live & ~finite
    loss32 = loss.astype(jnp.float32)
    counted = live & jnp.isfinite(loss32)
    initial = jnp.where(state.step == 0, loss32, state.initial_loss)
    factor = float(getattr(recipe, "divergence_factor", 0.0) or 0.0)
    above = counted & (loss32 > factor * initial) if factor > 0 else jnp.array(False)
    new_state = MemberState(
        params,
        opt_state,
        state.step + 1,
        state.diverged | newly_diverged,
        jnp.where(newly_diverged, state.step, state.diverged_at),
        jnp.where(live, loss, state.last_loss).astype(jnp.float32),
        initial,
        jnp.where(counted, jnp.maximum(state.max_loss, loss32), state.max_loss),
        jnp.where(above & (state.exceeded_at < 0), state.step, state.exceeded_at),
    )
    metrics = {"loss": jnp.where(live, loss, jnp.nan), **aux}
    trace = recipe.trace(state.params, consts, loss, grads)  # of theta_step, like the loss
    if trace:
        metrics["trace"] = {k: jnp.where(live, v, jnp.nan).astype(jnp.float32) for k, v in trace.items()}
    return new_state, metrics


def members_step(recipe, states: MemberState, consts, data=None):
    """One step of stacked members (``data``: their prefetched data of the step, or None). A
    recipe with ``vmap_inside_grad`` (a model that batches over the whole member axis itself,
    attention.layout_attention) has every member's gradient taken as ONE gradient of the
    summed member losses, the vmap inside it; members are independent, so the gradient of the
    sum is each member's own gradient (tested)."""
    if not recipe.vmap_inside_grad:
        return jax.vmap(lambda s, c, d: train_step(recipe, s, c, d))(states, consts, data)

    def total(params):
        loss = lambda p, c, s, d: recipe.loss(p, c, s, **_data(d))  # noqa: E731
        losses, aux = jax.vmap(loss)(params, consts, states.step, data)
        return jnp.sum(losses), (losses, aux)

    (_, (losses, aux)), grads = jax.value_and_grad(total, has_aux=True)(states.params)
    return jax.vmap(lambda *a: apply_gradients(recipe, *a))(states, consts, losses, aux, grads)


def member_status(state: MemberState) -> dict:
    """The few per-member values the host loop reads every chunk (not the whole state)."""
    status = {
        "diverged": state.diverged,
        "diverged_at": state.diverged_at,
        "exceeded_at": state.exceeded_at,
        "max_loss": state.max_loss,
        "initial_loss": state.initial_loss,
    }
    hyper = getattr(state.opt_state, "hyperparams", None)
    if hyper is not None and "learning_rate" in hyper:
        status["learning_rate"] = hyper["learning_rate"]
    return status


def per_shard(fn, recipe, mesh, in_specs, out_specs):
    """``fn`` run by every device on its own shard of the member axis (jax.shard_map over
    ``mesh``'s MEMBER_AXIS; None: as it is). Members are independent, so the step needs no
    collective, and every kernel the model calls (the Pallas kernels, the C++ attention: custom
    calls XLA cannot partition, which it would otherwise gather and run on every device for
    every member) sees members / N (issue 39). Specs: PartitionSpec prefixes of the arguments
    and results. Unrolled programs stay as XLA partitions them: their groups are slices of the
    whole member axis. check_vma off: pallas_call and ffi_call carry no varying-axis rules."""
    if mesh is None or isinstance(recipe, Unrolled):
        return fn
    return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)


def _specs():
    from jax.sharding import PartitionSpec

    from mhjax.models.member_layout import MEMBER_AXIS

    return PartitionSpec(MEMBER_AXIS), PartitionSpec(None, MEMBER_AXIS), PartitionSpec()


def make_init(recipe, out_shardings=None, mesh=None):
    """``mesh``: run per device on its shard of the member axis (per_shard); None: as one program."""
    members, _, _ = _specs()
    fn = per_shard(over_members(recipe, init_member), recipe, mesh, members, members)
    return jax.jit(fn, out_shardings=out_shardings)


def chunk_data(recipe, states: MemberState, consts, length: int):
    """The recipe's prefetched data of the ``length`` steps from each member's step, as a scan's
    xs (leaves (length, members, ...)); None for a recipe that draws in each step."""
    data = jax.vmap(lambda c, s: recipe.prefetch(c, s, length))(consts, states.step)
    return jax.tree_util.tree_map(lambda x: jnp.moveaxis(x, 0, 1), data)


def _chunk_steps(recipe, consts, length: int):
    """(to_carry(states), data(carry): the scan's xs, step(carry, x) -> (carry, metrics),
    from_carry(carry)) of a chunk's scan of ``length`` steps."""
    if isinstance(recipe, Unrolled):
        # The scan carries one state per group, so a step neither slices nor concatenates.
        group_consts = recipe.split(consts)

        def data(carry):
            return tuple(chunk_data(*a, length) for a in zip(recipe.recipes, carry, group_consts))

        def step(carry, x):
            out = [members_step(*a) for a in zip(recipe.recipes, carry, group_consts, x)]
            return tuple(o[0] for o in out), _concat([o[1] for o in out])

        return lambda states: tuple(recipe.split(states)), data, step, _concat
    return (
        lambda states: states,
        lambda carry: chunk_data(recipe, carry, consts, length),
        lambda carry, x: members_step(recipe, carry, consts, x),
        lambda carry: carry,
    )


def make_train_chunk(recipe, length: int, mesh=None):
    """jit(states, consts) -> (states, metrics with leaves (length, members)); ``mesh`` as make_init.
    A recipe's prefetched data (Recipe.prefetch) is drawn before the scan and scanned over."""

    def chunk(states, consts):
        to_carry, data, step, from_carry = _chunk_steps(recipe, consts, length)
        carry = to_carry(states)
        final, metrics = jax.lax.scan(step, carry, data(carry), length=length)
        return from_carry(final), metrics

    members, steps, _ = _specs()
    return jax.jit(per_shard(chunk, recipe, mesh, (members, members), (members, steps)), donate_argnums=0)


def make_partial_chunk(recipe, length: int, mesh=None):
    """jit(states, consts, count) -> (states after ``count`` steps, metrics (length, members)):
    one program for every chunk of up to ``length`` steps (``count`` is traced; the steps from
    ``count`` on are skipped by a conditional, their metric rows NaN; a recipe's prefetched data
    covers all ``length``). The trainer cuts its first chunk into such pieces to evaluate at
    early steps without compiling one program per piece. ``mesh`` as make_init."""

    def chunk(states, consts, count):
        to_carry, data, step, from_carry = _chunk_steps(recipe, consts, length)
        carry = to_carry(states)
        xs = (jnp.arange(length), data(carry))
        shapes = jax.eval_shape(lambda c, x: step(c, x)[1], carry, jax.tree_util.tree_map(lambda a: a[0], xs[1]))
        blank = jax.tree_util.tree_map(
            lambda s: jnp.full(s.shape, jnp.nan if jnp.issubdtype(s.dtype, jnp.inexact) else 0, s.dtype), shapes
        )

        def body(carry, x):
            t, d = x
            return jax.lax.cond(t < count, lambda c: step(c, d), lambda c: (c, blank), carry)

        final, metrics = jax.lax.scan(body, carry, xs)
        return from_carry(final), metrics

    members, steps, scalar = _specs()
    return jax.jit(per_shard(chunk, recipe, mesh, (members, members, scalar), (members, steps)), donate_argnums=0)


def make_evaluate(recipe, mesh=None):
    """``mesh`` as make_init."""
    members, _, _ = _specs()
    fn = over_members(recipe, lambda r, s, c: r.evaluate(s.params, c, s.step))
    return jax.jit(per_shard(fn, recipe, mesh, (members, members), members))
