"""Each attention path's activation memory at the run's T (mhjax/plan/memory.py), in the
dry run, and auto on a GPU never taking a path whose predicted memory does not fit."""

import pytest

import mhjax
from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.plan import memory, shapes
from tests.conftest import tiny_sequence_config


def test_each_paths_activations_against_a_hand_count():
    config = tiny_sequence_config(heads=(4,))  # batch 4, T 8, width 16, 1 layer, mlp 32, vocab 16
    swept = make_experiment(config).sweep_shapes()
    rows = 4 * 8 * (5 * 16 + 3 * 16 + 2 * 32)  # residual, norms, q/k/v, MLP rows
    maps = 3 * 4 * 4 * 8 * 8  # scores, probabilities, dropout mask: (B, H, T, T) each
    logits = 2 * 4 * 8 * 16
    jax_path, jax_maps = memory.activations(swept, 0, "jax")
    assert jax_path == 4.0 * (rows + maps + logits) and jax_maps == 4.0 * maps
    cpp, none = memory.activations(swept, 0, "cpu_kernel")
    assert cpp == 4.0 * (rows + 4 * 4 * 8 + logits) and none == 0.0  # (B, H, T) row statistics instead
    pallas, _ = memory.activations(swept, 0, "pallas")  # block kernels fit: their rows only
    assert pallas == 4.0 * (4 * 8 * (2 * 16 + 4 * 16) + 4 * 4 * 8 + logits)


def test_the_dry_run_names_each_paths_memory_at_long_t(capsys):
    config = mhjax.load_config("paper", {"model.seq_len": 1024, "attention": "jax"})
    lines = make_experiment(config).plan("cpu").lines()
    text = "\n".join(lines)
    assert "activation memory at T = 1024" in text
    jax_line = next(line for line in lines if line.strip().startswith("JAX path"))
    assert "(heads, T, T) maps 37.50 GiB" in jax_line and jax_line.endswith("<- this run")
    assert any(line.strip().startswith("C++ CPU kernel") for line in lines)
    assert any(line.strip().startswith("Pallas kernel") for line in lines)


# ~17 s: the dry-run test below names each path's memory
@pytest.mark.slow
def test_auto_on_a_gpu_never_takes_a_path_that_does_not_fit():
    long = make_experiment(mhjax.load_config("paper", {"model.seq_len": 1024, "sweep.seed": (0, 1)}))
    plan = long.plan("gpu")  # its programs made: the kernel's strategy fits
    assert plan.strategy != "fused"  # fused traces head counts: the JAX path, 283 GiB
    fused = make_experiment(
        mhjax.load_config("paper", {"model.seq_len": 1024, "sweep.seed": (0, 1), "strategy": "fused"})
    )
    with pytest.raises(
        ConfigError, match=r"config.attention: auto on gpu runs the JAX path .* need ~282.87 GiB per device"
    ):
        fused.programs("fused", "gpu")
    short = make_experiment(mhjax.load_config("paper", {"strategy": "fused"}))
    assert short.programs("fused", "gpu")  # T = 100: the JAX path fits
    asked = make_experiment(
        mhjax.load_config("paper", {"model.seq_len": 1024, "strategy": "fused", "attention": "jax"})
    )
    assert asked.programs("fused", "gpu")  # asked for by name: the user's call, not auto's


def test_the_dry_run_traces_each_distinct_model_once(monkeypatch):
    """The plan's lines and member_info ask for every member and path; the model is traced once per
    distinct shape (here heads 1 and 4), not once per call, and the counts equal a fresh trace's."""
    traces = []
    real = shapes.count_params  # called once per trace of the model's init
    shapes.param_count.cache_clear()
    monkeypatch.setattr(shapes, "count_params", lambda p: traces.append(1) or real(p))
    experiment = make_experiment(tiny_sequence_config(heads=(1, 4), seed=(0, 1, 2, 3)))
    experiment.plan("cpu").lines()
    assert len(traces) == 2
    counts = {m["heads"]: experiment.member_info(m)["params"] for m in experiment.members}
    shapes.param_count.cache_clear()
    assert counts == {h: experiment.member_info(m)["params"] for m in experiment.members for h in [m["heads"]]}
    assert len(traces) == 4
    shapes.param_count.cache_clear()  # no count of the patched tracer stays behind


def test_the_memory_check_counts_one_member_per_model_and_every_member():
    experiment = make_experiment(tiny_sequence_config(heads=(1, 4), seed=(0, 1, 2)))
    swept = experiment.sweep_shapes()
    alike = swept.alike()
    assert sorted((swept.heads[i], n) for i, n in alike) == [(1, 3), (4, 3)]
    every = sum(memory.member_bytes(swept, i, "jax") for i in range(len(experiment.members)))
    assert memory.need(swept, 2) == pytest.approx(every / 2)
