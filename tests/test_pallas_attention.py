"""The Pallas attention kernel (models/pallas_attention.py, interpret mode on this CPU) computes
the same function as the JAX attention path: values and gradients at static head counts (the
grouped and unrolled strategies' layer) and inside one_program's layout (each group of
members at its own head count), heads 1 to 16 at width 64 (head dims 64 down to 4, padded to
16 on chip), lengths 32 and 100 (100 padded to 128 on chip), with and without dropout; a tiny
sweep trains to the same losses; the lowering's constraints fail in interpret mode too.

Tolerances are the CPU kernel's (tests/test_cpu_attention.py): values rtol 1e-5, gradients
rtol 1e-4 with an atol for gradients near zero. Interpret mode computes in fp32 like the JAX
path. On a GPU the kernel's matmuls run as TF32 (the Triton lowering's default precision, as
XLA's default for the JAX path's fp32 dots): 10 mantissa bits, each product rounded by up to
2^-11 ~ 5e-4 relative, chained through softmax and the backward's five matmuls; compare there
with rtol 2e-3 (atol 1e-4 for gradients near zero).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.models import attention, pallas_attention
from tests.jaxprs import equations

WIDTH, BATCH, RATE = 64, 2, 0.3
ON_GPU = jax.default_backend() == "gpu"  # the real Triton lowering: TF32 matmuls (see above)
INTERPRET = not ON_GPU  # the kernel's static interpret mode (attention_choice.resolve_attention decides it in mhjax)
VALUE_RTOL, GRAD_RTOL = (2e-3, 2e-3) if ON_GPU else (1e-5, 1e-4)
GRAD_ATOL = 1e-4 if ON_GPU else 1e-5  # as the CPU kernel's width-64 test: sums of ~100 terms in another order


@pytest.fixture(scope="module")
def inputs():
    """x (B, 100, D) and the attention layer's parameters (their shapes do not depend on H)."""
    x = jax.random.normal(jax.random.PRNGKey(3), (BATCH, 100, WIDTH))
    params = jax.jit(attention.CausalSelfAttention(WIDTH, 1, RATE).init)(jax.random.PRNGKey(0), x)["params"]
    return x, params


def _assert_close(a, b, relative_atol=0.0):
    """Values and gradients close; ``relative_atol``: beside GRAD_ATOL, an absolute tolerance
    of that fraction of each gradient's largest entry (long sequences, below)."""
    (va, ga), (vb, gb) = a, b
    np.testing.assert_allclose(va, vb, rtol=VALUE_RTOL)
    for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
        atol = max(GRAD_ATOL, relative_atol * float(np.max(np.abs(y))))
        np.testing.assert_allclose(x, y, rtol=GRAD_RTOL, atol=atol)


def _layer_value_and_grad(inputs, heads, length, deterministic, implementation):
    x, params = inputs
    layer = attention.CausalSelfAttention(WIDTH, heads, RATE, implementation=implementation, interpret=INTERPRET)

    def loss(p, x):
        out, _ = layer.apply({"params": p}, x, None, deterministic, rngs={"dropout": jax.random.PRNGKey(7)})
        return jnp.sum(jnp.sin(out))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x[:, :length])


# The default run covers every head count, both lengths and both dropout settings; the rest of
# the grid is slow (interpret mode compiles each case for seconds).
FAST = [(1, 100, True), (2, 32, False), (4, 100, False), (8, 32, True), (16, 100, True), (16, 32, False)]
SLOW = [(h, t, d) for h in (1, 2, 4, 8, 16) for t in (32, 100) for d in (True, False) if (h, t, d) not in FAST]


@pytest.mark.parametrize(
    "heads,length,deterministic", FAST + [pytest.param(*case, marks=pytest.mark.slow) for case in SLOW]
)
def test_kernel_equals_jax_at_static_heads(inputs, heads, length, deterministic):
    run = lambda implementation: _layer_value_and_grad(inputs, heads, length, deterministic, implementation)  # noqa: E731
    _assert_close(run("jax"), run("pallas"))


LAYOUT = ((2, 1), (1, 2), (1, 4), (1, 8), (2, 16))  # (members, heads): one_program's groups


