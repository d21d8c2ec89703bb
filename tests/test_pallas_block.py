"""The fused block kernels (models/pallas_block.py, interpret mode on this CPU) compute the same
functions as plain JAX written here from transformer.RMSNorm's and Block's formulas, with
attention.HashDropout itself for the dropout: values and the gradients of every input, with and
without dropout, at the paper's sizes (D 64, M 128, F = 3D = 192, computed as 256 on chip) and
the tiny configs' (D 16, M 32, F 48), row counts N = B * T of 64, 200 and 21 (masked rows),
and N spanning several programs and loop steps (the weight-gradient partials summed); vmapped
over members equals each member alone; the keep decisions are HashDropout's exactly; bad input
is a ValueError naming the argument; with the GPU compiler installed, both kernels lower to
Triton for the H200 at the paper's shape.

Tolerances are tests/test_pallas_attention.py's: values rtol 1e-5, gradients rtol 1e-4 with atol
1e-5 for those near zero (sums over rows in another order), or 1e-6 of the gradient's largest
entry where that is more (weight gradients summed over 5000 rows); on a GPU the matmuls are TF32.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.models import attention, pallas_block, transformer
from mhjax.models.dropout_hash import dropout_threshold
from tests.test_target import NEEDS_COMPILER

ON_GPU = jax.default_backend() == "gpu"
INTERPRET = not ON_GPU
VALUE_RTOL, GRAD_RTOL = (2e-3, 2e-3) if ON_GPU else (1e-5, 1e-4)
GRAD_ATOL = 1e-4 if ON_GPU else 1e-5
VALUE_ATOL = 1e-4 if ON_GPU else 1e-6  # outputs that cancel to near zero
# The weight gradients sum over all N rows (5000 at the paper's shape: ~200 in size, the sum in
# another order): entries that cancel to near zero get an atol relative to the array's largest entry.
GRAD_SCALED_ATOL = 1e-5 if ON_GPU else 1e-6
RATE = 0.3
EPS = float(np.finfo(np.float32).eps)


def rms_norm(x, scale):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS) * scale


def reference_norm_dense(x, scale, kernel, bias):
    return rms_norm(x, scale) @ kernel + bias


def reference_mlp(x, scale, w_in, b_in, w_out, b_out, key, rate):
    """Block's MLP half: x + HashDropout(mlp_out(relu(mlp_in(ln2(x)))))."""
    h = jax.nn.relu(rms_norm(x, scale) @ w_in + b_in) @ w_out + b_out
    return x + attention.HashDropout(rate).apply({}, h, rate == 0.0, key)


def seed_of(key):
    """What HashDropout draws from its key."""
    return jax.random.bits(key, (2,), jnp.uint32)


def weights(key, width, shapes):
    """{argument name: weight}: the norm's scale around 1 and ``shapes`` {name: (shape, fan_in)}
    drawn U(+-1/sqrt(fan_in)), the model's init."""
    keys = iter(jax.random.split(key, 16))
    out = {"scale": 1.0 + 0.2 * jax.random.normal(next(keys), (width,))}
    for name, (shape, fan_in) in shapes.items():
        out[name] = attention.torch_uniform(fan_in)(next(keys), shape)
    return out


def mlp_params(key, width, hidden):
    shapes = dict(w_in=((width, hidden), width), b_in=((hidden,), width))
    return weights(key, width, {**shapes, "w_out": ((hidden, width), hidden), "b_out": ((width,), hidden)})


def dense_params(key, width, features):
    return weights(key, width, dict(kernel=((width, features), width), bias=((features,), width)))


def _assert_close(got, want):
    (vg, gg), (vw, gw) = got, want
    np.testing.assert_allclose(vg, vw, rtol=VALUE_RTOL, atol=VALUE_ATOL)
    assert len(gg) == len(gw)
    for a, b in zip(gg, gw):
        np.testing.assert_allclose(a, b, rtol=GRAD_RTOL, atol=max(GRAD_ATOL, GRAD_SCALED_ATOL * np.abs(b).max()))


