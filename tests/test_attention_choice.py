"""models/attention_choice.py: config.attention resolved once, for this process's backend or a
target's: what runs, the Pallas kernel's interpret mode, and why."""

import jax
import jax.numpy as jnp
import pytest

from mhjax.config import ConfigError
from mhjax.models import attention, cpu_attention
from mhjax.models.attention_choice import JAX, resolve_attention


def test_auto_takes_each_backends_kernel_and_says_why_not_when_it_cannot(monkeypatch):
    gpu = resolve_attention("auto", "gpu", 100)
    assert (gpu.implementation, gpu.interpret, gpu.fallback) == ("pallas", False, None)
    assert resolve_attention("auto", "cuda", 100) == gpu  # a platform name is its backend
    for length in (257, 1024, 8192):  # the tiled kernel has no length limit
        assert resolve_attention("auto", "gpu", length) == gpu
        assert resolve_attention("pallas", "gpu", length).implementation == "pallas"
    tpu = resolve_attention("auto", "tpu", 1024)
    assert (tpu.implementation, tpu.interpret, tpu.fallback) == ("pallas_tpu", False, None)
    assert resolve_attention("pallas", "tpu", 100).implementation == "pallas_tpu"  # asked for: at any T
    for length, rate in [(100, 0.1), (8192, 0.0)]:  # mhjax's TPU kernel: any T, dropout drawn on chip
        assert resolve_attention("auto", "tpu", length, dropout=rate) == tpu
    monkeypatch.setattr(cpu_attention, "available", lambda: False)
    cpu = resolve_attention("auto", "cpu", 100)
    assert cpu.implementation == "jax" and "C++ kernel is unavailable" in cpu.fallback
    monkeypatch.setattr(cpu_attention, "available", lambda: True)
    assert resolve_attention("auto", "cpu", 100).implementation == "cpu_kernel"


def test_pallas_interprets_on_a_cpu_only_and_the_fused_rule_is_the_records():
    on_cpu, on_gpu = resolve_attention("pallas", "cpu", 32), resolve_attention("pallas", "gpu", 32)
    assert on_cpu.interpret and not on_gpu.interpret and "interpret mode" in on_cpu.reason
    assert (on_gpu.core(traced_heads=False), on_gpu.core(traced_heads=True)) == ("pallas", "jax")
    on_tpu = resolve_attention("pallas", "tpu", 32)
    assert (on_tpu.core(traced_heads=False), on_tpu.core(traced_heads=True)) == ("pallas_tpu", "jax")
    assert resolve_attention("jax", "gpu", 32).core(traced_heads=False) == "jax" == JAX.implementation


@pytest.mark.parametrize(
    "requested,backend,seq_len,message",
    [
        ("flash", "cpu", 32, "config.attention: must be one of auto, jax, cpu_kernel, pallas; got 'flash'"),
        ("cpu_kernel", "gpu", 32, "config.attention: cpu_kernel runs on a CPU with a C++ compiler (here: backend gpu)"),
        ("pallas", "metal", 32, "config.attention: pallas runs on a GPU or a TPU (or a CPU, interpreted)"),
    ],
)
def test_what_cannot_run_is_a_one_line_config_error(requested, backend, seq_len, message):
    with pytest.raises(ConfigError) as exc:
        resolve_attention(requested, backend, seq_len, dropout=0.1)
    assert str(exc.value).startswith(message) and "\n" not in str(exc.value)


def test_resolving_for_a_gpu_target_on_this_cpu_lowers_the_triton_kernel():
    """The kernel's interpret mode is the resolver's static argument, not this process's backend:
    resolved for "cuda", the layer lowers to the Triton kernel from a CPU-only process."""
    choice = resolve_attention("auto", "cuda", 16)
    layer = attention.CausalSelfAttention(32, 2, 0.0, None, choice.implementation, choice.interpret)
    x = jnp.zeros((1, 16, 32))
    params = attention.CausalSelfAttention(32, 2).init(jax.random.PRNGKey(0), x)  # the same tree, on JAX
    lowered = jax.jit(layer.apply).trace(params, x).lower(lowering_platforms=("cuda",))
    assert "mhjax_attention_fwd" in lowered.as_text() and "triton" in lowered.as_text().lower()
    interpreted = resolve_attention("pallas", "cpu", 16)
    layer = attention.CausalSelfAttention(32, 2, 0.0, None, interpreted.implementation, interpreted.interpret)
    assert "triton" not in jax.jit(layer.apply).trace(params, x).lower().as_text().lower()


def test_the_dry_run_names_the_tpu_kernel_with_dropout_and_the_layer_lowers_to_mosaic():
    from mhjax.experiments import make_experiment
    from tests.conftest import tiny_sequence_config

    lines = make_experiment(tiny_sequence_config(heads=(1, 2))).plan("tpu").lines()  # model.dropout 0.1
    line = next(x for x in lines if x.startswith("attention: "))
    assert line.startswith("attention: pallas_tpu (config.attention=auto on tpu)")
    choice = resolve_attention("auto", "tpu", 16, dropout=0.1)
    layer = attention.CausalSelfAttention(32, 2, 0.1, None, choice.implementation, choice.interpret)
    x = jnp.zeros((1, 16, 32))
    params = attention.CausalSelfAttention(32, 2).init(jax.random.PRNGKey(0), x)
    train = lambda p, x: layer.apply(p, x, None, False, rngs={"dropout": jax.random.key(0)})[0]  # noqa: E731
    text = jax.jit(jax.grad(lambda p: jnp.sum(train(p, x)))).trace(params).lower(lowering_platforms=("tpu",)).as_text()
    assert text.count("tpu_custom_call") == 2 and "mhjax_tpu_attention_bwd" in text
