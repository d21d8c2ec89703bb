"""config.sweep_skip (experiments/sweep_skip.py): grid points left out keep every other member's
name, keys and numbers; bad entries are one line, exit 2; a sweep that drops a skip grows by the
skipped points only."""

import json
import os

import numpy as np
import pytest

import mhjax
from mhjax import cli
from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.io.workdir import Workdir
from mhjax.workflows.train import train
from tests.conftest import config_source, tiny_sequence_config
from tests.errors_common import assert_one_line_error

GRID = ["copy-h1-s0", "copy-h4-s0", "copy-d4-h1-s0", "copy-d4-h4-s0"]
SKIP = {"head_dim": 4, "heads": 4}  # at width 16, 4 heads of size 4 are the matched model


def _config(skip=None):
    config = tiny_sequence_config(heads=(1, 4), head_dim=(None, 4))
    if skip is not None:
        config.sweep_skip = skip
    return config


def _entries(workdir) -> dict:
    with open(Workdir(workdir).results_path) as f:
        return {m["name"]: m for m in json.load(f)["members"]}


def test_a_skipped_point_is_left_out_and_the_rest_keep_their_names():
    assert [m.name for m in make_experiment(_config()).members] == GRID
    for skip in ((SKIP,), ("head_dim=4,heads=4",), ["heads=4, head_dim=4"]):
        assert [m.name for m in make_experiment(_config(skip)).members] == [n for n in GRID if n != "copy-d4-h4-s0"]
    both = make_experiment(_config(("head_dim=4,heads=4", {"heads": 1, "head_dim": None})))
    assert [m.name for m in both.members] == ["copy-h4-s0", "copy-d4-h1-s0"]


@pytest.mark.parametrize(
    "skip, match",
    [
        (({"heads": 3},), "config.sweep_skip[0].heads: 3 is not one of its swept values (1, 4)"),
        (("head_size=4",), "config.sweep_skip[0]: 'head_size' is not a field of config.sweep"),
        (("heads",), "config.sweep_skip[0]: 'heads' is not 'field=value"),
        ((7,), "config.sweep_skip[0]: a dict of swept fields and values"),
        (({},), "config.sweep_skip[0]: empty"),
        (("heads=1", "heads=4"), "config.sweep_skip: leaves no member"),
    ],
)
def test_bad_entries_are_one_line_naming_the_entry(skip, match):
    with pytest.raises(ConfigError) as raised:
        make_experiment(_config(skip))
    assert match in str(raised.value) and "\n" not in str(raised.value)


def test_the_cli_refuses_a_bad_entry_with_one_line_and_exit_2(tmp_path, capsys):
    path = tmp_path / "skip.py"
    path.write_text(config_source(_config(("heads=2",))))
    code = cli.main(["train", "--config", str(path), "--workdir", str(tmp_path / "w"), "--no-progress"])
    assert_one_line_error(capsys, code, "config.sweep_skip[0].heads")
    assert not os.path.exists(tmp_path / "w")


def test_dropping_the_skip_grows_the_sweep_by_the_skipped_point_only(tmp_path):
    """Members' keys come from their fields, never from the grid (tested for any sweep in
    test_sweep.py), so the kept members are the whole grid's; the skipped point, trained later,
    is the matched model at 4 heads: the same numbers bit for bit."""
    workdir = str(tmp_path / "w")
    train(make_experiment(_config((SKIP,))), workdir, progress=False, log=lambda m: None)
    kept = _entries(workdir)
    assert list(kept) == ["copy-h1-s0", "copy-h4-s0", "copy-d4-h1-s0"]
    messages = []
    train(make_experiment(_config()), workdir, progress=False, log=messages.append)
    assert any("the sweep grows: 1 new member (copy-d4-h4-s0)" in m for m in messages), messages
    grown = _entries(workdir)
    assert sorted(grown) == sorted(GRID)
    assert {n: grown[n] for n in kept} == kept  # the trained members' entries as they were
    for key in ("train_loss", "eval_loss", "eval_accuracy", "params", "eval_accuracy_by_position"):
        assert grown["copy-d4-h4-s0"][key] == grown["copy-h4-s0"][key], key
    run = mhjax.load(workdir)  # readers see both parts
    assert sorted(run.member_names) == sorted(GRID) and len(run.to_pandas()) == 4
    tokens = np.zeros((1, 8), np.int32)
    out = {name: run.forward(name, tokens) for name in ("copy-h4-s0", "copy-d4-h4-s0")}
    np.testing.assert_array_equal(out["copy-h4-s0"].attention[0], out["copy-d4-h4-s0"].attention[0])
