"""Tests for the padded, masked multi-head attention classifier (arXiv 2310.12680)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.models.classifier import classifier_apply, gd_step, head_mask_for, init_params, logistic_loss


class Cfg:
    dim, seq_len = 4, 5


def reference_phi(Ws, Us, X, query):
    """Independent plain H-head model: Python loop over exactly len(Ws) heads.

    X: (n, T, d); returns (n,).
    """
    total = 0.0
    for W, U in zip(Ws, Us):
        if query == "full":
            A = jax.nn.softmax(X @ W @ jnp.swapaxes(X, 1, 2), axis=-1)  # (n,T,T)
            total = total + jnp.sum(U[None] * (A @ X), axis=(1, 2))
        else:
            s = jnp.einsum("ntd,de,ne->nt", X, W, X[:, 0])
            a = jax.nn.softmax(s, axis=-1)
            total = total + jnp.einsum("ntd,nt,d->n", X, a, U)
    return total / math.sqrt(len(Ws))


def ref_loss(Ws, Us, X, y, query):
    return jnp.mean(jax.nn.softplus(-y * reference_phi(Ws, Us, X, query)))


def data(n=6, seed=0):
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    X = jax.random.normal(kx, (n, Cfg.seq_len, Cfg.dim))
    y = jnp.where(jax.random.bernoulli(ky, 0.5, (n,)), 1.0, -1.0)
    return X, y


@pytest.mark.parametrize("query", ["full", "first"])
@pytest.mark.parametrize("active", [[0, 1, 2], [0, 3, 5], [4]])
def test_padded_equals_plain_value_and_grad(query, active):
    hmax = 6
    params = init_params(jax.random.PRNGKey(1), Cfg, hmax, "random", 0.5, query=query)
    mask = jnp.zeros(hmax).at[jnp.array(active)].set(1.0)
    H = len(active)
    X, y = data()
    Ws = [params["W"][h] for h in active]
    Us = [params["U"][h] for h in active]

    phi = jax.jit(classifier_apply, static_argnums=4)(params, X, mask, H, query)
    np.testing.assert_allclose(phi, reference_phi(Ws, Us, X, query), rtol=1e-5, atol=1e-6)

    g = jax.jit(jax.grad(logistic_loss), static_argnums=5)(params, X, y, mask, H, query)
    g_ref_W, g_ref_U = jax.jit(jax.grad(ref_loss, argnums=(0, 1)), static_argnums=4)(Ws, Us, X, y, query)
    for i, h in enumerate(active):
        np.testing.assert_allclose(g["W"][h], g_ref_W[i], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(g["U"][h], g_ref_U[i], rtol=1e-4, atol=1e-6)
    masked = [h for h in range(hmax) if h not in active]
    # masked heads: exactly zero gradient (not merely small)
    assert np.all(np.asarray(g["W"])[masked] == 0.0)
    assert np.all(np.asarray(g["U"])[masked] == 0.0)
    # ... and exactly zero contribution: changing them changes nothing
    junk = jax.tree_util.tree_map(lambda p: p.at[jnp.array(masked)].set(7.0), params)
    np.testing.assert_array_equal(classifier_apply(junk, X, mask, H, query), phi)


def test_shapes_and_variants():
    X, _ = data()
    p_full = init_params(jax.random.PRNGKey(0), Cfg, 3, "random")
    p_first = init_params(jax.random.PRNGKey(0), Cfg, 3, "random", query="first")
    assert p_full["W"].shape == (3, 4, 4) and p_full["U"].shape == (3, 5, 4)
    assert p_first["W"].shape == (3, 4, 4) and p_first["U"].shape == (3, 4)
    mask = head_mask_for(2, 3)
    np.testing.assert_array_equal(mask, [1.0, 1.0, 0.0])
    for p in (p_full, p_first):
        assert classifier_apply(p, X, mask).shape == (6,)
        assert classifier_apply(p, X[0], mask).shape == ()
        # single example == batched row; num_heads defaults to sum(mask)
        np.testing.assert_allclose(classifier_apply(p, X[2], mask, 2), classifier_apply(p, X, mask)[2], rtol=1e-6)
    with pytest.raises(ValueError, match="query"):
        classifier_apply(p_first, X, mask, 2, "full")
    with pytest.raises(ValueError, match="init"):
        init_params(None, Cfg, 3, "xavier")


@pytest.mark.parametrize("query", ["full", "first"])
def test_one_over_sqrt_h_scaling(query):
    # H identical heads: Phi_H = H * phi_head / sqrt(H) = sqrt(H) * Phi_1.
    X, _ = data()
    one = init_params(jax.random.PRNGKey(2), Cfg, 1, "random", query=query)
    hmax = 8
    tiled = jax.tree_util.tree_map(lambda p: jnp.repeat(p, hmax, axis=0), one)
    phi1 = classifier_apply(one, X, jnp.ones(1), 1)
    for H in (1, 2, 4, 8):
        phiH = classifier_apply(tiled, X, head_mask_for(H, hmax), H)
        np.testing.assert_allclose(phiH, math.sqrt(H) * phi1, rtol=1e-5, atol=1e-6)


def test_traced_num_heads_vmapped_members():
    # Members with different H share shapes: vmap over (mask, H) in one jit.
    hmax = 4
    X, y = data()
    params = init_params(jax.random.PRNGKey(3), Cfg, hmax, "random")
    Hs = jnp.array([1, 2, 4])
    masks = jax.vmap(lambda h: head_mask_for(h, hmax))(Hs)
    losses = jax.jit(jax.vmap(logistic_loss, in_axes=(None, None, None, 0, 0)))(params, X, y, masks, Hs)
    for i, H in enumerate([1, 2, 4]):
        expect = ref_loss(list(params["W"][:H]), list(params["U"][:H]), X, y, "full")
        np.testing.assert_allclose(losses[i], expect, rtol=1e-5)


def test_zero_init_and_one_gd_step():
    hmax, H = 4, 3
    X, y = data()
    mask = head_mask_for(H, hmax)
    p0 = init_params(None, Cfg, hmax, "zero")
    assert float(logistic_loss(p0, X, y, mask, H)) == pytest.approx(math.log(2))
    p1, loss0 = gd_step(p0, X, y, 0.5, mask, H)
    assert float(loss0) == pytest.approx(math.log(2))
    # At zero init dPhi/dW = 0 (it is multiplied by U = 0); dPhi/dU_h is the
    # uniform-attention output / sqrt(H), identical for every active head.
    assert np.all(np.asarray(p1["W"]) == 0.0)
    U = np.asarray(p1["U"])
    assert np.all(U[H:] == 0.0) and np.abs(U[0]).max() > 0
    np.testing.assert_allclose(U[1], U[0])
    mean_tok = jnp.mean(X, axis=1, keepdims=True)  # (n, 1, d)
    expect = 0.5 * jnp.mean((0.5 * y)[:, None, None] * jnp.broadcast_to(mean_tok, X.shape), 0) / math.sqrt(H)
    np.testing.assert_allclose(U[0], expect, rtol=1e-5, atol=1e-7)
