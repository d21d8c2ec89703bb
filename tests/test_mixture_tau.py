"""The init scale tau as a sweep axis of the mixture experiment: tau is a per-member constant
outside the key derivation, so a member of a tau sweep equals itself trained alone at that tau;
random_decoders with a first GD step approaches zero_plus_step as tau -> 0 (equal at tau = 0,
where every head is the same: head_spread 0); results.json records the init."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.experiments.mixture_results import head_spread
from mhjax.train.loop import run
from tests.conftest import set_field
from tests.test_mixture_init import trained
from tests.test_mixture_sweep import tiny_mixture_config

TAUS = (0.0, 0.001, 0.01, 0.1)


def _flat(params):
    return np.concatenate([np.ravel(params["W"]), np.ravel(params["U"])])


def test_random_decoders_approach_zero_plus_step_as_tau_shrinks():
    config = tiny_mixture_config(heads=(1, 4), num_train=(16,), step_size=(0.5,), init_tau=TAUS)
    config.init.scheme, config.init.first_step = "random_decoders", 0.5
    experiment, _, theta0, final, _ = trained(config)
    reference = tiny_mixture_config(heads=(1, 4), num_train=(16,), step_size=(0.5,))
    reference.init.first_step = 0.5  # zero_plus_step: zero parameters, one step of 0.5
    _, _, _, ref_final, _ = trained(reference)
    for h in (1, 4):
        diffs = [
            np.abs(_flat(final[f"h{h}-tau{t:g}-s0"].params) - _flat(ref_final[f"h{h}-s0"].params)).max() for t in TAUS
        ]
        np.testing.assert_allclose(diffs[0], 0.0, atol=1e-6)  # tau = 0 is zero init + the same step
        assert all(a < b for a, b in zip(diffs, diffs[1:])), (h, diffs)
        assert diffs[-1] > 1e-3, (h, diffs)
    mask = jnp.asarray(np.arange(4) < 4, jnp.float32)
    for state in (theta0, final):  # tau = 0: every head the same, at theta_0 and theta_K
        assert float(head_spread(state["h4-tau0-s0"].params, mask)) == 0.0
    assert float(head_spread(final["h4-tau0.01-s0"].params, mask)) > 0.0
    # Members differing only in tau share their random directions: theta_0 (before the step) scales with tau.
    recipe = experiment.programs("auto", "cpu")[0].recipe
    draws = {}
    for member in experiment.members:
        if member["heads"] == 4:
            consts = jax.tree_util.tree_map(jnp.asarray, experiment.member_constants(member))
            recipe.takes_step = False
            draws[member["init_tau"]] = np.asarray(recipe.init_params(consts)["U"])
    np.testing.assert_allclose(draws[0.1], 10 * draws[0.01], rtol=1e-5, atol=1e-8)
    assert not np.any(draws[0.0])


def test_member_of_a_tau_sweep_equals_itself_trained_alone():
    config = tiny_mixture_config(heads=(1, 4), num_train=(16,), init_tau=(0.01, 1.0))
    config.init.scheme = "random_decoders"
    _, _, _, final, _ = trained(config)
    config.sweep = dict(heads=(4,), seed=(0,), num_train=(16,), step_size=(1.0,))
    config.init.tau = 0.01
    _, _, _, alone, _ = trained(config)
    for key in ("W", "U"):
        np.testing.assert_allclose(
            np.asarray(alone["h4-s0"].params[key]),
            np.asarray(final["h4-tau0.01-s0"].params[key]),
            rtol=1e-5,
            atol=1e-6,
            err_msg=key,
        )


def test_tau_sweep_records_the_init_and_writes_the_comparison(tmp_path):
    config = tiny_mixture_config(heads=(1, 2), num_train=(8,), init_tau=(0, 0.1))
    config.init.scheme = "random_decoders"
    config.train.steps, config.train.eval_every, config.train.checkpoint_every = 10, 10, 10
    payload = run(make_experiment(config), str(tmp_path), progress=False, log=lambda m: None)
    with open(tmp_path / "results.json") as f:
        records = {m["name"]: m for m in json.load(f)["members"]}
    assert set(records) == {"h1-tau0-s0", "h2-tau0-s0", "h1-tau0.1-s0", "h2-tau0.1-s0"}
    for name, m in records.items():
        assert m["init_scheme"] == "random_decoders" and m["init_tau"] == (0.1 if "tau0.1" in name else 0.0)
        if m["heads"] == 1 or m["init_tau"] == 0:
            assert m["head_spread_init"] == 0.0 and m["head_spread"] == 0.0, name
        else:
            assert m["head_spread_init"] > 0.1 and m["head_spread"] > 0.1, name
    assert len(payload["members"]) == 4
    table = (tmp_path / "mixture_init.md").read_text()
    assert "| 8 | 1 | 0.1 | 2 | 1 |" in table and "tau = 0: heads differ: no" in table
    assert os.path.getsize(tmp_path / "test_accuracy_vs_H.png") > 0
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    acc = EventAccumulator(str(tmp_path / "tb" / "h2-tau0.1-s0"))
    acc.Reload()
    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    start = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    assert start.hparams["init_tau"].number_value == pytest.approx(0.1)
    assert start.hparams["init_scheme"].string_value == "random_decoders"
    assert "final/head_spread_init" in acc.Tags()["scalars"]


@pytest.mark.parametrize(
    "field, value",
    [("sweep.init_tau", (-0.1,)), ("sweep.init_tau", ()), ("sweep.init_tau", (float("inf"),)), ("init.tau", -1.0)],
)
def test_bad_tau_is_one_line_naming_the_field(field, value):
    config = set_field(tiny_mixture_config(), field, value)
    with pytest.raises(ConfigError) as info:
        make_experiment(config)
    assert str(info.value).startswith(f"config.{field}") and "\n" not in str(info.value), str(info.value)


def test_cli_rejects_a_negative_tau_with_status_2(tmp_path, capsys):
    from mhjax import cli

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    config = os.path.join(root, "configs", "mixture_init.py")
    code = cli.main(["train", "--config", config, "--workdir", str(tmp_path / "w"), "--config.sweep.init_tau=(0.1,-1)"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("mhjax: error: config.sweep.init_tau:"), err


def test_members_differing_only_in_step_size_or_n_share_theta0_and_equal_themselves_alone():
    """Step size and training-set size stay out of the key like tau: every (n, eta) of a seed
    starts from the same theta_0, so a rate or generalization curve compares paired runs; each
    member equals itself trained alone (n = 8 alone is unpadded, padded to 16 in the sweep)."""
    config = tiny_mixture_config(heads=(4,), num_train=(8, 16), step_size=(0.5, 1.0))
    config.init.scheme = "random_decoders"
    experiment, _, theta0, final, _ = trained(config)
    names = [m.name for m in experiment.members]
    assert len(names) == 4
    for name in names[1:]:
        for key in ("W", "U"):
            np.testing.assert_array_equal(
                np.asarray(theta0[name].params[key]), np.asarray(theta0[names[0]].params[key])
            )
    assert np.abs(_flat(final[names[0]].params) - _flat(final[names[-1]].params)).max() > 1e-3
    for member in experiment.members:
        alone = tiny_mixture_config(heads=(4,), num_train=(member["num_train"],), step_size=(member["step_size"],))
        alone.init.scheme = "random_decoders"
        _, _, _, alone_final, _ = trained(alone)
        np.testing.assert_allclose(
            _flat(alone_final["h4-s0"].params),
            _flat(final[member.name].params),
            rtol=1e-5,
            atol=1e-6,
            err_msg=member.name,
        )
