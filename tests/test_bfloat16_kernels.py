"""The Pallas kernels under config.model.dtype=bfloat16 (interpret mode on this CPU; issue 40): they
read bfloat16 (no cast to float32 before a pallas_call), accumulate in float32 and equal the JAX
path in bfloat16 to bfloat16's precision, values and gradients: the attention kernel (plain
heads, one_program's layout, dropout, several tiles), the block kernels against the unfused
bfloat16 block (transformer.RMSNorm, bfloat16 matmuls, HashDropout), and a bfloat16 Transformer
under attention=pallas against attention=jax. A float32 model's kernels hold no bfloat16 at all.

Tolerances: bfloat16 keeps 8 significant bits (a rounding is up to 2^-9 ~ 2e-3 relative); the JAX
path rounds after each op where a kernel rounds once at its store, so the two differ by a few
roundings: values rtol 2e-2, gradients rtol 5e-2, each with an atol of a fraction of the largest
entry (of the value; of all the gradients: entries that cancel to near zero).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.models import attention, pallas_block, transformer
from mhjax.models.dropout_hash import dropout_threshold
from mhjax.models.transformer import Transformer
from tests.jaxprs import equations
from tests.test_target import NEEDS_COMPILER

BF16, F32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)
ON_GPU = jax.default_backend() == "gpu"
INTERPRET = not ON_GPU
RATE = 0.3


def _assert_close(got, want, value_atol=1e-2, grad_atol=2e-2):
    """(value, gradients) of the kernel against the JAX path's: equal dtypes, close values."""
    (vg, gg), (vw, gw) = got, want
    assert vg.dtype == vw.dtype
    vg, vw = np.asarray(vg, np.float32), np.asarray(vw, np.float32)
    np.testing.assert_allclose(vg, vw, rtol=2e-2, atol=value_atol * np.abs(vw).max())
    gg, gw = jax.tree_util.tree_leaves(gg), jax.tree_util.tree_leaves(gw)
    assert len(gg) == len(gw)
    # atol against the largest gradient of all: the key bias's is zero up to rounding either way
    largest = max(float(np.abs(np.asarray(b, np.float32)).max()) for b in gw)
    for a, b in zip(gg, gw):
        assert a.dtype == b.dtype, (a.dtype, b.dtype)
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        np.testing.assert_allclose(a, b, rtol=5e-2, atol=grad_atol * largest)


def _calls(jaxpr):
    """{kernel name: [(operand dtypes), (result dtypes)] of each of its pallas_calls}."""
    found = {}
    for eqn in equations(jaxpr):
        if eqn.primitive.name == "pallas_call":
            name = str(eqn.params["name"]).split()[0]
            dtypes = tuple(v.aval.dtype for v in eqn.invars), tuple(v.aval.dtype for v in eqn.outvars)
            found.setdefault(name, []).append(dtypes)
    return found


def _widened(jaxpr, length):
    """Last axes of the bfloat16 activations ((..., T, features)) converted to float32 outside
    the kernels (not the weights' gradients, (members, D, F) under a layout)."""
    return {
        eqn.invars[0].aval.shape[-1]
        for eqn in equations(jaxpr)
        if eqn.primitive.name == "convert_element_type"
        and (eqn.invars[0].aval.dtype, eqn.outvars[0].aval.dtype) == (BF16, F32)
        and eqn.invars[0].aval.ndim >= 3
        and eqn.invars[0].aval.shape[-2] == length
    }


def _attention_checks(jaxpr, width, length):
    """The attention kernel reads bfloat16 q/k/v (out and dout backward) and writes bfloat16,
    its row statistics float32; neither the (..., 3 width) projection nor q, k or v (width) is
    widened to float32 on its way in."""
    calls = _calls(jaxpr)
    assert calls["mhjax_attention_fwd"] and calls["mhjax_attention_bwd"], calls
    for ins, outs in calls["mhjax_attention_fwd"]:
        assert ins[1:4] == (BF16,) * 3 and outs == (BF16, F32), (ins, outs)  # ins[0]: the seeds
    for ins, outs in calls["mhjax_attention_bwd"]:  # seeds, q, k, v, out, lse, dout (then a group's aliased dqkv)
        assert ins[1:7] == (BF16, BF16, BF16, BF16, F32, BF16) and outs == (BF16,), (ins, outs)
    assert not _widened(jaxpr, length) & {width, 3 * width}, _widened(jaxpr, length)