def _layout_value_and_grad(inputs, length, deterministic, implementation, layout=LAYOUT):
    """The layer vmapped over ``layout``'s members (7 in one_program's LAYOUT), the gradient of
    the summed member losses (as engine.members_step takes it)."""
    x, params = inputs
    members = sum(n for n, _ in layout)
    layer = attention.CausalSelfAttention(WIDTH, max(h for _, h in layout), RATE, layout, implementation, INTERPRET)
    heads = jnp.array([h for n, h in layout for _ in range(n)], jnp.int32)
    stacked = jax.tree_util.tree_map(lambda p: p * (1.0 + 0.1 * jnp.arange(members)).reshape(-1, *[1] * p.ndim), params)
    drops = jax.random.split(jax.random.PRNGKey(5), members)

    def loss(p, h, drop):
        out, _ = layer.apply({"params": p}, x[:, :length], h, deterministic, rngs={"dropout": drop})
        return jnp.sum(jnp.sin(out))

    def total(p):
        losses = jax.vmap(loss)(p, heads, drops)
        return jnp.sum(losses), losses

    (_, losses), grads = jax.jit(jax.value_and_grad(total, has_aux=True))(stacked)
    return losses, grads


@pytest.mark.parametrize(
    "length,deterministic",
    [(100, True)] + [pytest.param(*case, marks=pytest.mark.slow) for case in ((100, False), (32, True), (32, False))],
)
def test_kernel_equals_jax_inside_one_program_layout(inputs, length, deterministic):
    run = lambda implementation: _layout_value_and_grad(inputs, length, deterministic, implementation)  # noqa: E731
    _assert_close(run("jax"), run("pallas"))


# Long sequences (the kernel's tiles: 64 rows forward, 64 or 32 backward): two head-count
# groups per layout at width 64, head dims 64 and 16, 16 and 4; one batch row, one member each,
# so that interpret mode stays a few seconds per case. A weight's gradient sums ~T terms in
# fp32: at T = 1,000 the JAX path and the kernel are each up to ~1e-6 of the gradient's
# largest entry from a float64 run of the JAX path (measured, dims 16 and 4 with dropout;
# the kernel's error no larger), more than GRAD_ATOL for entries near zero.
LONG_RELATIVE_ATOL = 4e-6
LONG_LAYOUTS = {"dims 64 and 16": ((1, 1), (1, 4)), "dims 16 and 4": ((1, 4), (1, 16))}
LONG_FAST = [(300, "dims 16 and 4", False)]
LONG_SLOW = [
    (t, name, d) for t in (300, 1000) for name in LONG_LAYOUTS for d in (False, True) if (t, name, d) not in LONG_FAST
]


@pytest.fixture(scope="module")
def long_inputs():
    """x (1, 1000, D) and the attention layer's parameters."""
    x = jax.random.normal(jax.random.PRNGKey(4), (1, 1000, WIDTH))
    params = jax.jit(attention.CausalSelfAttention(WIDTH, 1, RATE).init)(jax.random.PRNGKey(1), x[:, :8])["params"]
    return x, params


@pytest.mark.parametrize(
    "length,layout,deterministic", LONG_FAST + [pytest.param(*case, marks=pytest.mark.slow) for case in LONG_SLOW]
)
def test_tiled_kernel_equals_jax_at_long_sequences_inside_one_program_layout(
    long_inputs, length, layout, deterministic
):
    """T = 300 and 1,000 (5 and 16 forward tiles, the last one partly past T): values and
    gradients of every member in a two-group layout, with and without dropout."""
    run = lambda implementation: _layout_value_and_grad(  # noqa: E731
        long_inputs, length, deterministic, implementation, LONG_LAYOUTS[layout]
    )
    _assert_close(run("jax"), run("pallas"), LONG_RELATIVE_ATOL)


