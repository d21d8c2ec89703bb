"""The Pallas TPU attention (models/pallas_tpu_attention.py: mhjax's Mosaic kernel, in TPU
interpret mode on this CPU) computes the JAX path's function: values and gradients at static
heads (the grouped and unrolled strategies' layer, also vmapped over members) and inside
one_program's layout (each group at its own head count), T = 100 and 300 (one tile) and 1,024
(four tiles of 256 rows), 1 to 16 heads, dropout on and off (the same keep decisions: the
hash), float32 and bfloat16.

The default run takes a case of each kind (a few seconds each in interpret mode); `-m slow`
the rest of the grid (T = 1,021 and 2,048 at 1 and 16 heads, dropout on and off: ~3 minutes on 2 cores). Tolerances as
tests/test_pallas_attention.py's in interpret mode (float32 throughout).

On a TPU (benchmarks/accelerator.sh's kernel_tests, JAX_PLATFORMS=tpu) the same tests run the
compiled Mosaic kernel: float32 matmuls at full precision on both paths (a TPU's default passes
float32 through bfloat16), tolerances as the GPU's compiled kernel's.
"""

import contextlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.models import attention, pallas_tpu_attention, tpu_vmem
from mhjax.models.attention_choice import resolve_attention
from tests.jaxprs import equations

this_module = sys.modules[__name__]  # its switches, patched to trace as on a TPU

WIDTH, BATCH, RATE = 64, 2, 0.3
ON_TPU = jax.default_backend() == "tpu"  # the real Mosaic lowering
INTERPRET = not ON_TPU  # the kernel's static interpret mode (attention_choice.resolve_attention decides it in mhjax)
# compiled: other transcendental and reduction orders than XLA's (as tests/test_pallas_attention.py on a GPU)
VALUE_RTOL, GRAD_RTOL, GRAD_ATOL = (2e-3, 2e-3, 1e-4) if ON_TPU else (1e-5, 1e-4, 1e-5)


@pytest.fixture(scope="module")
def inputs():
    """x (B, 2048, D) and the attention layer's parameters (their shapes do not depend on H)."""
    x = jax.random.normal(jax.random.PRNGKey(3), (BATCH, 2048, WIDTH))
    params = jax.jit(attention.CausalSelfAttention(WIDTH, 1, RATE).init)(jax.random.PRNGKey(0), x[:, :8])["params"]
    return x, params


def _assert_close(a, b, rtol=(VALUE_RTOL, GRAD_RTOL), atol=GRAD_ATOL):
    (va, ga), (vb, gb) = a, b
    # members' losses (sums of sines, some near 0 by cancellation) against the largest's scale
    np.testing.assert_allclose(va, vb, rtol=rtol[0], atol=rtol[0] * float(np.abs(vb).max()))
    for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
        # absolute error against the array's scale: summation order differs (the gradients sum
        # 300 rows of up to 16 heads; entries near 0 among entries of 100)
        np.testing.assert_allclose(x, y, rtol=rtol[1], atol=atol * max(1.0, float(np.abs(y).max())))


def _layer(heads, implementation, layout=None, dtype="float32"):
    return attention.CausalSelfAttention(WIDTH, heads, RATE, layout, implementation, interpret=INTERPRET, dtype=dtype)


def _precision(dtype="float32"):
    """Full float32 matmuls on a TPU, for both paths (traced under it: lax.dot_general reads it
    then, and the Mosaic lowering maps HIGHEST to fp32 contraction); bfloat16 inputs as they are."""
    return jax.default_matmul_precision("highest") if ON_TPU and dtype == "float32" else contextlib.nullcontext()


