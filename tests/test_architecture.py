"""Architecture axes (experiments/architecture.py): a sweep over width, layers, MLP width, dropout
and head size; model.head_dim fixes the head size; members of one model shape share programs."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax import cli
from mhjax.analysis import ablation
from mhjax.analysis.forward import forward
from mhjax.config import ConfigError, apply_overrides
from mhjax.experiments import make_experiment, override_defaults
from mhjax.experiments.architecture import record_sizes
from mhjax.models import cost, count_params, flops
from mhjax.models.attention import CausalSelfAttention
from mhjax.models.model_config import ModelConfig
from mhjax.models.probe import model_sizes
from mhjax.plotting.report import summary_table as report_summary
from mhjax.train.console import summary_lines
from mhjax.train.loop import Sweep
from tests.conftest import config_source, tiny_sequence_config


def configured(overrides: dict, **sweep):
    config = tiny_sequence_config(**sweep)
    return apply_overrides(config, overrides, override_defaults(config))


def hand_count(width, layers, mlp, vocab, length, attention):
    """Parameters of the Transformer counted by hand: embeddings, per block the two norm scales,
    q/k/v (width x A, bias A), the output projection (A x width, bias width), the MLP; readout."""
    block = 2 * width + 3 * (width * attention + attention) + attention * width + width
    block += width * mlp + mlp + mlp * width + width
    return vocab * width + length * width + layers * block + width * vocab + vocab


def trained(config, steps=2):
    sweep = Sweep(make_experiment(config), "cpu")
    states = sweep.train(sweep.init_states(), steps, steps)
    return sweep, sweep.member_states(states), sweep.evaluate(states)


@pytest.mark.slow  # ~38 s: test_growth trains heads x head_dim with hand-counted parameters
def test_heads_by_head_dim_trains_four_members_with_hand_counted_parameters_in_the_listed_programs(tmp_path, capsys):
    """heads 1,4 x head_dim 8,16 at width 16: four attention widths (8, 16, 32, 64), so four
    shape groups and four programs, which --dry-run lists and training runs."""
    config = configured({"sweep.head_dim": "8,16"}, heads=(1, 4))
    path = tmp_path / "tiny.py"
    path.write_text(config_source(tiny_sequence_config(heads=(1, 4))))
    argv = ["train", "--config", str(path), "--workdir", str(tmp_path / "w"), "--dry-run"]
    assert cli.main(argv + ["--config.sweep.head_dim=8,16"]) == 0
    out = capsys.readouterr().out
    listed = re.search(r"^strategy: grouped -> 4 program\(s\): (.*)$", out, re.M).group(1)
    assert "4 shape groups" in out and re.search(r"^  a64: .*attention width 64 \(head size 16\)", out, re.M)
    sweep, states, results = trained(config)
    assert listed == ", ".join(f"{p.name} (1 members)" for p in sweep.programs)
    assert [p.name for p in sweep.programs] == ["a8-h1", "a16-h1", "a32-h4", "a64-h4"]
    expected = {"copy-d8-h1-s0": 8, "copy-d8-h4-s0": 32, "copy-d16-h1-s0": 16, "copy-d16-h4-s0": 64}
    assert sorted(states) == sorted(expected)
    for name, attention in expected.items():
        params = states[name].params
        count = hand_count(16, 1, 32, 16, 8, attention)
        assert count_params(params) == count
        assert re.search(rf"^{name}\s+{count:,}\s", out, re.M)
        assert np.shape(params["block_0"]["attn"]["query"]["kernel"]) == (16, attention)
        assert np.shape(params["block_0"]["attn"]["out"]["kernel"]) == (attention, 16)
        assert all(np.isfinite(r["eval_loss"]) for r in results.values())
    # The end-of-training table (console; results.md lists every field) carries the sizes.
    experiment = sweep.experiment
    records = [{**m.hparams, **experiment.member_info(m), **results[i]} for i, m in enumerate(experiment.members)]
    table = summary_lines(experiment.summary_table(), records)
    assert table[0].split()[:3] == ["task", "heads", "head_dim"] and table[0].endswith("params  GFLOP/step")
    gflop = flops.train_step_flops(4, 8, 16, 1, 32, 16, 64) / 1e9
    report = report_summary(records, ["task", "head_dim", "heads", "seed"])  # report.md's table
    assert report.startswith("| task | heads | head_dim | members |") and "| params | gflop per step |" in report
    assert records[3]["gflop_per_step"] == gflop
    assert re.search(
        rf"^copy\s+4\s+16\s+1\s.*\s{hand_count(16, 1, 32, 16, 8, 64):,}\s+{gflop:.4g}$", "\n".join(table), re.M
    )


def test_todays_config_and_the_architecture_path_are_bit_equal():
    """A config without architecture fields against the same config with every one swept at a
    single value (and model.head_dim None), and against a width sweep holding it: the same names,
    keys and, after training, bitwise the same parameters and evaluations."""
    plain = tiny_sequence_config(heads=(2,))
    single = configured(
        {
            "sweep.width": "16,",
            "sweep.num_layers": "1,",
            "sweep.mlp_dim": "32,",
            "sweep.dropout": "0.1,",
            "sweep.head_dim": "None,",
            "model.head_dim": "None",
        },
        heads=(2,),
    )
    swept = configured({"sweep.width": "16,32"}, heads=(2,))
    runs = {name: trained(c) for name, c in (("plain", plain), ("single", single), ("swept", swept))}
    experiments = {name: run[0].experiment for name, run in runs.items()}
    assert [m.name for m in experiments["single"].members] == ["copy-h2-s0"]
    assert [p.name for p in runs["single"][0].programs] == ["h2"] == [p.name for p in runs["plain"][0].programs]
    assert [m.name for m in experiments["swept"].members] == ["copy-w16-h2-s0", "copy-w32-h2-s0"]
    assert [p.name for p in runs["swept"][0].programs] == ["w16-h2", "w32-h2"]
    for name in ("copy-h2-s0",):
        pairs = {"single": name, "swept": name.replace("copy-", "copy-w16-")}
        base = experiments["plain"].member_constants(next(m for m in experiments["plain"].members if m.name == name))
        for run, other in pairs.items():
            member = next(m for m in experiments[run].members if m.name == other)
            for a, b in zip(base, experiments[run].member_constants(member)):
                np.testing.assert_array_equal(a, b)
            for a, b in zip(
                jax.tree_util.tree_leaves(runs["plain"][1][name].params),
                jax.tree_util.tree_leaves(runs[run][1][other].params),
            ):
                np.testing.assert_array_equal(a, b)
            index = [m.name for m in experiments[run].members].index(other)
            plain_index = [m.name for m in experiments["plain"].members].index(name)
            assert runs[run][2][index] == runs["plain"][2][plain_index]


def test_four_heads_at_head_dim_none_and_at_width_over_four_train_identically():
    """H = 4 at width 16: head_dim None and head_dim 4 are one model, so one shape group, one
    program, the same keys and bitwise the same training."""
    config = configured({"sweep.head_dim": "None,4"}, heads=(4,))
    sweep, states, results = trained(config)
    assert [m.name for m in sweep.experiment.members] == ["copy-h4-s0", "copy-d4-h4-s0"]
    assert [p.name for p in sweep.programs] == ["h4"]
    for a, b in zip(*(jax.tree_util.tree_leaves(states[n].params) for n in ("copy-h4-s0", "copy-d4-h4-s0"))):
        np.testing.assert_array_equal(a, b)
    assert results[0] == results[1]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"sweep.width": "0,16"}, "config.sweep.width: each must be a positive integer; got 0"),
        ({"sweep.num_layers": "1.5,"}, "config.sweep.num_layers: each must be a positive integer; got 1.5"),
        ({"sweep.dropout": "1.0,"}, "config.sweep.dropout: each must be a number in [0, 1); got 1.0"),
        ({"sweep.head_dim": "-8,"}, "config.sweep.head_dim: each must be None (head size = width / heads) or a"),
        ({"model.head_dim": "0"}, "config.model.head_dim: must be None (head size = width / heads) or a positive"),
        ({"sweep.width": "16,24"}, "config.sweep.heads: 16 heads at width 24 with head_dim None"),
        ({"sweep.depth": "1,2"}, "config.sweep.depth: unknown field"),
    ],
)
def test_bad_architecture_values_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError) as exc:
        make_experiment(configured(overrides, heads=(16,)))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_fixed_head_size_frees_heads_from_dividing_the_width_and_groups_equal_attention_widths():
    """head_dim 8 at width 16: 3 heads are fine (attention width 24); 1 x 16 and 2 x 8 share one
    attention width, so one group, where fused runs the two head counts on fine heads."""
    experiment = make_experiment(configured({"model.head_dim": "8"}, heads=(3,)))
    assert [m.name for m in experiment.members] == ["copy-h3-s0"]  # a single value names nothing
    assert experiment.member_info(experiment.members[0])["params"] == hand_count(16, 1, 32, 16, 8, 24)
    model = {**experiment.config.model.to_dict()}
    assert record_sizes(model, {"heads": 3})["attention_width"] == 24  # Run.model from a results entry
    assert record_sizes(model, {"heads": 2, "head_dim": 16, "width": 64})["attention_width"] == 32
    assert "attention_width" not in record_sizes({**model, "head_dim": None}, {"heads": 3})
    experiment = make_experiment(configured({"sweep.head_dim": "8,16"}, heads=(1, 2)))
    groups = [(g.name, [experiment.members[i].name for i in g.members]) for g in experiment.groups]
    assert groups == [
        ("a8", ["copy-d8-h1-s0"]),
        ("a16", ["copy-d8-h2-s0", "copy-d16-h1-s0"]),
        ("a32", ["copy-d16-h2-s0"]),
    ]
    fused = experiment.programs("fused", "cpu")
    assert [(p.name, p.recipe.model.num_heads, p.recipe.static_heads) for p in fused] == [
        ("a8-all", 1, True),
        ("a16-all", 2, False),
        ("a32-all", 2, True),
    ]


@pytest.mark.parametrize("implementation", ["jax", "cpu_kernel", "pallas"])
def test_attention_at_a_fixed_head_size_equals_plain_heads_with_fine_heads_and_every_core(implementation):
    """Width 16, attention width 32: one head of size 32 run on 4 fine heads (traced count) and
    2 heads of size 16 by every implementation equal the plain JAX model at static heads."""
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 16))
    plain = CausalSelfAttention(16, 2, features=32)
    params = plain.init(jax.random.PRNGKey(1), x)
    assert params["params"]["out"]["kernel"].shape == (32, 16)
    want, _ = plain.apply(params, x)
    core = CausalSelfAttention(16, 2, features=32, implementation=implementation, interpret=True)
    np.testing.assert_allclose(core.apply(params, x)[0], want, rtol=1e-5, atol=1e-5)
    one, _ = CausalSelfAttention(16, 1, features=32).apply(params, x)
    fine, _ = CausalSelfAttention(16, 4, features=32).apply(params, x, jnp.int32(1))
    np.testing.assert_allclose(fine, one, rtol=1e-5, atol=1e-5)


def test_forward_ablation_flops_and_cost_take_the_head_size():
    model = ModelConfig(vocab_size=16, max_len=8, width=16, num_layers=1, mlp_dim=32, attention_width=32)
    transformer = model.transformer(4)
    params = transformer.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
    sizes = model_sizes(params)
    assert sizes["attention_width"] == 32 and ModelConfig.from_sizes(sizes) == model
    tokens = np.asarray(jax.random.randint(jax.random.PRNGKey(1), (3, 8), 0, 16))
    result = forward(params, 4, sizes, tokens, tokens)
    assert result.head_outputs[0].shape == (3, 8, 4, 8)  # head size 32 / 4
    full, layers = ablation.head_ablation(params, 4, tokens, tokens, sizes)
    assert np.isclose(full["loss"], float(np.mean(result.loss)), rtol=1e-5)
    without = forward(params, 4, sizes, tokens, tokens, heads_off={0: [1]})  # head 1's 8 columns zeroed
    assert np.isclose(layers[0]["ablation"]["loss_without"][1], float(np.mean(without.loss)), rtol=1e-5)
    assert not np.isclose(float(np.mean(without.loss)), float(np.mean(result.loss)))
    shape = cost.Shape(batch=4, length=8, width=16, num_layers=1, mlp_dim=32, vocab=16, attention_width=32)
    assert shape.params() == count_params(params) == hand_count(16, 1, 32, 16, 8, 32)
    assert flops.train_step_flops(4, 8, 16, 1, 32, 16, 16) == flops.train_step_flops(4, 8, 16, 1, 32, 16)
    assert flops.train_step_flops(4, 8, 16, 1, 32, 16, 32) > flops.train_step_flops(4, 8, 16, 1, 32, 16)
    assert cost.member_cost(shape, 4).flops > cost.member_cost(shape._replace(attention_width=None), 4).flops


def test_hparams_of_head_dim_none_beside_sixteen_are_text_of_one_type():
    """TensorBoard's HParams domain holds one type: head_dim None (text) beside 16 (a number)
    become "None" and "16" for every member, whichever member comes first."""
    from mhjax.io.hparams import experiment_summary, uniform_types

    members = make_experiment(configured({"sweep.head_dim": "16,None"}, heads=(1,))).members
    hparams = uniform_types({m.name: m.flat_hparams() for m in members})
    assert [h["head_dim"] for h in hparams.values()] == ["16", "None"]
    assert [h["heads"] for h in hparams.values()] == [1, 1]
    experiment_summary(hparams, ["final/eval_loss"])  # a mixed domain would not sort
