"""Tests for the tokenized-mixture generator (arXiv 2310.12680)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.data.mixture import default_mixture_config, num_relevant_tokens, sample_mixture, train_test_split_keys


def small_cfg(**overrides):
    cfg = default_mixture_config()
    cfg.dim, cfg.seq_len = 12, 8
    cfg.num_relevant_per_label, cfg.num_noise_clusters = 2, 3
    cfg.relevant_fraction, cfg.signal_norm, cfg.noise_std = 0.25, 3.0, 1.0
    for k, v in overrides.items():
        setattr(cfg, k, v)
    return cfg


# Tests reuse (config, n) pairs so the jitted sampler compiles few times.
N = 4000


def test_shapes_dtypes_labels_balance():
    X, y = sample_mixture(jax.random.PRNGKey(1), small_cfg(), N)
    assert X.shape == (N, 8, 12) and X.dtype == jnp.float32
    assert y.shape == (N,) and y.dtype == jnp.float32
    assert set(np.unique(np.asarray(y))) == {-1.0, 1.0}
    assert abs(float(jnp.mean(y))) < 0.06  # ~4 standard errors


def test_relevant_tokens_and_clusters_noise_free():
    # sigma = 0: every token is exactly S * e_cluster, so the cluster of each
    # token, hence the relevant fraction, can be read off X itself.
    cfg = small_cfg(noise_std=0.0)
    X, y, rel = sample_mixture(jax.random.PRNGKey(2), cfg, 500, return_relevant=True)
    X, y, rel = map(np.asarray, (X, y, rel))
    k, R, M = num_relevant_tokens(cfg), 2, 3
    assert k == 2
    np.testing.assert_allclose(np.linalg.norm(X, axis=-1), 3.0, rtol=1e-6)
    idx = X.argmax(-1)
    pos_rel = idx < R  # label +1 clusters
    neg_rel = (idx >= R) & (idx < 2 * R)  # label -1 clusters
    noise = (idx >= 2 * R) & (idx < 2 * R + M)
    assert np.all(pos_rel | neg_rel | noise)
    relevant_from_x = np.where(y[:, None] > 0, pos_rel, neg_rel)
    np.testing.assert_array_equal(relevant_from_x, rel)
    assert not np.any(np.where(y[:, None] > 0, neg_rel, pos_rel))
    np.testing.assert_array_equal(rel.sum(1), k)  # exact fraction
    # positions are random: every position is relevant in some sample
    assert np.all(rel.any(0))
    # all relevant and noise clusters get used
    assert len(np.unique(idx)) == 2 * R + M


def test_noise_std():
    cfg = small_cfg(noise_std=0.7)
    X, _ = sample_mixture(jax.random.PRNGKey(3), cfg, 500)
    Xc, _ = sample_mixture(jax.random.PRNGKey(3), small_cfg(noise_std=0.0), 500)
    # same key => same means; the difference is the noise alone
    np.testing.assert_allclose(np.std(np.asarray(X - Xc)), 0.7, rtol=0.03)


def test_determinism_and_keys():
    cfg = small_cfg()
    key = jax.random.PRNGKey(4)
    X1, y1 = sample_mixture(key, cfg, N)
    X2, y2 = sample_mixture(key, cfg, N)
    np.testing.assert_array_equal(X1, X2)
    np.testing.assert_array_equal(y1, y2)
    ktr, kte = train_test_split_keys(key)
    assert not np.array_equal(jax.random.key_data(ktr), jax.random.key_data(kte))
    Xtr, _ = sample_mixture(ktr, cfg, N)
    Xte, _ = sample_mixture(kte, cfg, N)
    assert not np.allclose(Xtr, Xte)
    # jit / vmap over keys give the same samples as eager calls
    keys = jax.random.split(key, 3)
    Xv, yv = jax.jit(jax.vmap(lambda k: sample_mixture(k, cfg, N)))(keys)
    Xe, ye = sample_mixture(keys[1], cfg, N)
    np.testing.assert_allclose(Xv[1], Xe, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(yv[1], ye)


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("dim", 6, "dim"),
        ("relevant_fraction", 0.0, "relevant_fraction"),
        ("relevant_fraction", 0.01, "relevant_fraction"),
        ("num_relevant_per_label", 0, "num_relevant_per_label"),
        ("noise_std", -1.0, "noise_std"),
    ],
)
def test_validation(field, value, match):
    with pytest.raises(ValueError, match=match):
        sample_mixture(jax.random.PRNGKey(0), small_cfg(**{field: value}), 4)
