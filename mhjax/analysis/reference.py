"""The released checkpoints, analysed on the evaluation sequences of a trained sweep.

The public reference implementation of "Beyond Parallelism: Synergistic Computational Graph
Effects in Multi-Head Attention" (arXiv 2507.02944, https://github.com/haitzsaezdeocariz/beyondparallelism)
ships the eight models of its Section 4 in ``checkpoints/{H}_heads_{task}.pt`` (H in 1, 4, 8,
16; copy or cycle; 20,000 steps, one seed). Every such file found in a directory is read with
the restricted unpickler (:mod:`mhjax.io.torch_import`) and analysed by
:func:`mhjax.analysis.metrics.analyze_checkpoint` on the same sequences and with the
same conventions as ``mhjax analyze --workdir W``, so that a released model and a trained
member are compared on identical inputs. Entries are shaped like ``analysis.json`` members.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

import numpy as np

from mhjax.analysis import metrics
from mhjax.config import ConfigError
from mhjax.data.sequences import TASKS
from mhjax.io.results import write_json

PAPER_STEPS = 20000  # how long the released models were trained
PATTERN = re.compile(r"(\d+)_heads_([a-z]+)\.pt")
CONVENTION_KEYS = ("horizon", "max_steps", "include_sink", "chain")
DEFAULT_SEQUENCES = 50  # mhjax analyze's defaults: 50 random sequences from seed 0
DEFAULT_SEED = 0
FIELDS = "ablation+rollout"  # what an entry holds: a cache written before these were added is stale


def find_checkpoints(directory) -> dict[tuple[str, int], str]:
    """{(task, heads): path} of the ``{H}_heads_{task}.pt`` files in ``directory``."""
    directory = str(directory)
    if not os.path.isdir(directory):
        raise ConfigError(f"--reference: no such directory: {directory}")
    found = {}
    for name in sorted(os.listdir(directory)):
        match = PATTERN.fullmatch(name)
        if match and match.group(2) in TASKS and int(match.group(1)) >= 1:
            found[(match.group(2), int(match.group(1)))] = os.path.join(directory, name)
    if not found:
        raise ConfigError(f"--reference: {directory} holds no released checkpoint named {{H}}_heads_{{task}}.pt")
    return dict(sorted(found.items()))


def evaluation_setup(
    workdir: str, analysis: dict | None, vocab_size: int, seq_len: int
) -> tuple[np.ndarray, dict, str]:
    """(tokens, conventions, description) of the sweep's analysis; mhjax analyze's defaults without one."""
    conventions = dict(metrics.DEFAULTS)
    num, seed, where = DEFAULT_SEQUENCES, DEFAULT_SEED, "mhjax analyze's defaults (no analysis of W yet)"
    if analysis:
        conventions.update(
            {k: analysis["conventions"][k] for k in CONVENTION_KEYS if k in (analysis.get("conventions") or {})}
        )
        first = next(iter(analysis.get("members", {}).values()), {})
        source = analysis.get("source") or {}
        seq_len = int(first.get("seq_len", seq_len))
        vocab_size = int((first.get("model") or {}).get("vocab_size", vocab_size))
        if source.get("sequences") == "random":
            num, seed, where = (
                int(first.get("num_sequences", num)),
                int(source.get("seed", seed)),
                "the sequences of W's analysis",
            )
        elif source.get("sequences") not in (None, "array") and os.path.isfile(source["sequences"]):
            tokens = metrics.load_sequences(source["sequences"], seq_len, vocab_size)
            return tokens, conventions, f"the sequences of W's analysis ({source['sequences']})"
        else:
            where = "mhjax analyze's defaults (W's analysis sequences are not on disk)"
    tokens = metrics.random_tokens(num, seq_len, vocab_size, seed)
    return tokens, conventions, f"{where}: {num} random sequences of length {seq_len} from seed {seed}"


def _cache_key(checkpoints: dict, tokens: np.ndarray, conventions: dict) -> str:
    # names, not paths: the same files reached through another path reuse the cache
    parts = [f"{os.path.basename(p)}:{os.path.getsize(p)}:{os.path.getmtime(p)}" for p in checkpoints.values()]
    parts += [
        hashlib.sha256(np.ascontiguousarray(tokens, np.int32).tobytes()).hexdigest(),
        str(tokens.shape),
        json.dumps(conventions, sort_keys=True),
        FIELDS,
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()


def analyze_reference(
    directory, tokens: np.ndarray, conventions: dict, cache: str | None = None, log=None
) -> list[dict]:
    """Analyse every released checkpoint in ``directory`` on ``tokens``; one entry per file.

    ``cache``: a JSON file holding the last result, reused while the files, the sequences and
    the conventions are unchanged (the report is rewritten often; the analysis takes minutes).
    """
    checkpoints = find_checkpoints(directory)
    key = _cache_key(checkpoints, tokens, conventions)
    if cache and os.path.isfile(cache):
        try:
            with open(cache) as f:
                stored = json.load(f)
            if stored.get("key") == key:
                return stored["members"]
        except (OSError, ValueError, KeyError):
            pass  # unreadable cache: analyse again
    entries = []
    for (task, heads), path in checkpoints.items():
        try:
            result = metrics.analyze_checkpoint(
                path, heads, task, sequences=tokens, **{k: conventions[k] for k in CONVENTION_KEYS}
            )
        except ConfigError as exc:  # a file that does not load, or sequences longer than its max_len
            raise ConfigError(f"--reference: {os.path.basename(path)}: {exc}") from None
        entries.append(
            {
                "name": f"released-{task}-h{heads}",
                "task": task,
                "heads": heads,
                "status": "ok",
                "steps": PAPER_STEPS,
                **result,
            }
        )
        if log is not None:
            log(f"released {os.path.basename(path)}: accuracy {result['accuracy']:.4f}")
    if cache:
        os.makedirs(os.path.dirname(cache) or ".", exist_ok=True)
        write_json(cache, {"key": key, "members": entries})
    return entries
