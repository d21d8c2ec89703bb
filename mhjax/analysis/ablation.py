"""Head ablation: which heads the trained model needs (Michel et al. 2019, "Are Sixteen Heads
Really Better than One?", arXiv 1905.10650), and synergy read off the task accuracy.

For every layer l and head h of an H-head Transformer, two variants of the eval-mode model:

* **without** (l, h): head h of layer l removed: its output is zeroed at the input of layer l's
  output projection, so the other heads, the projection's bias and every other layer are
  untouched;
* **only** (l, h): head h is the only head kept in layer l (the others zeroed there).

Each variant's cross-entropy loss and token accuracy on the evaluation sequences are weighted
means over positions (``weights`` (N, T), all ones by default: every position counts). All
2 L H variants and the full model run in ONE jitted program per model shape: the (L, H) head
masks are vmapped, a block of masks at a time (``lax.map``) to bound memory.

Accuracy synergy of layer l: full-model accuracy minus the best ``accuracy_only`` of that layer
(positive: the layer's heads together do better for the task than any one of them alone).
"""

from __future__ import annotations

from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mhjax.analysis.ranks import spearman
from mhjax.models.model_config import ModelConfig
from mhjax.models.probe import eval_model

MASK_BUDGET = 1 << 24  # floats of the largest per-variant activation held for one block of masks


def head_masks(num_layers: int, heads: int) -> np.ndarray:
    """(2, L, H, L, H) float32 head masks: ``[0, l, h]`` removes head h of layer l (all ones but
    that entry), ``[1, l, h]`` keeps only head h in layer l (layer l's row one-hot at h)."""
    L, H = num_layers, heads
    eye = np.eye(L * H, dtype=np.float32).reshape(L, H, L, H)
    without = 1.0 - eye
    layer_rows = np.eye(L, dtype=np.float32)[:, None, :, None]  # 1 on the masked layer's row
    only = (1.0 - layer_rows) + eye  # other layers all ones; layer l: one-hot at h
    return np.stack([without, only])


def token_totals(logits, targets, weights):
    """Weighted sums over positions: (cross-entropy sum, correct-argmax sum); logits (..., T, V),
    targets and weights (..., T). Divide by ``weights.sum()`` for the means."""
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(loss.dtype)
    return jnp.sum(weights * loss), jnp.sum(weights * correct)


