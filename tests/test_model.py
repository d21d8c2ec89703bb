"""The paper's Transformer: parameter count, initialisation, and grouped heads == plain heads."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.models import Transformer, count_params
from mhjax.models.transformer import RMS_EPS


def paper_params(heads):
    model = Transformer(256, 100, 64, 4, 128, heads, 0.1)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 100), jnp.int32)))
    return shapes["params"]


@pytest.mark.parametrize("heads", [1, 4, 8, 16])
def test_paper_model_has_172800_parameters(heads):
    assert count_params(paper_params(heads)) == 172_800


def test_rmsnorm_eps_is_float32_machine_epsilon():
    assert RMS_EPS == np.finfo(np.float32).eps


def test_rmsnorm_matches_its_definition_and_flax():
    import flax.linen as nn

    from mhjax.models.transformer import RMSNorm

    x = np.asarray(jax.random.normal(jax.random.PRNGKey(0), (3, 5, 16))) * 3.0
    scale = np.asarray(jax.random.normal(jax.random.PRNGKey(1), (16,)))
    ours = np.asarray(RMSNorm().apply({"params": {"scale": scale}}, x))
    expected = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + RMS_EPS) * scale
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-6)
    flax_out = nn.RMSNorm(epsilon=RMS_EPS).apply({"params": {"scale": scale}}, x)
    np.testing.assert_allclose(ours, flax_out, rtol=1e-6, atol=1e-6)


def test_fused_qkv_initialises_like_separate_dense_layers():
    """query/key/value are one (D, 3D) matmul but keep nn.Dense's names, shapes and init."""
    import flax.linen as nn

    from mhjax.models.attention import CausalSelfAttention, dense

    class Reference(nn.Module):
        @nn.compact
        def __call__(self, x):
            return [dense(16, 16, name)(x) for name in ("query", "key", "value")]

    x = jnp.ones((1, 4, 16))
    ours = CausalSelfAttention(16, 2).init(jax.random.PRNGKey(4), x)["params"]
    ref = Reference().init(jax.random.PRNGKey(4), x)["params"]
    for name in ("query", "key", "value"):
        for leaf in ("kernel", "bias"):
            np.testing.assert_array_equal(ours[name][leaf], ref[name][leaf])


def test_initialisation_scales_match_reference_framework():
    model = Transformer(256, 100, 64, 4, 128, 4, 0.1)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 100), jnp.int32))["params"]
    emb = np.asarray(params["token_emb"]["embedding"])
    assert abs(emb.std() - 1.0) < 0.03  # N(0, 1)
    for name, fan_in in (("query", 64), ("out", 64)):
        kernel = np.asarray(params["block_0"]["attn"][name]["kernel"])
        bias = np.asarray(params["block_0"]["attn"][name]["bias"])
        bound = 1 / np.sqrt(fan_in)
        assert np.abs(kernel).max() <= bound and np.abs(kernel).max() > 0.95 * bound
        assert np.abs(bias).max() <= bound and np.abs(bias).std() > 0
    mlp_out = np.asarray(params["block_0"]["mlp_out"]["kernel"])
    assert np.abs(mlp_out).max() <= 1 / np.sqrt(128)
    assert np.all(np.asarray(params["block_0"]["ln1"]["scale"]) == 1.0)


def _naive_attention(x, p, heads):
    """Independent H-head causal attention in numpy (eval mode)."""
    batch, length, width = x.shape
    d = width // heads
    proj = {n: x @ np.asarray(p[n]["kernel"]) + np.asarray(p[n]["bias"]) for n in ("query", "key", "value")}
    out = np.zeros_like(x)
    mask = np.tril(np.ones((length, length), bool))
    for h in range(heads):
        sl = slice(h * d, (h + 1) * d)
        s = np.einsum("btd,bsd->bts", proj["query"][..., sl], proj["key"][..., sl]) / np.sqrt(d)
        s = np.where(mask, s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        out[..., sl] = a @ proj["value"][..., sl]
    return out @ np.asarray(p["out"]["kernel"]) + np.asarray(p["out"]["bias"])


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_attention_matches_naive_numpy(heads):
    model = Transformer(16, 8, 16, 1, 32, heads, 0.0)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 8), 0, 16)
    params = model.init(jax.random.PRNGKey(0), tokens)["params"]
    from mhjax.models.attention import CausalSelfAttention

    x = jax.random.normal(jax.random.PRNGKey(2), (2, 8, 16))
    attn = CausalSelfAttention(16, heads)
    out, probs = attn.apply({"params": params["block_0"]["attn"]}, x)
    np.testing.assert_allclose(out, _naive_attention(np.asarray(x), params["block_0"]["attn"], heads), atol=1e-5)
    assert probs.shape == (2, heads, 8, 8)
    np.testing.assert_allclose(np.asarray(probs).sum(-1), 1.0, atol=1e-6)
    assert np.all(np.triu(np.asarray(probs), 1) == 0)  # causal: row = query, column = key


# 2 and 8 heads (slow): 1 and 4 hold the same code
@pytest.mark.parametrize(
    "heads", [1, pytest.param(2, marks=pytest.mark.slow), 4, pytest.param(8, marks=pytest.mark.slow)]
)
@pytest.mark.parametrize("deterministic", [True, False])
def test_grouped_heads_equal_plain_heads(heads, deterministic):
    """A member with H heads inside an 8-fine-head program == the plain H-head model,
    in logits, attention and gradients, with and without dropout."""
    plain, fine = Transformer(16, 8, 16, 2, 32, heads, 0.1), Transformer(16, 8, 16, 2, 32, 8, 0.1)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 8), 0, 16)
    params = plain.init(jax.random.PRNGKey(0), tokens)["params"]
    rngs = {"dropout": jax.random.PRNGKey(5)}

    def loss(p, model, h):
        logits = model.apply({"params": p}, tokens, h, deterministic=deterministic, rngs=rngs)
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    a, ga = jax.value_and_grad(loss)(params, plain, None)
    b, gb = jax.value_and_grad(loss)(params, fine, jnp.int32(heads))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
    _, pa = plain.apply({"params": params}, tokens, return_attention=True)
    _, pb = fine.apply({"params": params}, tokens, jnp.int32(heads), return_attention=True)
    group = 8 // heads
    for la, lb in zip(pa, pb):  # fine head f carries its coarse head f // group
        np.testing.assert_allclose(la, lb[:, ::group], atol=1e-6)