@pytest.mark.slow  # ~30 s: the one_program layout tests below read and write each group too
def test_members_attention_reads_and_writes_each_group_at_its_offset():
    """The kernel on member-axis arrays: each member (group offsets 0, 2, 3) at its own head
    count with its own dropout seeds equals the JAX path run on that member alone, values and
    the gradients of q, k and v, so no group's in-place writes touch another's members."""
    layout, width, length = ((2, 1), (1, 4), (2, 16)), 16, 8
    heads = [h for n, h in layout for _ in range(n)]
    keys = jax.random.split(jax.random.PRNGKey(11), 5)
    q, k, v, cotangent = (jax.random.normal(key, (len(heads), BATCH, length, width)) for key in keys[:4])
    seeds = jax.random.bits(keys[4], (len(heads), 16, 2), jnp.uint32)
    threshold, inv_keep = attention.dropout_threshold(RATE)

    def kernel(q, k, v):  # the kernel reads the fused projection; its gradient comes back as one array
        qkv = jnp.concatenate([q, k, v], axis=-1)
        return pallas_attention.members_attention(qkv, seeds, layout, threshold, inv_keep, INTERPRET)

    def alone(q, k, v):
        each = [
            attention.jax_attention(q[i], k[i], v[i], h, None, seeds[i, :h], threshold, inv_keep)[0]
            for i, h in enumerate(heads)
        ]
        return jnp.stack(each)

    (out, pull), (expected, pull_expected) = jax.vjp(kernel, q, k, v), jax.vjp(alone, q, k, v)
    np.testing.assert_allclose(out, expected, rtol=VALUE_RTOL, atol=1e-6)
    for got, want in zip(pull(cotangent), pull_expected(cotangent)):
        np.testing.assert_allclose(got, want, rtol=GRAD_RTOL, atol=GRAD_ATOL)


def _primitives(jaxpr, counts):
    """Primitive names of ``jaxpr`` and its sub-jaxprs, except inside kernels; a concatenation
    of activations (4 or more dimensions: members, batch, time, features) as 'concatenate4'."""
    for eqn in equations(jaxpr):
        name = eqn.primitive.name
        name += "4" if name == "concatenate" and eqn.outvars[0].aval.ndim >= 4 else ""
        counts[name] = counts.get(name, 0) + 1
    return counts


@pytest.mark.parametrize("implementation,copies", [("pallas", False), ("jax", True)])
def test_one_program_layout_has_no_per_group_copies_under_the_kernel(inputs, implementation, copies):
    """The gradient of a layout layer (5 members in 3 groups): under the kernel, no slice of a
    group's members, no pad of its gradient to all members and no concatenation of groups'
    outputs or of dq, dk, dv into the projection's gradient (the JAX path has all three)."""
    x, params = inputs
    layout = ((2, 1), (1, 2), (2, 4))
    layer = attention.CausalSelfAttention(WIDTH, 4, RATE, layout, implementation, INTERPRET)
    heads = jnp.array([h for n, h in layout for _ in range(n)], jnp.int32)
    stacked = jax.tree_util.tree_map(lambda p: jnp.stack([p] * len(heads)), params)
    drops, short = jax.random.split(jax.random.PRNGKey(5), len(heads)), x[:, :8]

    def loss(p, h, drop):
        return jnp.sum(layer.apply({"params": p}, short, h, False, rngs={"dropout": drop})[0])

    grad = jax.grad(lambda p: jnp.sum(jax.vmap(loss)(p, heads, drops)))
    counts = _primitives(jax.make_jaxpr(grad)(stacked).jaxpr, {})
    assert counts.get("pallas_call", 0) == (6 if implementation == "pallas" else 0)  # 3 groups, forward and backward
    copied = [counts.get(name, 0) for name in ("pad", "slice", "concatenate4")]
    assert (min(copied) > 0) == copies and (max(copied) == 0) == (not copies), counts


@pytest.mark.parametrize(
    "strategy",
    ["one_program", pytest.param("grouped", marks=pytest.mark.slow), pytest.param("unrolled", marks=pytest.mark.slow)],
)
def test_a_tiny_sweep_trains_to_the_same_losses_under_jax_and_pallas(strategy):
    from mhjax.experiments import make_experiment
    from mhjax.train.engine import recipe_groups
    from mhjax.train.loop import Sweep
    from tests.conftest import tiny_sequence_config

    losses = {}
    for implementation in ("jax", "pallas"):
        config = tiny_sequence_config(heads=(1, 4))  # width 16: head dims 16 and 4
        config.strategy, config.attention = strategy, implementation
        sweep = Sweep(make_experiment(config), backend="cpu")
        assert {recipe.model.attention for p in sweep.programs for _, recipe in recipe_groups(p)} == {implementation}
        states = sweep.train(sweep.init_states(), 3, 3)
        losses[implementation] = {p.name: np.asarray(states[p.name].last_loss) for p in sweep.programs}
    for name, pallas in losses["pallas"].items():
        np.testing.assert_allclose(pallas, losses["jax"][name], rtol=VALUE_RTOL)


