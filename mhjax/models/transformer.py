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

from mhjax.models.attention import CausalSelfAttention, DenseParams, HashDropout, Layout, dense
from mhjax.models.precision import compute_dtype, to_dtype, to_float32

RMS_EPS = float(np.finfo(np.float32).eps)
MLP_DROPOUT = "HashDropout_0"  # the name Flax gave it unnamed: dropout keys (and checkpoints) stay as they were


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * scale, as flax's nn.RMSNorm (same parameter), written
    out so XLA fuses it into two passes."""

    epsilon: float = RMS_EPS

    @nn.compact
    def __call__(self, x):
        """In float32 whatever x's dtype (models/precision.py); the result in x's dtype."""
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],))
        y = to_float32(x)
        y = y * jax.lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + self.epsilon) * scale
        return y.astype(x.dtype) if y.dtype != x.dtype else y


class Block(nn.Module):
    width: int
    num_heads: int
    mlp_dim: int
    dropout_rate: float
    layout: Layout | None = None
    attention: str = "jax"
    interpret: bool = False
    attention_width: int | None = None  # A = heads x head size; None: the width (parameter matching)
    dtype: str = "float32"  # the activations' (models/precision.py)

    @nn.compact
    def __call__(self, x, heads=None, deterministic: bool = True, head_mask=None, keys=None):
        """``keys``: (attention's, the MLP dropout's) dropout keys, derived by the caller
        (Transformer's scanned layers); None: make_rng, as usual.

        Where attention runs the Pallas kernel, so do the block's row-wise parts (issue 29,
        models/pallas_block.py), where their weights fit a program: the pre-norm inside the
        q/k/v projection's kernel (recomputed in the backward, no normalised copy stored) and the
        MLP half (norm, mlp_in, relu, mlp_out, dropout, residual) as one kernel. Same parameters,
        names, dropout draws and function as the unfused block."""
        attn_key, mlp_key = (None, None) if keys is None else keys
        fuse_norm, fuse_mlp = self._kernels()
        attention = CausalSelfAttention(
            self.width,
            self.num_heads,
            self.dropout_rate,
            self.layout,
            self.attention,
            self.interpret,
            self.attention_width,
            self.dtype,
            name="attn",
        )
        if fuse_norm:
            attn_out, probs = attention(
                x, heads, deterministic, head_mask, attn_key, norm=NormScale(self.width, name="ln1")()
            )
        else:
            attn_out, probs = attention(RMSNorm(name="ln1")(x), heads, deterministic, head_mask, attn_key)
        x = x + attn_out
        dropout = HashDropout(self.dropout_rate, name=MLP_DROPOUT)
        compute = compute_dtype(self.dtype)
        if fuse_mlp:
            from mhjax.models import pallas_block

            # the matmuls' parameters cast per use, as dense(..., compute) casts them (the scale: float32)
            w_in, b_in = (to_dtype(p, compute) for p in DenseParams(self.mlp_dim, self.width, name="mlp_in")())
            w_out, b_out = (to_dtype(p, compute) for p in DenseParams(self.width, self.mlp_dim, name="mlp_out")())
            seed, threshold, inv_keep = dropout.seed(deterministic, mlp_key)
            scale = NormScale(self.width, name="ln2")()
            out = pallas_block.mlp_block(x, scale, w_in, b_in, w_out, b_out, seed, threshold, inv_keep, self.interpret)
            return out, probs
        h = RMSNorm(name="ln2")(x)
        h = nn.relu(dense(self.mlp_dim, self.width, "mlp_in", compute)(h))
        h = dense(self.width, self.mlp_dim, "mlp_out", compute)(h)
        return x + dropout(h, deterministic, mlp_key), probs

    def _kernels(self) -> tuple[bool, bool]:
        """(the pre-norm inside the projection kernel, the MLP half as one kernel), in float32 or
        bfloat16 (the kernels take the block's dtype: models/precision.py). Triton kernels: a GPU's (or a
        CPU's, interpreted); "pallas_tpu" keeps the JAX block parts (a TPU block kernel: not written)."""
        if self.attention != "pallas":
            return False, False
        from mhjax.models import pallas_block

        return pallas_block.block_parts(self.width, self.mlp_dim, self.attention_width, self.dtype)


class NormScale(nn.Module):
    """RMSNorm's parameter alone (same name, shape and init), for a kernel that normalises."""

    width: int

    @nn.compact
    def __call__(self):
        return self.param("scale", nn.initializers.ones, (self.width,))


class Transformer(nn.Module):
    """tokens (B, T) int -> logits (B, T, V) [, per-layer attention probs].

    ``num_heads`` is static; pass ``heads`` (traced int dividing num_heads) to run a member
    with fewer, coarser heads in the same program (see attention.py); ``layout`` names the
    program's member groups when the model is vmapped over them (the one_program strategy);
    ``attention`` how the attention core is computed ("jax", "cpu_kernel", "pallas" or "pallas_tpu",
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
    # The blocks as one scanned layer (_scanned): XLA compiles one layer instead of num_layers,
    # for slow compiles (config.model.scan_layers; on a TPU by default). Each step then copies the
    # layers' saved activations into and out of stacks (on a GPU 1.6x to 2x the bytes per step).
    scan_layers: bool = False
    # The attention width A = heads x head size (q, k, v and the output projection's input); None:
    # the width (parameter matching, head size width / heads). A fixed head size sets it per model.
    attention_width: int | None = None
    # "float32" or "bfloat16": the activations' and matmuls' dtype; parameters stay float32, and
    # norms, softmax and the returned logits are float32 (models/precision.py).
    dtype: str = "float32"

    def _block(self, **kwargs) -> Block:
        return Block(
            self.width,
            self.num_heads,
            self.mlp_dim,
            self.dropout_rate,
            self.layout,
            self.attention,
            self.interpret,
            self.attention_width,
            self.dtype,
            **kwargs,
        )

    def _scanned(self, x, heads, deterministic: bool, head_mask, return_attention: bool):
        """The blocks as ONE layer in a lax.scan over their stacked parameters: XLA compiles one
        layer instead of num_layers (the parameter tree stays block_0 ... block_{L-1}; the stack
        exists inside the program only). Each layer's dropout keys are the ones make_rng gives
        its unscanned block (the same hash of the module path), so results are unchanged."""
        params = self.variables["params"]
        stacked = jax.tree_util.tree_map(
            lambda *p: jnp.stack(p), *[params[f"block_{layer}"] for layer in range(self.num_layers)]
        )
        keys = None
        if not deterministic and self.dropout_rate > 0.0:
            keys = tuple(
                jnp.stack([self._dropout_key(f"block_{layer}", child) for layer in range(self.num_layers)])
                for child in ("attn", MLP_DROPOUT)
            )
        block = self._block(parent=None)

        def layer(x, xs):
            p, k, mask = xs
            x, probs = block.apply({"params": p}, x, heads, deterministic, mask, k)
            return x, probs if return_attention else None

        x, maps = jax.lax.scan(layer, x, (stacked, keys, head_mask))
        return x, list(maps) if return_attention else None

    def _dropout_key(self, *path: str):
        """The key ``self.make_rng("dropout")`` returns in the submodule at ``path`` on its first call."""
        from flax.core.scope import LazyRng

        return LazyRng.create(self.scope.rngs["dropout"], *path, 1).as_jax_rng()

    @nn.compact
    def __call__(self, tokens, heads=None, deterministic: bool = True, return_attention: bool = False, head_mask=None):
        length = tokens.shape[-1]
        embed = nn.initializers.normal(stddev=1.0)
        compute = compute_dtype(self.dtype)
        x = nn.Embed(self.vocab_size, self.width, compute, embedding_init=embed, name="token_emb")(tokens)
        pos = nn.Embed(self.max_len, self.width, compute, embedding_init=embed, name="pos_emb")(jnp.arange(length))
        x = x + pos
        if self.scan_layers and not self.is_initializing() and self.num_layers > 1:
            x, maps = self._scanned(x, heads, deterministic, head_mask, return_attention)
        else:
            x, maps = self._unrolled(x, heads, deterministic, head_mask)
        logits = to_float32(dense(self.vocab_size, self.width, "readout", compute)(x))  # the loss in float32
        if return_attention:
            return logits, maps
        return logits

    def _unrolled(self, x, heads, deterministic: bool, head_mask):
        maps = []
        for layer in range(self.num_layers):
            block = self._block(name=f"block_{layer}")
            x, probs = block(x, heads, deterministic, None if head_mask is None else head_mask[layer])
            maps.append(probs)
        return x, maps


def count_params(params) -> int:
    return int(sum(np.prod(np.shape(p)) for p in jax.tree_util.tree_leaves(params)))
