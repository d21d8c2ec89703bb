"""ModelConfig (models/model_config.py): the Transformer's sizes as one keyword-only record."""

import dataclasses

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from mhjax.config import ConfigError
from mhjax.experiments.sequence import SequenceRecipe
from mhjax.models import Transformer
from mhjax.models.attention_choice import resolve_attention
from mhjax.models.model_config import ModelConfig
from mhjax.models.probe import model_sizes
from mhjax.workflows.configs import load_config


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


def test_scan_layers_is_on_for_accelerators_by_default_and_can_be_set_either_way():
    """config.model.scan_layers: "auto" scans on TPUs only (compile time; a GPU's scanned step moves
    1.6x the bytes under the kernels, 2x on the JAX path, for ~2 s less compile), "off" keeps the
    unrolled blocks everywhere, "on" scans everywhere; settable from the command line although the
    bundled configs leave it out; anything else is one line naming the choices."""
    auto = {("cpu", "jax"): False, ("gpu", "pallas"): False, ("gpu", "jax"): False, ("tpu", "jax"): True}
    for overrides, want in (({}, auto), ({"model.scan_layers": "off"}, {})):
        config = load_config("quick", overrides)
        for (backend, attention), scanned in {**dict.fromkeys(auto, False), **want}.items():
            choice = resolve_attention(attention, backend, config.model.seq_len)
            assert choice.implementation == attention
            assert SequenceRecipe(config, 4, static_heads=True, attention=choice).model.scan_layers is scanned
    config = load_config("quick", {"model.scan_layers": "on"})
    assert SequenceRecipe(config, 4, static_heads=True).model.scan_layers is True
    with pytest.raises(ConfigError, match=r"config.model.scan_layers: must be one of auto, on, off; got 'yes'"):
        load_config("quick", {"model.scan_layers": "yes"})
