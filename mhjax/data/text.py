"""The built-in task ``text``: next-token prediction on windows of a corpus file,
``config.data.path``.

Files: any file is read as bytes (token ids 0-255); a ``.bin`` is nanoGPT's format, uint16
token ids, little-endian, and needs ``model.vocab_size`` above its largest id. The last
``config.data.holdout`` fraction of the tokens (default 0.1) is held out.

A window is ``model.seq_len + 1`` consecutive tokens starting at an offset drawn uniformly from
a key: inputs are its first T tokens, targets its last T (the next token), every position
weighted. Training draws from the training part with the member's data key (the protocols of
data/sequences.py), so members that differ only in heads or learning rate see the same
windows. The held-out part is split into interleaved blocks (data/heldout_split.py): the
validation set (the task's ``validation`` form: what the tool selects on) draws from the even
blocks, the test set (its ``heldout`` form: evaluation, analysis and what is reported) from the
odd ones, so the two never share a token.

Where the corpus lives: a file up to ``ON_DEVICE_LIMIT`` (16 MiB: 16 Mi bytes, 8 Mi tokens of a
.bin) goes to the device, and the task's forms close over it, a constant of each compiled step
(measured on 2 loaded CPU cores, docs/text.md: a gather from a 1 MiB constant compiles in ~1.1 s,
8 MiB in ~1.3 s, 32 MiB in ~2.7 s). A larger file is memory-mapped and fed from the host per
chunk: the task is marked ``host_reads``, so the recipe draws a whole chunk's batches before the
chunk's scan (SequenceRecipe.prefetch, engine.chunk_data), the offsets from the same per-step keys,
and one host callback (``jax.pure_callback``, vmapped over the chunk's steps and the program's
members) reads every window of the chunk: equal batches either way, one read per chunk and
program (per group of an unrolled program). Memory: a chunk's batches are held on the device,
chunk_steps x batch_size windows of T tokens per member as int32 inputs, int32 targets and
float32 weights (12 bytes a token: configs/text.py, 250 x 32 x 256, 24.6 MB a member), besides
the callback's chunk_steps x batch_size x (T + 1) int32 ids. Held-out windows (evaluation,
analysis) are read by one callback per evaluation. A program holding a callback is not kept in
the persistent compile cache.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.config import ConfigError
from mhjax.data import heldout_split, python_corpora
from mhjax.data.tasks import Task, register_task

ON_DEVICE_LIMIT = 16 * 2**20  # bytes of token ids kept on the device (see the module docstring)
HOLDOUT = 0.1  # config.data.holdout's default
BYTE_VOCAB = 256


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A corpus file read and split (numpy), with what mhjax.json records of it."""

    path: str  # absolute
    size: int  # bytes on disk
    sha256: str
    encoding: str  # "bytes" or "uint16" (a .bin)
    train: np.ndarray  # uint8 or uint16 token ids
    heldout: np.ndarray
    max_id: int
    builtin: dict | None = None  # builtin:NAME: what python_corpora records of it (name, Python, ...)
    file_starts: tuple | None = None  # builtin:NAME: where its source files start (the windows' clusters)

    def clusters(self, starts, length: int):
        """Per held-out window at ``starts``: its source file where the corpus knows them, else its
        block (data/heldout_split.window_clusters)."""
        size, offset = self.heldout.size, self.train.size
        return heldout_split.window_clusters(starts, size, length, self.file_starts, offset)

    @property
    def cluster_kind(self) -> str:
        return "source file" if self.file_starts is not None else "block of the held-out region"

    @property
    def record(self) -> dict:
        """What mhjax.json records of the file (a changed sha256 refuses resume and analysis)."""
        out = {"path": self.path, "size": self.size, "sha256": self.sha256, "format": self.encoding}
        return {**out, **self.builtin} if self.builtin else out

    @property
    def facts(self) -> dict:
        """What results.json records of the corpus per member: its sha256, and a built-in's Python."""
        python = {"corpus_python": self.builtin["python"]} if self.builtin else {}
        return {"corpus_sha256": self.sha256, **python}

    def unigram_entropy_bits(self) -> float:
        """Entropy (bits per token) of the held-out tokens' own frequencies: what a model that
        knows the held-out unigram distribution, and nothing of context, would score."""
        counts = np.zeros(self.max_id + 1, np.int64)
        for i in range(0, self.heldout.size, 2**24):  # in blocks: a memory-mapped file stays on disk
            counts += np.bincount(self.heldout[i : i + 2**24], minlength=self.max_id + 1)
        p = counts[counts > 0] / self.heldout.size
        return float(-(p * np.log2(p)).sum())


