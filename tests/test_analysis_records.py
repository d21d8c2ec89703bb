"""analysis/records.py: analyze_params's options as one record, its result typed by MemberAnalysis."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.analysis.metrics import analyze_params
from mhjax.analysis.records import AnalysisOptions, LayerAnalysis, MemberAnalysis
from mhjax.models.model_config import ModelConfig
from mhjax.models.probe import eval_model


def test_options_record_equals_keywords_and_the_result_has_the_typed_keys():
    model = ModelConfig(vocab_size=11, max_len=6, width=8, num_layers=2, mlp_dim=12)
    params = eval_model(model, 2).init(jax.random.PRNGKey(0), jnp.zeros((1, 6), jnp.int32))["params"]
    tokens = np.random.default_rng(0).integers(0, 11, (4, 6)).astype(np.int32)
    options = AnalysisOptions(horizon=20, max_steps=30, batch_size=3, keep_attention=True)
    by_record = analyze_params(params, 2, "copy", tokens, options=options)
    by_keywords = analyze_params(params, 2, "copy", tokens, horizon=20, max_steps=30, batch_size=3, keep_attention=True)
    assert by_record["conventions"]["horizon"] == 20 and by_record["conventions"]["max_steps"] == 30
    assert by_record.keys() == by_keywords.keys() and by_record["layers"] == by_keywords["layers"]
    assert set(by_record) == set(MemberAnalysis.__annotations__)  # keep_attention + ablate: every field
    assert set(by_record["layers"][0]) == set(LayerAnalysis.__annotations__)
    with pytest.raises(TypeError):
        analyze_params(params, 2, "copy", tokens, horizn=20)  # a misspelt option is an error, not ignored
    with pytest.raises(TypeError):
        AnalysisOptions(100)  # keyword-only
