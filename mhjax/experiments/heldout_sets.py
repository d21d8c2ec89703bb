"""A sequence member's two held-out sets: the validation set (what the tool selects on:
analysis/comparisons.py's ``compare.tune``) and the test set (what it reports: ``eval_loss``).

Keys: the test set is drawn from the evaluation key, as it always was; the validation set from a
key of its own (``"validation"`` in place of ``"eval"``). A task with a held-out split (text)
draws both from (root seed, task) alone, every member on the same windows, the validation set
in the even blocks of the held-out region and the test set in the odd ones (data/text.py,
data/heldout_split.py: disjoint by construction); a generated task (copy, cycle, ...) draws
fresh sequences per seed, two draws from distinct keys.

Text windows carry clusters for their standard errors (source files of builtin:stdlib, else
blocks of the held-out region), kept beside the starts in W/eval_windows (io/window_files.py)."""

from __future__ import annotations

import hashlib

import numpy as np

from mhjax.data import heldout_split, text
from mhjax.train.members import derive_key

SETS = ("validation", "test")
_KEY_NAME = {"validation": "validation", "test": "eval"}  # "eval": the recorded test windows stay
SUFFIX = {"validation": ".validation", "test": ""}  # W/eval_windows/<member|task><suffix>...


def key(root: int, seed: int, task: str, bound, which: str = "test") -> np.ndarray:
    """The key of a member's ``which`` set: from (root, task) where the task has a held-out split
    (every member scored on the same windows, so head counts pair across seeds too), else from
    (root, seed, task) (members of one seed share it)."""
    name = _KEY_NAME[which]
    return derive_key(root, name, task) if bound.heldout is not None else derive_key(root, seed, name, task)


def set_id(key_data, num: int) -> str:
    """The id of a held-out set (results.json ``eval_set`` / ``val_set``): its key and size."""
    return "".join(f"{int(k):08x}" for k in np.asarray(key_data, np.uint32).ravel()) + f"-{num}"


def corpus_of(config) -> text.Corpus:
    return text.load(config.data.get("path", ""), config.data.get("holdout", text.HOLDOUT))


def starts(config, task, which: str) -> np.ndarray:
    """Where the ``which`` windows of a corpus task (the same for every member) start in its held-out part."""
    corpus, num, length = corpus_of(config), config.data.num_eval, config.model.seq_len
    k = key(config.seed, 0, task.name, task, which)
    part = heldout_split.PARTS[which]
    return np.asarray(heldout_split.part_starts(k, num, corpus.heldout.size, length, part), np.int64)


def clusters(config, task, which: str) -> np.ndarray | None:
    """Per ``which`` window of ``task``: its cluster (text), or None (generated windows: independent)."""
    if "text_format" not in task.facts:
        return None
    return corpus_of(config).clusters(starts(config, task, which), config.model.seq_len)


def window_files(config, tasks) -> dict:
    """{file name: array} for W/eval_windows: per corpus task and set, its starts and clusters."""
    out = {}
    for task in tasks:
        if "text_format" not in task.facts:
            continue
        for which in SETS:
            out[f"{task.name}{SUFFIX[which]}.starts"] = starts(config, task, which)
            out[f"{task.name}{SUFFIX[which]}.clusters"] = clusters(config, task, which)
    return out


def sha256(array) -> str:
    return hashlib.sha256(np.asarray(array).astype("<i8").tobytes()).hexdigest()


def facts(config, task) -> dict:
    """What results.json's ``baselines`` records of a corpus task's two sets: sha256 of the starts,
    the clusters (how many in each set, and what a cluster is) and the block length."""
    corpus = corpus_of(config)
    out = {
        "cluster": corpus.cluster_kind,
        "block_length": heldout_split.block_length(corpus.heldout.size, config.model.seq_len),
    }
    for which, prefix in (("validation", "val_"), ("test", "")):
        out[f"{prefix}starts_sha256"] = sha256(starts(config, task, which))
        out[f"{prefix}clusters"] = int(np.unique(clusters(config, task, which)).size)
    return out
