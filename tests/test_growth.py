"""A sweep that grows (workflows/growth.py): heads 1,4 trained, then 1,2,4 run in the same
workdir trains only heads 2; the recorded members' checkpoints and results stay byte-identical,
the new member equals itself trained alone, and readers see every member."""

import hashlib
import json
import os

import numpy as np
import pytest

import mhjax
from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.io.workdir import Workdir
from mhjax.workflows.train import train
from tests.conftest import config_source, tiny_sequence_config, tiny_train
from tests.test_reliability import train as reliability_train
from tests.test_reliability import train_and_kill


def _config(heads, seeds=(0,), **more):
    return tiny_sequence_config(heads=heads, seed=seeds, **more)


OLD = ["copy-d4-h1-s0", "copy-d4-h4-s0", "copy-d8-h1-s0", "copy-d8-h4-s0"]
NEW = ["copy-d4-h2-s0", "copy-d8-h2-s0"]
ALL = ["copy-d4-h1-s0", "copy-d4-h2-s0", "copy-d4-h4-s0", "copy-d8-h1-s0", "copy-d8-h2-s0", "copy-d8-h4-s0"]


def _train(config, workdir):
    return train(make_experiment(config), workdir, progress=False, log=lambda m: None)


def _digests(folder) -> dict:
    """{relative path: sha256} of every file under ``folder``."""
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


def _entries(workdir) -> dict:
    with open(Workdir(workdir).results_path) as f:
        return {m["name"]: json.dumps(m, indent=2) for m in json.load(f)["members"]}


def _leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


@pytest.fixture(scope="module")
def grown(tmp_path_factory):
    """A workdir trained at heads 1,4 x head_dim 4,8, its files' digests, then grown to heads 1,2,4."""
    workdir = str(tmp_path_factory.mktemp("grow") / "w")
    _train(_config((1, 4), head_dim=(4, 8)), workdir)
    before = {
        "checkpoints": _digests(os.path.join(workdir, "checkpoints")),
        "tb": {m: _digests(os.path.join(workdir, "tb", m)) for m in OLD},
        "entries": _entries(workdir),
    }
    messages = []
    payload = train(make_experiment(_config((1, 2, 4), head_dim=(4, 8))), workdir, progress=False, log=messages.append)
    return workdir, before, payload, messages


def test_growing_trains_only_the_new_member_and_leaves_the_old_ones_byte_identical(grown):
    workdir, before, payload, messages = grown
    assert [m["name"] for m in payload["members"]] == ALL
    assert any("the sweep grows: 2 new members (copy-d4-h2-s0, copy-d8-h2-s0)" in m for m in messages)
    params = {m["name"]: m["params"] for m in payload["members"]}
    # a head of size 8 adds its q, k, v columns with their biases and its rows of the output
    # projection: 3 * (16 * 8 + 8) + 8 * 16 at width 16
    assert params["copy-d8-h2-s0"] - params["copy-d8-h1-s0"] == 3 * (16 * 8 + 8) + 8 * 16
    assert params["copy-d8-h4-s0"] - params["copy-d8-h2-s0"] == 2 * (3 * (16 * 8 + 8) + 8 * 16)
    assert _digests(os.path.join(workdir, "checkpoints")) == before["checkpoints"]
    for member, digests in before["tb"].items():
        assert _digests(os.path.join(workdir, "tb", member)) == digests
    entries = _entries(workdir)
    for name, text in before["entries"].items():
        assert entries[name] == text  # the recorded entries, byte for byte
    assert set(Workdir(workdir).part("grown/1", []).checkpoint_steps()) == {3, 6}
    metadata = Workdir(workdir).metadata()
    history = metadata["sweep_history"]
    assert [(e["folder"], list(e["members"])) for e in history] == [("", OLD), ("grown/1", NEW)]
    assert history[1]["members"]["copy-d8-h2-s0"]["heads"] == 2
    assert metadata["config"]["sweep"]["heads"] == [1, 2, 4]