_LOADED: dict[tuple, Corpus] = {}  # by (path, size, mtime, holdout): configs are validated and built more than once


def load(path, holdout=HOLDOUT) -> Corpus:
    """The corpus at ``path`` (a file, or ``builtin:NAME``: data/python_corpora.py) split at
    ``holdout``; a missing, empty or odd-sized (.bin) file, or an unknown NAME, is a one-line
    ConfigError naming config.data.path."""
    if not isinstance(path, str) or not path:
        raise ConfigError(
            "config.data.path: the text task reads a corpus file; set it (--config.data.path=FILE: "
            "bytes, or a .bin of uint16 token ids; or builtin:stdlib)"
        )
    builtin, file_starts = None, None
    if python_corpora.is_builtin(path):
        file_starts = tuple(python_corpora.file_starts(path) or ()) or None
        path, builtin = python_corpora.resolve(path)
    if isinstance(holdout, bool) or not isinstance(holdout, (int, float)) or not 0 < holdout < 1:
        raise ConfigError(f"config.data.holdout: must be a number in (0, 1), the held-out fraction; got {holdout!r}")
    if os.path.isdir(path):
        raise ConfigError(f"config.data.path: {path} is a directory; give a corpus file")
    if not os.path.isfile(path):
        raise ConfigError(f"config.data.path: file not found: {path}")
    stat = os.stat(path)
    memo = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns, float(holdout))
    if memo in _LOADED:
        return _LOADED[memo]
    if stat.st_size == 0:
        raise ConfigError(f"config.data.path: {path} is empty")
    kind = "uint16" if path.endswith(".bin") else "bytes"
    if kind == "uint16" and stat.st_size % 2:
        raise ConfigError(
            f"config.data.path: {path} is a .bin (uint16 token ids, 2 bytes each) of an odd size ({stat.st_size} bytes)"
        )
    ids = np.memmap(path, np.dtype("<u2") if kind == "uint16" else np.uint8, mode="r")
    if stat.st_size <= ON_DEVICE_LIMIT:
        ids = np.array(ids)  # read: it goes to the device
    held = int(round(ids.size * float(holdout)))
    corpus = Corpus(
        os.path.abspath(path),
        stat.st_size,
        _sha256(path),
        kind,
        ids[: ids.size - held],
        ids[ids.size - held :],
        int(ids.max()),
        builtin,
        file_starts,
    )
    _LOADED[memo] = corpus
    return corpus


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(2**24), b""):
            digest.update(block)
    return digest.hexdigest()


def check(corpus: Corpus, seq_len: int, vocab_size: int, holdout=HOLDOUT) -> None:
    """Every id below model.vocab_size; the training part at least seq_len + 2 tokens (two windows), the
    held-out part two windows' lengths, 2 (seq_len + 1), so that it holds a validation and a test block."""
    if corpus.max_id >= vocab_size:
        what = "byte" if corpus.encoding == "bytes" else "token id"
        raise ConfigError(
            f"config.model.vocab_size: {corpus.path} holds {what} {corpus.max_id}; vocab_size must be above it "
            f"(at least {corpus.max_id + 1}), got {vocab_size}"
        )
    for part, ids, need, rule in (
        ("training", corpus.train, seq_len + 2, "model.seq_len + 2"),
        (f"held-out (last {holdout:g})", corpus.heldout, 2 * (seq_len + 1), "2 (model.seq_len + 1)"),
    ):
        if ids.size < need:
            raise ConfigError(
                f"config.data.path: {corpus.path} is too short: its {part} part has {count(ids.size, 'token')}, "
                f"fewer than "
                f"{rule} = {need}; use a longer file, a smaller model.seq_len or another data.holdout"
            )


