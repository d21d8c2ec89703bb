"""Comparing a workdir's recorded config with the config of a command that would resume it
(io/workdir.py's check_or_write_metadata): which fields may differ, and the first difference in words."""

from __future__ import annotations

# Config fields that choose how a sweep is computed, not what: a run may resume under another
# (checkpoints hold one entry per member whatever the strategy, devices or attention path), and
# with other snapshot steps (they keep parameters and change no number).
HOW_NOT_WHAT = ("attention", "strategy", "devices", "train.snapshot_steps")


def what(config):
    if not isinstance(config, dict):
        return config
    out = {k: v for k, v in config.items() if k not in HOW_NOT_WHAT}
    if isinstance(out.get("train"), dict):
        out["train"] = {k: v for k, v in out["train"].items() if f"train.{k}" not in HOW_NOT_WHAT}
    return out


def longer(stored: dict, now: dict) -> int | None:
    """The stored train.steps when ``now`` differs from ``stored`` only by a larger one, else None."""
    try:
        before, after = stored["train"]["steps"], now["train"]["steps"]
    except (KeyError, TypeError):
        return None
    same = {**stored, "train": {**stored["train"], "steps": after}} == now
    return before if same and isinstance(before, int) and isinstance(after, int) and after > before else None


def first_difference(a, b, prefix="config") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{prefix}.{key} present in only one"
            if a[key] != b[key]:
                return first_difference(a[key], b[key], f"{prefix}.{key}")
    return f"{prefix}: stored {a!r}, now {b!r}"
