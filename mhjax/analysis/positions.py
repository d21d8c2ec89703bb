"""Loss and accuracy per position: where in the sequence a trained member is right.

At position t, over sequences n with weight w[n, t]: ``loss_by_position[t] = sum_n w loss /
sum_n w`` and ``accuracy_by_position[t]`` the same of (argmax == target); None (JSON null)
where no weight falls at t (a task that never scores that position).
"""

from __future__ import annotations

from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mhjax.models.model_config import ATTENTION_WIDTH, SIZE_KEYS, ModelConfig
from mhjax.models.probe import eval_model


def per_token(logits, targets):
    """(cross-entropy, correct) per token: logits (..., T, V), targets (..., T) -> two (..., T)."""
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    return loss, (jnp.argmax(logits, axis=-1) == targets).astype(loss.dtype)


def by_position(loss, correct, weights) -> dict[str, list]:
    """{"loss_by_position", "accuracy_by_position"}: (T,) lists of weighted means over sequences
    of per-token ``loss`` and ``correct`` (N, T), None where the weights of a position sum to 0."""
    loss, correct, weights = (np.asarray(a, np.float64) for a in (loss, correct, weights))
    total = weights.sum(axis=0)

    def mean(values):
        sums = (values * weights).sum(axis=0)
        return [float(s / w) if w > 0 else None for s, w in zip(sums, total)]

    return {"loss_by_position": mean(loss), "accuracy_by_position": mean(correct)}


@lru_cache(maxsize=32)
def _token_fn(
    vocab_size: int, max_len: int, width: int, num_layers: int, mlp_dim: int, heads: int, attention_width=None
):
    sizes = dict(vocab_size=vocab_size, max_len=max_len, width=width, num_layers=num_layers, mlp_dim=mlp_dim)
    model = eval_model(ModelConfig.from_sizes({**sizes, ATTENTION_WIDTH: attention_width}), heads)

    @jax.jit
    def run(params, tokens, targets):
        return per_token(model.apply({"params": params}, tokens), targets)

    return run


SLICE_ELEMENTS = 2**26  # logits or attention scores per forward pass (256 MiB of float32)


def member_token_losses(params, heads: int, tokens, targets, sizes: dict) -> tuple[np.ndarray, np.ndarray]:
    """(cross-entropy, correct) per token, (N, T) numpy, of the plain eval-mode H-head model on
    ``tokens`` (N, T), in slices of windows holding at most SLICE_ELEMENTS logits (N x T x V) and
    attention scores (N x H x T x T): thousands of held-out windows fit any device. One jitted
    forward per slice shape (two: the slices and the last)."""
    run = _token_fn(*(sizes[k] for k in SIZE_KEYS), int(heads), sizes.get(ATTENTION_WIDTH))
    tokens, targets = np.asarray(tokens, np.int32), np.asarray(targets, np.int32)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    length = tokens.shape[1]
    rows = max(1, SLICE_ELEMENTS // (length * max(int(sizes["vocab_size"]), int(heads) * length)))
    out = [
        jax.device_get(run(params, tokens[i : i + rows], targets[i : i + rows])) for i in range(0, len(tokens), rows)
    ]
    return np.concatenate([o[0] for o in out]), np.concatenate([o[1] for o in out])


def member_by_position(params, heads: int, batch, sizes: dict) -> dict[str, list]:
    """:func:`by_position` of the plain eval-mode H-head model on ``batch`` (tokens, targets,
    weights (N, T))."""
    tokens, targets, weights = (np.asarray(a) for a in batch)
    return by_position(*member_token_losses(params, heads, tokens, targets, sizes), weights)
