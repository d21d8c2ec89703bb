"""ModelConfig (models/model_config.py): the Transformer's sizes as one keyword-only record."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from mhjax.models import Transformer
from mhjax.models.model_config import ModelConfig
from mhjax.models.probe import model_sizes


def test_sizes_cannot_be_passed_by_position_or_changed():
    with pytest.raises(TypeError):
        ModelConfig(16, 8, 32, 1, 64)  # which of 32 and 64 is the width? a TypeError, not a guess
    model = ModelConfig(vocab_size=16, max_len=8, width=32, num_layers=1, mlp_dim=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.width = 64


def test_from_config_builds_the_same_transformer_and_round_trips_the_sizes():
    section = ml_collections.ConfigDict(
        {"vocab_size": 16, "seq_len": 8, "width": 32, "num_layers": 2, "mlp_dim": 48, "dropout": 0.1}
    )
    model = ModelConfig.from_config(section)
    assert model.transformer(4) == Transformer(16, 8, 32, 2, 48, 4, 0.1)  # flax modules compare by fields
    params = model.transformer(4).init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
    sizes = model_sizes(params)
    assert sizes == model.sizes() == {"vocab_size": 16, "max_len": 8, "width": 32, "num_layers": 2, "mlp_dim": 48}
    assert ModelConfig.from_sizes(sizes) == dataclasses.replace(model, dropout=0.0)