def _layer_run(implementation, heads, length, deterministic, layout=None):
    """(value and gradients of a bfloat16 attention layer (width 64), the gradient's jaxpr); with
    ``layout``, the layer vmapped over its members, the summed member losses' gradient."""
    x = jax.random.normal(jax.random.PRNGKey(3), (2, length, 64)).astype(jnp.bfloat16)
    layer = attention.CausalSelfAttention(
        64, heads, RATE, layout, implementation=implementation, interpret=INTERPRET, dtype="bfloat16"
    )
    params = jax.jit(attention.CausalSelfAttention(64, 1, dtype="bfloat16").init)(jax.random.PRNGKey(0), x[:, :8])
    probe = jax.random.normal(jax.random.PRNGKey(2), (64, 5)).astype(jnp.bfloat16)

    def loss(p, x, h=None, drop=None):
        drop = jax.random.PRNGKey(7) if drop is None else drop
        out, _ = layer.apply(p, x, h, deterministic, rngs={"dropout": drop})
        return jnp.sum(jnp.sin((out @ probe).astype(jnp.float32))), out  # no (..., 64) activation widened

    if layout is None:
        fn = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)
        args = (params, x)
    else:
        members = sum(n for n, _ in layout)
        heads = jnp.array([h for n, h in layout for _ in range(n)], jnp.int32)
        drops = jax.random.split(jax.random.PRNGKey(5), members)
        scale = lambda p: p * (1.0 + 0.1 * jnp.arange(members)).reshape(-1, *[1] * p.ndim)  # noqa: E731
        stacked = jax.tree_util.tree_map(scale, params)

        def total(p, x):
            losses, outs = jax.vmap(loss, in_axes=(0, None, 0, 0))(p, x, heads, drops)
            return jnp.sum(losses), outs

        fn = jax.value_and_grad(total, argnums=(0, 1), has_aux=True)
        args = (stacked, x)
    ((_, out), grads) = jax.jit(fn)(*args)
    return (out, grads), jax.make_jaxpr(fn)(*args).jaxpr


# (heads, length, deterministic): head dims 64 (one tile), 16 at T = 100 (two 64-row tiles), 4
# (4, 100, False) (two tiles, dropout) stays fast; the others (~5 s each) are slow
@pytest.mark.parametrize(
    "heads,length,deterministic",
    [
        pytest.param(1, 12, True, marks=pytest.mark.slow),
        (4, 100, False),
        pytest.param(16, 32, False, marks=pytest.mark.slow),
    ],
)
def test_attention_kernel_reads_bfloat16_and_equals_the_jax_path(heads, length, deterministic):
    (got, jaxpr), (want, _) = (_layer_run(i, heads, length, deterministic) for i in ("pallas", "jax"))
    _attention_checks(jaxpr, 64, length)
    assert got[0].dtype == BF16
    _assert_close(got, want)


# ~8 s: the layout is the float32 tests'
@pytest.mark.slow
def test_attention_kernel_in_one_program_layout_reads_bfloat16_and_equals_the_jax_path():
    """Two head-count groups (heads 1 and 4) of one_program, with dropout: each group's call reads
    and writes the bfloat16 projection of every member in place."""
    layout = ((1, 1), (2, 4))
    (got, jaxpr), (want, _) = (_layer_run(i, 4, 24, False, layout) for i in ("pallas", "jax"))
    _attention_checks(jaxpr, 64, 24)
    assert len(_calls(jaxpr)["mhjax_attention_fwd"]) == 2  # one per group
    _assert_close(got, want)


