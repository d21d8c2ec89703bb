"""Analytic FLOPs and memory of the sequence Transformer (one multiply-add = 2 FLOPs).

``attention_width``: q, k and v's width A = heads x head size (None: the width, parameter
matching). At a fixed head size it grows with the head count; at fixed width it does not."""

from __future__ import annotations


def forward_flops(
    batch: int, length: int, width: int, num_layers: int, mlp_dim: int, vocab: int, attention_width=None
) -> float:
    """Matmul FLOPs of one forward pass. Causal attention is counted as half of the full
    T x T score and value products; independent of the head count at a fixed attention width."""
    a = attention_width or width
    per_token_layer = 4 * width * a + 2 * width * mlp_dim + length * a  # QKVO, MLP, causal QK^T + AV
    return 2.0 * batch * length * (num_layers * per_token_layer + width * vocab)


def train_step_flops(batch, length, width, num_layers, mlp_dim, vocab, attention_width=None) -> float:
    """Forward + backward (backward = 2x forward)."""
    return 3.0 * forward_flops(batch, length, width, num_layers, mlp_dim, vocab, attention_width)


def activation_bytes(batch, length, width, num_layers, mlp_dim, heads, vocab, dtype_bytes=4, attention_width=None):
    """Rough activations kept for the backward pass: per layer the residual, norms, q/k/v,
    MLP hidden and the (heads, T, T) scores, probabilities and dropout mask; plus logits."""
    a = attention_width or width
    per_layer = batch * length * (5 * width + 3 * a + 2 * mlp_dim) + 3 * batch * heads * length * length
    return dtype_bytes * (num_layers * per_layer + 2 * batch * length * vocab)
