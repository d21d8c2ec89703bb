"""The model probe: an eval-mode forward of a plain H-head Transformer that also returns
every layer's attention, for analysis and figures."""

from __future__ import annotations

import dataclasses
import re
from functools import lru_cache

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.config import ConfigError
from mhjax.models.model_config import ATTENTION_WIDTH, ModelConfig
from mhjax.models.transformer import Transformer


def model_sizes(params) -> dict[str, int]:
    """vocab_size, max_len, width, num_layers, mlp_dim (and attention_width where the query
    projection's width differs from the width: a fixed head size) read off a Transformer param tree."""
    try:
        vocab, width = np.shape(params["token_emb"]["embedding"])
        max_len = np.shape(params["pos_emb"]["embedding"])[0]
        num_layers = sum(1 for k in params if re.fullmatch(r"block_\d+", k))
        mlp_dim = np.shape(params["block_0"]["mlp_in"]["kernel"])[1]
        attention = np.shape(params["block_0"]["attn"]["query"]["kernel"])[1]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ConfigError(f"params: not a mhjax Transformer parameter tree ({type(exc).__name__}: {exc})") from None
    return {
        "vocab_size": int(vocab),
        "max_len": int(max_len),
        "width": int(width),
        "num_layers": int(num_layers),
        "mlp_dim": int(mlp_dim),
        **({ATTENTION_WIDTH: int(attention)} if attention != width else {}),
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


def eval_model(model: ModelConfig, heads: int) -> Transformer:
    """The plain H-head Transformer of these sizes, without dropout (eval mode). Its ``apply``
    takes ``head_mask`` (L, H) to scale heads at the input of each layer's output projection."""
    return dataclasses.replace(model, dropout=0.0).transformer(heads)


@lru_cache(maxsize=32)
def forward_fn(model: ModelConfig, heads: int):
    """jit(params, tokens (B, T)) -> (predictions (B, T) int32, attention (L, B, H, T, T)),
    compiled once per model shape."""
    transformer = eval_model(model, heads)

    @jax.jit
    def forward(params, tokens):
        logits, attn = transformer.apply({"params": params}, tokens, return_attention=True)
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), jnp.stack(attn)

    return forward


def predict(params, heads: int, tokens, sizes: dict | None = None):
    """Eval-mode forward of the plain H-head model: tokens (B, T) -> (argmax predictions (B, T),
    attention (L, B, H, T, T)) as numpy arrays."""
    forward = forward_fn(ModelConfig.from_sizes(sizes or model_sizes(params)), int(heads))
    preds, attn = forward(jax.tree_util.tree_map(jnp.asarray, params), jnp.asarray(tokens, jnp.int32))
    return np.asarray(preds), np.asarray(attn)