# both slow (~11 s each): tests/test_path_memory.py prices the T x T arrays of each path
@pytest.mark.slow
@pytest.mark.parametrize("implementation,maps", [("pallas", False), ("jax", True)])
def test_no_t_by_t_array_outside_the_kernel(implementation, maps):
    """The compiled one_program training step at T = 12 (16 on chip): the JAX path holds
    (..., 12, 12) arrays, the kernel's program none (its tiles are 16 x 16, inside the kernel)."""
    from mhjax.experiments import make_experiment
    from mhjax.train import engine
    from mhjax.train.loop import stack_constants
    from tests.conftest import tiny_sequence_config

    config = tiny_sequence_config(heads=(1, 4))
    config.model.seq_len, config.strategy, config.attention = 12, "one_program", implementation
    experiment = make_experiment(config)
    [program] = experiment.programs("one_program", jax.default_backend())
    consts = stack_constants(experiment, program.members)
    states = jax.eval_shape(engine.make_init(program.recipe), consts)
    text = engine.make_train_chunk(program.recipe, 1).lower(states, consts).compile().as_text()
    assert ("12,12]" in text) == maps


@pytest.mark.parametrize("length", [100, pytest.param(256, marks=pytest.mark.slow)])
def test_kernel_dropout_keeps_the_jax_paths_elements(length):
    """The in-kernel hash keeps exactly hash_keep's (b * T + i, j) elements (unpadded T = 100,
    past the first 64-row tile; 256: the old one-block kernel's longest): with v = one-hot
    columns of the keys, the kernel's output exposes p * keep / keep_prob."""
    batch, heads = 2, 1
    threshold, inv_keep = attention.dropout_threshold(0.5)
    seeds = attention.coarse_seeds(jax.random.PRNGKey(9), heads)
    q = k = jnp.zeros((batch, length, length))  # uniform causal attention: p_ij = 1 / (i + 1)
    v = jnp.broadcast_to(jnp.eye(length), (batch, length, length))  # value j = unit vector j
    qkv = jnp.concatenate([q, k, v], axis=-1)
    out = pallas_attention.attention(qkv, seeds, heads, threshold, inv_keep, INTERPRET)[..., :length]
    keep = attention.dropout_keep(seeds[0], batch, length, threshold)
    expected = jnp.where(keep & jnp.tril(jnp.ones((length, length), bool)), inv_keep, 0.0)
    expected = expected / jnp.arange(1, length + 1)[:, None]
    np.testing.assert_allclose(out, expected, rtol=VALUE_RTOL, atol=1e-7)


def test_the_block_size_rule_and_the_lowerings_constraints_are_checked_before_interpreting():
    """Tiles: the sequence padded to a power of two >= 16, capped by the head's padded columns
    (a power of two >= 16): 64 rows up to 32 columns, 64 forward and 32 backward at 64, smaller
    beyond; 4 warps up to 32 columns, 8 beyond."""
    sizes = pallas_attention.block_sizes
    assert sizes(100, 4) == (64, 64, 16, 4) and sizes(32, 64) == (32, 32, 64, 8) and sizes(12, 8) == (16, 16, 16, 4)
    assert (
        sizes(1000, 16) == (64, 64, 16, 4) and sizes(1000, 64) == (64, 32, 64, 8) and sizes(300, 33) == (64, 32, 64, 8)
    )
    assert sizes(1024, 128) == (32, 16, 128, 8) and sizes(1024, 256) == (16, 16, 256, 8)
    seeds = jnp.zeros((2, 2), jnp.uint32)
    half = jnp.zeros((1, 8, 3 * 32), jnp.float16)
    with pytest.raises(ValueError, match="float32 or bfloat16 inputs only, got float16"):
        pallas_attention.attention(half, seeds, 2, 1 << 24, 1.0, True)