def count(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 token", "2 tokens"."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def windows(ids, key, num: int, length: int):
    """``num`` windows of ``length + 1`` tokens of ``ids`` at offsets drawn uniformly from
    ``key``: (inputs, targets, weights), each (num, length). ``ids``: a device array, gathered
    in the step; or a numpy memmap, gathered on the host (a callback) at the same offsets."""
    return read_at(ids, window_starts(key, num, ids.shape[0], length), length)


def part_windows(ids, key, num: int, length: int, part: int):
    """``windows`` of the held-out ``ids``, in the blocks of ``part`` (data/heldout_split.py)."""
    return read_at(ids, heldout_split.part_starts(key, num, ids.shape[0], length, part), length)


def read_at(ids, starts, length: int):
    """(inputs, targets, weights) of the windows at ``starts``: gathered on the device or the host."""
    num = starts.shape[0]
    if isinstance(ids, np.ndarray):
        w = host_windows(ids, starts, length)
    else:
        w = jax.vmap(lambda s: jax.lax.dynamic_slice_in_dim(ids, s, length + 1))(starts).astype(jnp.int32)
    return w[:, :-1], w[:, 1:], jnp.ones((num, length), jnp.float32)


def window_starts(key, num: int, size: int, length: int):
    """The offsets of ``num`` windows of ``length + 1`` tokens in ``size`` ids, uniform from ``key``
    (every window inside): what ``windows`` reads, and what the host records of the held-out set."""
    return jax.random.randint(key, (num,), 0, size - length)


def host_windows(ids: np.ndarray, starts, length: int):
    """The windows at ``starts`` (num,) read from the memory-mapped ``ids`` by the host: (num,
    length + 1) int32. Vmapped (a chunk's steps, the members), the callback gets every starts at once."""
    shape = jax.ShapeDtypeStruct((*starts.shape, length + 1), jnp.int32)
    return jax.pure_callback(lambda s: read_windows(ids, s, length), shape, starts, vmap_method="expand_dims")


def read_windows(ids: np.ndarray, starts, length: int) -> np.ndarray:
    """The host's read: the windows of ``length + 1`` ids at ``starts`` (any shape), int32."""
    starts = np.asarray(starts, np.int64)
    return np.asarray(ids[starts[..., None] + np.arange(length + 1)], np.int32)


def text(key, length: int, vocab_size: int):
    """The registered placeholder: ``text`` draws from a corpus, bound per config (``bind``)."""
    raise ConfigError("task 'text': it draws windows of config.data.path; run it from a sequence config")


def bind(config) -> Task:
    """The text task over ``config.data.path``, its file checked against config.model: forms
    closing over the training and held-out token ids on the device, and a source recording the
    file (path, size, sha256)."""
    d, m = config.data, config.model
    holdout = d.get("holdout", HOLDOUT)
    corpus = load(d.get("path", ""), holdout)
    check(corpus, int(m.seq_len), int(m.vocab_size), holdout)
    memo = (corpus.path, corpus.sha256, float(holdout))
    if memo not in _BOUND:  # one device copy and one set of forms per file: steps trace them once
        _BOUND[memo] = _task(corpus)
    return _BOUND[memo]


_BOUND: dict[tuple, Task] = {}


def _task(corpus: Corpus) -> Task:
    train, heldout = corpus.train, corpus.heldout  # memory-mapped: read by the host
    if not isinstance(train, np.memmap):  # within ON_DEVICE_LIMIT: on the device
        train, heldout = jnp.asarray(train), jnp.asarray(heldout)

    def sample(key, length, vocab_size):
        inputs, targets, weights = windows(train, key, 1, length)
        return inputs[0], targets[0], weights[0]

    def batch(key, num, length, vocab_size):
        return windows(train, key, num, length)

    def held_out(key, num, length, vocab_size):  # the test set
        return part_windows(heldout, key, num, length, heldout_split.TEST)

    def validation(key, num, length, vocab_size):
        return part_windows(heldout, key, num, length, heldout_split.VALIDATION)

    registered = TEXT
    return dataclasses.replace(
        registered,
        sample=sample,
        batch=batch,
        heldout=held_out,
        validation=validation,
        bind=None,
        source={**registered.source, "data": corpus.record},
        facts={
            "text_format": corpus.encoding,
            "heldout_unigram_entropy_bits": corpus.unigram_entropy_bits(),
            **corpus.facts,
        },
        host_reads=isinstance(train, np.memmap),
    )


TEXT = register_task("text", text, bind=bind)


def bits(loss_nats: float) -> float:
    """A cross-entropy in nats as bits (per token: per byte for a byte file)."""
    return loss_nats / math.log(2)
