"""A trained member run on given tokens, with its internals (``Run.forward``, ``Run.model``).

The eval-mode plain H-head Transformer of models/probe.py (no dropout), the one the analysis
runs: the same attention probabilities, and heads switched off with the analysis's own head
mask (analysis/ablation.py: a head's output zeroed at the input of its layer's output
projection). Internals are read with flax's method interception, so the model's code (and a
training program) is unchanged; activation patching replaces heads' outputs by the same
interception, at the output projection's input. One jitted function per model shape: any tokens
of that shape and any heads switched off reuse it; and one more for patching, which any patch set
(heads, positions, patch tokens of that shape) reuses.
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
      (zero for a head switched off; with ``patch``, the patched values where patched); A, the
      attention width, is D unless the head size is fixed.
    residual: per layer (N, T, D): the residual stream after the layer's block.
    loss: (N, T) per-token cross-entropy, None without targets.
    loss_by_position, accuracy_by_position: (T,) means over sequences weighted by ``weights``,
      NaN where no weight falls; None without targets.
    weights: (N, T) the weights those means used (given, or the task's own with its targets:
      0 where the task leaves a position undefined); None without targets.
    allow_changed_task: whether the call allowed a task source (or the text task's corpus)
      changed since training (the task's own targets are then the edited code's).
    task_sha256: {"recorded": at training, "current": now} of the task's source file (the text
      task: its corpus file); None for mhjax's own tasks without a file.
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
    weights: np.ndarray | None = None


def head_mask(heads_off, num_layers: int, heads: int, name: str = "heads_off") -> np.ndarray:
    """(L, H) float32 mask from ``{layer: [head, ...]}`` (0-based, as analysis.json): 0 for
    the heads named (switched off), 1 elsewhere; errors name the argument ``name``."""
    mask = np.ones((num_layers, heads), np.float32)
    if heads_off is None:
        return mask
    if not isinstance(heads_off, dict):
        raise ConfigError(f"{name}: must be a dict {{layer: [head, ...]}}, got {heads_off!r}")
    for layer, off in heads_off.items():
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < num_layers:
            raise ConfigError(f"{name}: layer {layer!r} is not one of 0..{num_layers - 1}")
        for head in [off] if isinstance(off, (int, np.integer)) else off:
            if isinstance(head, bool) or not isinstance(head, (int, np.integer)) or not 0 <= head < heads:
                raise ConfigError(f"{name}: layer {layer}: head {head!r} is not one of 0..{heads - 1}")
            mask[layer, head] = 0.0
    return mask


def checked_tokens(tokens, sizes: dict, name: str) -> np.ndarray:
    """``tokens`` as a non-empty (N, T) integer array in the model's vocabulary and length (a
    (T,) array as one sequence); a ConfigError naming ``name`` otherwise."""
    tokens = np.asarray(tokens)
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer) or tokens.size == 0:
        raise ConfigError(
            f"{name}: expected a non-empty (N, T) integer array, got dtype {tokens.dtype} and shape {tokens.shape}"
        )
    if not 1 <= tokens.shape[1] <= sizes["max_len"] or tokens.min() < 0 or tokens.max() >= sizes["vocab_size"]:
        raise ConfigError(
            f"{name}: need 1 <= T <= {sizes['max_len']} and tokens in [0, {sizes['vocab_size'] - 1}], "
            f"got shape {tokens.shape} with values in [{tokens.min()}, {tokens.max()}]"
        )
    return tokens


def patch_mask(patch, positions, num_layers: int, heads: int, length: int) -> np.ndarray:
    """(L, T, H) bool mask from ``patch`` {layer: [head, ...]} (0-based) and ``positions``
    (0-based positions, None: all): True where a head's output is patched."""
    heads_on = head_mask(patch, num_layers, heads, "patch") == 0.0  # (L, H): the heads patched
    at = np.ones(length, bool)
    if positions is not None:
        if isinstance(positions, np.ndarray):
            listed = positions.ravel().tolist()
        else:
            listed = list(positions) if isinstance(positions, (list, tuple, range)) else [positions]
        for position in listed:
            if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or not 0 <= position < length:
                raise ConfigError(f"patch_positions: position {position!r} is not one of 0..{length - 1}")
        twice = next((p for i, p in enumerate(listed) if p in listed[:i]), None)
        if twice is not None:  # a position listed twice is most likely a typo for another one
            shown = [int(p) for p in listed]
            raise ConfigError(f"patch_positions: position {twice} is listed twice ({shown}); list each position once")
        at = np.zeros(length, bool)
        at[np.asarray(listed, int)] = True
    return heads_on[:, None, :] & at[None, :, None]


