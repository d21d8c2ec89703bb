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