def _unfused_norm(x, scale):
    """transformer.RMSNorm on x's dtype: statistics in float32, the result cast back."""
    return transformer.RMSNorm().apply({"params": {"scale": scale}}, x)


def _bfloat16_args(key, width, shapes):
    """x (3, 7, D) bfloat16 (21 rows: masked ones), scale float32 around 1, weights drawn as the
    model's and cast to bfloat16 (the per-use cast of the float32 parameters)."""
    keys = jax.random.split(key, 2 + len(shapes))
    x = jax.random.normal(keys[0], (3, 7, width)).astype(jnp.bfloat16)
    scale = 1.0 + 0.2 * jax.random.normal(keys[1], (width,))
    weights = [attention.torch_uniform(fan_in)(k, s).astype(jnp.bfloat16) for k, (s, fan_in) in zip(keys[2:], shapes)]
    return (x, scale, *weights)


def _value_and_grads(fn, args):
    cotangent = jax.random.normal(jax.random.PRNGKey(9), jax.eval_shape(fn, *args).shape)

    def run(*args):
        out, pull = jax.vjp(fn, *args)
        return out, pull(cotangent.astype(out.dtype))

    return jax.jit(run)(*args)


@pytest.mark.parametrize("width,features", [(64, 192), (16, 48)])
def test_norm_dense_in_bfloat16_equals_the_unfused_bfloat16_projection(width, features):
    """rmsnorm (float32 statistics, cast to bfloat16) then the bfloat16 matmul and bias: values,
    and the gradients of x, the scale (float32), the kernel and the bias (bfloat16)."""
    args = _bfloat16_args(jax.random.PRNGKey(width), width, [((width, features), width), ((features,), width)])
    kernel = lambda *a: pallas_block.norm_dense(*a, INTERPRET)  # noqa: E731
    reference = lambda x, scale, w, b: _unfused_norm(x, scale) @ w + b  # noqa: E731
    got = _value_and_grads(kernel, args)
    assert got[0].dtype == BF16 and [g.dtype for g in got[1]] == [BF16, F32, BF16, BF16]
    _assert_close(got, _value_and_grads(reference, args))


@pytest.mark.parametrize("width,hidden,rate", [(64, 128, RATE), (16, 32, 0.0)])
def test_mlp_block_in_bfloat16_equals_the_unfused_bfloat16_mlp_half(width, hidden, rate):
    """x + HashDropout(mlp_out(relu(mlp_in(rmsnorm(x))))) with the matmuls, relu, dropout and the
    residual add in bfloat16: values and the gradients of every input."""
    shapes = [((width, hidden), width), ((hidden,), width), ((hidden, width), hidden), ((width,), hidden)]
    args = _bfloat16_args(jax.random.PRNGKey(hidden), width, shapes)
    key = jax.random.PRNGKey(4)
    threshold, inv_keep = dropout_threshold(rate) if rate else (pallas_block.NO_DROPOUT, 1.0)
    seed = jax.random.bits(key, (2,), jnp.uint32)  # what HashDropout draws from its key
    kernel = lambda *a: pallas_block.mlp_block(*a, seed, threshold, inv_keep, INTERPRET)  # noqa: E731

    def reference(x, scale, w_in, b_in, w_out, b_out):
        h = jax.nn.relu(_unfused_norm(x, scale) @ w_in + b_in) @ w_out + b_out
        return x + attention.HashDropout(rate).apply({}, h, rate == 0.0, key)

    got = _value_and_grads(kernel, args)
    assert got[0].dtype == BF16 and [g.dtype for g in got[1]] == [BF16, F32, BF16, BF16, BF16, BF16]
    _assert_close(got, _value_and_grads(reference, args))


VOCAB = 32  # no other axis of _model's has this size