def _value_and_grad(inputs, heads, length, implementation, members=0, dtype="float32", dropout=False):
    """Loss and gradients of the layer at ``heads`` (``dropout``: a training call, rate RATE,
    the same dropout key for both implementations); ``members`` > 0: the layer vmapped over
    that many members with scaled parameters (the grouped strategy's program)."""
    x, params = inputs
    layer = _layer(heads, implementation, dtype=dtype)

    def loss(p):
        rngs = {"dropout": jax.random.key(7)} if dropout else {}
        out, _ = layer.apply({"params": p}, x[:, :length], None, not dropout, rngs=rngs)
        return jnp.sum(jnp.sin(out.astype(jnp.float32)))

    with _precision(dtype):
        if not members:
            return jax.jit(jax.value_and_grad(loss))(params)
        scales = 1.0 + 0.1 * jnp.arange(members)
        stacked = jax.tree_util.tree_map(lambda p: p * scales.reshape(-1, *[1] * p.ndim), params)
        return jax.jit(jax.vmap(jax.value_and_grad(loss)))(stacked)


@pytest.fixture
def vmapped_grids(monkeypatch):
    """jax 0.10.2's TPU interpret mode takes a pallas_call's dimension semantics as given, not
    extended by the grid dimensions vmap adds (the Mosaic lowering extends them: vmapped_dims in
    jax/_src/pallas/mosaic/lowering.py): prepend parallel ones as the lowering does. Compiled (a
    TPU), the lowering's own rule applies: nothing to patch."""
    if not INTERPRET:
        return
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as interpreter

    given = interpreter._get_parallel_dim_semantics

    def extended(params, dims):
        semantics = given(params, dims)
        return (True,) * (dims - len(semantics)) + semantics

    monkeypatch.setattr(interpreter, "_get_parallel_dim_semantics", extended)


FAST = [(1, 100, 0, True), (4, 100, 2, True), (16, 100, 0, False), (16, 300, 0, True), (4, 1024, 0, True)]
FAST += [(2, 600, 0, True)]  # padded to 768 rows: three tiles, three above the diagonal skipped
SLOW = [(16, 100, 0, True), (1, 300, 0, True), (4, 300, 2, False), (4, 600, 2, False), (4, 37, 0, True)]
SLOW += [
    (heads, length, 0, dropout) for heads in (1, 16) for length in (1021, 2048) for dropout in (False, True)
]  # (heads, T, members vmapped (0: one), dropout)


@pytest.mark.parametrize(
    "heads,length,members,dropout", FAST + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW]
)
def test_tpu_kernel_equals_jax_at_static_heads(inputs, vmapped_grids, heads, length, members, dropout):
    run = lambda implementation: _value_and_grad(inputs, heads, length, implementation, members, dropout=dropout)  # noqa: E731
    _assert_close(run("jax"), run("pallas_tpu"))


def test_dropout_changes_the_kernels_output_as_the_jax_paths(inputs):
    """Dropout on is not dropout off (the keep decisions are applied), and the kernel drops what
    the JAX path drops: the difference between on and off agrees too."""
    on = [_value_and_grad(inputs, 4, 100, impl, dropout=True)[0] for impl in ("jax", "pallas_tpu")]
    off = _value_and_grad(inputs, 4, 100, "pallas_tpu")[0]
    assert abs(float(on[1] - off)) > 1e-2
    np.testing.assert_allclose(on[1], on[0], rtol=VALUE_RTOL)


@pytest.mark.parametrize("heads,length", [(4, 100), pytest.param(16, 300, marks=pytest.mark.slow)])
def test_tpu_kernel_equals_jax_in_bfloat16(inputs, heads, length):
    """bfloat16 q, k, v: the kernel's float32 accumulation against the JAX path's bfloat16
    probabilities meeting v: values and gradients to bfloat16's ~1e-2."""
    run = lambda implementation: _value_and_grad(inputs, heads, length, implementation, dtype="bfloat16")  # noqa: E731
    _assert_close(run("jax"), run("pallas_tpu"), rtol=(5e-2, 5e-2), atol=5e-2)


def _layout_value_and_grad(inputs, length, implementation, layout):
    """The layer vmapped over ``layout``'s members, the gradient of the summed member losses (as
    engine.members_step takes it): each group through the kernel at its own head count."""
    x, params = inputs
    members = sum(n for n, _ in layout)
    layer = _layer(max(h for _, h in layout), implementation, layout)
    heads = jnp.array([h for n, h in layout for _ in range(n)], jnp.int32)
    stacked = jax.tree_util.tree_map(lambda p: p * (1.0 + 0.1 * jnp.arange(members)).reshape(-1, *[1] * p.ndim), params)

    def total(p):
        losses = jax.vmap(lambda p, h: jnp.sum(jnp.sin(layer.apply({"params": p}, x[:, :length], h, True)[0])))(
            p, heads
        )
        return jnp.sum(losses), losses

    with _precision():
        (_, losses), grads = jax.jit(jax.value_and_grad(total, has_aux=True))(stacked)  # deterministic
    return losses, grads


