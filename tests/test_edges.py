"""Edges users hit (issue 56 items 9 and 10): a prompt of bytes that are not UTF-8, `--shard`
with `--dry-run`, ..."""

import os

import pytest

from mhjax.config import ConfigError


def test_a_prompt_of_bytes_that_are_not_utf8_is_those_bytes():
    from mhjax.workflows.sample import decode, encode

    # what Python makes of argv bytes \xff\xfe (os.fsdecode: surrogate escapes)
    argv = os.fsdecode(b"ab\xff\xfe")
    assert encode(argv, True, None).tolist() == [97, 98, 0xFF, 0xFE]
    assert decode(encode(argv, True, None), True, None) == "ab\ufffd\ufffd"
    with pytest.raises(ConfigError, match=r"^--prompt: '\\ud800' at 1 is no text of bytes \(a lone surrogate\)$"):
        encode("a\ud800", True, None)


def test_shard_with_dry_run_is_refused_in_one_line(tmp_path, capsys):
    """Before: --shard was ignored and the whole sweep described."""
    from mhjax import cli
    from tests.conftest import config_source, tiny_sequence_config

    (tmp_path / "c.py").write_text(config_source(tiny_sequence_config()))
    assert cli.main(["train", "--config", str(tmp_path / "c.py"), "--dry-run", "--shard", "0/2"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "mhjax: error: --shard: not with --dry-run, which describes the whole sweep (drop --shard)"
    ]


def test_sweep_trains_one_shard_with_the_shard_argument(tmp_path):
    """mhjax.sweep(config, W, shard="I/N") is ``mhjax train --shard I/N`` (before: no such argument)."""
    import mhjax
    from tests.conftest import tiny_sequence_config, tiny_train

    config = tiny_train(tiny_sequence_config(heads=(1, 2)), 3, 3, 3, 3)  # two programs: two whole shards
    first = mhjax.sweep(config, tmp_path / "w", progress=False, shard="0/2")
    assert len(first.missing_members) == 1 and len(first.results) == 1
    with pytest.raises(mhjax.ConfigError, match=r"^shard: I must be in \[0, 2\) in I/2"):
        mhjax.sweep(config, tmp_path / "w", progress=False, shard="2/2")
    second = mhjax.sweep(config, tmp_path / "w", progress=False, shard="1/2")
    assert second.missing_members == [] and len(second.results) == 2


@pytest.mark.parametrize(
    "tasks, said",
    [
        (["text"], "40 sequences per task (text: the same held-out windows for every seed)"),
        (["copy"], "40 sequences per task and seed"),
    ],
)
def test_analyze_says_text_shares_its_held_out_windows_across_seeds(tmp_path, tasks, said):
    """Before: "per task and seed" for text too, whose held-out windows are drawn once for every seed."""
    import json

    from mhjax.workflows.analyze import held_out_note

    config = {"sweep": {"task": tasks, "seed": [0, 1]}, "data": {"num_eval": 40}, "train": {"steps": 1}}
    (tmp_path / "mhjax.json").write_text(json.dumps({"config": config}))
    assert f"held-out set, {said}: other samples" in held_out_note(str(tmp_path))


def test_readme_says_when_train_loss_at_step_s_is_theta_s():
    """README's train/loss sentence names the chunk length up to which every step is logged."""
    from mhjax.io.curves import TRAIN_POINTS_PER_CHUNK, train_window

    text = " ".join(open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")).read().split())
    said = f"theta_s's (chunks over {TRAIN_POINTS_PER_CHUNK} steps: the mean of the ceil(chunk_steps / "
    assert said + f"{TRAIN_POINTS_PER_CHUNK}) steps up to s)" in text
    assert train_window(TRAIN_POINTS_PER_CHUNK) == 1 and train_window(TRAIN_POINTS_PER_CHUNK + 1) == 2


def test_a_sharded_workdir_refuses_to_grow_in_one_line_naming_why(tmp_path):
    """Before: "holds a run of another config ... only added sweep values grow it", which they do not here."""
    from mhjax.experiments import make_experiment
    from mhjax.workflows import shards
    from tests.conftest import tiny_sequence_config, tiny_train

    workdir = str(tmp_path / "w")
    shards.train_shard(
        make_experiment(tiny_train(tiny_sequence_config(heads=(1, 2)), 3, 3, 3, 3)),
        workdir,
        0,
        2,
        progress=False,
        log=lambda m: None,
    )
    before = open(os.path.join(workdir, "mhjax.json")).read()
    grown = make_experiment(tiny_train(tiny_sequence_config(heads=(1, 2, 4)), 3, 3, 3, 3))
    with pytest.raises(
        ConfigError, match=r"^--shard: .* was started as 2 shards, which do not grow \(added sweep values\)"
    ):
        shards.train_shard(grown, workdir, 1, 2, progress=False, log=lambda m: None)
    assert open(os.path.join(workdir, "mhjax.json")).read() == before