def _model(implementation, dtype):
    return Transformer(
        vocab_size=VOCAB, max_len=12, width=16, num_layers=2, mlp_dim=40, num_heads=2, dropout_rate=RATE,
        attention=implementation, interpret=INTERPRET, dtype=dtype,
    )  # fmt: skip


TOKENS = jax.random.randint(jax.random.PRNGKey(0), (2, 12), 0, VOCAB)


def _model_step(implementation, dtype):
    model = _model(implementation, dtype)
    params = model.init(jax.random.PRNGKey(1), TOKENS)

    def loss(p):
        logits = model.apply(p, TOKENS, deterministic=False, rngs={"dropout": jax.random.PRNGKey(5)})
        return jnp.sum(jnp.sin(logits))

    return jax.jit(jax.value_and_grad(loss))(params), jax.make_jaxpr(jax.grad(loss))(params).jaxpr


# ~16 s: each kernel is checked alone above
@pytest.mark.slow
def test_a_bfloat16_transformer_runs_every_block_part_as_a_bfloat16_kernel_and_equals_the_jax_path():
    """Under attention=pallas a bfloat16 block takes all three kernels (norm_dense, attention,
    mlp_block; forward and backward, in each of 2 layers), each reading and writing the bfloat16
    residual stream and projection with the weights cast to bfloat16; the loss and the float32
    parameters' gradients equal the JAX path's in bfloat16."""
    (got, jaxpr), (want, _) = _model_step("pallas", "bfloat16"), _model_step("jax", "bfloat16")
    calls = _calls(jaxpr)
    assert {name: len(c) for name, c in calls.items()} == {
        f"mhjax_{kernel}_{way}": 2 for kernel in ("norm_dense", "attention", "mlp_block") for way in ("fwd", "bwd")
    }
    _attention_checks(jaxpr, 16, TOKENS.shape[1])
    dense_in = [(BF16, F32, BF16, BF16)] * 2  # x, scale, kernel, bias
    assert [ins for ins, _ in calls["mhjax_norm_dense_fwd"]] == dense_in
    assert [outs[0] for _, outs in calls["mhjax_norm_dense_bwd"]] == [BF16] * 2  # dx
    mlp_in = [(jnp.dtype(jnp.uint32), BF16, F32, BF16, BF16, BF16, BF16)] * 2  # seed, x, scale, weights
    assert [ins for ins, _ in calls["mhjax_mlp_block_fwd"]] == mlp_in
    assert [outs for _, outs in calls["mhjax_mlp_block_fwd"]] == [(BF16,)] * 2
    assert _widened(jaxpr, TOKENS.shape[1]) == {VOCAB}  # the logits alone: every norm is inside a kernel
    assert {g.dtype for g in jax.tree_util.tree_leaves(got[1])} == {F32}
    _assert_close(got, want)


def _dtypes_everywhere(jaxpr, found):
    """Every dtype in ``jaxpr``, kernel bodies and sub-jaxprs included."""
    for eqn in jaxpr.eqns:
        found.update(v.aval.dtype for v in (*eqn.invars, *eqn.outvars) if hasattr(v.aval, "dtype"))
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _dtypes_everywhere(inner, found)
    return found


def test_a_float32_model_under_the_kernels_holds_no_bfloat16_inside_them_or_out():
    """The float32 program is unchanged by bfloat16 support: no bfloat16 value (so no cast) in the
    training step's jaxpr, the kernels' bodies included (the bfloat16 model's has them: the check
    can fail)."""
    params = _model("pallas", "float32").init(jax.random.PRNGKey(1), TOKENS)
    for dtype, has in (("float32", False), ("bfloat16", True)):
        model = _model("pallas", dtype)

        def loss(p, model=model):
            return jnp.sum(model.apply(p, TOKENS, deterministic=False, rngs={"dropout": jax.random.PRNGKey(5)}))

        assert (BF16 in _dtypes_everywhere(jax.make_jaxpr(jax.grad(loss))(params).jaxpr, set())) == has


