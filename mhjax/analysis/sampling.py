"""Sampling a continuation from a trained sequence member (``Run.sample``, ``mhjax sample``).

The model has learned absolute positions and a context of ``max_len`` (config.model.seq_len)
tokens, so, as nanoGPT's ``generate`` does, each new token is predicted from the last ``max_len``
tokens at positions 0.. of a fresh forward pass: no key/value cache (a cache would need the
positions to shift, which learned positions do not allow; each step costs one full forward of at
most ``max_len`` tokens). The context is a fixed-shape (max_len,) window filled from the left:
with causal attention the logits at its last filled position do not see the padding after it, so
one jitted step function serves every prompt length, token count, temperature and top-k (one
compile per model shape), and the tokens stay on the device until the end (no sync per token).

Token i is drawn with ``fold_in(PRNGKey(seed), i)``: temperature 0 is the argmax (greedy);
otherwise softmax(logits / temperature) over the ``top_k`` most likely tokens (ties at the k-th
kept; None or 0: every token).
"""

from __future__ import annotations

from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.config import ConfigError
from mhjax.models.model_config import ATTENTION_WIDTH, SIZE_KEYS, ModelConfig
from mhjax.models.probe import eval_model


@lru_cache(maxsize=32)
def step_fn(vocab_size: int, max_len: int, width: int, num_layers: int, mlp_dim: int, heads: int, attention_width=None):
    """jit(params, window (max_len,) int32, filled (int32, 1..max_len), key, temperature, top_k)
    -> (next token, the window with it appended, filled): the model on the window, the logits at
    position filled - 1 drawn from; a full window shifts left by one to take the new token."""
    sizes = dict(vocab_size=vocab_size, max_len=max_len, width=width, num_layers=num_layers, mlp_dim=mlp_dim)
    model = eval_model(ModelConfig.from_sizes({**sizes, ATTENTION_WIDTH: attention_width}), heads)

    @jax.jit
    def step(params, window, filled, key, temperature, top_k):
        logits = model.apply({"params": params}, window[None])[0, filled - 1].astype(jnp.float32)
        token = draw(logits, key, temperature, top_k)
        full = filled == max_len
        shifted = jnp.where(full, jnp.roll(window, -1), window)
        window = shifted.at[jnp.where(full, max_len - 1, filled)].set(token)
        return token, window, jnp.minimum(filled + 1, max_len)

    return step


def draw(logits, key, temperature, top_k):
    """A token from (V,) logits: the argmax at temperature 0, else softmax(logits / temperature)
    over the top_k largest logits (top_k: 1..V; ties at the k-th kept)."""
    kth = jnp.sort(logits)[logits.shape[0] - top_k]
    kept = jnp.where(logits >= kth, logits, -jnp.inf)
    hot = jnp.where(temperature > 0, temperature, 1.0)
    sampled = jax.random.categorical(key, kept / hot)
    return jnp.where(temperature > 0, sampled, jnp.argmax(logits)).astype(jnp.int32)


def sample(params, heads: int, sizes: dict, prompt, tokens: int, temperature=1.0, top_k=None, seed: int = 0):
    """``tokens`` new token ids (numpy int32) continuing ``prompt`` (a non-empty sequence of ids
    below the vocabulary) with the eval-mode H-head model of ``sizes``; see the module docstring."""
    prompt = np.asarray(prompt)
    vocab, max_len = sizes["vocab_size"], sizes["max_len"]
    if prompt.ndim != 1 or prompt.size == 0 or not np.issubdtype(prompt.dtype, np.integer):
        raise ConfigError(f"--prompt: give at least one token (a 1-d integer sequence), got shape {prompt.shape}")
    if prompt.min() < 0 or prompt.max() >= vocab:
        raise ConfigError(
            f"--prompt: token ids must be in [0, {vocab - 1}] (the model's vocabulary), "
            f"got [{prompt.min()}, {prompt.max()}]"
        )
    if isinstance(tokens, bool) or not isinstance(tokens, (int, np.integer)) or tokens < 1:
        raise ConfigError(f"--tokens: must be a positive integer, got {tokens!r}")
    ok = isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and np.isfinite(temperature)
    if not ok or temperature < 0:
        raise ConfigError(f"--temperature: must be a finite number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 0):
        raise ConfigError(f"--top-k: must be a positive integer (0 or None: every token), got {top_k!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**32:
        raise ConfigError(f"--seed: must be an integer in [0, 2**32), got {seed!r}")
    k = vocab if not top_k else min(int(top_k), vocab)  # above the vocabulary: every token
    step = step_fn(*(sizes[s] for s in SIZE_KEYS), int(heads), sizes.get(ATTENTION_WIDTH))
    context = prompt[-max_len:]  # the model sees the last max_len tokens
    window = jnp.asarray(np.pad(context, (0, max_len - context.size)), jnp.int32)
    filled = jnp.int32(context.size)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    root = jax.random.PRNGKey(int(seed))
    temperature, k = jnp.float32(temperature), jnp.int32(k)
    out = []
    for i in range(int(tokens)):  # dispatched without waiting: the tokens are fetched once, at the end
        token, window, filled = step(params, window, filled, jax.random.fold_in(root, i), temperature, k)
        out.append(token)
    return np.asarray(jax.device_get(jnp.stack(out)), np.int32)
