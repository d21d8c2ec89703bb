"""The text task's baselines, per sweep (results.json ``baselines``): unigram, bigram and trigram
models counted on the corpus's training split (data/ngram.py: interpolated Witten-Bell) and scored
on the test windows every member is scored on, in bits per byte (per token for a .bin) beside
``heldout_unigram_entropy_bits``; where the test and validation windows start and their clusters
(experiments/heldout_sets.py, kept as W/eval_windows/<task>[.validation].{starts,clusters}.npy);
and the console's note on a member not below the bigram."""

from __future__ import annotations

from mhjax.data import ngram, text
from mhjax.experiments import heldout_sets
from mhjax.io.window_files import ARRAYS

_MEMO: dict[tuple, dict] = {}  # (corpus sha256, holdout, key, num, T, vocab): counted once per process


def corpus_tasks(experiment) -> list:
    """The sweep's tasks that read a corpus (text)."""
    return [t for t in experiment.tasks if "text_format" in t.facts]


def baselines(experiment) -> dict:
    """{"baselines": {task: {...}}, ARRAYS: {file name: array}} for the corpus tasks ({} without)."""
    config = experiment.config
    found = {}
    for task in corpus_tasks(experiment):
        corpus = heldout_sets.corpus_of(config)
        starts = heldout_sets.starts(config, task, "test")
        memo = (corpus.sha256, corpus.heldout.size, starts.tobytes(), config.model.seq_len, config.model.vocab_size)
        if memo not in _MEMO:
            windows = text.read_windows(corpus.heldout, starts, config.model.seq_len)
            _MEMO[memo] = ngram.baselines(corpus.train, windows, int(config.model.vocab_size))
        unit = "bits/byte" if task.facts["text_format"] == "bytes" else "bits/token"
        found[task.name] = {
            "unit": unit,
            **_MEMO[memo],
            "heldout_unigram_entropy_bits": task.facts["heldout_unigram_entropy_bits"],
            "windows": int(starts.size),
            **heldout_sets.facts(config, task),
        }
    arrays = heldout_sets.window_files(config, corpus_tasks(experiment))
    return {"baselines": found, ARRAYS: arrays} if found else {}


def bigram_notes(payload: dict) -> list[str]:
    """A line per member (not diverged) whose held-out bits are not below its task's bigram."""
    out = []
    for m in payload.get("members", []):
        base = (payload.get("baselines") or {}).get(m.get("task"))
        per = "byte" if m.get("text_format") == "bytes" else "token"
        bits = m.get(f"eval_bits_per_{per}")
        if base is None or bits is None or m.get("status") == "diverged" or bits < base["bigram_bits"]:
            continue
        out.append(
            f"{m['name']}: held-out {bits:.4f} bits/{per}, not below the bigram baseline ({base['bigram_bits']:.4f}; "
            f"trigram {base['trigram_bits']:.4f}): it has not learned to use more than one token of context"
        )
    return out