@lru_cache(maxsize=32)
def forward_fn(
    vocab_size: int,
    max_len: int,
    width: int,
    num_layers: int,
    mlp_dim: int,
    heads: int,
    patched: bool,
    attention_width=None,
):
    """jit(params, tokens (N, T), head_mask (L, H)[, patch_tokens (N, T), patch_mask (L, T, H)])
    -> (logits, attention, head outputs, residual). ``attention_width``: A = heads x head size where
    it differs from the width (a fixed head size). ``patched``: the program also runs the model on
    ``patch_tokens`` (unpatched, the same heads off) and, in the run on ``tokens``, replaces the
    heads' outputs where ``patch_mask`` is True with that run's, at the input of each layer's output
    projection (where ``head_mask`` acts). The mask is traced: one compile for any patch set."""
    sizes = dict(vocab_size=vocab_size, max_len=max_len, width=width, num_layers=num_layers, mlp_dim=mlp_dim)
    model = eval_model(ModelConfig.from_sizes({**sizes, ATTENTION_WIDTH: attention_width}), heads)
    head_size = (attention_width or width) // heads
    blocks = [f"block_{l}" for l in range(num_layers)]

    def apply(params, tokens, mask, replace=None):
        """The model with every layer's output-projection input (replaced by ``replace(layer, x)``)
        and residual stream captured, by flax's method interception (the model's code unchanged)."""
        outputs, residual = {}, {}

        def capture(next_fun, args, kwargs, context):
            path = getattr(context.module, "path", ())
            if context.method_name == "__call__" and len(path) == 3 and path[1:] == ("attn", "out"):
                if replace is not None:  # the input of the output projection: every head's output
                    args = (replace(blocks.index(path[0]), args[0]), *args[1:])
                outputs[path[0]] = args[0]
            out = next_fun(*args, **kwargs)
            if context.method_name == "__call__" and len(path) == 1 and path[0].startswith("block_"):
                residual[path[0]] = out[0]
            return out

        with nn.intercept_methods(capture):
            logits, attention = model.apply({"params": params}, tokens, return_attention=True, head_mask=mask)
        return logits, list(attention), [outputs[b] for b in blocks], [residual[b] for b in blocks]

    def split(outputs, tokens):
        n, t = tokens.shape
        return [x.reshape(n, t, heads, head_size) for x in outputs]

    if not patched:

        @jax.jit
        def run(params, tokens, mask):
            logits, attention, outputs, residual = apply(params, tokens, mask)
            return logits, attention, split(outputs, tokens), residual

        return run

    @jax.jit
    def run_patched(params, tokens, mask, patch_tokens, patch):
        source = apply(params, patch_tokens, mask)[2]

        def replace(layer, x):
            where = jnp.repeat(patch[layer], head_size, axis=-1)  # (T, A)
            return jnp.where(where[None], source[layer], x)

        logits, attention, outputs, residual = apply(params, tokens, mask, replace)
        return logits, attention, split(outputs, tokens), residual

    return run_patched


def forward(
    params,
    heads: int,
    sizes: dict,
    tokens,
    targets=None,
    weights=None,
    heads_off=None,
    patch=None,
    patch_tokens=None,
    patch_positions=None,
) -> Forward:
    """The eval-mode H-head model of ``sizes`` on ``tokens`` (N, T); ``targets`` (N, T) give the
    per-token loss, weighted over sequences by ``weights`` (N, T; default all ones).

    Activation patching: ``patch`` {layer: [head, ...]} (0-based) replaces those heads' outputs,
    at the input of the layer's output projection (where ``heads_off`` acts), with the ones the
    same model (the same heads off) computes on ``patch_tokens`` (the tokens' shape) in an
    unpatched run; at ``patch_positions`` only (None: every position). The loss stays the one
    against ``targets``; ``head_outputs`` hold the patched values. One compile for any patch set."""
    tokens = checked_tokens(tokens, sizes, "tokens")
    mask = head_mask(heads_off, sizes["num_layers"], int(heads))
    params = jax.tree_util.tree_map(jnp.asarray, params)
    args = [params, jnp.asarray(tokens, jnp.int32), mask]
    if patch is None:
        for name, value in (("patch_tokens", patch_tokens), ("patch_positions", patch_positions)):
            if value is not None:
                raise ConfigError(f"{name}: given without patch; pass patch={{layer: [head, ...]}} too")
    else:
        if patch_tokens is None:
            raise ConfigError(
                f"patch_tokens: required with patch; pass integer tokens of the tokens' shape {tokens.shape}"
            )
        other = np.asarray(patch_tokens)
        other = other[None] if other.ndim == 1 else other
        if other.shape != tokens.shape or not np.issubdtype(other.dtype, np.integer):
            raise ConfigError(
                f"patch_tokens: expected integer tokens of the tokens' shape {tokens.shape}, "
                f"got dtype {other.dtype} and shape {np.shape(patch_tokens)}"
            )
        other = checked_tokens(other, sizes, "patch_tokens")
        where = patch_mask(patch, patch_positions, sizes["num_layers"], int(heads), tokens.shape[1])
        args += [jnp.asarray(other, jnp.int32), where]
    run = forward_fn(*(sizes[k] for k in SIZE_KEYS), int(heads), patch is not None, sizes.get(ATTENTION_WIDTH))
    logits, attention, outputs, residual = jax.device_get(run(*args))
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
        weights=weights,
    )


def apply_fn(sizes: dict, heads: int):
    """A pure ``apply(params, tokens (N, T)) -> logits (N, T, V)``: the eval-mode H-head model,
    jitted as ``forward`` is. Its logits equal ``forward``'s to float32 round-off, not bit for
    bit: they are two programs (``forward`` also returns the internals), which XLA may fuse and
    round differently (docs/sweeps.md). Run op by op (unjitted, before), it was 3.3e-6 from
    ``forward`` on one user's model and 4.8e-7 on the tests'; jitted, equal bit for bit there."""
    model = eval_model(ModelConfig.from_sizes(sizes), int(heads))

    @jax.jit
    def apply(params, tokens):
        return model.apply({"params": params}, jnp.asarray(tokens, jnp.int32))

    return apply
