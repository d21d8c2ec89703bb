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


def _assert_close(a, b):
    (va, ga), (vb, gb) = a, b
    np.testing.assert_allclose(va, vb, rtol=VALUE_RTOL)
    for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
        np.testing.assert_allclose(x, y, rtol=GRAD_RTOL, atol=GRAD_ATOL)


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


def _layout_value_and_grad(inputs, length, deterministic, implementation):
    """The layer vmapped over 7 members in one_program's layout, the gradient of the summed
    member losses (as engine.members_step takes it)."""
    x, params = inputs
    members = sum(n for n, _ in LAYOUT)
    layer = attention.CausalSelfAttention(WIDTH, 16, RATE, LAYOUT, implementation, INTERPRET)
    heads = jnp.array([h for n, h in LAYOUT for _ in range(n)], jnp.int32)
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
    "length,deterministic", [(32, False), (100, True), pytest.param(100, False, marks=pytest.mark.slow)]
)
def test_kernel_equals_jax_inside_one_program_layout(inputs, length, deterministic):
    run = lambda implementation: _layout_value_and_grad(inputs, length, deterministic, implementation)  # noqa: E731
    _assert_close(run("jax"), run("pallas"))


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


@pytest.mark.parametrize("implementation,maps", [("pallas", False), pytest.param("jax", True, marks=pytest.mark.slow)])
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


def test_kernel_dropout_keeps_the_jax_paths_elements():
    """The in-kernel hash keeps exactly hash_keep's (b * T + i, j) elements (unpadded T = 100):
    with v = one-hot columns of the keys, the kernel's output exposes p * keep / keep_prob."""
    batch, length, heads = 2, 100, 1
    threshold, inv_keep = attention.dropout_threshold(0.5)
    seeds = attention.coarse_seeds(jax.random.PRNGKey(9), heads)
    q = k = jnp.zeros((batch, length, 128))  # uniform causal attention: p_ij = 1 / (i + 1)
    v = jnp.broadcast_to(jnp.eye(length, 128), (batch, length, 128))  # value j = unit vector j
    out = pallas_attention.attention(q, k, v, seeds, heads, threshold, inv_keep, INTERPRET)[..., :length]
    keep = attention.dropout_keep(seeds[0], batch, length, threshold)
    expected = jnp.where(keep & jnp.tril(jnp.ones((length, length), bool)), inv_keep, 0.0)
    expected = expected / jnp.arange(1, length + 1)[:, None]
    np.testing.assert_allclose(out, expected, rtol=VALUE_RTOL, atol=1e-7)


def test_the_lowerings_constraints_are_checked_before_interpreting():
    assert pallas_attention.block_sizes(100, 4) == (128, 16) and pallas_attention.block_sizes(32, 64) == (32, 64)
    seeds = jnp.zeros((2, 2), jnp.uint32)
    too_long = jnp.zeros((1, pallas_attention.MAX_LENGTH + 1, 32))
    with pytest.raises(ValueError, match="sequence length"):
        pallas_attention.attention(too_long, too_long, too_long, seeds, 2, 1 << 24, 1.0, True)
    half = jnp.zeros((1, 8, 32), jnp.bfloat16)
    with pytest.raises(ValueError, match="float32"):
        pallas_attention.attention(half, half, half, seeds, 2, 1 << 24, 1.0, True)
