"""A trained member run on given tokens, with its internals (``Run.forward``, ``Run.model``).

The eval-mode plain H-head Transformer of models/probe.py (no dropout), the one the analysis
runs: the same attention probabilities, and heads switched off with the analysis's own head
mask (analysis/ablation.py: a head's output zeroed at the input of its layer's output
projection). Internals are read with flax's method interception, so the model's code (and a
training program) is unchanged. One jitted function per model shape: any tokens of that
shape and any heads switched off reuse it.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mhjax.analysis.positions import by_position, per_token
from mhjax.config import ConfigError
from mhjax.models.model_config import ATTENTION_WIDTH, SIZE_KEYS, ModelConfig
from mhjax.models.probe import eval_model


@dataclasses.dataclass(frozen=True)
class Forward:
    """What ``Run.forward`` returns (numpy arrays; N sequences, T positions, H heads, D width,
    V tokens; lists over layers, layer 0 first; heads numbered from 0).

    logits: (N, T, V).
    attention: per layer (N, H, T, T): attention[l][n, h, i, j] is query i attending to key j.
    head_outputs: per layer (N, T, H, A/H): each head's output before the output projection
      (zero for a head switched off); A, the attention width, is D unless the head size is fixed.
    residual: per layer (N, T, D): the residual stream after the layer's block.
    loss: (N, T) per-token cross-entropy, None without targets.
    loss_by_position, accuracy_by_position: (T,) means over sequences weighted by ``weights``,
      NaN where no weight falls; None without targets.
    allow_changed_task: with the task's own targets, whether the call allowed a task source
      changed since training (its targets are then the edited code's).
    task_sha256: with the task's own targets, {"recorded": at training, "current": now} of its
      source file (None: mhjax's own task, or no task targets).
    """

    logits: np.ndarray
    attention: list
    head_outputs: list
    residual: list
    loss: np.ndarray | None = None
    loss_by_position: np.ndarray | None = None
    accuracy_by_position: np.ndarray | None = None
    allow_changed_task: bool = False
    task_sha256: dict | None = None


def head_mask(heads_off, num_layers: int, heads: int) -> np.ndarray:
    """(L, H) float32 mask from ``{layer: [head, ...]}`` (0-based, as analysis.json): 0 for
    the heads switched off, 1 elsewhere."""
    mask = np.ones((num_layers, heads), np.float32)
    if heads_off is None:
        return mask
    if not isinstance(heads_off, dict):
        raise ConfigError(f"heads_off: must be a dict {{layer: [head, ...]}}, got {heads_off!r}")
    for layer, off in heads_off.items():
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < num_layers:
            raise ConfigError(f"heads_off: layer {layer!r} is not one of 0..{num_layers - 1}")
        for head in [off] if isinstance(off, (int, np.integer)) else off:
            if isinstance(head, bool) or not isinstance(head, (int, np.integer)) or not 0 <= head < heads:
                raise ConfigError(f"heads_off: layer {layer}: head {head!r} is not one of 0..{heads - 1}")
            mask[layer, head] = 0.0
    return mask


@lru_cache(maxsize=32)
def forward_fn(
    vocab_size: int, max_len: int, width: int, num_layers: int, mlp_dim: int, heads: int, attention_width=None
):
    """jit(params, tokens (N, T), head_mask (L, H)) -> (logits, attention, head outputs, residual).
    ``attention_width``: A = heads x head size where it differs from the width (a fixed head size)."""
    sizes = dict(vocab_size=vocab_size, max_len=max_len, width=width, num_layers=num_layers, mlp_dim=mlp_dim)
    model = eval_model(ModelConfig.from_sizes({**sizes, ATTENTION_WIDTH: attention_width}), heads)
    head_size = (attention_width or width) // heads

    @jax.jit
    def run(params, tokens, mask):
        outputs, residual = {}, {}

        def capture(next_fun, args, kwargs, context):
            out = next_fun(*args, **kwargs)
            path = getattr(context.module, "path", ())
            if context.method_name == "__call__" and len(path) == 3 and path[1:] == ("attn", "out"):
                outputs[path[0]] = args[0]  # the input of the output projection: every head's output
            elif context.method_name == "__call__" and len(path) == 1 and path[0].startswith("block_"):
                residual[path[0]] = out[0]
            return out

        with nn.intercept_methods(capture):
            logits, attention = model.apply({"params": params}, tokens, return_attention=True, head_mask=mask)
        blocks = [f"block_{l}" for l in range(num_layers)]
        n, t = tokens.shape
        split = [outputs[b].reshape(n, t, heads, head_size) for b in blocks]
        return logits, list(attention), split, [residual[b] for b in blocks]

    return run


def forward(params, heads: int, sizes: dict, tokens, targets=None, weights=None, heads_off=None) -> Forward:
    """The eval-mode H-head model of ``sizes`` on ``tokens`` (N, T); ``targets`` (N, T) give the
    per-token loss, weighted over sequences by ``weights`` (N, T; default all ones)."""
    tokens = np.asarray(tokens)
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer) or tokens.size == 0:
        raise ConfigError(
            f"tokens: expected a non-empty (N, T) integer array, got dtype {tokens.dtype} and shape {tokens.shape}"
        )
    if not 1 <= tokens.shape[1] <= sizes["max_len"] or tokens.min() < 0 or tokens.max() >= sizes["vocab_size"]:
        raise ConfigError(
            f"tokens: need 1 <= T <= {sizes['max_len']} and tokens in [0, {sizes['vocab_size'] - 1}], "
            f"got shape {tokens.shape} with values in [{tokens.min()}, {tokens.max()}]"
        )
    mask = head_mask(heads_off, sizes["num_layers"], int(heads))
    run = forward_fn(*(sizes[k] for k in SIZE_KEYS), int(heads), sizes.get(ATTENTION_WIDTH))
    params = jax.tree_util.tree_map(jnp.asarray, params)
    logits, attention, outputs, residual = jax.device_get(run(params, jnp.asarray(tokens, jnp.int32), mask))
    record = dict(
        logits=np.asarray(logits),
        attention=[np.asarray(a) for a in attention],
        head_outputs=[np.asarray(a) for a in outputs],
        residual=[np.asarray(a) for a in residual],
    )
    if targets is None:
        return Forward(**record)
    targets = np.asarray(targets)
    weights = np.ones(tokens.shape, np.float32) if weights is None else np.asarray(weights, np.float32)
    for name, array in (("targets", targets), ("weights", weights)):
        if array.shape != tokens.shape:
            raise ConfigError(f"{name}: expected the tokens' shape {tokens.shape}, got {array.shape}")
    if not np.issubdtype(targets.dtype, np.integer) or targets.min() < 0 or targets.max() >= sizes["vocab_size"]:
        raise ConfigError(
            f"targets: need integer tokens in [0, {sizes['vocab_size'] - 1}], got dtype {targets.dtype} "
            f"with values in [{targets.min()}, {targets.max()}]"
        )
    if not np.all(np.isfinite(weights)) or weights.min() < 0:
        raise ConfigError("weights: must be finite and >= 0")
    loss, correct = (np.asarray(a) for a in per_token(jnp.asarray(logits), jnp.asarray(targets, jnp.int32)))
    positions = by_position(loss, correct, weights)
    nan = lambda values: np.array([np.nan if v is None else v for v in values])  # noqa: E731
    return Forward(
        **record,
        loss=loss,
        loss_by_position=nan(positions["loss_by_position"]),
        accuracy_by_position=nan(positions["accuracy_by_position"]),
    )


def apply_fn(sizes: dict, heads: int):
    """A pure ``apply(params, tokens (N, T)) -> logits (N, T, V)``: the eval-mode H-head model."""
    model = eval_model(ModelConfig.from_sizes(sizes), int(heads))

    def apply(params, tokens):
        return model.apply({"params": params}, jnp.asarray(tokens, jnp.int32))

    return apply


def model_sizes(model: dict) -> dict:
    """The Transformer sizes of a config's ``model`` section (a dict; max_len = seq_len)."""
    keys = {"vocab_size": "vocab_size", "max_len": "seq_len", "width": "width", "num_layers": "num_layers"}
    return {**{k: model[v] for k, v in keys.items()}, "mlp_dim": model["mlp_dim"]}
