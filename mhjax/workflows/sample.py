"""A trained sequence member's continuation of a prompt (``Run.sample``, ``mhjax sample``):
the prompt encoded as the member's task reads tokens, the continuation sampled
(analysis/sampling.py: the last seq_len tokens, no cache, one compile) and decoded.

A byte file's members (results' ``text_format`` "bytes") take the prompt as UTF-8 text and
give text; any other member (a ``.bin`` corpus of token ids, a synthetic task) takes token
ids ("12 7 301" or "12,7,301") and gives ids, or, with a vocabulary file (one token per line,
line number = id), text: the tokens joined by ``join``, and prompt words looked up in it.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from mhjax.analysis.sampling import sample as sample_ids
from mhjax.config import ConfigError
from mhjax.models import probe
from mhjax.workflows.forward import member_record
from mhjax.workflows.members import check_step
from mhjax.workflows.workdir import open_workdir


@dataclasses.dataclass(frozen=True)
class Sample:
    """What ``Run.sample`` returns. ``prompt_ids`` and ``ids`` (the continuation): int32 numpy
    arrays; ``text``: prompt and continuation decoded (a byte file's members, or with a
    vocabulary), else None; ``continuation``: the continuation alone decoded (else None);
    ``step``: the parameters' step; ``context``: how many tokens the model sees (seq_len)."""

    prompt_ids: np.ndarray
    ids: np.ndarray
    text: str | None
    continuation: str | None
    step: int
    context: int


def read_vocab(path) -> list[str]:
    """The tokens of a vocabulary file: one per line (its line ending dropped), line number = id."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ConfigError(f"--vocab: file not found: {path}")
    with open(path, encoding="utf-8", newline="") as f:
        return [line.removesuffix("\n").removesuffix("\r") for line in f]


def encode(prompt, byte_text: bool, vocab: list[str] | None) -> np.ndarray:
    """``prompt`` as token ids: ids given as a sequence kept; text: UTF-8 bytes for a byte file's
    members (bytes of the command line that are not UTF-8, such as ``$'\\xff\\xfe'``, as
    themselves), else ids written out (space or comma separated), or tokens of ``vocab``."""
    if not isinstance(prompt, str):
        return np.asarray(prompt)
    if byte_text:
        try:  # the command line's bytes that are not UTF-8 arrive as surrogate escapes: the same bytes again
            data = prompt.encode("utf-8", errors="surrogateescape")
        except UnicodeEncodeError as exc:  # a lone surrogate given in Python, of no byte
            bad = exc.object[exc.start : exc.end]
            raise ConfigError(f"--prompt: {bad!r} at {exc.start} is no text of bytes (a lone surrogate)") from None
        return np.frombuffer(data, np.uint8).astype(np.int32)
    ids = {token: i for i, token in reversed(list(enumerate(vocab)))} if vocab else {}
    out = []
    for piece in prompt.replace(",", " ").split():
        if piece.lstrip("-").isdigit():
            out.append(int(piece))
        elif piece in ids:
            out.append(ids[piece])
        else:
            where = "neither an id nor a line of --vocab" if vocab else "not an id (ids: '12 7 301'; or pass --vocab)"
            raise ConfigError(f"--prompt: {piece!r} is {where}")
    return np.asarray(out, np.int32)


def decode(ids, byte_text: bool, vocab: list[str] | None, join: str = " ") -> str | None:
    """Token ids as text: bytes decoded as UTF-8 (an invalid sequence, or an id above 255 of a
    vocab_size set above 256, as U+FFFD); ids through ``vocab`` joined by ``join`` (an id past its
    end as <id>); None without either."""
    ids = [int(i) for i in ids]
    if byte_text:
        return b"".join(bytes([i]) if i < 256 else "\ufffd".encode() for i in ids).decode("utf-8", errors="replace")
    if vocab is None:
        return None
    return join.join(vocab[i] if i < len(vocab) else f"<{i}>" for i in ids)


def member_sample(
    workdir,
    member: str,
    prompt,
    tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int = 0,
    step: int | None = None,
    vocab=None,
    join: str = " ",
) -> Sample:
    """``member`` at the latest checkpoint, or ``step`` (a kept checkpoint or a snapshot, as
    forward), continuing ``prompt`` by ``tokens`` tokens (analysis/sampling.py). ``vocab``: a
    vocabulary file's path, or its tokens as a list."""
    opened = open_workdir(workdir)
    record = member_record(opened, member)
    step = opened.files.latest_step() if step is None else check_step(opened, step)
    if step is None:
        raise ConfigError(f"--workdir: {opened.path} has no checkpoint yet")
    step = min(step, record.get("stopped_at_step", step))  # halving stopped it there: its state since
    byte_text = record.get("text_format") == "bytes"
    if isinstance(vocab, (str, os.PathLike)):
        vocab = read_vocab(vocab)
    if vocab is not None and byte_text:
        raise ConfigError("--vocab: this member reads bytes (a byte file's text task): its tokens are bytes")
    vocab = None if vocab is None else list(vocab)
    params = opened.files.params(member, step)
    sizes = probe.model_sizes(params)
    prompt_ids = np.asarray(encode(prompt, byte_text, vocab))
    ids = sample_ids(params, record["heads"], sizes, prompt_ids, tokens, temperature, top_k, seed)
    prompt_ids = prompt_ids.astype(np.int32)
    return Sample(
        prompt_ids,
        ids,
        decode(np.concatenate([prompt_ids, ids]), byte_text, vocab, join),
        decode(ids, byte_text, vocab, join),
        int(step),
        sizes["max_len"],
    )