@pytest.mark.parametrize(
    "length,layout",
    [(100, ((2, 1), (1, 4)))] + [pytest.param(300, ((1, 1), (1, 4), (1, 16)), marks=pytest.mark.slow)],
)
def test_tpu_kernel_equals_jax_inside_one_program_layout(inputs, length, layout):
    run = lambda implementation: _layout_value_and_grad(inputs, length, implementation, layout)  # noqa: E731
    _assert_close(run("jax"), run("pallas_tpu"))


def test_auto_on_a_tpu_takes_the_kernel_at_any_length_and_with_dropout():
    for length, rate in [(100, 0.1), (100, 0.0), (1024, 0.1)]:
        choice = resolve_attention("auto", "tpu", length, dropout=rate)
        assert (choice.implementation, choice.fallback) == ("pallas_tpu", None)


def test_tpu_kernel_pads_long_sequences_to_whole_tiles():
    """Up to 512 rows one tile of T; beyond, 256-row tiles and T rounded up (1,001 = 7 x 11 x 13:
    no divisor hunt), the tile pairs on or below the diagonal run (n tiles: n (n + 1) / 2)."""
    lengths = (1, 100, 300, 512, 513, 768, 1001, 1021, 1024, 2048)
    assert [tpu_vmem.tiles(t) for t in lengths] == [
        (1, 1), (100, 100), (300, 300), (512, 512), (256, 768), (256, 768), (256, 1024), (256, 1024), (256, 1024),
        (256, 2048),
    ]  # fmt: skip
    assert [tpu_vmem.tile_pairs(t) for t in lengths] == [1, 1, 1, 1, 6, 6, 10, 10, 10, 36]


def test_tpu_kernel_refuses_what_mosaic_would():
    with pytest.raises(ValueError, match="heads do not divide width"):
        pallas_tpu_attention.check(64, 3, jnp.float32)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        pallas_tpu_attention.check(64, 4, jnp.float16)


def _kernel_calls(inputs):
    """The pallas_calls of the tests' layer (4 heads, T = 100) under its gradient, traced as the
    tests trace it (``_layer``, ``_precision``); nothing is lowered."""
    x, params = inputs
    layer = _layer(4, "pallas_tpu")
    loss = lambda p: jnp.sum(layer.apply({"params": p}, x[:, :100], None, True)[0])  # noqa: E731
    with _precision():
        jaxpr = jax.make_jaxpr(jax.grad(loss))(params)
    return [e for e in equations(jaxpr.jaxpr) if e.primitive.name == "pallas_call"]


def test_on_a_tpu_the_tests_run_the_compiled_kernel_at_full_float32_precision(inputs, monkeypatch):
    """benchmarks/accelerator.sh runs this file on a TPU: there the kernel is traced for the
    Mosaic lowering (no interpret mode) and its matmuls at HIGHEST (a TPU's default passes
    float32 through bfloat16); on this CPU, interpret mode at the default precision, as before."""
    dots = lambda call: {
        e.params["precision"] for e in equations(call.params["jaxpr"]) if e.primitive.name == "dot_general"
    }  # noqa: E731
    here = _kernel_calls(inputs)
    assert len(here) == 2 and all(c.params["interpret"] for c in here)  # forward and backward
    assert set().union(*map(dots, here)) == {None}
    monkeypatch.setattr(this_module, "ON_TPU", True)
    monkeypatch.setattr(this_module, "INTERPRET", False)
    on_tpu = _kernel_calls(inputs)
    assert len(on_tpu) == 2 and not any(c.params["interpret"] for c in on_tpu)
    assert set().union(*map(dots, on_tpu)) == {(jax.lax.Precision.HIGHEST,) * 2}
