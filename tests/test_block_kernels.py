"""The Transformer block where attention runs the Pallas kernel (issue 29, items 2 and 3): the
pre-norms inside the kernels that consume them and the MLP half as one kernel
(models/pallas_block.py, interpret mode on this CPU). The same parameters, dropout draws and
function as the unfused block the JAX path runs; the MLP's hidden activations never leave the
kernel. The kernels' own equality tests: tests/test_pallas_block.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.models.transformer import Transformer
from tests.jaxprs import equations

ON_GPU = jax.default_backend() == "gpu"
VALUE_RTOL, GRAD_RTOL, GRAD_ATOL = (2e-3, 2e-3, 1e-4) if ON_GPU else (1e-5, 1e-4, 1e-5)
MLP = 40  # a size no other axis has (3D = 48, vocab 32): an array with it outside a kernel is the MLP's hidden layer
TOKENS = jax.random.randint(jax.random.PRNGKey(0), (2, 12), 0, 32)


def _model(attention, scan_layers=False, layers=2):
    return Transformer(
        vocab_size=32, max_len=12, width=16, num_layers=layers, mlp_dim=MLP, num_heads=2, dropout_rate=0.3,
        attention=attention, interpret=not ON_GPU, scan_layers=scan_layers,
    )  # fmt: skip


def _value_and_grad(model, params):
    def loss(p):
        logits = model.apply(p, TOKENS, deterministic=False, rngs={"dropout": jax.random.PRNGKey(5)})
        return jnp.sum(jnp.sin(logits))

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("scan_layers", [False, pytest.param(True, marks=pytest.mark.slow)])  # scanned: ~10 s
def test_the_kernel_block_is_the_jax_block(scan_layers):
    """Same parameter tree and initial values, same loss and gradients with dropout on (the
    MLP dropout's keep decisions drawn from the same key), unrolled and scanned layers."""
    plain, fused = _model("jax", scan_layers), _model("pallas", scan_layers)
    params = plain.init(jax.random.PRNGKey(1), TOKENS)
    kernel_params = fused.init(jax.random.PRNGKey(1), TOKENS)
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(kernel_params)
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(kernel_params)):
        np.testing.assert_array_equal(a, b)
    (value, grads), (kernel_value, kernel_grads) = _value_and_grad(plain, params), _value_and_grad(fused, params)
    np.testing.assert_allclose(kernel_value, value, rtol=VALUE_RTOL)
    for a, b in zip(jax.tree_util.tree_leaves(kernel_grads), jax.tree_util.tree_leaves(grads)):
        np.testing.assert_allclose(a, b, rtol=GRAD_RTOL, atol=GRAD_ATOL)


def _is_hidden(shape) -> bool:
    """(B, T, MLP) or (B * T, MLP) rows: not the (D, MLP) weights or their gradients."""
    return shape[-1:] == (MLP,) and np.prod(shape[:-1]) % TOKENS.size == 0


@pytest.mark.parametrize("attention", ["pallas", "jax"])
def test_a_training_step_runs_three_kernels_per_layer_and_no_hidden_activation(attention):
    """The gradient of one layer under the kernels: attention, the norm and q/k/v projection and
    the MLP block, each forward and backward (6 Pallas calls), and no (..., MLP) array outside
    them (the JAX path stores the hidden activation for its backward)."""
    model = _model(attention, layers=1)
    params = model.init(jax.random.PRNGKey(1), TOKENS)
    jaxpr = jax.make_jaxpr(lambda p: jax.grad(lambda p: jnp.sum(model.apply(p, TOKENS)))(p))(params).jaxpr
    eqns = list(equations(jaxpr))
    names = [str(e.params["name"]).split()[0] for e in eqns if e.primitive.name == "pallas_call"]
    assert len(names) == (6 if attention == "pallas" else 0), names
    hidden = [
        v.aval.shape for e in eqns if e.primitive.name != "pallas_call" for v in e.outvars if _is_hidden(v.aval.shape)
    ]
    assert (hidden == []) == (attention == "pallas"), hidden


def test_the_block_kernels_rule_leaves_what_one_program_cannot_hold_to_xla():
    """pallas_block.fits: padded sizes within MAX_DIM and their product within the kernel's
    shared-memory budget (found by the H200 compile: tests/test_target.py checks it there)."""
    from mhjax.models import pallas_block

    assert pallas_block.block_parts(64, 128) == (True, True)  # the paper's model (F = 192 as 256)
    assert pallas_block.block_parts(64, 256) == (True, False)  # 64 x 256 x 2 weights: too much for one program
    assert pallas_block.block_parts(128, 128, 64) == (True, False)  # F = 192 as 256; mlp 128 x 128
    assert pallas_block.block_parts(256, 512) == (False, False)
    assert pallas_block.block_parts(32, 256, 32) == (True, True)
    x = jnp.zeros((4, 64), jnp.float32)
    weights = (jnp.ones(64), jnp.zeros((64, 256)), jnp.zeros(256), jnp.zeros((256, 64)), jnp.zeros(64))
    with pytest.raises(ValueError, match=r"mlp_block: D x M = 64 x 256 padded to 64 x 256 > 8192 weight elements"):
        pallas_block.mlp_block(x, *weights, jnp.zeros(2, jnp.uint32), 1 << 24, 1.0, True)