def _value_and_grads(fn, args, cotangent_key):
    """The output and the gradients of every argument of sum(out * cotangent)."""
    cotangent = jax.random.normal(cotangent_key, jax.eval_shape(fn, *args).shape)

    def run(*args):
        out, pull = jax.vjp(fn, *args)
        return out, pull(cotangent)

    return jax.jit(run)(*args)  # one compile: interpret mode's op-by-op dispatch is slow


def _x(key, batch, length, width):
    return jax.random.normal(key, (batch, length, width))


# (batch, length, width, features): N = 64, 200 (4 programs), 21 (odd: masked rows), the tiny configs'
# width 16 with F 48 (masked columns), and 600 rows (5 programs of 4 to 8 loop steps each).
DENSE_FAST = [(2, 32, 64, 192), (2, 100, 64, 192), (3, 7, 64, 192), (4, 8, 16, 48), (6, 100, 64, 192)]
DENSE_SLOW = [(50, 100, 64, 192), (3, 7, 24, 40)]  # the paper's N = 5000 (5 programs of 1024 rows); width 24


@pytest.mark.parametrize(
    "batch,length,width,features", DENSE_FAST + [pytest.param(*c, marks=pytest.mark.slow) for c in DENSE_SLOW]
)
def test_norm_dense_equals_jax(batch, length, width, features):
    keys = jax.random.split(jax.random.PRNGKey(batch * length + width), 3)
    p = dense_params(keys[0], width, features)
    args = (_x(keys[1], batch, length, width), p["scale"], p["kernel"], p["bias"])
    kernel = lambda *a: pallas_block.norm_dense(*a, INTERPRET)  # noqa: E731
    _assert_close(_value_and_grads(kernel, args, keys[2]), _value_and_grads(reference_norm_dense, args, keys[2]))


# (batch, length, width, mlp_dim, rate)
MLP_FAST = [(2, 32, 64, 128, RATE), (2, 100, 64, 128, 0.0), (3, 7, 64, 128, RATE), (4, 8, 16, 32, RATE)]
MLP_FAST += [(6, 100, 64, 128, RATE)]
MLP_SLOW = [(2, 32, 64, 128, 0.0), (2, 100, 64, 128, RATE), (3, 7, 64, 128, 0.0), (6, 100, 64, 128, 0.0)]
MLP_SLOW += [(50, 100, 64, 128, RATE), (3, 7, 24, 40, RATE)]


@pytest.mark.parametrize(
    "batch,length,width,mlp_dim,rate", MLP_FAST + [pytest.param(*c, marks=pytest.mark.slow) for c in MLP_SLOW]
)
def test_mlp_block_equals_jax(batch, length, width, mlp_dim, rate):
    keys = jax.random.split(jax.random.PRNGKey(batch * length + width + mlp_dim), 4)
    p = mlp_params(keys[0], width, mlp_dim)
    x = _x(keys[1], batch, length, width)
    args = (x, p["scale"], p["w_in"], p["b_in"], p["w_out"], p["b_out"])
    threshold, inv_keep = dropout_threshold(rate) if rate else (pallas_block.NO_DROPOUT, 1.0)
    kernel = lambda *a: pallas_block.mlp_block(*a, seed_of(keys[2]), threshold, inv_keep, INTERPRET)  # noqa: E731
    reference = lambda *a: reference_mlp(*a, keys[2], rate)  # noqa: E731
    _assert_close(_value_and_grads(kernel, args, keys[3]), _value_and_grads(reference, args, keys[3]))


