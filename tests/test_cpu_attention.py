"""The fused CPU attention kernel computes the same function as the JAX attention:
values and gradients, plain and grouped heads, with and without dropout, vmapped members
with different head counts; and its dropout keeps the right fraction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.models import Transformer, attention, cpu_attention

pytestmark = pytest.mark.skipif(
    jax.default_backend() != "cpu" or not cpu_attention.available(), reason="CPU attention kernel unavailable"
)


def _value_and_grad(model, params, tokens, heads, deterministic):
    def loss(p):
        logits = model.apply(
            {"params": p}, tokens, heads, deterministic=deterministic, rngs={"dropout": jax.random.PRNGKey(5)}
        )
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    return jax.jit(jax.value_and_grad(loss))(params)


def _assert_kernel_matches_jax(run, grad_atol=1e-6):
    """run(implementation) -> (value, grads) on the JAX path and the CPU kernel: values to
    rtol 1e-5, gradients to rtol 1e-4."""
    a, ga = run("jax")
    b, gb = run("cpu_kernel")
    np.testing.assert_allclose(a, b, rtol=1e-5)
    for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=grad_atol)


# (heads, grouped, deterministic): the fast cases take every value of each and every
# grouped x deterministic pair; the rest of the grid (seconds of compiling each) is slow.
FAST = [(1, False, False), (8, False, True), (2, True, False), (1, True, True)]
SLOW = [c for c in ((h, g, d) for h in (1, 2, 8) for g in (False, True) for d in (True, False)) if c not in FAST]


@pytest.mark.parametrize(
    "heads,grouped,deterministic", FAST + [pytest.param(*case, marks=pytest.mark.slow) for case in SLOW]
)
def test_kernel_equals_jax_attention(heads, grouped, deterministic):
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 12), 0, 16)
    plain = Transformer(16, 12, 16, 2, 32, heads, 0.3)
    params = plain.init(jax.random.PRNGKey(0), tokens)["params"]
    h = jnp.int32(heads) if grouped else None

    def run(implementation):
        model = Transformer(16, 12, 16, 2, 32, 8 if grouped else heads, 0.3, attention=implementation)
        return _value_and_grad(model, params, tokens, h, deterministic)

    _assert_kernel_matches_jax(run)


@pytest.mark.parametrize("heads", [1, 2, 4, 16])
def test_kernel_equals_jax_at_wide_heads_and_odd_length(heads):
    """Width 64: head dims 64/32/16 (the kernel's row-major value path) and 4; length 13
    (not a multiple of the kernel's 4-query blocks), with dropout."""
    x = jax.random.normal(jax.random.PRNGKey(3), (2, 13, 64))
    params = attention.CausalSelfAttention(64, heads, 0.2).init(jax.random.PRNGKey(0), x)["params"]

    def run(implementation):
        layer = attention.CausalSelfAttention(64, heads, 0.2, implementation=implementation)

        def loss(p, x):
            out, _ = layer.apply({"params": p}, x, None, False, rngs={"dropout": jax.random.PRNGKey(7)})
            return jnp.sum(jnp.sin(out))

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)

    _assert_kernel_matches_jax(run, grad_atol=1e-5)


def test_kernel_vmapped_members_with_different_heads():
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 10), 0, 16)
    params = Transformer(16, 10, 16, 1, 32, 8, 0.2).init(jax.random.PRNGKey(0), tokens)["params"]
    heads = jnp.array([1, 2, 4, 8], jnp.int32)

    def run(implementation):
        model = Transformer(16, 10, 16, 1, 32, 8, 0.2, attention=implementation)

        def one(h):
            def loss(p):
                logits = model.apply(
                    {"params": p}, tokens, h, deterministic=False, rngs={"dropout": jax.random.PRNGKey(5)}
                )
                return jnp.mean(logits**2)

            return jax.value_and_grad(loss)(params)

        return jax.jit(jax.vmap(one))(heads)

    _assert_kernel_matches_jax(run)


def test_hash_dropout_keeps_the_fraction_scales_and_is_off_in_eval():
    x = jnp.ones((40, 50, 64))
    layer = attention.HashDropout(0.25)
    assert np.all(np.asarray(layer.apply({}, x, True)) == 1.0)
    y = np.asarray(layer.apply({}, x, False, rngs={"dropout": jax.random.PRNGKey(0)}))
    assert set(np.unique(y)) == {0.0, np.float32(1 / 0.75)}
    assert abs((y > 0).mean() - 0.75) < 0.005
    z = np.asarray(layer.apply({}, x, False, rngs={"dropout": jax.random.PRNGKey(1)}))
    assert abs(np.corrcoef((y > 0).ravel(), (z > 0).ravel())[0, 1]) < 0.01  # another key: independent


def test_dropout_keep_fraction_and_independence():
    threshold, inv_keep = attention.dropout_threshold(0.1)
    assert inv_keep == pytest.approx(1 / 0.9)
    keep = np.asarray(attention.dropout_keep(jnp.array([123, 456], jnp.uint32), 50, 100, threshold))
    assert abs(keep.mean() - 0.9) < 0.003
    other = np.asarray(attention.dropout_keep(jnp.array([124, 456], jnp.uint32), 50, 100, threshold))
    assert abs(np.corrcoef(keep.ravel(), other.ravel())[0, 1]) < 0.01  # another head: independent
    assert abs(np.corrcoef(keep[..., 1:].ravel(), keep[..., :-1].ravel())[0, 1]) < 0.01  # neighbours