@NEEDS_COMPILER
def test_the_bfloat16_kernels_lower_to_triton_for_the_h200():
    """A bfloat16 Transformer's training gradient (width 64, MLP 128, T 100: the paper's block
    shapes) compiled for the H200 without a GPU (Triton and ptxas for sm_90): the three kernels
    forward and backward, no interpreted copy of them."""
    from mhjax.train import hlo
    from mhjax.train import target as targets

    mesh = jax.make_mesh((1,), ("x",), devices=targets.devices(targets.load("h200")))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    model = Transformer(
        vocab_size=VOCAB, max_len=100, width=64, num_layers=1, mlp_dim=128, num_heads=4, dropout_rate=0.1,
        attention="pallas", interpret=False, dtype="bfloat16",
    )  # fmt: skip
    tokens = jnp.zeros((8, 100), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.PRNGKey(1), tokens)

    def loss(p, tokens):
        return jnp.sum(model.apply(p, tokens, deterministic=False, rngs={"dropout": jax.random.PRNGKey(5)}))

    spec = lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding)  # noqa: E731
    text = jax.jit(jax.grad(loss)).lower(jax.tree_util.tree_map(spec, params), spec(tokens)).compile().as_text()
    kernels = ("norm_dense", "attention", "mlp_block")
    assert dict(hlo.triton_kernels(text)) == {f"mhjax_{k}_{way}": 1 for k in kernels for way in ("fwd", "bwd")}
    assert " while(" not in text


def test_bfloat16_weights_fit_twice_the_elements_in_one_program():
    """pallas_block.fits under bfloat16: norm_dense up to 256 x 256 (MAX_DIM both ways), mlp_block
    up to D x M = 128 x 128 (float32: 128 x 256 and 64 x 128); a bfloat16 block takes the kernels
    where a float32 one leaves the MLP to XLA, and the checks refuse past the bfloat16 budget."""
    assert pallas_block.block_parts(64, 256) == (True, False)
    assert pallas_block.block_parts(64, 256, dtype="bfloat16") == (True, True)
    assert pallas_block.block_parts(128, 128, 64, "bfloat16") == (True, True)
    assert pallas_block.block_parts(256, 128, 64, "bfloat16") == (True, False)  # mlp 256 x 128
    assert pallas_block.block_parts(128, 256, 128, "bfloat16") == (False, False)  # F = 384 as 512 > MAX_DIM
    assert pallas_block.fits(256, 256, "norm_dense", "bfloat16") and not pallas_block.fits(256, 256)
    x = jnp.zeros((4, 128), jnp.bfloat16)
    scale, w = jnp.ones(128), lambda *shape: jnp.zeros(shape, jnp.bfloat16)  # noqa: E731
    weights = (w(128, 256), w(256), w(256, 128), w(128))
    with pytest.raises(ValueError, match="128 x 256 > 16384 weight elements in bfloat16"):
        pallas_block.mlp_block(x, scale, *weights, jnp.zeros(2, jnp.uint32), 1 << 24, 1.0, True)


@NEEDS_COMPILER
def test_the_bfloat16_block_rule_is_what_the_h200_compiles():
    """Both sides of each bfloat16 budget against the compiler (benchmarks/studies/block_fit.py): a shape
    the rule gives the kernel compiles for the H200, one it leaves to XLA runs out of shared memory."""
    import importlib.util
    import os

    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location(
        "block_fit", os.path.join(ROOT, "benchmarks", "studies", "block_fit.py")
    )
    block_fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(block_fit)
    cases = (("norm_dense", 256, 256), ("norm_dense", 128, 512), ("mlp_block", 128, 128), ("mlp_block", 128, 256))
    for kind, width, hidden in cases:
        verdict = block_fit.compiles(kind, width, hidden, dtype="bfloat16")
        if pallas_block.fits(width, hidden, kind, "bfloat16"):
            assert verdict == "ok", (kind, width, hidden, verdict)
        else:
            assert "Shared memory size limit exceeded" in verdict, (kind, width, hidden, verdict)
