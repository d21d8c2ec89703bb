"""Comparing a workdir's recorded config with the config of a command that would resume it
(io/workdir.py's check_or_write_metadata): which fields may differ, and the first difference in words."""

from __future__ import annotations

import json
import os

from mhjax import __version__
from mhjax.config import ConfigError
from mhjax.io.results import json_ready

# mhjax.json's record of a sweep that grew (workflows/growth.py, io/parts.py): one entry per part,
# {"folder", "sweep", "members": {name: hparams}}; the first part's folder is "" (W/checkpoints).
HISTORY = "sweep_history"

# Config fields that choose how a sweep is computed, not what: a run may resume under another
# (checkpoints hold one entry per member whatever the strategy, devices or attention path), and
# with other snapshot steps (they keep parameters and change no number).
HOW_NOT_WHAT = ("attention", "strategy", "devices", "train.snapshot_steps", "train.preempt_grace_s")

# mhjax.json's record of what changed between the runs of one workdir, one entry per change, with
# the ``step`` it took effect (the checkpoint the run resumed from: the steps before it ran under
# "before"): a setting that may change, {"step", "field", "before", "after"} (RECORDED_FIELDS); a
# plug-in's source file, {"step", "source", "file", "sha256_before", "sha256_after"} (``source``:
# where mhjax.json records it, e.g. "tasks.marker"; `mhjax train --allow-changed-task` allows it).
RESUME_HISTORY = "resume_history"
RECORDED_FIELDS = ("train.snapshot_steps",)


# mhjax.json's record of the files a sweep's data was read from (the text task's corpus):
# {label: {"path", "size", "sha256", ...}}; a resume refuses a file whose sha256 changed.
DATA_FILES = "data_files"


def check_data_files(workdir, stored, now) -> None:
    """A data file recorded in mhjax.json (``stored``: its DATA_FILES) that this run reads
    changed (``now``): a ConfigError, whatever is allowed (the data is the run's)."""
    for label, record in (stored or {}).items():
        current = (now or {}).get(label)
        if isinstance(record, dict) and isinstance(current, dict) and record.get("sha256") != current.get("sha256"):
            raise ConfigError(
                f"--workdir: {workdir.path} was trained on {record.get('path')} ({label}); {current.get('path')} "
                "differs from it now (sha256 differs): put the file back or use a new workdir"
            )


def resolved(config, defaults: dict | None):
    """``config`` (a config dict) JSON-ready, with each optional field it leaves out at its default
    (``defaults``: {dotted field: value}, e.g. experiments.override_defaults; a "*" field, a family
    of fields, is not filled): a field given at its default equals the field left out."""
    out = json.loads(json.dumps(json_ready(config)))
    if not isinstance(out, dict):
        return out
    for field, value in (defaults or {}).items():
        *parents, last = field.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {}) if isinstance(node, dict) else None
        if "*" not in field and isinstance(node, dict) and last not in node:
            node[last] = json.loads(json.dumps(json_ready(value)))
    return out


def field_value(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def source_changes(stored, current, path: tuple = ()) -> list[dict]:
    """The plug-in sources (records with a "function" and a "sha256": data/plugins.pinned) whose
    sha256 differs between ``stored`` (W/mhjax.json) and ``current`` (this run's record):
    [{"source": where they are recorded, e.g. "tasks.marker", "file", "sha256_before", "sha256_after"}]."""
    if not isinstance(stored, dict) or not isinstance(current, dict):
        return []
    if "function" in stored and stored.get("sha256"):
        if current.get("sha256") == stored["sha256"]:
            return []
        file = current.get("config") or current.get("file") or stored.get("config") or stored.get("file")
        where = ".".join(path)
        return [
            {"source": where, "file": file, "sha256_before": stored["sha256"], "sha256_after": current.get("sha256")}
        ]
    return [c for key in stored if key in current for c in source_changes(stored[key], current[key], (*path, key))]


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


def check_or_write(
    workdir, config_dict: dict, kind: str, extra: dict | None = None, cannot_extend=None, defaults=None
) -> bool:
    """True if ``workdir`` already belongs to this exact config (resume), up to HOW_NOT_WHAT
    fields, both configs ``resolved`` with ``defaults``; writes mhjax.json if new, with the
    experiment's ``extra`` fields (e.g. ``tasks``: where plug-in tasks came from). A config that
    differs only by a larger ``train.steps`` trains the workdir longer: mhjax.json then records the
    new config and, in ``extended_from_steps``, the earlier totals; ``cannot_extend``: why this
    experiment cannot (a ConfigError then). A resume under another RECORDED_FIELDS value or
    another plug-in source (refused before, unless allowed: workflows/train.py) records it in
    RESUME_HISTORY. A sweep that grew was recorded before (workflows/growth.py): its history is kept."""
    current = json.loads(json.dumps(json_ready({"mhjax_version": __version__, "experiment": kind, **(extra or {})})))
    current["config"] = config_dict
    if not os.path.exists(workdir.metadata_path):
        if os.path.exists(workdir.path) and not os.path.isdir(workdir.path):
            raise ConfigError(f"--workdir: {workdir.path} exists and is not a folder")
        workdir.write_metadata(current)
        return False
    stored = workdir.metadata()
    if stored.get("mhjax_version") != __version__:
        raise ConfigError(
            f"--workdir: {workdir.path} was written by mhjax {stored.get('mhjax_version')}, this is "
            f"{__version__}; use a new workdir"
        )
    check_data_files(workdir, stored.get(DATA_FILES), current.get(DATA_FILES))
    stored_full, now_full = resolved(stored.get("config", {}), defaults), resolved(config_dict, defaults)
    stored_config, config_now = what(stored_full), what(now_full)
    extended = list(stored.get("extended_from_steps", []))
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
        extended.append(before)
    changes = source_changes(stored, current) + [
        {"field": f, "before": field_value(stored_full, f), "after": field_value(now_full, f)}
        for f in RECORDED_FIELDS
        if field_value(stored_full, f) != field_value(now_full, f)
    ]
    records_differ = any(stored.get(k) != v for k, v in current.items() if k != "config")  # a grown sweep's tasks
    if len(extended) > len(stored.get("extended_from_steps", [])) or changes or records_differ:
        step = workdir.latest_step() or 0
        history = list(stored.get(RESUME_HISTORY, [])) + [{"step": step, **c} for c in changes]
        written = {**stored, **current, **({"extended_from_steps": extended} if extended else {})}
        workdir.write_metadata({**written, **({RESUME_HISTORY: history} if history else {})})
    return True