def test_mlp_block_keeps_hash_dropouts_elements():
    """With w_out = 0 and b_out = 1 the MLP's output is the dropout of ones: out - x is the keep
    mask times 1 / keep_prob, element for element HashDropout's (rows across 5 programs)."""
    width, hidden, key = 64, 128, jax.random.PRNGKey(4)
    p = mlp_params(jax.random.PRNGKey(1), width, hidden)
    x = _x(jax.random.PRNGKey(2), 6, 100, width)
    threshold, inv_keep = dropout_threshold(RATE)
    zero, one = jnp.zeros((hidden, width)), jnp.ones(width)
    run = jax.jit(lambda *a: pallas_block.mlp_block(*a, threshold, inv_keep, True))
    out = run(x, p["scale"], p["w_in"], p["b_in"], zero, one, seed_of(key))
    expected = attention.HashDropout(RATE).apply({}, jnp.ones(x.shape), False, key)
    kept = np.asarray(out - x) > 0.5
    np.testing.assert_array_equal(kept, np.asarray(expected) > 0.5)
    assert 0.6 < kept.mean() < 0.8  # about 1 - RATE: the check can fail
    np.testing.assert_allclose(np.asarray(out - x)[kept], inv_keep, rtol=1e-5)


# ~10 s: test_block_kernels runs the kernels vmapped in a model
@pytest.mark.slow
def test_vmapped_over_members_equals_each_member_alone():
    """jax.vmap over 3 members (each its own x, weights and seed) of both kernels, values and
    gradients (taken inside the vmap, and of the summed member losses from outside it, as
    engine.members_step does), equals each member's call alone: the added grid axis leaves
    rows, dropout rows and partials per member."""
    members, width, hidden, features = 3, 64, 128, 192
    keys = jax.random.split(jax.random.PRNGKey(8), members)
    threshold, inv_keep = dropout_threshold(RATE)
    stacked = lambda f: jax.tree_util.tree_map(lambda *a: jnp.stack(a), *[f(k) for k in keys])  # noqa: E731
    mlp = stacked(lambda k: (_x(k, 2, 100, width), *mlp_params(k, width, hidden).values(), seed_of(k)))
    dense = stacked(lambda k: (_x(k, 3, 7, width), *dense_params(jax.random.fold_in(k, 1), width, features).values()))

    def run_mlp(x, scale, w_in, b_in, w_out, b_out, seed):
        return pallas_block.mlp_block(x, scale, w_in, b_in, w_out, b_out, seed, threshold, inv_keep, INTERPRET)

    def run_dense(x, scale, kernel, bias):
        return pallas_block.norm_dense(x, scale, kernel, bias, INTERPRET)

    for run, args, diff in ((run_mlp, mlp, 6), (run_dense, dense, 4)):
        loss = lambda *a, run=run: jnp.sum(jnp.sin(run(*a)))  # noqa: E731
        grad = jax.jit(jax.value_and_grad(loss, argnums=tuple(range(diff))))
        values, grads = jax.jit(jax.vmap(grad))(*args)
        summed = jax.jit(jax.grad(lambda *a, loss=loss: jnp.sum(jax.vmap(loss)(*a)), argnums=tuple(range(diff))))
        for m in range(members):
            value, grad_alone = grad(*(a[m] for a in args))
            np.testing.assert_allclose(values[m], value, rtol=VALUE_RTOL)
            for got, outside, want in zip(grads, summed(*args), grad_alone):
                np.testing.assert_allclose(got[m], want, rtol=GRAD_RTOL, atol=GRAD_ATOL)
                np.testing.assert_allclose(outside[m], want, rtol=GRAD_RTOL, atol=GRAD_ATOL)


def test_the_norm_epsilon_is_the_models():
    assert pallas_block.RMS_EPS == transformer.RMS_EPS == EPS


def test_chunks_and_costs_at_the_paper_shape():
    """N = 5000 rows: 5 programs of 1024 rows; F = 192 computed as 256."""
    assert [pallas_block.chunk_rows(n) for n in (5000, 600, 200, 21)] == [1024, 128, 64, 64]
    rows, programs, computed = 5000, 5, 5120
    mlp = pallas_block.mlp_block_cost(rows, 64, 128)
    weights = 2 * 64 + 2 * 64 * 128 + 128
    assert mlp.dot_flops == 7 * 2 * computed * 64 * 128  # the backward recomputes h
    assert mlp.bytes == 4 * (5 * rows * 64 + programs * (3 * weights - 64))
    dense = pallas_block.norm_dense_cost(rows, 64, 192)
    weights = 64 + 64 * 192 + 192
    assert dense.dot_flops == 3 * 2 * computed * 64 * 256
    assert dense.bytes == 4 * (rows * (3 * 64 + 2 * 192) + programs * (3 * weights - 192))
    assert mlp.flops > mlp.dot_flops and dense.flops > dense.dot_flops


