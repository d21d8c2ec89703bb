"""What successive halving (train/halving.py) leaves in a workdir for its readers: W/halving.json,
the rungs decided so far, and W/halving/<step>, the saved states of the members stopped there
(mhjax status, Workdir.params: a stopped member's state from its rung on)."""

from __future__ import annotations

import json
import os

from mhjax.io.checkpoint_names import member_key

HALVING_FILE = "halving.json"  # train/halving.FILE
HALVING_FOLDER = "halving"  # train/halving.FOLDER


def stopped_steps(path) -> dict:
    """{member: its rung's step} of the members halving stopped in workdir ``path`` ({} without halving)."""
    try:
        with open(os.path.join(path, HALVING_FILE)) as f:
            decisions = json.load(f).get("decisions", [])
    except (OSError, ValueError):  # none, or being replaced (atomically): read next time
        return {}
    return {name: d["step"] for d in decisions for name in d.get("stopped", {})}


def stopped_state(path, member: str, step: int | None = None) -> dict | None:
    """``member``'s raw saved state where halving stopped it, at a rung at or before ``step`` (None:
    any); None where halving did not stop it (its state at any later step is that one)."""
    at = stopped_steps(path).get(member)
    if at is None or (step is not None and at > step):
        return None
    from mhjax.io.checkpoint import SweepCheckpointer  # orbax imports slowly: only here

    saver = SweepCheckpointer(os.path.join(path, HALVING_FOLDER), keep=None)
    try:
        return saver.restore_raw(at)["members"][member_key(member)]
    finally:
        saver.close()
