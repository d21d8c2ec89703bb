"""The model probe: an eval-mode forward of a plain H-head Transformer that also returns
every layer's attention, for analysis and figures."""

from __future__ import annotations

import re
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.config import ConfigError
from mhjax.models.transformer import Transformer


def model_sizes(params) -> dict[str, int]:
    """vocab_size, max_len, width, num_layers, mlp_dim read off a Transformer param tree."""
    try:
        vocab, width = np.shape(params["token_emb"]["embedding"])
        max_len = np.shape(params["pos_emb"]["embedding"])[0]
        num_layers = sum(1 for k in params if re.fullmatch(r"block_\d+", k))
        mlp_dim = np.shape(params["block_0"]["mlp_in"]["kernel"])[1]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ConfigError(f"params: not a mhjax Transformer parameter tree ({type(exc).__name__}: {exc})") from None
    return {
        "vocab_size": int(vocab),
        "max_len": int(max_len),
        "width": int(width),
        "num_layers": int(num_layers),
        "mlp_dim": int(mlp_dim),
    }


def config_sizes(model) -> dict[str, int]:
    """The same sizes from a config's ``model`` section (a Transformer with ``max_len = seq_len``)."""
    return {
        "vocab_size": model.vocab_size,
        "max_len": model.seq_len,
        "width": model.width,
        "num_layers": model.num_layers,
        "mlp_dim": model.mlp_dim,
    }


def eval_model(vocab_size: int, max_len: int, width: int, num_layers: int, mlp_dim: int, heads: int) -> Transformer:
    """The plain H-head Transformer of these sizes, without dropout (eval mode). Its ``apply``
    takes ``head_mask`` (L, H) to scale heads at the input of each layer's output projection."""
    return Transformer(vocab_size, max_len, width, num_layers, mlp_dim, heads, 0.0)


@lru_cache(maxsize=32)
def forward_fn(vocab_size: int, max_len: int, width: int, num_layers: int, mlp_dim: int, heads: int):
    """jit(params, tokens (B, T)) -> (predictions (B, T) int32, attention (L, B, H, T, T)),
    compiled once per model shape."""
    model = eval_model(vocab_size, max_len, width, num_layers, mlp_dim, heads)

    @jax.jit
    def forward(params, tokens):
        logits, attn = model.apply({"params": params}, tokens, return_attention=True)
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), jnp.stack(attn)

    return forward


def predict(params, heads: int, tokens, sizes: dict | None = None):
    """Eval-mode forward of the plain H-head model: tokens (B, T) -> (argmax predictions (B, T),
    attention (L, B, H, T, T)) as numpy arrays."""
    sizes = sizes or model_sizes(params)
    forward = forward_fn(
        sizes["vocab_size"], sizes["max_len"], sizes["width"], sizes["num_layers"], sizes["mlp_dim"], int(heads)
    )
    preds, attn = forward(jax.tree_util.tree_map(jnp.asarray, params), jnp.asarray(tokens, jnp.int32))
    return np.asarray(preds), np.asarray(attn)