# both slow (~28 s each): test_sweep's one_program tests train the layout against grouped programs
@pytest.mark.slow
@pytest.mark.parametrize("deterministic", [True, False])
def test_member_layout_equals_plain_heads_per_member(deterministic):
    """One model vmapped over members of 1, 2, 4 and 8 heads with their layout (attention run
    group by group at static head counts), gradients taken of the summed losses as the engine
    does == each member's plain model at its own head count, alone: losses and gradients."""
    heads = [1, 1, 2, 4, 4, 8]
    layout = ((2, 1), (1, 2), (2, 4), (1, 8))
    packed = Transformer(16, 8, 16, 2, 32, 8, 0.1, layout)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 8), 0, 16)
    keys = jax.random.split(jax.random.PRNGKey(0), len(heads))
    params = jax.vmap(lambda k: packed.init(k, tokens)["params"])(keys)
    drops = jax.random.split(jax.random.PRNGKey(5), len(heads))

    def loss(p, model, h, drop):
        logits = model.apply({"params": p}, tokens, h, deterministic=deterministic, rngs={"dropout": drop})
        return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

    def total(p):
        losses = jax.vmap(lambda p, h, d: loss(p, packed, h, d))(p, jnp.array(heads), drops)
        return jnp.sum(losses), losses

    (_, losses), grads = jax.jit(jax.value_and_grad(total, has_aux=True))(params)
    alone = {}  # one compiled plain model per head count (jit, not op by op: seconds less)
    for i, h in enumerate(heads):
        own = jax.tree_util.tree_map(lambda x, i=i: x[i], params)
        if h not in alone:
            plain = Transformer(16, 8, 16, 2, 32, h, 0.1)
            alone[h] = jax.jit(jax.value_and_grad(lambda p, d, plain=plain: loss(p, plain, None, d)))
        a, ga = alone[h](own, drops[i])
        np.testing.assert_allclose(losses[i], a, rtol=1e-5, atol=1e-6)
        for x, y in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ga)):
            np.testing.assert_allclose(x[i], y, rtol=1e-4, atol=1e-6)


def test_member_layout_must_cover_the_vmapped_axis():
    model = Transformer(16, 8, 16, 1, 32, 4, 0.0, ((2, 1), (1, 4)))
    tokens = jnp.zeros((1, 8), jnp.int32)
    with pytest.raises(ValueError, match="vmapped over 2 members, the layout has 3"):
        jax.vmap(lambda k: model.init(k, tokens))(jax.random.split(jax.random.PRNGKey(0), 2))


# plain heads (slow): the same scan as the traced head count's case, which stays fast
@pytest.mark.parametrize(
    "num_heads, heads, layout",
    [
        pytest.param(4, None, None, marks=pytest.mark.slow),
        pytest.param(8, 2, None, marks=pytest.mark.slow),
        (4, None, ((2, 1), (1, 4))),
    ],
)
def test_scanned_layers_equal_the_unrolled_blocks(num_heads, heads, layout):
    """scan_layers (accelerators: one layer compiled instead of L) computes what the unrolled
    blocks compute: the same parameter tree, the same dropout draws (each layer's keys are the
    ones make_rng gives its block), losses and gradients to float rounding, attention maps."""
    tokens = jax.random.randint(jax.random.PRNGKey(1), (3, 8), 0, 16)
    unrolled, scanned = (Transformer(16, 8, 16, 3, 32, num_heads, 0.3, layout, scan_layers=s) for s in (False, True))
    params = unrolled.init(jax.random.PRNGKey(0), tokens)["params"]
    same = jax.tree_util.tree_map(np.array_equal, params, scanned.init(jax.random.PRNGKey(0), tokens)["params"])
    assert all(jax.tree_util.tree_leaves(same)) and "block_2" in params

    def loss(model, p, deterministic):
        out = model.apply({"params": p}, tokens, heads, deterministic, rngs={"dropout": jax.random.PRNGKey(5)})
        return jnp.mean(out**2)

    stacked = jax.tree_util.tree_map(lambda x: jnp.stack([x] * 3), params)

    def value(model, deterministic):
        if layout is None:
            return jax.value_and_grad(lambda p: loss(model, p, deterministic))(params)
        # a layout model is vmapped over its members, its gradient taken outside the vmap
        return jax.value_and_grad(lambda s: jnp.sum(jax.vmap(lambda p: loss(model, p, deterministic))(s)))(stacked)

    for deterministic in (True, False):
        (a, ga), (b, gb) = (jax.jit(value, static_argnums=(0, 1))(m, deterministic) for m in (unrolled, scanned))
        np.testing.assert_allclose(b, a, rtol=1e-6)
        for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
            np.testing.assert_allclose(y, x, rtol=1e-5, atol=1e-6)
    if layout is None:
        _, maps_a = unrolled.apply({"params": params}, tokens, heads, return_attention=True)
        _, maps_b = scanned.apply({"params": params}, tokens, heads, return_attention=True)
        assert len(maps_b) == 3
        np.testing.assert_allclose(np.stack(maps_b), np.stack(maps_a), atol=1e-6)
