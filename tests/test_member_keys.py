"""Members' keys derived on the host (train/threefry.py) bit for bit as jax.random derives them,
and the dry run's per-member bookkeeping without its costly paths (issue 49 item 5)."""

import random

import jax
import ml_collections
import numpy as np
import pytest

from mhjax import config as cfg
from mhjax.experiments import architecture, make_experiment
from mhjax.plan import memory
from mhjax.train import threefry
from mhjax.train.members import derive_key, stable_id
from tests.conftest import tiny_sequence_config


def eager_key(root: int, *parts) -> np.ndarray:
    """derive_key as it was: jax.random's PRNGKey and one eager fold_in per part."""
    key = jax.random.PRNGKey(root)
    for part in parts:
        key = jax.random.fold_in(key, stable_id(part) if isinstance(part, str) else int(part))
    return np.asarray(key)


def test_threefry_folds_equal_jax_random():
    draw = random.Random(0)
    roots = [0, 1, 2**31 - 1] + [draw.randrange(2**31) for _ in range(6)]
    data = [0, 1, 2**31 - 1, 2**32 - 1] + [draw.randrange(2**32) for _ in range(6)]
    for root in roots:
        key = jax.random.PRNGKey(root)
        assert threefry.key(root) == tuple(int(w) for w in np.asarray(key))
        for d in data:
            assert threefry.fold_in(threefry.key(root), d) == tuple(
                int(w) for w in np.asarray(jax.random.fold_in(key, d))
            )


def test_member_keys_equal_the_eager_derivation():
    cases = [
        (0, 0, "copy-h4-s0"),
        (0, 3, "data", "cycle"),
        (5, 2, "eval", "copy"),
        (2**31 - 1, 7),
        (17, 2**32 - 1),
        (3,),
    ]
    for case in cases:
        key = derive_key(*case)
        assert key.dtype == np.uint32 and key.shape == (2,)
        np.testing.assert_array_equal(key, eager_key(*case))
    # recorded from the eager derivation (mhjax before the host path): a change in either shows
    assert derive_key(0, 0, "copy-h4-s0").tolist() == [3742729728, 2381965281]
    assert derive_key(0, 3, "data", "cycle").tolist() == [3927807968, 3250370216]


def test_member_keys_need_no_jax_dispatch(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("derived by jax.random")

    experiment = make_experiment(tiny_sequence_config(heads=(1, 4), seed=(0, 1)))
    monkeypatch.setattr(jax.random, "fold_in", refuse)
    monkeypatch.setattr(jax.random, "PRNGKey", refuse)
    for member in experiment.members:
        experiment.member_constants(member)


def test_out_of_range_numbers_still_go_through_jax_random(monkeypatch):
    monkeypatch.setattr(threefry, "fold_in", lambda *a: pytest.fail("host path for a number it does not cover"))
    np.testing.assert_array_equal(derive_key(2**31, 1), eager_key(2**31, 1))


def test_optional_fields_build_no_did_you_mean_message(monkeypatch):
    """A ConfigDict's get of a missing field builds a difflib message (~50 us); the dry run of
    hundreds of members asked tens of thousands of times (model.head_dim, model.dtype)."""
    experiment = make_experiment(tiny_sequence_config(heads=(1, 4)))
    member = experiment.members[0]

    def refuse(*args, **kwargs):
        raise AssertionError("a missing field's did-you-mean message was built")

    monkeypatch.setattr(ml_collections.ConfigDict, "_generate_did_you_mean_message", refuse)
    model = architecture.member_model(experiment.config, member)
    assert model.dtype == "float32" and model.width == 16 and model.attention_width is None
    assert memory.activations(experiment.sweep_shapes(), 0, "jax")[0] > 0
    assert cfg.optional(experiment.config.model, "head_dim") is None
    assert cfg.optional(experiment.config.model, "width") == 16
