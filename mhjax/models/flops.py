"""Analytic FLOPs and memory of the sequence Transformer (one multiply-add = 2 FLOPs)."""

from __future__ import annotations


def forward_flops(batch: int, length: int, width: int, num_layers: int, mlp_dim: int, vocab: int) -> float:
    """Matmul FLOPs of one forward pass. Causal attention is counted as half of the full
    T x T score and value products; independent of the head count at fixed width."""
    per_token_layer = 4 * width * width + 2 * width * mlp_dim + length * width  # QKVO, MLP, causal QK^T + AV
    return 2.0 * batch * length * (num_layers * per_token_layer + width * vocab)


def train_step_flops(batch, length, width, num_layers, mlp_dim, vocab) -> float:
    """Forward + backward (backward = 2x forward)."""
    return 3.0 * forward_flops(batch, length, width, num_layers, mlp_dim, vocab)


def activation_bytes(batch, length, width, num_layers, mlp_dim, heads, vocab, dtype_bytes=4) -> float:
    """Rough activations kept for the backward pass: per layer the residual, norms, q/k/v,
    MLP hidden and the (heads, T, T) scores, probabilities and dropout mask; plus logits."""
    per_layer = batch * length * (8 * width + 2 * mlp_dim) + 3 * batch * heads * length * length
    return dtype_bytes * (num_layers * per_layer + 2 * batch * length * vocab)
