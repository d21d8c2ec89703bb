"""Causal multi-head self-attention whose head count can be a traced value.

Two ways to run H heads at width D:
- plain: ``num_heads = H`` and ``heads=None``; standard H-head attention.
- grouped-in-one-program: ``num_heads = F`` fine heads (F a multiple of every
  member's H) and ``heads = H`` (a traced int). Fine scores q_f . k_f are summed
  over the F/H fine heads of each coarse head, scaled by 1/sqrt(D/H) and soft-maxed;
  each fine head then reads its own values with its coarse head's attention. This
  equals plain H-head attention exactly (tested), so members with different head
  counts share one compiled program.
"""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp


def torch_uniform(fan_in: int):
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): the reference framework's Linear default."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def dense(features: int, fan_in: int, name: str) -> nn.Dense:
    init = torch_uniform(fan_in)
    return nn.Dense(features, kernel_init=init, bias_init=init, name=name)


def head_groups(heads, num_fine: int):
    """Coarse-head index of each fine head, (F,) int32, for a (traced) head count."""
    group_size = num_fine // heads
    return jnp.arange(num_fine) // group_size


class CausalSelfAttention(nn.Module):
    width: int
    num_heads: int  # fine heads F in this program (static)
    dropout_rate: float = 0.0

    @nn.compact
    def __call__(self, x, heads=None, deterministic: bool = True):
        """x: (B, T, D) -> (out (B, T, D), probs (B, F, T, T)); probs[b, f, i, j] is query i
        (receiver) attending to key j (sender); in grouped mode fine heads of one coarse head
        carry identical rows."""
        batch, length, width = x.shape
        fine = self.num_heads
        head_dim = width // fine

        def project(name):
            return dense(width, width, name)(x).reshape(batch, length, fine, head_dim)

        q, k, v = project("query"), project("key"), project("value")
        scores = jnp.einsum("btfd,bsfd->bfts", q, k)
        if heads is None:
            group = jnp.arange(fine)
            scale = 1.0 / math.sqrt(head_dim)
        else:
            group = head_groups(heads, fine)
            same_group = (group[:, None] == group[None, :]).astype(scores.dtype)
            scores = jnp.einsum("fg,bgts->bfts", same_group, scores)
            scale = jax.lax.rsqrt(width / jnp.asarray(heads, scores.dtype))
        causal = jnp.tril(jnp.ones((length, length), dtype=bool))
        scores = jnp.where(causal, scores * scale, jnp.finfo(scores.dtype).min)
        probs = jax.nn.softmax(scores, axis=-1)
        attended = probs
        if not deterministic and self.dropout_rate > 0.0:
            attended = probs * self._dropout_mask(group, (batch, length, length))
        out = jnp.einsum("bfts,bsfd->btfd", attended, v).reshape(batch, length, width)
        return dense(width, width, "out")(out), probs

    def _dropout_mask(self, group, shape):
        """Inverted-dropout mask, one draw per COARSE head: coarse head c's mask comes from
        fold_in(key, c), so a member's dropout does not depend on how finely its program
        splits heads (plain == grouped under dropout too)."""
        key = self.make_rng("dropout")
        keep_prob = 1.0 - self.dropout_rate
        coarse_keys = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.arange(self.num_heads))
        keep = jax.vmap(lambda k: jax.random.bernoulli(k, keep_prob, shape))(coarse_keys)
        keep = keep[group]  # (F, B, T, T): fine head f uses its coarse head's mask
        return jnp.moveaxis(keep, 0, 1).astype(jnp.float32) / keep_prob