def test_bad_input_is_a_value_error_naming_the_argument():
    x, seed = jnp.zeros((2, 8, 16)), jnp.zeros(2, jnp.uint32)
    p = mlp_params(jax.random.PRNGKey(0), 16, 32)
    mlp = lambda **change: pallas_block.mlp_block(  # noqa: E731
        change.get("x", x), p["scale"], p["w_in"], p["b_in"], change.get("w_out", p["w_out"]), p["b_out"],
        change.get("seed", seed), 1 << 24, 1.0, True,
    )  # fmt: skip
    with pytest.raises(ValueError, match="x must be float32 or bfloat16, got float16"):
        mlp(x=x.astype(jnp.float16))
    with pytest.raises(ValueError, match=r"w_in must be bfloat16 \(x's dtype\), got float32"):
        mlp(x=x.astype(jnp.bfloat16))
    with pytest.raises(ValueError, match=r"w_out must have shape \(32, 16\), got \(16, 32\)"):
        mlp(w_out=p["w_in"])
    with pytest.raises(ValueError, match="seed must be uint32, got int32"):
        mlp(seed=seed.astype(jnp.int32))
    with pytest.raises(ValueError, match=r"kernel must have shape \(16, F\), got \(32, 48\)"):
        pallas_block.norm_dense(x, p["scale"], jnp.zeros((32, 48)), jnp.zeros(48), True)
    with pytest.raises(ValueError, match=r"kernel must be float32 \(x's dtype\), got float16"):
        pallas_block.norm_dense(x, p["scale"], jnp.zeros((16, 48), jnp.float16), jnp.zeros(48), True)
    with pytest.raises(ValueError, match="scale must be float32, got bfloat16"):
        pallas_block.norm_dense(x, p["scale"].astype(jnp.bfloat16), jnp.zeros((16, 48)), jnp.zeros(48), True)
    with pytest.raises(ValueError, match="> 256"):
        pallas_block.norm_dense(x, p["scale"], jnp.zeros((16, 300)), jnp.zeros(300), True)


@NEEDS_COMPILER
def test_both_kernels_lower_to_triton_for_the_h200():
    """Forward and backward of both kernels at the paper's shape (N = 5000, D 64, M 128, F 192),
    alone and vmapped over 8 members, compiled for the H200 without a GPU (Triton and ptxas): each
    program calls exactly the two Triton kernels, no interpreted (while-loop) copy of them."""
    from mhjax.train import hlo
    from mhjax.train import target as targets

    mesh = jax.make_mesh((1,), ("x",), devices=targets.devices(targets.load("h200")))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    threshold, inv_keep = dropout_threshold(0.1)
    dense = (lambda *a: pallas_block.norm_dense(*a, False), [(64,), (64, 192), (192,)], "norm_dense")
    mlp_shapes = [(64,), (64, 128), (128,), (128, 64), (64,)]
    mlp = (lambda *a: pallas_block.mlp_block(*a, threshold, inv_keep, False), mlp_shapes, "mlp_block")
    for fn, shapes, name in (dense, mlp):
        args = [((50, 100, 64), jnp.float32)] + [(s, jnp.float32) for s in shapes]
        args += [((2,), jnp.uint32)] if name == "mlp_block" else []
        grad = jax.value_and_grad(lambda *a, fn=fn: jnp.sum(jnp.sin(fn(*a))), argnums=tuple(range(len(shapes) + 1)))
        for members in (None, 8):
            step = grad if members is None else jax.vmap(grad)
            lead = () if members is None else (members,)
            specs = [jax.ShapeDtypeStruct((*lead, *s), d, sharding=sharding) for s, d in args]
            text = jax.jit(step).lower(*specs).compile().as_text()
            assert dict(hlo.triton_kernels(text)) == {f"mhjax_{name}_fwd": 1, f"mhjax_{name}_bwd": 1}, name
            assert " while(" not in text, name