def masks_per_block(num_masks: int, batch: int, length: int, sizes: dict, heads: int) -> int:
    """How many masks one vmapped block holds: the largest per-variant activation (attention
    probabilities (B, H, T, T), the MLP or the logits) times the block stays under MASK_BUDGET;
    the blocks are then evened out so that padding the last one wastes little."""
    per_variant = batch * length * max(heads * length, 2 * sizes["mlp_dim"], sizes["vocab_size"])
    most = max(1, min(num_masks, MASK_BUDGET // max(per_variant, 1)))
    blocks = -(-num_masks // most)
    return -(-num_masks // blocks)


@lru_cache(maxsize=32)
def scored_forward_fn(model: ModelConfig, heads: int):
    """jit(params, tokens, targets, weights (B, T)) -> (predictions (B, T) int32, attention
    (L, B, H, T, T), full (2,)): the DAG analysis's forward and the full model's weighted (loss sum,
    correct sum) from the same logits, so the full model runs once per batch."""
    transformer = eval_model(model, heads)

    @jax.jit
    def run(params, tokens, targets, weights):
        logits, attn = transformer.apply({"params": params}, tokens, return_attention=True)
        predictions = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return predictions, jnp.stack(attn), jnp.stack(token_totals(logits, targets, weights))

    return run


@lru_cache(maxsize=32)
def ablation_fn(model: ModelConfig, heads: int, block: int, with_full: bool = True):
    """jit(params, tokens, targets, weights (B, T)) -> (full (2,), variants (2, L, H, 2)): weighted
    (loss sum, correct sum) of the full model and of every head mask of :func:`head_masks`
    (``block`` masks per vmapped step; ``block = 0``: the full model only, variants None;
    ``with_full = False``: full None, for a caller that has the full model's sums)."""
    transformer, num_layers = eval_model(model, heads), model.num_layers
    masks = head_masks(num_layers, heads).reshape(-1, num_layers, heads)

    @jax.jit
    def run(params, tokens, targets, weights):
        def totals(head_mask):
            logits = transformer.apply({"params": params}, tokens, head_mask=head_mask)
            return jnp.stack(token_totals(logits, targets, weights))

        full = totals(None) if with_full else None
        if block == 0:
            return full, None
        count = masks.shape[0]
        padded = np.concatenate([masks, np.ones(((-count) % block, num_layers, heads), np.float32)])
        sums = jax.lax.map(jax.vmap(totals), jnp.asarray(padded).reshape(-1, block, num_layers, heads))
        return full, sums.reshape(-1, 2)[:count].reshape(2, num_layers, heads, 2)

    return run


def head_ablation(
    params,
    heads: int,
    tokens,
    targets,
    sizes: dict,
    weights=None,
    batch_size: int = 50,
    ablate: bool = True,
    head_weights=None,
    *,
    full_totals=None,
) -> tuple[dict, list[dict] | None]:
    """Loss and accuracy of the full model and of every head removed / kept alone.

    tokens, targets: (N, T) int; weights: (N, T) nonnegative (None: all ones), positive sum.
    Sequences go through in batches of ``batch_size`` (the tail padded with zero weight, so
    every call has one shape). Returns ``({"loss", "accuracy"}, layers)`` where ``layers[l]`` =
    ``{"ablation": {"loss_without", "accuracy_without", "loss_only", "accuracy_only"} (lists over
    heads), "accuracy_synergy", "head_weight_ablation_spearman"}`` (None when ``ablate`` is False).
    ``head_weight_ablation_spearman``: across the layer's heads, the Spearman correlation between
    ``head_weights`` (L, H) (the DAG analysis's beta) and the loss increase when the head is
    removed (None without head weights, with one head or when either is constant).
    ``full_totals``: the full model's (loss sum, correct sum) over these sequences when the caller
    has them (:func:`scored_forward_fn`); then only the head masks run.
    """
    tokens, targets = np.asarray(tokens, np.int32), np.asarray(targets, np.int32)
    weights = np.ones(tokens.shape, np.float32) if weights is None else np.asarray(weights, np.float32)
    if weights.shape != tokens.shape or not weights.sum() > 0 or (weights < 0).any():
        raise ValueError(f"weights: need nonnegative (N, T) = {tokens.shape} with a positive sum, got {weights.shape}")
    N, T = tokens.shape
    L = sizes["num_layers"]
    bs = max(1, min(int(batch_size), N))
    block = masks_per_block(2 * L * heads, bs, T, sizes, heads) if ablate else 0
    with_full = full_totals is None
    run = ablation_fn(ModelConfig.from_sizes(sizes), int(heads), block, with_full)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    full = np.zeros(2) if with_full else np.asarray(full_totals, np.float64)
    variants = np.zeros((2, L, heads, 2))
    for start in range(0, N if with_full or ablate else 0, bs):
        pad = max(0, start + bs - N)
        rows = slice(start, start + bs)
        chunk = [np.concatenate([a[rows], np.repeat(a[:1], pad, axis=0)]) for a in (tokens, targets)]
        w = np.concatenate([weights[rows], np.zeros((pad, T), np.float32)])
        f, v = jax.device_get(run(params, *chunk, w))
        if with_full:
            full += np.asarray(f, np.float64)
        if ablate:
            variants += np.asarray(v, np.float64)
    total = float(weights.sum())
    loss, accuracy = full / total
    member = {"loss": float(loss), "accuracy": float(accuracy)}
    if not ablate:
        return member, None
    means = variants / total  # (without/only, L, H, loss/accuracy)
    layers = []
    for l in range(L):
        ablation = {  # loss_without, accuracy_without, loss_only, accuracy_only
            f"{metric}_{variant}": [float(x) for x in means[v, l, :, m]]
            for v, variant in enumerate(("without", "only"))
            for m, metric in enumerate(("loss", "accuracy"))
        }
        increase = np.asarray(ablation["loss_without"]) - loss
        layers.append(
            {
                "ablation": ablation,
                "accuracy_synergy": accuracy - max(ablation["accuracy_only"]),
                "head_weight_ablation_spearman": None if head_weights is None else spearman(head_weights[l], increase),
            }
        )
    return member, layers


def synergy_verdict(differences) -> bool | None:
    """Whether a layer is synergistic for the task over seeds: the full layer beats the best
    single head (mean of ``differences`` = full accuracy - best ``accuracy_only``, one per seed)
    by more than their standard deviation over seeds (population, ddof=0, as the report's ±).
    None with fewer than two finite values (one seed, a released model: no verdict)."""
    vals = np.array([np.nan if d is None else float(d) for d in differences], float)
    vals = vals[np.isfinite(vals)]
    if vals.size < 2:
        return None
    return bool(vals.mean() > vals.std())
