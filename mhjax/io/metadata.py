"""Comparing a workdir's recorded config with the config of a command that would resume it
(io/workdir.py's check_or_write_metadata): which fields may differ, and the first difference in words."""

from __future__ import annotations

import json
import os

from mhjax import __version__
from mhjax.config import ConfigError

# mhjax.json's record of a sweep that grew (workflows/growth.py, io/parts.py): one entry per part,
# {"folder", "sweep", "members": {name: hparams}}; the first part's folder is "" (W/checkpoints).
HISTORY = "sweep_history"

# Config fields that choose how a sweep is computed, not what: a run may resume under another
# (checkpoints hold one entry per member whatever the strategy, devices or attention path), and
# with other snapshot steps (they keep parameters and change no number).
HOW_NOT_WHAT = ("attention", "strategy", "devices", "train.snapshot_steps", "train.preempt_grace_s")


# mhjax.json's record of the files a sweep's data was read from (the text task's corpus):
# {label: {"path", "size", "sha256", ...}}; a resume refuses a file whose sha256 changed.
DATA_FILES = "data_files"


def _check_data_files(workdir, stored, now) -> None:
    for label, record in (stored or {}).items():
        current = (now or {}).get(label)
        if isinstance(record, dict) and isinstance(current, dict) and record.get("sha256") != current.get("sha256"):
            raise ConfigError(
                f"--workdir: {workdir.path} was trained on {record.get('path')} ({label}); {current.get('path')} "
                "differs from it now (sha256 differs): put the file back or use a new workdir"
            )


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


def check_or_write(workdir, config_dict: dict, kind: str, extra: dict | None = None, cannot_extend=None) -> bool:
    """True if ``workdir`` already belongs to this exact config (resume), up to HOW_NOT_WHAT
    fields; writes mhjax.json if new, with the experiment's ``extra`` fields (e.g. ``tasks``: where
    plug-in tasks came from). A config that differs only by a larger ``train.steps`` trains the
    workdir longer: mhjax.json then records the new config and, in ``extended_from_steps``, the
    earlier totals; ``cannot_extend``: why this experiment cannot (a ConfigError then). A sweep
    that grew was recorded before (workflows/growth.py): its history is kept."""
    current = {"mhjax_version": __version__, "experiment": kind, "config": config_dict, **(extra or {})}
    if os.path.exists(workdir.metadata_path):
        stored = workdir.metadata()
        if stored.get("mhjax_version") != __version__:
            raise ConfigError(
                f"--workdir: {workdir.path} was written by mhjax {stored.get('mhjax_version')}, this is "
                f"{__version__}; use a new workdir"
            )
        _check_data_files(workdir, stored.get(DATA_FILES), current.get(DATA_FILES))
        stored_config, config_now = what(stored.get("config", {})), what(json.loads(json.dumps(config_dict)))
        if stored_config != config_now:
            diff = first_difference(stored_config, config_now)
            before = longer(stored_config, config_now)
            if before is None:
                raise ConfigError(
                    f"--workdir: {workdir.path} holds a run of another config ({diff}); use a new workdir or the same "
                    "config (only a larger config.train.steps trains it longer, and only added sweep values grow it)"
                )
            if cannot_extend:
                raise ConfigError(f"--workdir: {workdir.path} holds a run of {before} steps: {cannot_extend}")
            extended = list(stored.get("extended_from_steps", [])) + [before]
            kept = {HISTORY: stored[HISTORY]} if HISTORY in stored else {}
            workdir.write_metadata({**current, **kept, "extended_from_steps": extended})
        return True
    if os.path.exists(workdir.path) and not os.path.isdir(workdir.path):
        raise ConfigError(f"--workdir: {workdir.path} exists and is not a folder")
    workdir.write_metadata(current)
    return False
