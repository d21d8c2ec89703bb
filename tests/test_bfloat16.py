"""config.model.dtype (models/precision.py): bfloat16 activations and matmuls on float32
parameters, float32 norms, softmax and loss; float32 (the default) is the program it was."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.config import ConfigError, apply_overrides
from mhjax.experiments import make_experiment, override_defaults
from mhjax.experiments.sequence_config import validate
from mhjax.models.attention import CausalSelfAttention
from mhjax.models.model_config import ModelConfig
from mhjax.plan.lines import estimate_lines
from mhjax.train.loop import Sweep
from tests.conftest import tiny_sequence_config

MODEL = ModelConfig(vocab_size=16, max_len=8, width=16, num_layers=2, mlp_dim=32, dropout=0.0)


def configured(dtype: str | None, steps: int, **sweep):
    config = tiny_sequence_config(**sweep)
    if dtype is not None:
        config = apply_overrides(config, {"model.dtype": dtype}, override_defaults(config))
    return config, steps


def trained(config_steps, chunk=None):
    config, steps = config_steps
    sweep = Sweep(make_experiment(config), "cpu")
    states = sweep.train(sweep.init_states(), steps, chunk or steps)
    return sweep, states, sweep.evaluate(states)


def _dots(dtype: str) -> list[tuple[str, str]]:
    """(input dtype, result dtype) of every dot_general in the model's forward jaxpr."""
    model = dataclasses.replace(MODEL, dtype=dtype).transformer(2)
    tokens = jnp.zeros((2, 8), jnp.int32)
    params = model.init(jax.random.PRNGKey(0), tokens)
    jaxpr = jax.make_jaxpr(lambda p: model.apply(p, tokens))(params)
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                found.append((str(eqn.invars[0].aval.dtype), str(eqn.outvars[0].aval.dtype)))
            for value in eqn.params.values():
                if hasattr(value, "jaxpr"):
                    walk(value.jaxpr)

    walk(jaxpr.jaxpr)
    return found


def test_bfloat16_matmuls_run_in_bfloat16_with_float32_scores_and_logits():
    """Every matmul of the bfloat16 model takes bfloat16 inputs; the attention scores come out
    float32 (the softmax's), the rest bfloat16; the logits are float32. The float32 model has no
    bfloat16 anywhere. Parameters are float32 in both."""
    dots = _dots("bfloat16")
    assert dots and all(a == "bfloat16" for a, _ in dots)
    # per layer: q/k/v, scores (float32 result), probs x v, out, mlp_in, mlp_out; then the read-out.
    # The scores appear twice per layer in the jaxpr: the layer's probs output (dead code unless
    # asked for) and the attention's own.
    assert [r for _, r in dots].count("float32") == 2 * MODEL.num_layers
    assert len(dots) == MODEL.num_layers * 7 + 1
    assert all(a == r == "float32" for a, r in _dots("float32"))
    model = dataclasses.replace(MODEL, dtype="bfloat16").transformer(2)
    tokens = jnp.zeros((2, 8), jnp.int32)
    params = model.init(jax.random.PRNGKey(0), tokens)
    assert {p.dtype for p in jax.tree_util.tree_leaves(params)} == {jnp.dtype(jnp.float32)}
    assert model.apply(params, tokens).dtype == jnp.float32


@pytest.mark.slow  # trains twice; test_results_json_... covers float32 results
def test_the_default_and_an_explicit_float32_are_the_same_training():
    """model.dtype left out and model.dtype=float32: bitwise the same parameters and evaluations."""
    _, a, ra = trained(configured(None, 3))
    _, b, rb = trained(configured("float32", 3))
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)
    assert ra == rb


