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
