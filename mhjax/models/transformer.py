"""The causal Transformer of the training experiment (Section 4) of "Beyond Parallelism:
Synergistic Computational Graph Effects in Multi-Head Attention" (arXiv 2507.02944).

Pre-norm blocks with RMSNorm (eps = float32 machine epsilon), biases everywhere,
dropout on attention probabilities and after the MLP (counter-based hash masks),
learned token and absolute position embeddings, no final norm, linear read-out.
Initialisation follows the reference framework: Linear weights and biases
U(+-1/sqrt(fan_in)), embeddings N(0, 1).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from mhjax.models.attention import CausalSelfAttention, HashDropout, Layout, dense

RMS_EPS = float(np.finfo(np.float32).eps)


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * scale, as flax's nn.RMSNorm (same parameter), written
    out so XLA fuses it into two passes."""

    epsilon: float = RMS_EPS

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + self.epsilon) * scale


class Block(nn.Module):
    width: int
    num_heads: int
    mlp_dim: int
    dropout_rate: float
    layout: Layout | None = None
    attention: str = "jax"
    interpret: bool = False

    @nn.compact
    def __call__(self, x, heads=None, deterministic: bool = True, head_mask=None):
        h = RMSNorm(name="ln1")(x)
        attn_out, probs = CausalSelfAttention(
            self.width, self.num_heads, self.dropout_rate, self.layout, self.attention, self.interpret, name="attn"
        )(h, heads, deterministic, head_mask)
        x = x + attn_out
        h = RMSNorm(name="ln2")(x)
        h = nn.relu(dense(self.mlp_dim, self.width, "mlp_in")(h))
        h = dense(self.width, self.mlp_dim, "mlp_out")(h)
        h = HashDropout(self.dropout_rate)(h, deterministic)
        return x + h, probs


class Transformer(nn.Module):
    """tokens (B, T) int -> logits (B, T, V) [, per-layer attention probs].

    ``num_heads`` is static; pass ``heads`` (traced int dividing num_heads) to run a member
    with fewer, coarser heads in the same program (see attention.py); ``layout`` names the
    program's member groups when the model is vmapped over them (the one_program strategy);
    ``attention`` how the attention core is computed ("jax", "cpu_kernel" or "pallas",
    models/attention.py), the same function whichever, and ``interpret`` whether the Pallas
    kernel runs in interpret mode (both from attention_choice.resolve_attention).
    ``head_mask`` (L, num_heads) scales each head's output at the input of its layer's output
    projection (head ablation, mhjax.analysis.ablation); None leaves the program as it was.
    """

    vocab_size: int = 256
    max_len: int = 100
    width: int = 64
    num_layers: int = 4
    mlp_dim: int = 128
    num_heads: int = 1
    dropout_rate: float = 0.1
    layout: Layout | None = None
    attention: str = "jax"
    interpret: bool = False

    @nn.compact
    def __call__(self, tokens, heads=None, deterministic: bool = True, return_attention: bool = False, head_mask=None):
        length = tokens.shape[-1]
        embed = nn.initializers.normal(stddev=1.0)
        x = nn.Embed(self.vocab_size, self.width, embedding_init=embed, name="token_emb")(tokens)
        pos = nn.Embed(self.max_len, self.width, embedding_init=embed, name="pos_emb")(jnp.arange(length))
        x = x + pos
        maps = []
        for layer in range(self.num_layers):
            x, probs = Block(
                self.width,
                self.num_heads,
                self.mlp_dim,
                self.dropout_rate,
                self.layout,
                self.attention,
                self.interpret,
                name=f"block_{layer}",
            )(x, heads, deterministic, None if head_mask is None else head_mask[layer])
            maps.append(probs)
        logits = dense(self.vocab_size, self.width, "readout")(x)
        if return_attention:
            return logits, maps
        return logits


def count_params(params) -> int:
    return int(sum(np.prod(np.shape(p)) for p in jax.tree_util.tree_leaves(params)))