@pytest.mark.parametrize("implementation", ["cpu_kernel", "pallas"])
def test_the_kernels_under_bfloat16_equal_the_jax_path_in_bfloat16(implementation):
    """The C++ kernel takes bfloat16 q/k/v cast to float32 at its boundary, the Pallas kernel
    (interpret mode) reads them in bfloat16 with float32 accumulation (tests/test_bfloat16_kernels.py
    holds what it reads): their bfloat16 layer equals the JAX path's bfloat16 layer to bfloat16's
    precision (the JAX path reads v with bfloat16 probabilities), values and gradients."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 16)).astype(jnp.bfloat16)
    jax_layer = CausalSelfAttention(16, 4, dtype="bfloat16")
    params = jax_layer.init(jax.random.PRNGKey(1), x)
    layer = CausalSelfAttention(16, 4, implementation=implementation, interpret=True, dtype="bfloat16")

    def value_and_grad(module):
        loss = lambda p: jnp.sum(module.apply(p, x)[0].astype(jnp.float32) ** 2)  # noqa: E731
        return jax.value_and_grad(loss)(params)

    (want, want_grad), (got, got_grad) = value_and_grad(jax_layer), value_and_grad(layer)
    assert layer.apply(params, x)[0].dtype == jnp.bfloat16
    np.testing.assert_allclose(got, want, rtol=2e-2)
    # atol: against the largest gradient (the key bias's is zero up to rounding either way)
    scale = max(float(jnp.max(jnp.abs(b))) for b in jax.tree_util.tree_leaves(want_grad))
    for a, b in zip(jax.tree_util.tree_leaves(got_grad), jax.tree_util.tree_leaves(want_grad)):
        assert a.dtype == jnp.float32
        np.testing.assert_allclose(a, b, rtol=5e-2, atol=2e-2 * scale)


def test_bfloat16_trains_float32_parameters_and_optimizer_state():
    """What a checkpoint holds (parameters and Adam's moments) stays float32 under bfloat16."""
    _, states, _ = trained(configured("bfloat16", 2))
    leaves = jax.tree_util.tree_leaves(states)
    floats = {x.dtype for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)}
    assert floats == {jnp.dtype(jnp.float32)}


def _compare(steps: int, loss_tol: float):
    """The tiny sweep (copy, heads 1 and 4) in bfloat16 against float32 after ``steps`` steps."""
    runs = {d: trained(configured(d, steps), chunk=steps) for d in ("float32", "bfloat16")}
    config = configured("float32", steps)[0]
    tokens = config.data.num_eval * config.model.seq_len  # held-out tokens per member
    (_, _, f32), (_, _, bf16) = runs["float32"], runs["bfloat16"]
    for i in f32:
        assert abs(bf16[i]["eval_loss"] - f32[i]["eval_loss"]) <= loss_tol * f32[i]["eval_loss"]
        assert abs(bf16[i]["eval_accuracy"] - f32[i]["eval_accuracy"]) * tokens <= 2 + 1e-6
    return f32, bf16


def test_the_tiny_sweep_in_bfloat16_matches_float32_after_100_steps():
    """100 steps (compile-bound: ~25 s): held-out losses within 2 % of float32 (measured: 0.13 %),
    accuracies within 2 of the 64 held-out tokens (measured: equal)."""
    _compare(100, 0.02)


@pytest.mark.parametrize("value", ["float16", "bf16", 32])
def test_a_bad_dtype_is_one_line(value):
    config = tiny_sequence_config()
    with config.model.unlocked():
        config.model.dtype = value
    with pytest.raises(ConfigError) as info:
        validate(config)
    assert str(info.value) == f"config.model.dtype: must be one of float32, bfloat16; got {value!r}"


def test_the_dry_run_prices_bfloat16_beside_float32():
    """Each dtype's estimate, and the other dtype's rate on a line of its own: the two agree
    (models/cost_dtype.py prices bfloat16; tests/test_cost_devices.py holds its bytes)."""
    experiments = {d: make_experiment(configured(d, 2)[0]) for d in ("float32", "bfloat16")}
    lines = {d: estimate_lines(e.plan("cpu")) for d, e in experiments.items()}
    rate = {d: e.plan("gpu", 1).predict("grouped")["member_steps_per_s"] for d, e in experiments.items()}
    assert rate["bfloat16"] > rate["float32"]
    assert lines["float32"][-1].startswith(f"  in bfloat16: ~{rate['bfloat16']:,.0f} member-steps/s")
    assert f"~{rate['bfloat16']:,.0f} member-steps/s" in lines["bfloat16"][1]
    assert lines["bfloat16"][-2].startswith("  model.dtype=bfloat16: priced in bfloat16")
    assert lines["bfloat16"][-1].startswith(f"  in float32: ~{rate['float32']:,.0f} member-steps/s")


def test_results_json_records_bfloat16_and_float32_results_stay_as_they_were():
    fields = {d: make_experiment(configured(d, 2)[0]).results_fields("cpu") for d in (None, "bfloat16")}
    assert "dtype" not in fields[None]
    assert fields["bfloat16"] == {**fields[None], "dtype": "bfloat16"}