def test_the_new_member_equals_itself_trained_alone(grown, tmp_path):
    workdir = grown[0]
    alone = str(tmp_path / "alone")
    _train(_config((2,), head_dim=(4, 8)), alone)
    got, want = Workdir(workdir).params("copy-d8-h2-s0"), Workdir(alone).params("copy-d8-h2-s0")
    for a, b in zip(_leaves(got), _leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    grown_entry, alone_entry = (json.loads(_entries(w)["copy-d8-h2-s0"]) for w in (workdir, alone))
    assert grown_entry["eval_accuracy"] == pytest.approx(alone_entry["eval_accuracy"], abs=1e-6)


# ~18 s: test_sweep_skip reads a grown workdir through mhjax.load, to_pandas and forward
@pytest.mark.slow
def test_readers_see_every_part(grown):
    workdir = grown[0]
    run = mhjax.load(workdir)
    assert run.member_names == ALL
    assert run.checkpoint_steps == [3, 6]
    states = Workdir(workdir).member_states(6)
    assert sorted(states) == sorted(OLD + NEW)
    assert len(run.to_pandas()) == 6
    analysis = run.analyze(num_sequences=4, plot=False, tensorboard=False)
    assert sorted(analysis["members"]) == sorted(OLD + NEW)
    tokens = np.zeros((1, 8), np.int32)
    assert run.forward("copy-d8-h2-s0", tokens).attention[0].shape[1] == 2  # (N, heads, T, T) of layer 0
    assert os.path.isfile(run.report()["md"])


def test_running_the_grown_config_again_trains_nothing(grown):
    workdir = grown[0]
    digests = _digests(workdir)
    messages = []
    payload = train(make_experiment(_config((1, 2, 4), head_dim=(4, 8))), workdir, progress=False, log=messages.append)
    assert len(payload["members"]) == 6
    assert any("training already complete" in m for m in messages)
    after = _digests(workdir)
    assert {k: v for k, v in after.items() if k.startswith(("checkpoints", "grown"))} == {
        k: v for k, v in digests.items() if k.startswith(("checkpoints", "grown"))
    }


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(heads=(1,)), "holds 1 member config.sweep leaves out .copy-h4-s0."),
        (dict(heads=(4, 1)), "same members .* in another order"),
        (
            dict(heads=(1, 4), dropout=(0.0, 0.1)),
            "sweep over heads, learning_rate, seed, task; config.sweep is over dropout, heads",
        ),
    ],
)
def test_removing_or_changing_members_is_refused_in_one_line(tmp_path, change, match):
    workdir = str(tmp_path / "w")
    _train(_config((1, 4)), workdir)
    heads = change.pop("heads")
    with pytest.raises(ConfigError, match=match):
        _train(_config(heads, **change), workdir)


def test_growing_and_changing_another_field_is_refused(tmp_path):
    workdir = str(tmp_path / "w")
    _train(_config((1,)), workdir)
    config = _config((1, 2))
    config.model.mlp_dim = 64
    with pytest.raises(ConfigError, match=r"another config \(config.model.mlp_dim: stored 32, now 64\)"):
        _train(config, workdir)


@pytest.mark.slow  # ~40 s loaded: three CLI runs; test_reliability kills and resumes the same loop
def test_a_kill_while_growing_resumes(tmp_path):
    """kill -9 in the new part's third chunk (after its checkpoint at step 6); the same command
    resumes it from there and ends equal, member for member, to a growth never killed."""
    config_path = tmp_path / "grown.py"
    config_path.write_text(config_source(tiny_train(_config((1, 2)), 9, 3, 3, 6)))
    killed, whole = str(tmp_path / "killed"), str(tmp_path / "whole")
    for workdir in (killed, whole):
        _train(tiny_train(_config((1,)), 9, 3, 3, 6), workdir)
    _train(tiny_train(_config((1, 2)), 9, 3, 3, 6), whole)  # compiles what the killed run loads from the cache
    cache = os.environ["JAX_COMPILATION_CACHE_DIR"]  # the suite's (tests/conftest.py)
    train_and_kill(tmp_path, config_path, killed, "chunk", cache)
    assert sorted(os.listdir(os.path.join(killed, "grown", "1", "checkpoints"))) == ["6"]
    assert "resuming from checkpoint at step 6" in reliability_train(config_path, killed, cache).stderr
    for name in ("copy-h1-s0", "copy-h2-s0"):
        for a, b in zip(_leaves(Workdir(killed).params(name)), _leaves(Workdir(whole).params(name)), strict=True):
            np.testing.assert_array_equal(a, b)
    assert list(_entries(killed)) == ["copy-h1-s0", "copy-h2-s0"]


@pytest.mark.slow  # ~60 s of mixture compiles and end-of-run analysis; the sequence tests cover the path
def test_a_mixture_sweep_grows_too(tmp_path):
    """The mixture experiment through the same path: seeds 0 -> 0,1 trains the seed-1 members
    alone; the seed-0 entries stay byte-identical and the new ones equal a seed-1 run."""
    from tests.test_mixture_sweep import tiny_mixture_config

    workdir, alone = str(tmp_path / "w"), str(tmp_path / "alone")
    _train(tiny_mixture_config(heads=(2,), num_train=(8,)), workdir)
    before = _entries(workdir)
    payload = _train(tiny_mixture_config(heads=(2,), num_train=(8,), seed=(0, 1)), workdir)
    assert len(payload["members"]) == 2
    entries = _entries(workdir)
    assert {n: entries[n] for n in before} == before
    _train(tiny_mixture_config(heads=(2,), num_train=(8,), seed=(1,)), alone)
    for name, text in _entries(alone).items():
        got, want = json.loads(entries[name]), json.loads(text)
        assert got["test_accuracy"] == pytest.approx(want["test_accuracy"], abs=1e-6)
        assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-5)
